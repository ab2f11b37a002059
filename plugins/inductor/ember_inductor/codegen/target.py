"""One IR, two targets: what differs by device lives in a target object, not in ``if device``
branches through lowering, scheduling and the wrapper.

A target decides

* which graph rewrites pay off before lowering (the CPU's oneDNN linear layers and its fused
  attention kernel are CPU ATen ops; a GPU keeps ``addmm`` for cuBLAS),
* how the scheduler's fused groups become kernels (:meth:`Target.generate`: C++ functions, one per
  region, or Triton kernels, one per fused group),
* how the wrapper builds, loads and launches them (:meth:`Target.header` and :meth:`Target.call`),
  and where its buffers live (:attr:`Target.device`);
* whether a kernel may write a result over a dead buffer it reads (Triton: one in/out pointer,
  scheduler.plan_in_place; C++ declares its pointers ``__restrict__``, so never there).

Lowering and the scheduler are shared; tiling, vector width, block sizes and the timing of
candidates are the code generator's (codegen/cpp.py, codegen/triton.py and the runtime each uses).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

__all__ = ["Target", "CppTarget", "TritonTarget", "target_for", "ConvLayoutRules",
           "conv_layout_rules"]


@dataclasses.dataclass(frozen=True)
class ConvLayoutRules:
    """What the channels-last layout plan (layout.py) may do with one device's convolutions.

    These follow the device whose ATen runs the convolutions (oneDNN on a CPU, cuDNN on a GPU),
    not the code generator: CPU tensors under ``cpu_codegen="triton"`` keep the CPU's rules.

    * ``dtypes``: the dtypes whose 2-d convolutions and 4-d stored values the plan makes
      channels-last;
    * ``onednn``: oneDNN's own entry points (a fused ReLU / add+ReLU epilogue, the timed
      ``mkldnn._convolution_pointwise`` path), which exist for CPU tensors only;
    * ``f64_statistics``: per-channel ``var_mean`` and spatial ``mean`` of channels-last values
      accumulated in float64 in one pass (cheap on a CPU; a GPU's float64 rate is a fraction of
      its float32 one, so there the usual lowering, which reads any layout, is kept);
    * ``result_strides``: ``"channels_last"`` when ATen's result for channels-last operands is
      channels-last for every size (checked by tests/inductor/test_layout.py on the CPU);
      ``"aten"`` when it depends on which library ATen picks for the size (cuDNN returns
      channels-last, its other CUDA kernels need not): asked of ATen itself through fake
      tensors, which run the same choice;
    * ``strided_1x1_backward_contiguous``: the backward of a strided 1x1 convolution runs on
      contiguous operands (ATen's channels-last CPU kernel corrupts the heap for some sizes);
    * ``weights_channels_last``: a weight the graph computes (autocast's cast of a parameter)
      is stored channels-last (cuDNN copies a contiguous one to channels-last in every call; the
      CPU's oneDNN path gains nothing from it, measured on convnet).
    """

    dtypes: tuple[torch.dtype, ...]
    onednn: bool
    f64_statistics: bool
    result_strides: str
    strided_1x1_backward_contiguous: bool
    weights_channels_last: bool


_CONV_RULES = {
    "cpu": ConvLayoutRules((torch.float32, torch.float64), onednn=True, f64_statistics=True,
                           result_strides="channels_last", strided_1x1_backward_contiguous=True,
                           weights_channels_last=False),
    # cuDNN keeps float64 contiguous (its channels-last kernels take float32/16 and bfloat16)
    "cuda": ConvLayoutRules((torch.float32, torch.float16, torch.bfloat16), onednn=False,
                            f64_statistics=False, result_strides="aten",
                            strided_1x1_backward_contiguous=False, weights_channels_last=True),
}


def conv_layout_rules(device: Any) -> ConvLayoutRules | None:
    """The rules for tensors on ``device`` (a torch.device or its type); None: no plan there."""
    return _CONV_RULES.get(getattr(device, "type", device))


class Target:
    """The interface; see the module docstring."""

    name = ""
    #: device of the graph's tensors ("cpu", "cuda"); the wrapper allocates there
    device = "cpu"
    #: option values this target uses unless the caller sets them
    default_options: dict[str, Any] = {}

    def rewrite(self, gm: Any, options: dict[str, Any]) -> Any:
        """The graph rewrites this target wants before lowering (a new graph, or ``gm``)."""
        return gm

    def generate(self, sched: Any, dtypes: dict[str, torch.dtype]) -> Any:
        raise NotImplementedError

    def header(self, regions: list[Any], sources: Any) -> list[str]:
        """Wrapper lines (module level) that build and load the kernels."""
        raise NotImplementedError

    def call(self, region: Any, args: list[str], desc: str, ops: str) -> list[str]:
        """Wrapper lines (inside ``call``) that run ``region`` on ``args`` (buffer names, then
        the size symbols)."""
        raise NotImplementedError

    def split_policy(self) -> Any:
        """``policy(rows, row_length, xcontig) -> parts``: how many programs share each row of a
        reduction with few long rows (scheduler.Scheduler); None: rows are never split."""
        return None

    def alloc_kwargs(self) -> str:
        """Extra keyword arguments of the wrapper's ``torch.empty_strided`` calls."""
        return "" if self.device == "cpu" else f", device={self.device!r}"

    def keeps_buffers(self) -> bool:
        """Whether the wrapper keeps its internal buffers between calls (runtime/pool.py).
        On the CPU a fresh large buffer pays a page fault per page on first touch, which a kept
        one does not. On a GPU the caching allocator already reuses blocks without that cost,
        and a kept buffer is memory held outside any CUDA graph's pool: a recorded graph
        would write it after the pool let it go (a new size drops the old buffers), and it
        adds to the peak memory between calls. Off there."""
        return self.device == "cpu"


class CppTarget(Target):
    """C++ with OpenMP through gcc (codegen/cpp.py, runtime/cache.py)."""

    name = "cpp"

    def __init__(self, isa: str = "native"):
        self.isa = isa  # the instruction set the C++ is built for (option cpu_isa)

    def rewrite(self, gm: Any, options: dict[str, Any]) -> Any:
        # hand-written attention -> one fused kernel; matrix multiplies -> oneDNN where timing
        # says it is faster (patterns.py)
        from ..patterns import rewrite_graph

        return rewrite_graph(gm, options)

    def generate(self, sched: Any, dtypes: dict[str, torch.dtype]) -> list[str]:
        from .cpp import generate_cpp

        return generate_cpp(sched, dtypes, self.isa)

    def header(self, regions: list[Any], sources: list[str]) -> list[str]:
        head = ["CPP_SOURCES = ["]
        for src in sources:
            head.append("r'''" + src + "''',")
        head.append("]")
        head.append("compile_cpp_many(CPP_SOURCES)  # what the cache lacks builds in parallel")
        head.append("_libs = [load_cpp(s) for s in CPP_SOURCES]")
        where = {}
        for i, src in enumerate(sources):
            for r in regions:
                if re.search(rf'extern "C" (void|int) {r.name}\(', src):
                    where[r.name] = i
        for r in regions:
            n = len(r.reads) + len(r.writes)
            k = len(getattr(r, "size_args", []))
            head.append(f"{r.name} = _libs[{where[r.name]}].{r.name}")
            head.append(f"{r.name}.argtypes = [ctypes.c_void_p] * {n}"
                        + (f" + [ctypes.c_int64] * {k}" if k else ""))
            head.append(f"{r.name}.restype = "
                        + ("ctypes.c_int  # a status: see _kernel_failed"
                           if getattr(r, "checked", False) else "None"))
        return head

    def imports(self) -> list[str]:
        return ["from ember_inductor.runtime.cache import compile_cpp_many, load_cpp"]

    def call(self, region: Any, args: list[str], desc: str, ops: str) -> list[str]:
        nbuf = len(region.reads) + len(region.writes)
        ptrs = [f"{a}.data_ptr()" for a in args[:nbuf]] + args[nbuf:]
        call = f"{region.name}({', '.join(ptrs)})"
        if getattr(region, "checked", False):
            return [f"    status = {call}  # {desc}",
                    "    if status:",
                    f"        _kernel_failed(status, {region.name!r}, {ops!r})"]
        return [f"    {call}  # {desc}"]


class TritonTarget(Target):
    """Triton kernels (codegen/triton.py), built ahead and launched through runtime/triton.py.
    ``device`` is "cuda" on a GPU, or "cpu" under ``TRITON_INTERPRET=1`` (option
    ``cpu_codegen="triton"``: CPU tensors through Triton's interpreter)."""

    name = "triton"

    def __init__(self, device: str = "cuda", tune: str = "light"):
        self.device = device
        self.tune = tune  # "light": the heuristic's configuration and 2 more; "full": all
        # Freezing checks every frozen parameter's contents on each call (freezing.py): on a
        # GPU that is a comparison and a synchronization per parameter per call. Off by
        # default there (as torch.compile's); options={"freezing": True} turns it on.
        self.default_options = {"freezing": False} if device == "cuda" else {}

    def rewrite(self, gm: Any, options: dict[str, Any]) -> Any:
        if self.device != "cuda" and options.get("pad_mm") != "always":
            return gm
        # products with sizes cuBLAS's fast kernels cannot take, padded where timing on this
        # GPU says so (padding.py)
        from ..padding import pad_matmuls

        return pad_matmuls(gm, options.get("pad_mm", "auto"))

    def generate(self, sched: Any, dtypes: dict[str, torch.dtype]) -> Any:
        from ..scheduler import plan_in_place
        from .triton import generate_triton

        # a kernel writes a result over a dead buffer it reads, element by element, through
        # one in/out pointer (never one address as two parameters, which a compiler may take
        # for distinct); on a GPU the caching allocator recycles freed blocks anyway, so only
        # this lowers the peak
        sched.in_place = plan_in_place(sched, outputs=not self.keeps_buffers())
        return generate_triton(sched, dtypes, device=self.device, tune=self.tune)

    def split_policy(self) -> Any:
        from .triton import SPLIT_INTERPRETER_SMS, split_policy

        import os

        if self.device == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            return split_policy(SPLIT_INTERPRETER_SMS, interpret=True)
        # GPU kernels; without a GPU (their source generated for reading, or for tests that
        # build them): an H100's count
        sms = (torch.cuda.get_device_properties(torch.cuda.current_device())
               .multi_processor_count if torch.cuda.is_available() else 132)
        return split_policy(int(sms), interpret=False)

    def imports(self) -> list[str]:
        if self.device == "cpu":
            return ["from ember_inductor.runtime.triton import load_kernels"]
        return ["from ember_inductor.runtime.triton import load_kernels, capturing as _capturing, "
                "on_device as _on_device"]

    def header(self, regions: list[Any], sources: Any) -> list[str]:
        from .triton import wrapper_header

        return wrapper_header(regions, sources)

    def call(self, region: Any, args: list[str], desc: str, ops: str) -> list[str]:
        from .triton import wrapper_call

        return wrapper_call(region, args, desc, ops, self.device)


_CPP = CppTarget()


def target_for(gm: Any, options: dict[str, Any] | None) -> Target:
    """The target of a graph: its tensors' device, and for CPU tensors the option
    ``cpu_codegen`` ("cpp", the default, or "triton": Triton kernels under the interpreter).
    Every value counts, not only the inputs: a graph with no CUDA input may make CUDA tensors
    (``torch.zeros(n, device="cuda")``), which the CPU target would have allocated on the CPU."""
    options = options or {}
    device = "cpu"
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        vals = v if isinstance(v, (tuple, list)) else (v,)
        dev = next((t.device.type for t in vals
                    if isinstance(t, torch.Tensor) and t.device.type != "cpu"), None)
        if dev is not None:
            device = dev
            break
    if device == "cuda":
        return TritonTarget("cuda", str(options.get("_triton_tune", "light")))
    if device != "cpu":
        raise NotImplementedError(f"ember-inductor: {device} graphs are not supported (CPU and "
                                  "CUDA only)")
    codegen = options.get("cpu_codegen", "cpp")
    if codegen == "triton":
        return TritonTarget("cpu")
    if codegen not in ("cpp", None):
        raise ValueError(f"ember-inductor: option cpu_codegen={codegen!r}: expected 'cpp' or "
                         "'triton'")
    from .isa import cpu_isa

    isa = cpu_isa(options)
    return _CPP if isa == "native" else CppTarget(isa)
