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
from .names import readable_names, rename_placeholders
from .runtime import ForwardOnly, Training
from .symbolic import (DataDependentSymbols, ShapeEnvWatch, SizeExprs, SymbolBinder,
                       allow_unbacked, discard_unbacked, example_hint, guard_check,
                       has_unbacked, is_sym, unbacked_mode)
from .trace import trace_forward, trace_joint

__all__ = ["aot_compile", "AOTCompiled"]

log = logging.getLogger("ember.aot")


def _example_from_meta(gm: torch.fx.GraphModule) -> list[Any]:
    """Real (zero-filled) tensors matching a graph's placeholders, for backend.compile; symbolic
    sizes take their example values, SymInt placeholders become those ints (a data-dependent
    size, an unbacked symbol, a stand-in value: see :func:`ember.aot.symbolic.example_hint`)."""
    out: list[Any] = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            if not isinstance(v, torch.Tensor):
                out.append(example_hint(v))
                continue
            out.append(torch.empty_strided(tuple(map(example_hint, v.shape)),
                                           tuple(map(example_hint, v.stride())), dtype=v.dtype,
                                           device=v.device).zero_())
    return out


def _readable(gm: torch.fx.GraphModule) -> str:
    return gm.print_readable(print_output=False)


#: The variant key of a call made with grad mode off to a graph that turns it on.
_GRAD_ON_INSIDE = "grad-enabled-inside"


class _RunEagerly:
    """A variant that could not be traced (a branch on data in its backward, say)."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm


def _data_dependent(e: BaseException) -> str | None:
    """The op whose output shape or value depends on tensor data, if ``e`` says so."""
    from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                               DynamicOutputShapeException)
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    if isinstance(e, (DynamicOutputShapeException, DataDependentOutputException)):
        return str(e.func) if getattr(e, "func", None) is not None else str(e)
    if isinstance(e, DataDependentSymbols):
        return str(e)
    if isinstance(e, GuardOnDataDependentSymNode):
        # a branch on an unbacked size/value (dynamic shapes): the first line says which
        return str(e).split("\n", 1)[0]
    text = str(e)
    if isinstance(e, RuntimeError) and "get value out of a tracing tensor with" in text:
        # .item()/_local_scalar_dense, equal, allclose: a Python value read from a tensor
        return text.split("tracing tensor with", 1)[1].split(" - ", 1)[0].strip()
    return None


class AOTCompiled:
    """The callable ``aot_compile`` returns. Takes the graph's inputs positionally, returns its
    outputs. Variants (training for a given ``requires_grad`` pattern, inference) are compiled on
    first use; the one for the example inputs is compiled eagerly.

    Dynamic shapes (``context.fake_mode`` set): the ATen graphs are traced over the placeholders'
    symbolic ``meta["val"]`` under that mode, SymInt placeholders stay graph inputs (real ints at
    run time), and one build of a variant serves every size; variants never key on sizes."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], backend: Any,
                 options: dict[str, Any], context: Any = None):
        self.gm = gm
        self.backend = backend
        self.options = options
        #: the torch-level graph's CompileContext; ATen graphs get a derived one (kind, inputs)
        self.context = context
        #: dynamic shapes: capture's FakeTensorMode (None: static, every size is a constant)
        self.fake_mode = getattr(context, "fake_mode", None) if context is not None else None
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.metas: list[Any] | None = None
        if self.fake_mode is not None:
            metas = [n.meta.get("val") for n in placeholders]
            if len(metas) != len(example_inputs):
                raise NotImplementedError(
                    f"dynamic shapes: the graph has {len(metas)} placeholders but "
                    f"{len(example_inputs)} example inputs")
            for n, m, a in zip(placeholders, metas, example_inputs):
                if isinstance(a, torch.Tensor) and getattr(m, "fake_mode", None) is not \
                        self.fake_mode:
                    raise NotImplementedError(
                        f"dynamic shapes: placeholder {n.name} has no FakeTensor of the "
                        "compile's fake_mode in meta['val']")
            # the ATen graphs' inputs: tensors and sizes (SymInt placeholders)
            self.input_idx = [i for i, (a, m) in enumerate(zip(example_inputs, metas))
                              if isinstance(a, torch.Tensor) or is_sym(m)]
            self.metas = [metas[i] for i in self.input_idx]
            self.binder: SymbolBinder | None = SymbolBinder(self.metas)
        else:
            self.input_idx = [i for i, a in enumerate(example_inputs)
                              if isinstance(a, torch.Tensor)]
            self.binder = None
        self.tensor_idx = self.input_idx  # the name older code uses
        self._placeholder_names = [n.name for n in placeholders]
        self._variants: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self._decomps = dict(backend.get_decompositions())
        #: the graph turns grad mode on somewhere (see :meth:`_key`)
        self._enables_grad = any(n.op == "call_function" and
                                 n.target is torch._C._set_grad_enabled and bool(n.args[0])
                                 for n in gm.graph.nodes)
        self._warned_guard = False
        self._key_and_build(example_inputs)

    @property
    def dynamic(self) -> bool:
        return self.fake_mode is not None

    # -- variants ------------------------------------------------------------------------
    def _key(self, inputs: Sequence[Any]) -> Any:
        # requires_grad only: never sizes (one variant serves every size under dynamic shapes)
        if torch.is_grad_enabled():
            rg = tuple(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
            if any(rg):
                return rg
        elif self._enables_grad and any(isinstance(t, torch.Tensor) and t.requires_grad
                                        for t in inputs):
            # Called with grad mode off, the graph turns it on (the rest of a ``no_grad`` block
            # split by a graph break): what it computes from then on is differentiable, which
            # neither variant models (inference runs without autograd; a training variant's
            # autograd.Function records nothing under no_grad). The captured graph runs as is.
            return _GRAD_ON_INSIDE
        return "inference"

    def _key_and_build(self, args: Sequence[Any], first: bool = True) -> Any:
        inputs = [args[i] for i in self.input_idx]
        key = self._key(inputs)
        v = self._variants.get(key)
        if v is None and key == _GRAD_ON_INSIDE:
            v = self._variants[key] = _RunEagerly(self.gm)
        if v is None:
            with self._lock:
                v = self._variants.get(key)
                if v is None:
                    try:
                        v = self._build(key, args, inputs)
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
        return v, inputs

    def __call__(self, *args: Any) -> Any:
        v, inputs = self._key_and_build(args, first=False)
        if isinstance(v, _RunEagerly):
            return v.gm(*args)
        guards = v.size_guards
        if guards is not None and not guards(inputs):
            self._guard_failed(v, inputs)
            return self.gm(*args)
        return v(inputs)

    def _guard_failed(self, v: Any, inputs: Sequence[Any]) -> None:
        if not self._warned_guard:
            self._warned_guard = True
            vals = dict(zip(map(str, v.size_guards.binder.symbols),
                            v.size_guards.binder.values(inputs)))
            log.warning("ember: a size guard added while AOT autograd traced this graph fails "
                        "for sizes %s (guards: %s); running the captured graph eagerly for "
                        "such calls", vals,
                        ", ".join(f"{g} ({src})" for g, src in zip(v.size_guards.guards,
                                                                  v.size_guards.sources)))

    # -- building ------------------------------------------------------------------------
    def _graph_fn(self, args: Sequence[Any]) -> torch.fx.GraphModule | Callable[..., Any]:
        if len(self.input_idx) == len(args):
            return self.gm
        consts = list(args)
        input_idx = self.input_idx

        def only_inputs(*ts: Any) -> Any:  # other inputs are baked in as constants
            full = list(consts)
            for i, t in zip(input_idx, ts):
                full[i] = t
            return self.gm(*full)

        return only_inputs  # type: ignore[return-value]

    def _context(self, kind: str, inputs: list[Any]) -> Any:
        if self.context is None:
            return None
        gid = f"{self.context.graph_id}.{kind}"
        n = sum(1 for k in self._variants if k != "inference") if kind != "inference" else 0
        if n:  # a second training variant (another requires_grad pattern)
            gid += f"{n}"
        return self.context.derive(graph_id=gid, kind=kind, inputs=tuple(inputs))

    def _primal_infos(self) -> list[Any]:
        """The torch-level InputInfos of the ATen graphs' primals (tensor and size inputs)."""
        if self.context is None:
            return []
        return [self.context.inputs[i] for i in self.input_idx]

    def _primal_names(self) -> list[str]:
        return readable_names(self._primal_infos(),
                              [self._placeholder_names[i] for i in self.input_idx])

    def _compile(self, gm: torch.fx.GraphModule, example: list[Any],
                 context: Any = None) -> Callable[..., Any]:
        from ..backends import _run_passes, call_backend  # late: backends imports aot lazily

        gm = _run_passes(gm, "aten")
        graphs = _cuda_graphs(self.options, example)
        fn = call_backend(self.backend, gm, example,
                          _no_kept_buffers(self.options, self.backend) if graphs else self.options,
                          context)
        if not callable(fn):
            raise TypeError(f"backend {self.backend.name!r} returned {type(fn).__name__} for an "
                            "ATen graph, expected a callable")
        if self.options.get("mode") in ("reduce-overhead", "max-autotune"):  # as torch.compile
            fn = _reduce_overhead(fn, gm, example, context, self.backend.name)
        return fn

    def _build(self, key: Any, args: Sequence[Any], inputs: list[Any]) -> Any:
        """Trace, partition and compile one variant.

        Data-dependent results (``nonzero``, ``x[mask]``, ``masked_select``, ``.item()``, the
        backward of ``x[mask] = v``) get unbacked symbols: sizes that flow through the graphs and
        are read from the tensors at run time, as torch.compile does. Dynamic shapes: capture's
        ShapeEnv allows them while AOT traces. Static shapes: the graph is traced as before
        (no ShapeEnv at all) and, only when that meets a data-dependent op, traced again over
        static inputs in a mode whose ShapeEnv makes unbacked symbols. A branch on such a value
        (a guard on an unbacked symbol) still refuses the graph, with the op as the reason."""
        try:
            if self.dynamic:
                watch = ShapeEnvWatch(self.fake_mode.shape_env)
                with allow_unbacked(self.fake_mode.shape_env):
                    runtime = self._build_variant(key, args, inputs, watch, self.fake_mode)
            else:
                try:
                    runtime = self._build_variant(key, args, inputs, None, None)
                except Exception as e:
                    op = _data_dependent(e)
                    if op is None:
                        raise
                    log.debug("AOT autograd: data-dependent op in graph %s (%s); tracing again "
                              "with unbacked symbols", getattr(self.context, "graph_id", "?"), op)
                    mode = unbacked_mode()
                    watch = ShapeEnvWatch(mode.shape_env)
                    runtime = self._build_variant(key, args, inputs, watch, mode)
        except Exception as e:
            from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

            op = _data_dependent(e)
            if op is None:
                raise
            where = "forward" if key == "inference" else "joint forward/backward"
            how = ("the graph needs its concrete value (a branch on it, or an int made of it: a "
                   "guard on an unbacked symbol), which a compiled graph cannot have"
                   if isinstance(e, GuardOnDataDependentSymNode)
                   else "no symbolic size can express it")
            raise RuntimeError(
                f"data-dependent shape or value in the {where} graph ({op}: its result depends "
                f"on tensor values); {how}") from e
        return runtime

    def _build_variant(self, key: Any, args: Sequence[Any], inputs: list[Any],
                       watch: ShapeEnvWatch | None, mode: Any) -> Any:
        """``mode``: capture's FakeTensorMode (dynamic shapes), a static mode whose ShapeEnv
        makes unbacked symbols (:func:`unbacked_mode`), or None (static, no ShapeEnv)."""
        from . import cache  # on-disk AOT results: a warm start traces nothing
        ck, hit = cache.lookup(self, key, args, inputs)
        if hit is not None:
            return hit
        if mode is not None and not self.dynamic:
            ck = None  # unbacked symbols: sizes the cache's format cannot express
        t0 = time.perf_counter()
        fn = self._graph_fn(args)
        training = key != "inference"
        rg = list(key) if training else [False] * len(inputs)
        metas = self.metas
        # Every stage runs the graph, and with it its grad-mode/autocast switches: each starts
        # from the caller's state (a stage must not see the state an earlier one left).
        from ..backends import _global_state, _set_global_state
        state = _global_state()
        with discard_unbacked(mode):
            info: GraphInfo = analyze(fn, inputs, rg, need_grad_info=training, mode=mode,
                                      metas=metas)
        _set_global_state(state)
        if training and any(rg[i] for i in info.meta_mutated):
            raise NotImplementedError(
                "an in-place view op (t_, transpose_, squeeze_, as_strided_, ...) changes the "
                "metadata of an input that requires grad; AOT autograd does not support it")
        if self.dynamic:
            if info.meta_mutated:
                raise NotImplementedError(
                    "dynamic shapes: an in-place view op (t_, transpose_, as_strided_, ...) "
                    "changes an input's sizes or strides; AOT autograd does not support it")
            info.geometry = _alias_geometry(info, self.binder)
        elif mode is not None:
            _static_alias_geometry(info)
        out_rg = info.graph_out_requires_grad + info.mutated_requires_grad
        if training and not any(out_rg):
            training = False  # nothing to differentiate: no joint trace needed
        detached = [t.detach() if isinstance(t, torch.Tensor) else t for t in inputs]
        names = self._primal_names()
        if not training:
            fw_gm = trace_forward(fn, inputs, info, self._decomps, mode, metas)
            _set_global_state(state)
            fw_gm = rename_placeholders(fw_gm, names)
            cache.store(ck, info, fw_gm)
            guards = self._size_guards(watch)
            self._log("inference forward", fw_gm)
            t1 = time.perf_counter()
            events.emit("timing", stage="aot", seconds=t1 - t0, graph="inference")
            runtime = ForwardOnly(info, self._compile(
                fw_gm, detached, self._context("inference", self._primal_infos())))
            runtime.graph = fw_gm
            runtime.backend = str(self.backend.name)
            runtime.size_guards = guards
            return runtime

        joint, n_tangents = trace_joint(fn, inputs, rg, info, self._decomps, mode, metas,
                                        watch.ignored if watch is not None else None)
        _set_global_state(state)
        joint = rename_placeholders(
            joint, names + [f"tangents_{j + 1}" for j in range(n_tangents)])
        guards = self._size_guards(watch)
        n_fwd = len(info.graph_out_flat) + len(info.mutated)
        part = partition_joint(joint, len(inputs), n_fwd, set(info.mutated),
                               recompute=self.backend.recompute)
        cache.store(ck, info, part.fw, part)
        if enabled("aot"):
            log.info("AOT joint graph:\n%s", _readable(joint))
            log.info("AOT saved for backward (%d tensors, %d bytes; %d sizes): %s",
                     part.n_saved, part.saved_bytes, part.n_saved_sym,
                     ", ".join(part.saved_names))
        self._log("forward", part.fw)
        self._log("backward", part.bw)
        tangent_meta = []
        n_saved_all = part.n_saved + part.n_saved_sym
        for n in list(part.bw.graph.nodes)[n_saved_all:]:
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
                           backend=str(self.backend.name), n_saved_sym=part.n_saved_sym,
                           dynamic=self.dynamic or any(has_unbacked(m[0]) or has_unbacked(m[1])
                                                       for m in tangent_meta))
        runtime.partition = part  # for inspection (tests, debugging)
        runtime.size_guards = guards
        return runtime

    def _size_guards(self, watch: ShapeEnvWatch | None) -> Any:
        """After tracing: no new symbols but unbacked ones (data-dependent sizes), and a check of
        the guards tracing added (see :class:`ember.aot.symbolic.GuardCheck`)."""
        if watch is None:
            return None
        watch.check_no_new_symbols(allow_unbacked=True)
        new = watch.new_guards()
        if not self.dynamic:
            if new:  # static shapes: there is nothing a guard could check at run time
                raise NotImplementedError(
                    "tracing with unbacked symbols added guards "
                    f"{', '.join(str(g.expr) for g in new)}; AOT autograd cannot check them")
            return None
        if new:
            log.debug("AOT autograd's tracing added size guards: %s",
                      ", ".join(str(g.expr) for g in new))
        fixed = [g for g in new if _specializes(g.expr)]
        if fixed:
            # not silent: the graphs are valid for these values only (capture's guards or the
            # runtime's check send other sizes elsewhere), which defeats dynamic shapes
            log.warning("ember: tracing graph %s at the ATen level specialized sizes to "
                        "constants: %s; the compiled graphs serve those sizes only",
                        getattr(self.context, "graph_id", "?"),
                        "; ".join(f"{g.expr} ({g.sloc})" for g in fixed))
        return guard_check(self.binder, new)

    def _backward_infos(self, joint: torch.fx.GraphModule, part: Any,
                        primals: list[Any]) -> list[Any]:
        """Saved values (a primal saved as is keeps its InputInfo; others are activations, or
        sizes), then tangents."""
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
            elif len(out) < part.n_saved + part.n_saved_sym:
                out.append(by_name.get(n.name) or InputInfo("symint", "", False))
            else:
                out.append(InputInfo("tangent", "", False))
        return out

    def _log(self, what: str, gm: torch.fx.GraphModule) -> None:
        if enabled("aot"):
            log.info("AOT %s graph:\n%s", what, _readable(gm))


def _cuda_graphs(options: dict[str, Any], example: list[Any]) -> bool:
    """Will the compiled callable be recorded into CUDA graphs (see :func:`_reduce_overhead`)?"""
    return options.get("mode") in ("reduce-overhead", "max-autotune") and any(
        isinstance(t, torch.Tensor) and t.is_cuda for t in example)


def _no_kept_buffers(options: dict[str, Any], backend: Any) -> dict[str, Any]:
    """A backend whose callables keep internal buffers between calls declares the option
    ``buffer_pool``: recorded into CUDA graphs, a kept buffer that the callable later drops
    (another shape) would still be written by the earlier recording's replays, so it is off."""
    accepted = backend.accepted_options() if hasattr(backend, "accepted_options") else None
    if accepted and "buffer_pool" in accepted and "buffer_pool" not in options:
        return {**options, "buffer_pool": False}
    return options


def _reduce_overhead(fn: Callable[..., Any], gm: torch.fx.GraphModule, example: list[Any],
                     context: Any, backend: str) -> Callable[..., Any]:
    """``mode="reduce-overhead"`` (and ``"max-autotune"``, as in torch.compile): record the
    compiled callable of a graph on CUDA into CUDA graphs (ember-cudagraphs' ``wrap``); elsewhere
    the default mode, with an info log. A callable whose ``ember_cudagraphs_refuse`` attribute
    names a reason (a backend that knows its code cannot be recorded safely) runs without. A
    callable with per-call work that a replay would skip (a check of its inputs, folded
    constants refreshed when they changed) has an ``ember_cudagraphs_split(wrap)`` method: it
    records only its inner part, through ``wrap(fn, gm, example, context)``, keeps its own work
    outside the recording, and returns the callable to use."""
    if getattr(fn, "_ember_cudagraphs", False) or backend == "cudagraphs":
        return fn
    gid = getattr(context, "graph_id", "?")
    if not any(isinstance(t, torch.Tensor) and t.is_cuda for t in example):
        log.info("ember: mode=%r: graph %s is not on CUDA; compiled without CUDA graphs (they "
                 "need CUDA tensors)", getattr(context, "mode", None) or "reduce-overhead", gid)
        return fn
    refuse = getattr(fn, "ember_cudagraphs_refuse", None)
    if refuse:
        log.info("ember: mode=%r: graph %s compiled without CUDA graphs: %s",
                 getattr(context, "mode", None) or "reduce-overhead", gid, refuse)
        return fn
    try:
        import ember_cudagraphs
    except ImportError:
        log.info("ember: CUDA graphs need ember-cudagraphs, which is not installed (pip install "
                 "./plugins/cudagraphs); graph %s compiled without them", gid)
        return fn
    split = getattr(fn, "ember_cudagraphs_split", None)
    if split is not None:
        return split(lambda f, g, ex, ctx: ember_cudagraphs.wrap(f, g, ex, context=ctx))
    return ember_cudagraphs.wrap(fn, gm, example, context=context)


def _specializes(expr: Any) -> bool:
    """Is a guard ``Eq(<symbolic size>, <number>)`` (a size fixed to a constant)?"""
    import sympy

    return (isinstance(expr, sympy.Eq) and bool(expr.free_symbols)
            and any(a.is_number for a in expr.args))


def _static_alias_geometry(info: GraphInfo) -> None:
    """Static shapes with unbacked symbols: an output that is a view of an input or of another
    output is regenerated with its traced geometry, which must then be numbers."""
    for o in info.outputs:
        if o.kind in ("input_alias", "output_alias") and not o.same:
            if not all(isinstance(v, int) for v in (*o.size, *o.stride, o.offset)):
                raise NotImplementedError(
                    "an output that is a view has a data-dependent size or stride "
                    f"({list(o.size)}, {list(o.stride)}); AOT autograd cannot regenerate it")


def _alias_geometry(info: GraphInfo, binder: Any) -> Any:
    """``inputs -> {output position: (size, stride, offset)}`` for the outputs that alias an
    input or another output and are regenerated as views (None when there are none)."""
    slots: list[tuple[int, int, int]] = []  # (output position, rank, start in exprs)
    exprs: list[Any] = []
    for k, o in enumerate(info.outputs):
        if o.kind in ("input_alias", "output_alias") and not o.same:
            slots.append((k, len(o.size), len(exprs)))
            exprs.extend(o.size)
            exprs.extend(o.stride)
            exprs.append(o.offset)
            exprs.append(o.base_offset)
    if not slots:
        return None
    ev = SizeExprs(binder, exprs)

    def geometry(inputs: Sequence[Any]) -> dict[int, tuple[Any, ...]]:
        """{output position: (size, stride, offset, traced base offset)}"""
        vals = ev(inputs)
        return {k: (vals[s:s + r], vals[s + r:s + 2 * r], vals[s + 2 * r], vals[s + 2 * r + 1])
                for k, r, s in slots}

    return geometry


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
    from .masks import drop_constant_masks

    try:
        drop_constant_masks(gm)  # exact: attention masks that mask nothing (masks.py)
    except Exception as e:  # noqa: BLE001 - an optimization: the graph compiles without it
        log.debug("ember: attention masks of %s not examined: %s: %s",
                  getattr(context, "graph_id", "?"), type(e).__name__, e)
    return AOTCompiled(gm, example_inputs, backend, dict(options or {}), context)
