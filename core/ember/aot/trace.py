"""Trace a captured torch-level graph to functional ATen graphs over FakeTensors.

Two passes, both with ``make_fx``:

1. Record the program at the ATen level. For training, the traced function runs the forward with
   autograd on and calls ``torch.autograd.grad``, so the backward ops land in the same graph (the
   "joint" graph). Autograd runs above the tracer, so every forward and backward kernel is recorded.
2. Replay that ATen graph under ``torch.func.functionalize``: in-place ops and input mutations
   become out-of-place ops, so the result is a pure data-flow graph the partitioner and backends
   can reorder freely. The mutated inputs' new values are explicit outputs (functionalization's
   trailing ``copy_`` into the inputs is dropped: the runtime does that copy).

The backend's decomposition table applies in both passes (pass 1 so that decompositions which
mutate are functionalized; pass 2 for ops that functionalization itself introduces).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping, Sequence

import torch
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from .analysis import GraphInfo, fakeify
from .opaque import fallen_back, opaque_custom_backwards
from .symbolic import discard_unbacked

__all__ = ["base_decompositions", "trace_forward", "trace_joint"]

aten = torch.ops.aten


def base_decompositions() -> dict[Any, Callable[..., Any]]:
    """Decompositions Ember always applies: legacy batch-norm kernels whose schema hides the
    running-statistics mutation are rewritten to one ``_native_batch_norm_legit`` call, whose
    schema shows it, so functionalization turns it into an explicit new value (evaluation:
    ``_native_batch_norm_legit_no_training``, nothing mutated). Not torch's decomposition into
    elementwise ops (about eight kernels per batch norm in evaluation, a dozen in training, which
    backends without code generation, aot_eager and cudagraphs, ran one by one: resnet50 under
    CUDA graphs 2.70 ms against torch's 2.22 ms on an H100). A code-generating backend
    decomposes these ops in its own table (inductor does)."""
    from torch._decomp import decomposition_table

    table: dict[Any, Callable[..., Any]] = {}
    for name, reserve in (("native_batch_norm", False), ("cudnn_batch_norm", True),
                          ("miopen_batch_norm", False)):
        packet = getattr(aten, name, None)
        op = getattr(packet, "default", None)
        if op is not None and op in decomposition_table:
            table[op] = _legit_batch_norm(reserve)
    packet = getattr(aten, "_batch_norm_impl_index", None)
    if packet is not None and packet.default in decomposition_table:
        table[packet.default] = decomposition_table[packet.default]
    return table


def _legit_batch_norm(reserve: bool) -> Callable[..., Any]:
    """A legacy batch-norm kernel as one ``_native_batch_norm_legit*`` call: evaluation as
    ``_native_batch_norm_legit_no_training``, training as ``_native_batch_norm_legit`` (its
    schema shows the running statistics' update, which functionalization makes a new value), with
    cuDNN's outputs where the kernel is cuDNN's (an empty reserve; empty statistics in evaluation,
    as torch's own decomposition of it)."""

    def batch_norm(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                   training: bool, momentum: float, eps: float) -> Any:
        if running_mean is None or running_var is None:
            if not training:
                raise RuntimeError("batch norm in evaluation needs running statistics")
            out = aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)
        elif training:
            out = aten._native_batch_norm_legit.default(input, weight, bias, running_mean,
                                                        running_var, True, momentum, eps)
        else:
            out = aten._native_batch_norm_legit_no_training.default(
                input, weight, bias, running_mean, running_var, momentum, eps)
            if reserve:
                out = (out[0], weight.new_zeros((0,)), weight.new_zeros((0,)))
        if reserve:
            return (*out, input.new_zeros((0,), dtype=torch.uint8))
        return out

    return batch_norm


class _RnnWithoutMkldnn(torch.overrides.TorchFunctionMode):
    """Training traces record RNNs (``torch._VF.lstm``/``gru``/``rnn_*``) in their matmul and
    pointwise form, not as oneDNN's ``mkldnn_rnn_layer``: that kernel makes the workspace its
    backward needs only when grad mode is on, and a compiled forward runs under no_grad, so the
    saved workspace would be None (nn.LSTM training failed in its backward)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func not in _RNN_FUNCS:
            return func(*args, **kwargs)
        was = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        try:
            return func(*args, **kwargs)
        finally:
            torch._C._set_mkldnn_enabled(was)


_RNN_FUNCS = frozenset(getattr(torch._VF, n) for n in ("lstm", "gru", "rnn_tanh", "rnn_relu"))


def _user_tensors(gm: torch.fx.GraphModule, xs: Sequence[torch.Tensor]) -> list[Any]:
    if has_recompute(gm):
        # activation checkpointing: run node by node with each node's meta current, so that
        # make_fx copies ``meta["custom"]`` (the recompute tag) onto the ATen nodes it records
        with torch.fx.traceback.preserve_node_meta():
            flat, _ = pytree.tree_flatten(torch.fx.Interpreter(gm).run(*xs))
        return flat
    flat, _ = pytree.tree_flatten(gm(*xs))
    return flat


def has_recompute(gm: Any) -> bool:
    """Does ``gm`` hold nodes of an activation-checkpointed region (capture's
    ``meta["custom"]["ember_recompute"]``)?"""
    graph = getattr(gm, "graph", None)
    return graph is not None and any("ember_recompute" in n.meta.get("custom", ())
                                     for n in graph.nodes)


def _functionalize(g1: torch.fx.GraphModule, fakes: Sequence[Any], mode: FakeTensorMode,
                   decomps: Mapping[Any, Any], symbolic: bool = False) -> torch.fx.GraphModule:
    def replay(*args: Any) -> Any:
        # g1 already holds the casts autocast made in pass 1: replaying it under an active
        # autocast would cast again (and ignore regions the program ran with autocast off).
        with torch._C._DisableAutocast():
            return torch.fx.Interpreter(g1).run(*args)

    fn = torch.func.functionalize(replay, remove="mutations")
    import contextlib
    keep_meta = torch.fx.traceback.preserve_node_meta() if has_recompute(g1) else \
        contextlib.nullcontext()
    with mode, keep_meta:
        g2 = _make_fx(fn, decomps, symbolic)(*fakes)
    _cleanup(g2)
    return g2


def _make_fx(fn: Callable[..., Any], decomps: Mapping[Any, Any],
             symbolic: bool) -> Callable[..., torch.fx.GraphModule]:
    """make_fx; ``symbolic``: the inputs are capture's symbolic fakes and SymInts, and make_fx
    takes their FakeTensorMode and ShapeEnv from them (it makes no symbols of its own: it only
    makes one for a plain int argument, and we pass none). Sizes then appear as
    ``aten.sym_size.int`` nodes and SymInt arithmetic as ``operator``/``torch.sym_*`` nodes."""
    if symbolic:
        return make_fx(fn, decomposition_table=dict(decomps), tracing_mode="symbolic")
    return make_fx(fn, decomposition_table=dict(decomps))


def _symbolic(mode: FakeTensorMode | None, metas: Sequence[Any] | None) -> bool:
    """Trace with make_fx's symbolic mode: dynamic shapes (``metas``), or a mode whose ShapeEnv
    makes unbacked symbols for data-dependent results (static inputs; see
    :func:`ember.aot.symbolic.unbacked_mode`)."""
    return metas is not None or (mode is not None and mode.shape_env is not None)


def _cleanup(gm: torch.fx.GraphModule) -> None:
    """Drop functionalization's trailing ``copy_`` into inputs (their new values are already
    outputs) and ``detach`` nodes (identity in a graph that runs without autograd), then DCE."""
    g = gm.graph
    placeholders = {n for n in g.nodes if n.op == "placeholder"}
    # in-place view ops on inputs (the metadata mutations of x.t_(); the runtime applies them)
    input_views = set(placeholders)
    for n in g.nodes:
        if (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                and torch.Tag.inplace_view in n.target.tags
                and n.args and n.args[0] in input_views):
            input_views.add(n)
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        if n.target is aten.copy_.default and n.args[0] in input_views and not n.users:
            g.erase_node(n)
        elif n.target in (aten.detach.default, aten.alias.default) and not _is_output(n):
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)
    for n in reversed(list(g.nodes)):
        if n in input_views and n not in placeholders and not n.users:
            g.erase_node(n)
    g.eliminate_dead_code()
    g.lint()
    gm.recompile()


def _is_output(n: torch.fx.Node) -> bool:
    return any(u.op == "output" for u in n.users)


def _detach(v: Any) -> Any:
    return v.detach() if isinstance(v, torch.Tensor) else v


def trace_forward(gm: Any, tensors: Sequence[Any], info: GraphInfo, decomps: Mapping[Any, Any],
                  mode: FakeTensorMode | None = None,
                  metas: Sequence[Any] | None = None) -> torch.fx.GraphModule:
    """Functional ATen forward graph: inputs = the graph inputs (tensors; SymInts too under
    dynamic shapes); outputs = the user outputs that are not aliases, then the new values of
    mutated inputs.

    Dynamic shapes: ``mode`` is capture's FakeTensorMode and ``metas`` the inputs' symbolic
    ``meta["val"]``s; the trace uses them (and their ShapeEnv) instead of fresh static fakes.
    Static shapes with ``mode`` a mode over a ShapeEnv: static fakes, data-dependent results get
    unbacked symbols."""
    symbolic = _symbolic(mode, metas)
    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = fakeify(mode, tensors, None, metas)
    table = {**base_decompositions(), **decomps}

    def fwd(*xs: Any) -> list[Any]:
        flat = _user_tensors(gm, xs)
        return [flat[k] for k in info.graph_out_flat] + [xs[i] for i in info.mutated]

    with mode, torch.no_grad():
        g1 = _make_fx(fwd, table, symbolic)(*fakes)
    with torch.no_grad():
        return _functionalize(g1, fakes, mode, table, symbolic)


def trace_joint(gm: Any, tensors: Sequence[Any], requires_grad: Sequence[bool], info: GraphInfo,
                decomps: Mapping[Any, Any], mode: FakeTensorMode | None = None,
                metas: Sequence[Any] | None = None,
                ignore_symbols: set[Any] | None = None) -> tuple[torch.fx.GraphModule, int]:
    """Functional ATen joint graph.

    Inputs: the graph inputs (primals), then one tangent per forward output that requires grad.
    Outputs: the forward outputs (user outputs that are not aliases, then mutated inputs' new
    values), then one gradient (or None) per input that requires grad.
    Returns the graph and the number of tangents. ``mode``/``metas``: as for
    :func:`trace_forward`. ``ignore_symbols`` gets the symbols made by backward traces that were
    abandoned for an opaque custom-op backward (see :mod:`ember.aot.opaque`).
    """
    symbolic = _symbolic(mode, metas)
    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = fakeify(mode, tensors, requires_grad, metas)
    out_rg = list(info.graph_out_requires_grad) + list(info.mutated_requires_grad)
    with mode:
        meta = info.fwd_out_meta
        if meta is None:
            with discard_unbacked(mode):
                meta = [(o.shape, o.dtype, o.device) if isinstance(o, torch.Tensor) else None
                        for o in _fake_outputs(gm, fakes, info)]
        # tangents are contiguous, with the outputs' (symbolic) sizes
        tangents = [torch.empty(m[0], dtype=m[1], device=m[2])
                    for m, rg in zip(meta, out_rg) if rg]
    n_primals = len(fakes)
    table = {**base_decompositions(), **decomps}
    rg_idx = [i for i, r in enumerate(requires_grad) if r]

    def joint(*args: Any) -> list[Any]:
        primals, tans = args[:n_primals], args[n_primals:]
        with torch.enable_grad():
            xs = list(primals)
            for i in info.mutated:
                if xs[i].requires_grad:  # autograd forbids in-place ops on leaves needing grad
                    xs[i] = xs[i].clone()
            flat = _user_tensors(gm, xs)
            fwd_outs = [flat[k] for k in info.graph_out_flat] + [xs[i] for i in info.mutated]
            diff_outs = [o for o, rg in zip(fwd_outs, out_rg) if rg]
            grads = torch.autograd.grad(diff_outs, [primals[i] for i in rg_idx], list(tans),
                                        allow_unused=True)
        return list(fwd_outs) + list(grads)

    all_fakes = list(fakes) + tangents
    # a custom op whose Python backward cannot be traced (data-dependent) runs it opaque
    with mode, opaque_custom_backwards(mode.shape_env) as ignored, _RnnWithoutMkldnn():
        g1 = _make_fx(joint, table, symbolic)(*all_fakes)
        if fallen_back():
            # the abandoned backward traces left ops nothing uses (reads of tensor values)
            g1.graph.eliminate_dead_code()
            g1.recompile()
    if ignore_symbols is not None:
        ignore_symbols |= ignored
    # Pass 2 replays the recorded ATen ops: no autograd needed, inputs need not require grad.
    plain = [_detach(t) for t in all_fakes]
    with torch.no_grad():
        g2 = _functionalize(g1, plain, mode, table, symbolic)
    return g2, len(tangents)


def _fake_outputs(gm: Any, fakes: Sequence[Any], info: GraphInfo) -> list[Any]:
    with torch.no_grad():
        xs = [_detach(f) for f in fakes]
        flat = _user_tensors(gm, xs)
        return [flat[k] for k in info.graph_out_flat] + [xs[i] for i in info.mutated]


def node_is_getitem(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and n.target is operator.getitem
