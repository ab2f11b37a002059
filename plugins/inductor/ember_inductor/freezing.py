"""Freezing: in an inference graph, what depends on parameters and buffers alone is computed once.

When the compile context says a graph is an ``"inference"`` graph and which of its inputs are
parameters or buffers (``InputInfo.kind``), three rewrites run on the ATen graph before lowering:

* **BatchNorm folded into the preceding convolution**: ``conv(x, W)`` followed by a per-channel
  affine chain on parameters (``(y - mean) * rsqrt(var + eps) * weight + bias``, as the BatchNorm
  decomposition writes it) becomes ``conv(x, W * s, b * s + t)``;
* **matmul weights**: ``addmm(b, x, W.t())`` may become a call on a weight pre-transposed into
  contiguous memory, pre-packed for MKL (``mkl._mkl_linear``) or oneDNN's linear, whichever was
  fastest on the example inputs on this machine (timed once, cached on disk: see
  :mod:`ember_inductor.autotune`; ``onednn_linear=False`` keeps eager's ``addmm``);
* **constant subexpressions**: every node computed from parameters, buffers and constants alone
  (the new ``W * s`` above, ``rsqrt(var + eps)``, casts, packed weights) is cut out of the graph
  into a small "constant graph" whose results become extra inputs of the compiled graph.

The constant graph runs on the first call and again whenever a frozen input changed: each call
compares every frozen input's version counter and data pointer (an optimizer step, ``copy_``,
``load_state_dict`` change them) and, unless ``freezing_check="version"`` is given, its content
with a snapshot taken when the constants were computed (``p.data.add_(...)`` changes neither the
version nor the pointer). A changed parameter is never answered with stale constants.

Options (``ember.compile(options=...)``): ``freezing`` (default True; False turns all of this
off), ``fold_conv_bn`` (``"auto"``, the default: not into a 1x1 convolution whose weight is
larger than its result, see :func:`_fold_pays`; ``"always"``), ``freezing_check``
(``"content"``, the default, or ``"version"``: trust version counters, skip the per-call
content comparison, so writes through ``.data`` are not seen).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections import Counter
from typing import Any, Callable, Sequence

import torch
import torch.fx

from .runtime.compare import same_contents

__all__ = ["FrozenGraph", "freeze", "FrozenCall", "freeze_and_compile", "counters"]

log = logging.getLogger("ember.inductor.freezing")

#: ``graphs``: graphs compiled frozen; ``conv_bn``: BatchNorms folded into convolutions;
#: ``folds``: runs of a constant graph (the first call, then one per detected change)
counters: Counter[str] = Counter()

aten = torch.ops.aten

#: ops that only reinterpret memory: a chain of them over a parameter costs nothing at run time,
#: so it is not worth a folded copy
_VIEW_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
             aten.permute.default, aten.t.default, aten.transpose.int, aten.unsqueeze.default,
             aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.expand.default,
             aten.as_strided.default, aten.slice.Tensor, aten.select.int, aten.alias.default,
             aten.detach.default}


def _is_pure(node: torch.fx.Node) -> bool:
    t = node.target
    if node.op != "call_function":
        return False
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    if t._schema.is_mutable:
        return False
    if torch.Tag.nondeterministic_seeded in t.tags:
        return False
    return True


# -- BatchNorm into convolution ---------------------------------------------------------------

_AFFINE = {aten.add.Tensor: "add", aten.sub.Tensor: "sub", aten.mul.Tensor: "mul",
           aten.div.Tensor: "div"}


def _channel_vector(v: Any, const: set[torch.fx.Node], channels: int) -> bool:
    """Is ``v`` a per-output-channel (or scalar) value computed from parameters alone?"""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return True
    if not isinstance(v, torch.fx.Node) or v not in const:
        return False
    val = v.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
        return False
    shape = list(val.shape)
    # broadcast against [N, C, *spatial]: [C, 1, ..., 1], [1, C, 1, ...], a scalar, or [1]
    while shape and shape[0] == 1 and len(shape) > 1:
        shape = shape[1:]
    return all(s == 1 for s in shape) or (shape[0] == channels and all(s == 1 for s in shape[1:]))


def _fold_pays(wval: torch.Tensor, yval: torch.Tensor) -> bool:
    """Is folding a BatchNorm into this convolution's weight worth watching the weight?

    Folding saves one pass over the convolution's result (the affine chain, read and written);
    the folded weight makes the weight a watched input, which the default content check reads
    twice per call (itself and its snapshot, runtime/compare.py) and copies once (the
    snapshot). A weight with a spatial kernel (3x3) is folded anyway: left as it is, ATen
    would copy it into the channels-last layout on every call of a channels-last convolution
    (as much traffic as the check), where the folded one is stored channels-last once. A 1x1
    weight (the same bytes in either layout) is folded only where the result has at least as
    many elements as the weight: then the check never reads more than folding saves.
    Otherwise the BatchNorm stays a per-channel affine (its per-channel factors are still
    folded: small), computed in the kernel that reads the result anyway. Measured on
    ResNet-50 (97.5 MiB of parameters), batch 1, 128x128, one thread: folding every weight
    watched 90 MiB and the content check took 20-50 ms per call (16% of the step) while
    folding gained nothing measurable over no freezing; leaving every weight whose result is
    smaller unfolded watched 2.7 MiB but looked slower at 224x224 (3x3 weights copied per
    call; the machine was too loaded to be sure), hence the kernel rule. At larger batches or
    images every weight is folded as before."""
    sizes = (*wval.shape, *yval.shape)
    if not all(isinstance(d, int) for d in sizes):
        return True  # symbolic sizes: as before
    if wval.dim() != 4 or wval.shape[2] * wval.shape[3] > 1:
        return True
    return yval.numel() >= wval.numel()


def fold_conv_bn(gm: torch.fx.GraphModule, const: set[torch.fx.Node],
                 mode: Any = "auto") -> int:
    """Rewrite ``conv(x, W, b)`` followed by an affine chain on per-channel parameter values into
    one convolution with folded weight and bias (computed from parameters, so the constant
    folder then computes them once). Returns how many convolutions were rewritten.
    ``mode="auto"`` folds where :func:`_fold_pays`; ``"always"`` wherever the pattern matches."""
    g = gm.graph
    done = 0
    for conv in list(g.nodes):
        if conv.op != "call_function" or conv.target is not aten.convolution.default:
            continue
        x, w, b, stride, padding, dilation, transposed, out_pad, groups = conv.args
        if transposed or w not in const or (b is not None and b not in const):
            continue
        wval = w.meta.get("val")
        yval = conv.meta.get("val")
        if not isinstance(wval, torch.Tensor) or not isinstance(yval, torch.Tensor):
            continue
        if yval.dim() < 3 or not wval.dtype.is_floating_point:
            continue
        if mode != "always" and not _fold_pays(wval, yval):
            continue
        channels = yval.shape[1]
        chain: list[tuple[str, Any]] = []
        cur = conv
        while len(cur.users) == 1:
            user = next(iter(cur.users))
            kind = _AFFINE.get(user.target)
            if kind is None or user.kwargs.get("alpha", 1) != 1:
                break
            a0, a1 = user.args[0], user.args[1]
            if a0 is cur and _channel_vector(a1, const, channels):
                other, left = a1, True
            elif a1 is cur and kind in ("add", "mul") and _channel_vector(a0, const, channels):
                other, left = a0, False
            else:
                break
            uval = user.meta.get("val")
            if not isinstance(uval, torch.Tensor) or uval.shape != yval.shape \
                    or uval.dtype != yval.dtype:
                break
            chain.append((kind, other))
            cur = user
        if not chain:
            continue
        # y * s + t, with s and t per channel: build them from the chain's operands (all
        # defined before the chain's last node)
        with g.inserting_before(cur):
            def call(op: Any, *args: Any) -> Any:
                return g.call_function(op, args)

            def num(v: Any) -> bool:
                return not isinstance(v, torch.fx.Node)

            def mul(a: Any, c: Any) -> Any:
                if num(a) and num(c):
                    return a * c
                if num(a) and a == 1:
                    return c
                if num(c) and c == 1:
                    return a
                return call(aten.mul.Tensor, c, a) if num(a) else call(aten.mul.Tensor, a, c)

            def div(a: Any, c: Any) -> Any:
                if num(a) and num(c):
                    return a / c
                if num(a):
                    return mul(call(aten.reciprocal.default, c), a)
                return call(aten.div.Tensor, a, c)

            def add(a: Any, c: Any) -> Any:
                if num(a) and num(c):
                    return a + c
                if num(a) and a == 0:
                    return c
                if num(c) and c == 0:
                    return a
                return call(aten.add.Tensor, c, a) if num(a) else call(aten.add.Tensor, a, c)

            def sub(a: Any, c: Any) -> Any:
                if num(a) and num(c):
                    return a - c
                if num(c):
                    return add(a, -c)
                return call(aten.rsub.Scalar, c, a) if num(a) else call(aten.sub.Tensor, a, c)

            def full(v: Any) -> Any:
                if num(v):
                    return g.call_function(aten.full.default, ([channels], float(v)),
                                           {"dtype": yval.dtype, "device": yval.device})
                return call(aten.clone.default, call(aten.expand.default, v, [channels]))

            s: Any = 1.0
            t: Any = 0.0 if b is None else b
            for kind, other in chain:
                o = call(aten.reshape.default, other, [-1]) if not num(other) else other
                if kind == "mul":
                    s, t = mul(s, o), mul(t, o)
                elif kind == "div":
                    s, t = div(s, o), div(t, o)
                elif kind == "add":
                    t = add(t, o)
                else:
                    t = sub(t, o)
            s, t = full(s), full(t)
            new_w = call(aten.mul.Tensor, w, call(aten.reshape.default, s,
                                                  [channels] + [1] * (wval.dim() - 1)))
            new_conv = g.call_function(aten.convolution.default,
                                       (x, new_w, t, stride, padding, dilation, transposed,
                                        out_pad, groups))
        new_conv.meta["val"] = cur.meta.get("val")
        cur.replace_all_uses_with(new_conv)
        done += 1
    if done:
        g.eliminate_dead_code()
        _propagate_meta(gm)
        gm.recompile()
    return done


def _propagate_meta(gm: torch.fx.GraphModule) -> None:
    """Fill ``meta["val"]`` of nodes a rewrite added (computed on fake tensors from their
    inputs' values)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = None
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, FakeTensor):
            mode = v.fake_mode
            break
    if mode is None:
        # Graphs rebuilt from the AOT cache carry real (uninitialized) tensors, not FakeTensors:
        # compute on real zeros, so that a warm start never creates a FakeTensorMode (whose
        # first use loads a large part of torch, about 1.3 s).
        try:
            _propagate_on_meta(gm)
            return
        except Exception:
            mode = FakeTensorMode(allow_non_fake_inputs=True)
    for n in gm.graph.nodes:
        if n.op != "call_function" or "val" in n.meta:
            continue

        def val(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                v = a.meta.get("val")
                if isinstance(v, torch.Tensor) and not isinstance(v, FakeTensor):
                    v = mode.from_tensor(v)
                return v
            return a

        args = torch.fx.node.map_aggregate(n.args, val)
        kwargs = torch.fx.node.map_aggregate(n.kwargs, val)
        with mode:
            n.meta["val"] = n.target(*args, **kwargs)


def _propagate_on_meta(gm: torch.fx.GraphModule) -> None:
    """``_propagate_meta`` for graphs whose values are real tensors: each new node's value is an
    uninitialized tensor of the geometry the op gives on zero-filled inputs of the same geometry
    (the nodes a rewrite adds compute on parameters: small)."""
    todo: dict[torch.fx.Node, Any] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or "val" in n.meta:
            continue
        device = [None]

        def val(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                v = todo.get(a, a.meta.get("val"))
                if isinstance(v, torch.Tensor):
                    device[0] = device[0] or v.device
                    # real zeros, not the meta device: meta kernels of some ops are Python
                    # references that load torch's tracing stack; these are parameter-sized tensors
                    return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype,
                                               device=v.device).zero_()
                return v
            return a

        args = torch.fx.node.map_aggregate(n.args, val)
        kwargs = torch.fx.node.map_aggregate(n.kwargs, val)
        out = n.target(*args, **kwargs)
        dev = device[0] or torch.device("cpu")
        todo[n] = torch.utils._pytree.tree_map(
            lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=dev)
            if isinstance(t, torch.Tensor) else t, out)
    for n, v in todo.items():  # all or nothing: a failure above leaves the graph untouched
        n.meta["val"] = v


# -- constant subgraph -----------------------------------------------------------------------

def _const_nodes(gm: torch.fx.GraphModule, frozen: set[torch.fx.Node]) -> tuple[set[Any], set[Any]]:
    """(nodes computable from frozen inputs and constants alone, those among them that compute
    something, i.e. are not only views of an input)."""
    const: set[torch.fx.Node] = set(frozen)
    compute: set[torch.fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            const.add(n)
            continue
        if n.op != "call_function" or not _is_pure(n):
            continue
        inputs = n.all_input_nodes
        if all(i in const for i in inputs):
            const.add(n)
            if n.target not in _VIEW_OPS and n.target is not operator.getitem \
                    or any(i in compute for i in inputs):
                compute.add(n)
    return const, compute


@dataclasses.dataclass
class FrozenGraph:
    """The graph to compile (constants cut out as trailing inputs) and how to compute them."""
    gm: torch.fx.GraphModule            # original placeholders + one per folded value
    const_fn: Callable[..., Any]        # frozen inputs (in ``watch`` order) -> folded values
    watch: list[int]                    # positions of the frozen inputs the constants read
    example_consts: list[torch.Tensor]  # folded values for the example inputs
    folded: int                         # how many graph nodes were folded
    conv_bn: int                        # how many BatchNorms were folded into convolutions
    channels_last: tuple[int, ...] = ()  # folded values stored channels-last (conv weights)


def freeze(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], context: Any,
           options: dict[str, Any], rewrite: Callable[..., Any] | None = None
           ) -> FrozenGraph | None:
    """Cut the parameter-only computation out of an inference graph; None when nothing is
    frozen (not an inference graph, no parameters, fake example inputs, freezing off)."""
    if context is None or getattr(context, "kind", None) != "inference":
        return None
    if not options.get("freezing", True):
        return None
    from torch._subclasses.fake_tensor import FakeTensor

    if any(isinstance(e, FakeTensor) for e in example_inputs):
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(context.inputs) or len(placeholders) != len(example_inputs):
        return None
    frozen = {n for n, info, ex in zip(placeholders, context.inputs, example_inputs)
              if info.kind in ("parameter", "buffer") and info.stable_address
              and isinstance(ex, torch.Tensor)
              and not ex.requires_grad and not isinstance(n.meta.get("val"), torch.SymInt)}
    if not frozen:
        return None
    names = {n.name for n in frozen}
    gm = _copy(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    frozen = {n for n in placeholders if n.name in names}
    const, _ = _const_nodes(gm, frozen)
    conv_bn = fold_conv_bn(gm, const, options.get("fold_conv_bn", "auto"))
    if rewrite is not None:
        const, _ = _const_nodes(gm, frozen)
        rewrite(gm, const, frozen, example_inputs)
    const, compute = _const_nodes(gm, frozen)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    boundary = [n for n in gm.graph.nodes
                if n in compute and n.op == "call_function"
                and isinstance(n.meta.get("val"), torch.Tensor)
                and any(u not in const for u in n.users) and output not in n.users]
    if not boundary:
        return None
    # the constant graph: the boundary nodes' ancestors, over the frozen inputs they read
    cg = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    needed: set[torch.fx.Node] = set()
    stack = list(boundary)
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        stack.extend(n.all_input_nodes)
    watch = [i for i, n in enumerate(placeholders) if n in needed]
    for i in watch:
        env[placeholders[i]] = cg.placeholder(placeholders[i].name)
    for n in gm.graph.nodes:
        if n in needed and n.op != "placeholder":
            env[n] = cg.node_copy(n, lambda a: env[a])
    cg.output([env[n] for n in boundary])
    const_gm = torch.fx.GraphModule(gm, cg)
    ex = [example_inputs[i] for i in watch]
    with torch.no_grad():
        example_consts = list(const_gm(*ex))
    # the graph to compile: one new trailing placeholder per boundary node
    last = placeholders[-1]
    channels_last: list[int] = []
    for k, n in enumerate(boundary):
        with gm.graph.inserting_after(last):
            p = gm.graph.placeholder(f"frozen{k}")
        p.meta["val"] = n.meta["val"]
        last = p
        n.replace_all_uses_with(p)
        if _channels_last_weight(p, options):
            # ATen copies a contiguous weight to channels-last on every call of a channels-last
            # convolution (``weight.contiguous(channels_last)``): folded once that way instead
            channels_last.append(k)
            example_consts[k] = example_consts[k].contiguous(memory_format=torch.channels_last)
            v = p.meta["val"]
            # the strides ATen gives (a 1x1 weight keeps its contiguous ones: the same layout)
            p.meta["val"] = v.new_empty_strided(v.shape, example_consts[k].stride())
    gm.graph.eliminate_dead_code()
    gm.recompile()
    log.debug("froze %d values (%d BatchNorms into convolutions) from %d inputs",
              len(boundary), conv_bn, len(watch))
    return FrozenGraph(gm, const_gm, watch, example_consts, len(needed - set(placeholders)),
                       conv_bn, tuple(channels_last))


def _channels_last_weight(p: torch.fx.Node, options: dict[str, Any]) -> bool:
    """Is the frozen value ``p`` read only as the weight of 2-d convolutions that the layout
    plan runs channels-last (their inputs are made channels-last, so a channels-last weight
    changes no result's layout)?"""
    from .layout import _conv2d, rules

    v = p.meta.get("val")
    r = rules(v)
    if (not options.get("layout_opt", True) or not isinstance(v, torch.Tensor) or v.dim() != 4
            or r is None or v.dtype not in r.dtypes or not p.users
            or not v.is_contiguous() or not all(isinstance(s, int) for s in v.shape)):
        return False
    return all(u.op == "call_function" and u.target is aten.convolution.default
               and u.args[1] is p and p not in u.args[:1] + u.args[2:] and _conv2d(u)
               for u in p.users)


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    import copy

    g = copy.deepcopy(gm.graph)  # node metas (fake tensors) are shared, not copied
    return torch.fx.GraphModule(gm, g)


class FrozenCall:
    """Calls the compiled graph with the folded constants appended; refolds when a frozen
    input changed (version counter, data pointer, and, with ``check="content"``, its values).

    The content check is what makes a write through ``.data`` (or through a NumPy view, or any
    write outside torch's in-place ops) visible: such a write bumps neither the parameter's
    version counter nor its pointer (``p.data`` is a new tensor with a version counter of its
    own; a storage has none), so no cheap signal exists. Its cost grows with the watched
    bytes: a snapshot as large as the watched inputs, and a ``memcmp`` over both per call
    (ResNet-50, 90 MiB watched: 18-23 ms per call on one core, 10-15% of a batch-1 128x128
    step). :attr:`watched_bytes` says how much is watched; the first check logs its measured
    cost once (``ember.inductor.freezing``, INFO) with the way out:
    ``freezing_check="version"`` or ``freezing=False``."""

    def __init__(self, compiled: Callable[..., Any], frozen: FrozenGraph, check: str = "content"):
        self.compiled = compiled
        self.const_fn = frozen.const_fn
        self.watch = frozen.watch
        # constants kept channels-last (convolution weights; see freeze)
        self.channels_last = frozen.channels_last
        self.check = check
        self.consts: list[torch.Tensor] | None = None
        self.key: list[tuple[int, int]] = []
        self.snapshot: list[torch.Tensor] = []
        self.refolds = 0
        #: bytes of the frozen inputs the constants are computed from (known after the first call)
        self.watched_bytes = 0
        self._reported = False
        #: (the frozen graph, its example inputs, its context) until the first call: what a
        #: CUDA-graph recording of the compiled graph needs (:meth:`ember_cudagraphs_split`)
        self._graph: tuple[Any, list[Any], Any] | None = None

    def ember_cudagraphs_split(self, wrap: Callable[..., Any]) -> "FrozenCall":
        """Under CUDA graphs (``mode="reduce-overhead"``): record the compiled graph alone, the
        folded constants among its inputs, read in place like parameters. A replay runs no
        Python, so recording this whole callable would skip the check below on every replay
        and answer a changed parameter with stale constants; here the check and the refold
        stay outside, every call. A refold makes new constants at new addresses, which the
        recording sees (as a moved parameter) and records again."""
        if self._graph is None:
            return self
        from ember.context import InputInfo

        gm, example, context = self._graph
        self._graph = None
        # the constants: inputs at stable addresses (kept here between refolds)
        infos = tuple(context.inputs) + tuple(
            InputInfo(kind="buffer", source="", stable_address=True)
            for _ in range(len(example) - len(context.inputs)))
        self.compiled = wrap(self.compiled, gm, example, context.derive(inputs=infos))
        return self

    def _same_contents(self, ws: list[torch.Tensor]) -> bool:
        for t, s in zip(ws, self.snapshot):
            if not same_contents(t, s):  # byte-wise, one thread (runtime/compare.py)
                return False
        return True

    def _changed(self, ws: list[torch.Tensor]) -> bool:
        if self.consts is None:
            return True
        key = [(t._version, t.data_ptr()) for t in ws]
        if key != self.key:
            return True
        if self.check == "content":
            if not self._reported:
                return self._first_check(ws)
            return not self._same_contents(ws)
        return False

    def _first_check(self, ws: list[torch.Tensor]) -> bool:
        """The content check, timed once and reported: its cost is the price of seeing writes
        that bypass version counters, and the user may prefer not to pay it."""
        import time

        t0 = time.perf_counter()
        same = self._same_contents(ws)
        ms = (time.perf_counter() - t0) * 1e3
        self._reported = True
        mib = self.watched_bytes / 2 ** 20
        log.info("frozen constants are computed from %d parameters/buffers (%d bytes, %.1f MiB): "
                "each call compares them with a snapshot (%.1f MiB more memory; %.2f ms on "
                "this call) so that writes through .data are seen; pass "
                "options={'freezing_check': 'version'} if the model's parameters only change "
                "through torch's own in-place ops, copy_ or load_state_dict (or "
                "{'freezing': False})", len(ws), self.watched_bytes, mib, mib, ms)
        return not same

    def __call__(self, *args: Any) -> Any:
        if self._graph is not None:  # compiled and called: the examples are not needed
            self._graph = None
        ws = [args[i] for i in self.watch]
        if self._changed(ws):
            with torch.no_grad():
                self.consts = list(self.const_fn(*ws))
                for k in self.channels_last:
                    self.consts[k] = self.consts[k].contiguous(memory_format=torch.channels_last)
            self.key = [(t._version, t.data_ptr()) for t in ws]
            self.watched_bytes = sum(t.numel() * t.element_size() for t in ws)
            if self.check == "content":
                self.snapshot = [t.detach().clone() for t in ws]
            self.refolds += 1
            counters["folds"] += 1
        return self.compiled(*args, *self.consts)  # type: ignore[misc]


def freeze_and_compile(compile_fn: Callable[..., Any], gm: torch.fx.GraphModule,
                       example_inputs: Sequence[Any], context: Any,
                       options: dict[str, Any]) -> FrozenCall | None:
    """Freeze ``gm`` and compile what is left with ``compile_fn`` (inductor's compile, called
    with ``_frozen=True``); None when nothing was frozen, and the caller compiles ``gm`` as is.
    Each frozen linear layer's matmul variant is picked by timing (:mod:`.autotune`)."""
    from .autotune import tune_linears

    # each frozen linear layer's kernel, by timing (autotune.py) unless an option forces one
    lin = options.get("onednn_linear", "auto")
    forced = "addmm" if lin is False else "onednn" if lin in (True, "always") else None

    def rewrite(gm: Any, const: Any, frozen: Any, example: Any) -> int:
        return tune_linears(gm, const, frozen, example, forced=forced,
                            check=str(options.get("freezing_check", "content")))
    if context is not None and getattr(context, "kind", None) == "inference":
        from .layout import decide_layout, wants_channels_last

        if options.get("layout_opt", "auto") == "auto" and wants_channels_last(gm):
            # decided once, here, so that the frozen weights and the plan agree (layout.py)
            try:
                options = {**options, "layout_opt": decide_layout(gm, options)}
            except Exception as e:
                log.warning("layout choice failed, channels-last kept: %s: %s",
                            type(e).__name__, e)
                options = {**options, "layout_opt": True}
    try:
        frozen = freeze(gm, example_inputs, context, options, rewrite)
    except Exception as e:  # freezing is an optimization: compile the graph as it is
        log.warning("freezing skipped: %s: %s", type(e).__name__, e)
        return None
    if frozen is None:
        return None
    from ember.context import InputInfo

    infos = tuple(context.inputs) + tuple(
        InputInfo(kind="buffer", source="", stable_address=False) for _ in frozen.example_consts)
    ctx = context.derive(inputs=infos)
    try:
        compiled = compile_fn(frozen.gm, list(example_inputs) + frozen.example_consts,
                              context=ctx, **{**options, "_frozen": True})
    except Exception as e:
        log.warning("freezing skipped, the frozen graph failed to compile: %s: %s",
                    type(e).__name__, e)
        return None
    counters["graphs"] += 1
    counters["conv_bn"] += frozen.conv_bn
    call = FrozenCall(compiled, frozen, str(options.get("freezing_check", "content")))
    # for core, if it records this graph into CUDA graphs (ember_cudagraphs_split); released by
    # the split or by the first call, which follows the compile at once
    call._graph = (frozen.gm, list(example_inputs) + list(frozen.example_consts), context)
    return call
