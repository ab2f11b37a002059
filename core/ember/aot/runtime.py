"""Run compiled forward/backward graphs with eager semantics.

The compiled graphs are functional. Around them the runtime

* wraps training graphs in an ``autograd.Function`` (forward graph in ``forward``, backward graph
  in ``backward``; the values the partitioner chose are kept with ``save_for_backward``),
* copies the new values of mutated inputs back into the inputs (``copy_``, tracked by autograd
  when the new value requires grad, as an in-place op in eager would be),
* regenerates outputs that alias an input or another output as views (``as_strided``) so that
  the user sees the same aliasing as in eager,
* puts non-tensor constants back and rebuilds the output structure.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

from ..exc import BackendCompilerFailed, EmberError
from .._views import input_alias, output_alias, view_of  # noqa: F401  (view_of: re-exported)
from .analysis import GraphInfo

__all__ = ["ForwardOnly", "Training", "DoubleBackwardError"]

log = logging.getLogger("ember.aot")


class DoubleBackwardError(EmberError):
    """Raised when a graph compiled by Ember's AOT autograd is differentiated twice."""


def _regenerate(info: GraphInfo, inputs: Sequence[Any], graph_outs: Sequence[Any]) -> Any:
    # an output that aliases another may come before it: the graph's own outputs first
    flat: list[Any] = [graph_outs[o.index] if o.kind == "graph" else None for o in info.outputs]
    # dynamic shapes: the aliases' geometry evaluated for this call's sizes
    geo = info.geometry(inputs) if info.geometry is not None else None
    for k, o in enumerate(info.outputs):
        if o.kind == "graph":
            continue
        elif o.kind == "input_alias":
            base = inputs[o.index]
            if o.same:
                flat[k] = base
                continue
            if o.detached:
                base = base.detach()
            size, stride, offset, base_offset = (geo[k] if geo is not None else
                                                 (o.size, o.stride, o.offset, o.base_offset))
            flat[k] = input_alias(base, size, stride, offset, base_offset, o.dtype)
        elif o.kind == "output_alias":
            base = flat[o.index]
            if o.same:
                flat[k] = base
            else:
                if o.detached:
                    base = base.detach()
                size, stride, offset, _ = geo[k] if geo is not None else (o.size, o.stride,
                                                                            o.offset, 0)
                flat[k] = output_alias(base, size, stride, offset, o.dtype)
        else:
            flat[k] = o.value
    return pytree.tree_unflatten(flat, info.out_spec)


def check_outputs(outs: Any, n: int, backend: str, graph: str, none_ok: bool = False,
                  ints: frozenset[int] = frozenset(), nones: range | frozenset[int] = frozenset()
                  ) -> None:
    """A compiled ATen graph must return a tuple/list of ``n`` tensors (checked on its first call):
    anything else would be indexed into a wrong answer or a bare IndexError. Positions in ``ints``
    are sizes (dynamic shapes): an int (or float/bool) there. Positions in ``nones`` (or all, with
    ``none_ok``) may be None: values saved for the backward that an op left undefined (an optional
    result such as ``mkldnn_rnn_layer``'s workspace, a tensor when traced, None when run)."""
    if not isinstance(outs, (tuple, list)) or len(outs) != n:
        what = (f"{type(outs).__name__} of {len(outs)}" if isinstance(outs, (tuple, list))
                else type(outs).__name__)
        raise BackendCompilerFailed(
            f"backend {backend!r}: the callable it compiled for the {graph} graph returned {what}; "
            f"expected a tuple or list of {n} tensors (what the graph returns)")
    bad = [k for k, o in enumerate(outs)
           if not (isinstance(o, torch.Tensor) or (o is None and (none_ok or k in nones))
                   or (k in ints and isinstance(o, (int, float, bool, torch.SymInt))))]
    if bad:
        where = ", ".join(f"{k}: {type(outs[k]).__name__}" for k in bad[:8])
        raise BackendCompilerFailed(
            f"backend {backend!r}: the callable it compiled for the {graph} graph returned "
            f"{len(outs)} values, not all tensors (position {where}); expected a tuple or list "
            f"of {n} tensors (what the graph returns)")


def _fall_back(error: BackendCompilerFailed, graph: Any, what: str) -> Callable[..., Any]:
    """A compiled graph's first result failed :func:`check_outputs`: with
    ``ember.config.suppress_errors`` (the default) the ATen graph itself runs from now on
    (correct, not compiled), with the reason logged once; otherwise the error propagates."""
    from .. import config

    if graph is None or not config.suppress_errors:
        raise error
    log.warning("ember: %s; running the %s graph's ATen ops as they are instead (set "
                "ember.config.suppress_errors = False to raise)", error, what)
    return graph.forward


def _copy_back(info: GraphInfo, inputs: Sequence[torch.Tensor],
               new_values: Sequence[torch.Tensor]) -> None:
    for i, v in zip(info.mutated, new_values):
        inp = inputs[i]
        # A leaf that requires grad (a parameter) can only have been mutated under no_grad
        # (eager refuses otherwise, and so did the trace): its update is not differentiable.
        if v.requires_grad and torch.is_grad_enabled() and not (inp.is_leaf and
                                                                inp.requires_grad):
            inp.copy_(v)
        else:
            with torch.no_grad():
                inputs[i].copy_(v)


def _apply_metadata(info: GraphInfo, inputs: Sequence[torch.Tensor]) -> None:
    """Inputs whose size/strides the program changed in place (``x.t_()``) get them now."""
    for i, (size, stride, offset) in info.meta_mutated.items():
        with torch.no_grad():
            inputs[i].as_strided_(size, stride, offset)


def _no_autocast() -> Any:
    """The ATen graphs already hold the casts that autocast made while they were traced; running
    them under an active autocast would cast a second time (e.g. inside regions the model runs
    with autocast disabled, such as rotary embeddings)."""
    return torch._C._DisableAutocast()


@dataclasses.dataclass
class ForwardOnly:
    """Inference: one forward graph, no autograd bookkeeping."""

    info: GraphInfo
    fw: Callable[..., Any]
    graph: Any = None  # the functional ATen forward graph (for inspection)
    backend: str = "?"
    checked: bool = False
    # dynamic shapes: guards AOT's tracing added (checked by AOTCompiled before each call)
    size_guards: Any = None

    def _run(self, inputs: Sequence[torch.Tensor]) -> Any:
        # No output of an inference graph is differentiable (AOT found none that requires grad,
        # or grad mode is off): inputs that require grad must not give the graph's results a
        # history (a result computed under ``no_grad`` inside the graph, say). Grad mode is
        # switched off only where it is on (a no_grad context costs ~1 us per call).
        grad = torch.is_grad_enabled()
        if grad:
            torch._C._set_grad_enabled(False)
        try:
            with _no_autocast():
                return self.fw(*inputs)
        finally:
            if grad:
                torch._C._set_grad_enabled(True)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> Any:
        outs = self._run(inputs)
        n = len(self.info.graph_out_flat)
        if not self.checked:
            try:
                check_outputs(outs, n + len(self.info.mutated), self.backend, "inference",
                              ints=self.info.graph_out_sym)
            except BackendCompilerFailed as e:
                self.fw = _fall_back(e, self.graph, "inference")
                outs = self._run(inputs)
            self.checked = True
        if self.info.meta_mutated:  # first: the new values have the new shapes
            _apply_metadata(self.info, inputs)
        _copy_back(self.info, inputs, outs[n:n + len(self.info.mutated)])
        return _regenerate(self.info, inputs, outs[:n])


class Training:
    """Training: forward and backward graphs inside an ``autograd.Function``."""

    def __init__(self, info: GraphInfo, fw: Callable[..., Any], bw_compile: Callable[..., Any],
                 requires_grad: Sequence[bool], n_saved: int, tangent_meta: list[Any],
                 grad_deps: Sequence[frozenset[int]],
                 primal_reaches: Sequence[frozenset[int]] | None = None, backend: str = "?",
                 n_saved_sym: int = 0, dynamic: bool = False):
        self.info = info
        self.backend = backend
        self._fw_checked = self._bw_checked = False
        self.partition: Any = None  # the Partition (forward/backward graphs), for inspection
        self.size_guards: Any = None  # dynamic shapes: see ForwardOnly.size_guards
        n_user = len(info.graph_out_flat)
        self.n_fwd = n_user + len(info.mutated)
        out_rg = list(info.graph_out_requires_grad) + list(info.mutated_requires_grad)
        self.diff_outs = [k for k, rg in enumerate(out_rg) if rg]
        self.nondiff_outs = [k for k, rg in enumerate(out_rg)
                             if not rg and k not in info.graph_out_sym]
        n_saved_all = n_saved + n_saved_sym
        # forward outputs that are ints: sizes the user gets, sizes saved for the backward
        int_outs = frozenset(info.graph_out_sym) | frozenset(
            range(self.n_fwd + n_saved, self.n_fwd + n_saved_all))
        self.rg_idx = [i for i, r in enumerate(requires_grad) if r]
        n_inputs = len(requires_grad)
        runtime = self
        # A gradient that depends on no tangent (a zeros tensor) is given, as eager gives it, when
        # an output its input flows into has a gradient.
        tangent_of = {k: j for j, k in enumerate(self.diff_outs)}
        grad_deps = list(grad_deps)
        for pos, i in enumerate(self.rg_idx):
            if pos < len(grad_deps) and not grad_deps[pos] and primal_reaches is not None:
                grad_deps[pos] = frozenset(tangent_of[k] for k in primal_reaches[i]
                                           if k in tangent_of)
        # The backward graph is compiled once; bw_compile returns the callable.
        self._fw = fw
        self._bw: Callable[..., Any] | None = None
        self._bw_compile = bw_compile
        saved_pos = range(self.n_fwd, self.n_fwd + n_saved)

        class CompiledFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, *inputs: torch.Tensor) -> Any:
                with _no_autocast():
                    outs = runtime._fw(*inputs)
                if not runtime._fw_checked:
                    try:
                        check_outputs(outs, runtime.n_fwd + n_saved_all, runtime.backend,
                                      "forward", ints=int_outs, nones=saved_pos)
                    except BackendCompilerFailed as e:
                        # the compiled backward may expect the compiled forward's layouts:
                        # both run as ATen graphs from now on
                        part = runtime.partition
                        runtime._fw = _fall_back(e, getattr(part, "fw", None), "forward")
                        runtime._bw = part.bw.forward
                        with _no_autocast():
                            outs = runtime._fw(*inputs)
                    runtime._fw_checked = True
                fwd, saved = outs[:runtime.n_fwd], outs[runtime.n_fwd:runtime.n_fwd + n_saved]
                if any(isinstance(o, torch.Tensor) and o._is_view() for o in fwd):
                    # an output that is a view of one of the graph's intermediates (``return
                    # h.view(-1)``): autograd forbids writing in place into a view a Function
                    # returns, which eager allows on the same output. The same memory under a
                    # tensor that is no view (its own autograd history comes from this Function)
                    fwd = [o.detach() if isinstance(o, torch.Tensor) and o._is_view() else o
                           for o in fwd]
                ctx.save_for_backward(*saved)
                if n_saved_sym:
                    ctx.saved_sizes = tuple(outs[runtime.n_fwd + n_saved:
                                                 runtime.n_fwd + n_saved_all])
                if dynamic:  # the tangents' sizes, for gradients that do not come
                    ctx.out_shapes = [fwd[k].shape for k in runtime.diff_outs]
                ctx.set_materialize_grads(False)
                ctx.mark_non_differentiable(*[fwd[k] for k in runtime.nondiff_outs])
                return tuple(fwd)

            @staticmethod
            def backward(ctx: Any, *grads: torch.Tensor) -> Any:
                if torch.is_grad_enabled():
                    raise DoubleBackwardError(
                        "ember: double backward (create_graph=True, or a gradient of a gradient) "
                        "through a graph compiled by Ember's AOT autograd is not supported. "
                        "Compute higher-order gradients without ember.compile (or with a "
                        "level='torch' backend such as 'eager').")
                saved = ctx.saved_tensors
                tangents = []
                present = set()
                for j, (k, meta) in enumerate(zip(runtime.diff_outs, tangent_meta)):
                    g = grads[k]
                    if g is None:  # output unused in the loss
                        shape = ctx.out_shapes[j] if dynamic else meta[0]
                        g = torch.zeros(shape, dtype=meta[2], device=meta[3])
                    else:
                        present.add(j)
                        if g.layout != torch.strided:  # a sparse gradient (to_dense's backward)
                            g = g.to_dense()
                        # traced tangents are contiguous (symbolic strides: checked as such)
                        if g.dtype != meta[2] or (not g.is_contiguous() if dynamic
                                                  else g.stride() != meta[1]):
                            g = g.to(meta[2]).contiguous()
                    tangents.append(g)
                if not present:
                    return (None,) * n_inputs
                if runtime._bw is None:
                    runtime._bw = runtime._bw_compile()
                with _no_autocast():
                    gin = runtime._bw(*saved, *getattr(ctx, "saved_sizes", ()), *tangents)
                if not runtime._bw_checked:
                    try:
                        check_outputs(gin, len(runtime.rg_idx), runtime.backend, "backward",
                                      none_ok=True)
                    except BackendCompilerFailed as e:
                        part = runtime.partition
                        runtime._bw = _fall_back(e, getattr(part, "bw", None), "backward")
                        with _no_autocast():
                            gin = runtime._bw(*saved, *getattr(ctx, "saved_sizes", ()),
                                              *tangents)
                    runtime._bw_checked = True
                result: list[Any] = [None] * n_inputs
                for i, g, d in zip(runtime.rg_idx, gin, grad_deps):
                    # as in eager, no gradient for inputs reaching only outputs unused in the loss
                    result[i] = g if d & present else None
                return tuple(result)

        self.fn = CompiledFunction

    def __call__(self, inputs: Sequence[torch.Tensor]) -> Any:
        outs = self.fn.apply(*inputs)
        n = len(self.info.graph_out_flat)
        if self.info.meta_mutated:  # first: the new values have the new shapes
            _apply_metadata(self.info, inputs)
        _copy_back(self.info, inputs, outs[n:self.n_fwd])
        return _regenerate(self.info, inputs, outs[:n])
