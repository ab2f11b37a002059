"""``aot_compile``: AOT autograd for backends that declare ``level="aten"``."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

import torch

from .. import events
from .._logging import enabled
from .analysis import GraphInfo, analyze
from .partition import partition_joint
from .runtime import ForwardOnly, Training
from .trace import trace_forward, trace_joint

__all__ = ["aot_compile", "AOTCompiled"]

log = logging.getLogger("ember.aot")


def _example_from_meta(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """Real (zero-filled) tensors matching a graph's placeholders, for backend.compile."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            out.append(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype,
                                           device=v.device).zero_())
    return out


def _readable(gm: torch.fx.GraphModule) -> str:
    return gm.print_readable(print_output=False)


class _RunEagerly:
    """A variant that could not be traced (data-dependent shapes in its backward, say)."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm


def _data_dependent(e: BaseException) -> str | None:
    """The op whose output shape or value depends on tensor data, if ``e`` says so."""
    from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                               DynamicOutputShapeException)

    if isinstance(e, (DynamicOutputShapeException, DataDependentOutputException)):
        return str(e.func) if getattr(e, "func", None) is not None else str(e)
    text = str(e)
    if isinstance(e, RuntimeError) and "get value out of a tracing tensor with" in text:
        # .item()/_local_scalar_dense, equal, allclose: a Python value read from a tensor
        return text.split("tracing tensor with", 1)[1].split(" - ", 1)[0].strip()
    return None


class AOTCompiled:
    """The callable ``aot_compile`` returns. Takes the graph's inputs positionally, returns its
    outputs. Variants (training for a given ``requires_grad`` pattern, inference) are compiled on
    first use; the one for the example inputs is compiled eagerly."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], backend: Any,
                 options: dict[str, Any], context: Any = None):
        self.gm = gm
        self.backend = backend
        self.options = options
        #: the torch-level graph's CompileContext; ATen graphs get a derived one (kind, inputs)
        self.context = context
        self.tensor_idx = [i for i, a in enumerate(example_inputs) if isinstance(a, torch.Tensor)]
        self._variants: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self._decomps = dict(backend.get_decompositions())
        self._key_and_build(example_inputs)

    # -- variants ------------------------------------------------------------------------
    def _key(self, tensors: Sequence[torch.Tensor]) -> Any:
        if torch.is_grad_enabled():
            rg = tuple(t.requires_grad for t in tensors)
            if any(rg):
                return rg
        return "inference"

    def _key_and_build(self, args: Sequence[Any], first: bool = True) -> Any:
        tensors = [args[i] for i in self.tensor_idx]
        key = self._key(tensors)
        v = self._variants.get(key)
        if v is None:
            with self._lock:
                v = self._variants.get(key)
                if v is None:
                    try:
                        v = self._build(key, args, tensors)
                    except Exception as e:
                        if first:  # the caller (compile_graph) reports it and runs eagerly
                            raise
                        # A variant built at call time (a new requires_grad pattern) that cannot
                        # be traced runs the captured graph as is: correct, not compiled.
                        log.warning("ember: AOT autograd cannot compile this graph for "
                                    "requires_grad=%s; running it eagerly: %s: %s", key,
                                    type(e).__name__, e)
                        v = _RunEagerly(self.gm)
                    self._variants[key] = v
        return v, tensors

    def __call__(self, *args: Any) -> Any:
        v, tensors = self._key_and_build(args, first=False)
        if isinstance(v, _RunEagerly):
            return v.gm(*args)
        return v(tensors)

    # -- building ------------------------------------------------------------------------
    def _graph_fn(self, args: Sequence[Any]) -> torch.fx.GraphModule | Callable[..., Any]:
        if len(self.tensor_idx) == len(args):
            return self.gm
        consts = list(args)
        tensor_idx = self.tensor_idx

        def only_tensors(*ts: Any) -> Any:  # non-tensor inputs are baked in as constants
            full = list(consts)
            for i, t in zip(tensor_idx, ts):
                full[i] = t
            return self.gm(*full)

        return only_tensors  # type: ignore[return-value]

    def _context(self, kind: str, inputs: list[Any]) -> Any:
        if self.context is None:
            return None
        gid = f"{self.context.graph_id}.{kind}"
        n = sum(1 for k in self._variants if k != "inference") if kind != "inference" else 0
        if n:  # a second training variant (another requires_grad pattern)
            gid += f"{n}"
        return self.context.derive(graph_id=gid, kind=kind, inputs=tuple(inputs))

    def _primal_infos(self) -> list[Any]:
        """The torch-level InputInfos of the tensor inputs (the ATen graphs' primals)."""
        if self.context is None:
            return []
        return [self.context.inputs[i] for i in self.tensor_idx]

    def _compile(self, gm: torch.fx.GraphModule, example: list[Any],
                 context: Any = None) -> Callable[..., Any]:
        from ..backends import _run_passes, call_backend  # late: backends imports aot lazily

        gm = _run_passes(gm, "aten")
        fn = call_backend(self.backend, gm, example, self.options, context)
        if not callable(fn):
            raise TypeError(f"backend {self.backend.name!r} returned {type(fn).__name__} for an "
                            "ATen graph, expected a callable")
        return fn

    def _build(self, key: Any, args: Sequence[Any], tensors: list[torch.Tensor]) -> Any:
        try:
            return self._build_variant(key, args, tensors)
        except Exception as e:
            op = _data_dependent(e)
            if op is None:
                raise
            where = "forward" if key == "inference" else "joint forward/backward"
            raise RuntimeError(
                f"data-dependent shape or value in the {where} graph ({op}: its result depends "
                "on tensor values); AOT autograd traces static shapes") from e

    def _build_variant(self, key: Any, args: Sequence[Any], tensors: list[torch.Tensor]) -> Any:
        t0 = time.perf_counter()
        fn = self._graph_fn(args)
        training = key != "inference"
        rg = list(key) if training else [False] * len(tensors)
        # Every stage runs the graph, and with it its grad-mode/autocast switches: each starts
        # from the caller's state (a stage must not see the state an earlier one left).
        from ..backends import _global_state, _set_global_state
        state = _global_state()
        info: GraphInfo = analyze(fn, tensors, rg, need_grad_info=training)
        _set_global_state(state)
        if training and any(rg[i] for i in info.meta_mutated):
            raise NotImplementedError(
                "an in-place view op (t_, transpose_, squeeze_, as_strided_, ...) changes the "
                "metadata of an input that requires grad; AOT autograd does not support it")
        out_rg = info.graph_out_requires_grad + info.mutated_requires_grad
        if training and not any(out_rg):
            training = False  # nothing to differentiate: no joint trace needed
        detached = [t.detach() for t in tensors]
        if not training:
            fw_gm = trace_forward(fn, tensors, info, self._decomps)
            _set_global_state(state)
            self._log("inference forward", fw_gm)
            t1 = time.perf_counter()
            events.emit("timing", stage="aot", seconds=t1 - t0, graph="inference")
            runtime = ForwardOnly(info, self._compile(
                fw_gm, detached, self._context("inference", self._primal_infos())))
            runtime.graph = fw_gm
            runtime.backend = str(self.backend.name)
            return runtime

        joint, n_tangents = trace_joint(fn, tensors, rg, info, self._decomps)
        _set_global_state(state)
        n_fwd = len(info.graph_out_flat) + len(info.mutated)
        part = partition_joint(joint, len(tensors), n_fwd, set(info.mutated))
        if enabled("aot"):
            log.info("AOT joint graph:\n%s", _readable(joint))
            log.info("AOT saved for backward (%d tensors, %d bytes): %s", part.n_saved,
                     part.saved_bytes, ", ".join(part.saved_names))
        self._log("forward", part.fw)
        self._log("backward", part.bw)
        tangent_meta = []
        for n in list(part.bw.graph.nodes)[part.n_saved:]:
            if n.op != "placeholder":
                break
            v = n.meta["val"]
            tangent_meta.append((tuple(v.shape), tuple(v.stride()), v.dtype, v.device))
        t1 = time.perf_counter()
        events.emit("timing", stage="aot", seconds=t1 - t0, graph="training",
                    saved_bytes=part.saved_bytes)
        primals = self._primal_infos()
        fw = self._compile(part.fw, detached, self._context("forward", primals))
        bw = self._compile(part.bw, _example_from_meta(part.bw),
                           self._context("backward", self._backward_infos(joint, part, primals)))
        runtime = Training(info, fw, lambda: bw, rg, part.n_saved, tangent_meta,
                           part.grad_tangent_deps, part.primal_reaches,
                           backend=str(self.backend.name))
        runtime.partition = part  # for inspection (tests, debugging)
        return runtime

    def _backward_infos(self, joint: torch.fx.GraphModule, part: Any,
                        primals: list[Any]) -> list[Any]:
        """Saved values (a primal saved as is keeps its InputInfo; others are activations),
        then tangents."""
        if self.context is None:
            return []
        from ..context import InputInfo

        names = [n.name for n in joint.graph.nodes if n.op == "placeholder"][:len(primals)]
        by_name = dict(zip(names, primals))
        out = []
        for n in part.bw.graph.nodes:
            if n.op != "placeholder":
                break
            if len(out) < part.n_saved:
                out.append(by_name.get(n.name) or InputInfo("activation", "", False))
            else:
                out.append(InputInfo("tangent", "", False))
        return out

    def _log(self, what: str, gm: torch.fx.GraphModule) -> None:
        if enabled("aot"):
            log.info("AOT %s graph:\n%s", what, _readable(gm))


def aot_compile(gm: torch.fx.GraphModule, example_inputs: list[Any], *, backend: Any,
                options: dict[str, Any] | None = None, context: Any = None) -> Callable[..., Any]:
    """Compile a torch-level graph through AOT autograd for an ``level="aten"`` backend.

    ``gm`` takes the flat inputs (user tensors, parameters, buffers) positionally and returns a
    flat tuple/list of outputs. ``example_inputs`` are real tensors. ``backend`` is an
    :class:`ember.Backend`: its ``compile`` gets the forward and the backward ATen graphs (training),
    or one forward graph (inference, when no input requires grad or grad mode is off), with its
    decomposition table applied. Returns a callable with ``gm``'s calling convention whose results
    behave as eager's: gradients flow through the compiled backward, mutated inputs are updated,
    outputs alias as in eager. ``context`` (the torch-level graph's :class:`ember.CompileContext`)
    is passed on, with ``kind`` "inference", "forward" or "backward" and the ATen graph's inputs,
    to backends whose compile accepts ``context=``.
    """
    return AOTCompiled(gm, example_inputs, backend, dict(options or {}), context)
