"""``compile_inductor``: ATen fx graph -> IR -> schedule -> C++ + wrapper -> a callable.

A warm start skips everything but loading: the wrapper source is cached by a key over the graph's
code, its input metadata, the options and this code generator's version; the kernels it loads are
cached by their source (runtime/cache.py)."""

from __future__ import annotations

import functools
import hashlib
import logging
import pathlib
import time
from typing import Any, Callable, Sequence

import torch

__all__ = ["compile_inductor", "CODEGEN_VERSION", "generate_source"]

log = logging.getLogger("ember.inductor")
out_log = logging.getLogger("ember.output_code")

#: Bump when lowering or codegen changes what is generated for a graph.
CODEGEN_VERSION = "1"

#: How many graphs this process lowered and generated code for ("generated"), and how many it
#: compiled in all ("compiled", cache hits included). A graph with symbolic sizes is generated
#: once and then serves every size: calling it never adds to these.
counters: dict[str, int] = {"generated": 0, "compiled": 0}


@functools.lru_cache(None)
def _code_fingerprint() -> str:
    """A hash of this compiler's own source (lowering, scheduling, codegen): any change to it
    makes earlier cached wrappers misses, so a stale wrapper is never loaded."""
    h = hashlib.sha256(CODEGEN_VERSION.encode())
    root = pathlib.Path(__file__).parent
    for p in sorted(root.rglob("*.py")):
        if "runtime" in p.relative_to(root).parts:
            continue
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _graph_key(gm: torch.fx.GraphModule, options: dict[str, Any]) -> str:
    h = hashlib.sha256()
    h.update(_code_fingerprint().encode())
    h.update(torch.__version__.encode())
    # the code embeds choices timed on this machine (autotune.py): another CPU, ISA or thread
    # count decides again
    from .autotune import machine_key

    h.update(machine_key().encode())
    if any(isinstance(v, torch.Tensor) and v.device.type == "cuda"
           for v in (n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder")):
        # and choices timed on this GPU (padding.py): another GPU, driver or Triton decides again
        from .runtime.triton import machine_key as gpu_key

        h.update(gpu_key().encode())
    h.update(gm.code.encode())
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr"):
            v = n.meta.get("val")
            if n.op == "get_attr":
                v = getattr(gm, n.target)
            if isinstance(v, torch.Tensor):
                h.update(repr((n.name, tuple(v.shape), tuple(v.stride()), str(v.dtype),
                               str(v.device))).encode())
            elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                h.update(repr((n.name, type(v).__name__, str(v))).encode())
            else:
                h.update(repr((n.name, type(v).__name__)).encode())
    h.update(repr(sorted((k, repr(v)) for k, v in options.items())).encode())
    env = _shape_env(gm)
    if env is not None:
        # symbolic sizes: the code may rely on the symbols' ranges and on the guards' relations
        # (never on their example values, which stay out of the key)
        h.update(repr(sorted(str(getattr(g, "expr", g)) for g in getattr(env, "guards", []))
                      ).encode())
        h.update(repr(sorted((str(k), str(v)) for k, v in env.var_to_range.items())).encode())
    return h.hexdigest()


def _shape_env(gm: torch.fx.GraphModule) -> Any:
    """The ShapeEnv of a graph traced with symbolic sizes (None for a static graph)."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        vals = list(v.shape) + list(v.stride()) if isinstance(v, torch.Tensor) else [v]
        for x in vals:
            if isinstance(x, torch.SymInt):
                return x.node.shape_env
    return None


def _symbolic(v: Any) -> bool:
    """Whether a node value holds a symbolic size, stride or number."""
    if isinstance(v, torch.Tensor):
        if any(not isinstance(d, int) for d in v.shape):
            return True
        return v.layout == torch.strided and (
            any(not isinstance(d, int) for d in v.stride())
            or not isinstance(v.storage_offset(), int))
    if isinstance(v, (list, tuple)):
        return any(_symbolic(x) for x in v)
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _unbacked_sizes(gm: torch.fx.GraphModule) -> str | None:
    """Why the graph has data-dependent sizes (the first node whose value has an unbacked
    symbol), or None."""
    if not any(_symbolic(n.meta.get("val")) for n in gm.graph.nodes):
        return None  # static graph: no symbols at all (and no sympy import on a warm start)
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for n in gm.graph.nodes:
        syms = free_unbacked_symbols(n.meta.get("val"))
        if syms:
            return (f"{n.target if n.op == 'call_function' else n.name} has sizes or values "
                    f"that depend on tensor data ({', '.join(sorted(map(str, syms)))})")
    return None


def generate_source(gm: torch.fx.GraphModule, key: str = "",
                    options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """(wrapper source, info) for an ATen graph; the wrapper embeds the kernels' source (C++
    or Triton: the graph's target, codegen/target.py)."""
    from .codegen.target import target_for
    from .codegen.wrapper import WrapperWriter
    from .layout import plan_for
    from .lowering import GraphLowering
    from .scheduler import CppRegion, Scheduler

    from .sizes import SizeEnv, size_env

    target = target_for(gm, options)
    gm = target.rewrite(gm, options or {})
    # symbolic sizes (if any) are known to lowering, scheduling and code generation through one
    # SizeEnv: their example values steer heuristics only
    with size_env(SizeEnv()):
        graph = GraphLowering(gm)
        # var/var_mean about the row's first element (lowering/reductions.py): both targets
        graph.shifted_var_mean = True
        graph.random_in_kernels = target.name == "triton"
        graph.host_ops_as_aten = target.device != "cpu"
        # channels-last activations in graphs with convolutions (layout.py)
        graph.layout_plan = plan_for(gm, options or {})
        # C++ keeps values read back by a later loop of their row in a stack row (or the
        # output) instead of a buffer (scheduler.ROW_SCRATCH_MAX); lowering stores them then
        graph.row_scratch = target.name == "cpp"
        # C++ loops have no 2-D tiles: a transposing output is computed along its loads, then
        # copied (lowering/graph.py, _loads_across); Triton tiles transposes itself
        graph.transpose_by_copy = target.name == "cpp"
        # float16/bfloat16 results rounded per op in fused kernels (lowering/common.pointwise)
        graph.round_16bit = bool((options or {}).get("emulate_precision_casts", False))
        graph.run()
        sched = Scheduler(graph, row_scratch=graph.row_scratch,
                          split_policy=target.split_policy())
        dtypes = {b.name: b.dtype for b in graph.operations}
        dtypes.update({b.name: b.dtype for b in graph.inputs})
        for name, t in graph.constants.items():
            dtypes[name] = t.dtype
        # the OpenMP threshold: this machine's (calibrate.py) unless an option forces one
        from . import calibrate

        forced = (options or {}).get("parallel_min_work")
        prev = calibrate.override[0]
        if forced is not None:
            calibrate.override[0] = int(forced)
        try:
            kernels = target.generate(sched, dtypes)
        finally:
            calibrate.override[0] = prev
        writer = WrapperWriter(graph, sched, kernels, key, options, target)
        src = writer.generate()
    counters["generated"] += 1
    # buffer_plan: what the wrapper allocates and frees (its live_bytes(): memory per step)
    info = {"fallbacks": graph.fallback_ops,
            "regions": sum(isinstance(s, CppRegion) for s in sched.steps),
            "buffer_plan": writer.plan}
    return src, info


def load_wrapper(src: str, gm: torch.fx.GraphModule, key: str) -> Callable[..., Any]:
    import linecache

    ns: dict[str, Any] = {"__name__": f"ember_inductor_graph_{key[:12]}"}
    name = f"<ember_inductor {key[:12]}>"
    # a traceback through the wrapper shows its generated lines (which kernel, which buffers)
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    exec(compile(src, name, "exec"), ns)
    targets = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    for i, t in enumerate(targets):
        ns[f"const{i}"] = getattr(gm, t)
    call = ns["call"]
    return call


def compile_inductor(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                     context: Any = None, **options: Any) -> Callable[..., Any]:
    """Compile a functional ATen graph (from Ember's AOT autograd) for the CPU.

    Returns a callable taking the graph's inputs positionally and returning its output tuple.
    ``mode`` ("default", "max-autotune", "reduce-overhead") is accepted; on the CPU it changes
    nothing yet. ``context`` (an ember CompileContext) is optional. The choices timed on this
    machine while compiling (autotune.py) share one time budget per graph.
    """
    from .autotune import session

    with session():
        return _compile_inductor(gm, example_inputs, context=context, **options)


def _compile_inductor(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                      context: Any = None, **options: Any) -> Callable[..., Any]:
    from ._logging_util import output_code_enabled
    from .runtime.cache import get_text, put_text

    if "debug_fill" not in options:
        import ember.config

        if getattr(ember.config, "debug_fill", False):
            options = {**options, "debug_fill": True}  # in the cache key: its own wrapper

    from .codegen.target import target_for

    # refuses a device without a target, before any work; the target's defaults for options
    # the caller did not set
    target = target_for(gm, options)
    if target.name == "triton" and target.device == "cpu":
        from .runtime.triton_math import interpreting

        if not interpreting():
            # compiled for a GPU, a kernel given CPU pointers reads and writes host addresses
            # on the device: an illegal memory access that poisons the whole CUDA context
            raise ValueError("ember-inductor: option cpu_codegen='triton' runs CPU tensors "
                             "through Triton's interpreter and needs TRITON_INTERPRET=1 set "
                             "before triton is first imported; without it Triton compiles the "
                             "kernels for a GPU, which cannot read CPU memory. Set "
                             "TRITON_INTERPRET=1, move the tensors to the GPU, or drop the "
                             "option (the C++ target)")
    options = {**target.default_options, **options}
    if target.name == "triton":
        # how many configurations each kernel's first launch times on a GPU (runtime/triton.py)
        mode = getattr(context, "mode", None) or options.get("mode")
        options.setdefault("_triton_tune", "full" if mode == "max-autotune" else "light")
    unbacked = _unbacked_sizes(gm)
    if unbacked is not None:
        # Sizes that depend on tensor data (nonzero, x[mask], masked_select, .item(): unbacked
        # symbols) are not lowered: the graph runs as its ATen ops, still one compiled graph.
        log.info("graph %s runs as ATen ops, not generated code: %s",
                 getattr(context, "graph_id", "?"), unbacked)
        return gm.forward
    kind = getattr(context, "kind", None)
    if kind in ("forward", "backward") and not options.get("_layout_final"):
        from . import layout

        if layout.wants_channels_last(gm) and options.get("layout_opt", True):
            if kind == "forward":
                # generated when its backward is compiled: saved activations stay channels-last
                return layout.defer_forward(compile_inductor, gm, example_inputs, context,
                                            options)
            inputs = layout.take_forward(context, gm)
            options = {**options, "_layout_final": True}
            if inputs:
                options["_layout"] = {"inputs": tuple(sorted(inputs.items()))}
    if not options.get("_frozen"):
        # inference graphs: fold parameter-only computation once (freezing.py); the graph
        # compiled below takes the folded values as trailing inputs
        from .freezing import freeze_and_compile

        frozen = freeze_and_compile(compile_inductor, gm, example_inputs, context, options)
        if frozen is not None:
            return frozen
    t0 = time.perf_counter()
    counters["compiled"] += 1
    opts = {k: v for k, v in options.items()}
    from .codegen.isa import cpu_isa

    # the instruction set the kernels are built for (an option, or EMBER_CPU_ISA) is in the key
    isa = cpu_isa(opts)
    opts.pop("cpu_isa", None)
    if isa != "native":
        opts["cpu_isa"] = isa
    key = _graph_key(gm, opts)
    src = get_text("wrapper", key)
    hit = src is not None
    if src is None:
        src, info = generate_source(gm, key, opts)
        put_text("wrapper", key, src)
        if info["fallbacks"]:
            log.info("ATen fallbacks: %s", ", ".join(sorted(set(info["fallbacks"]))))
    fn = load_wrapper(src, gm, key)
    if output_code_enabled():
        out_log.info("graph %s (%s):\n%s", key[:16], "cached" if hit else "generated", src)
    log.debug("compiled graph %s in %.3fs (%s)", key[:16], time.perf_counter() - t0,
              "warm" if hit else "cold")
    return fn
