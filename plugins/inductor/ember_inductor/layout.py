"""Layout optimisation for convolution graphs: channels-last activations.

oneDNN (mkldnn) runs 2-d convolutions on CPUs much faster on channels-last (NHWC) tensors than on
contiguous (NCHW) ones, forward and backward, and ATen's convolution returns a channels-last
result for a channels-last input. A graph with 2-d convolutions is therefore lowered with every
4-d floating-point value it stores in channels-last memory (:class:`LayoutPlan`):

* convolution inputs and weights are realized channels-last (a lazy pointwise value is stored
  that way at no cost; a stored value in another layout is copied once);
* the convolution's (and its backward's) results are declared channels-last, which is what ATen
  returns for channels-last inputs (checked by tests over strides, kernels, groups, dilations);
* pointwise values and reductions read any layout; values the graph stores (batch-norm + ReLU
  epilogues, residual adds) are stored channels-last too, so no copy sits between two
  convolutions;
* anything that must see eager's strides gets them: an ATen fallback or extern kernel other than
  convolution reads a copy in the layout the graph's metadata describes, and every graph output
  is stored with eager's strides, except the activations a training forward saves for its own
  backward (below).

Whether it pays is timed on this machine for inference graphs (:func:`channels_last_chosen`, cached
on disk with the machine in the key). Options: ``layout_opt`` (``"auto"``, the default; True
forces channels-last, False turns all of this off); ``layout_weights`` ("none", the default,
"backward", "all") also copies convolution weights channels-last for the backward or for both
directions (measured on convnet: no gain, the copies cost what oneDNN saves).

Training: the forward's saved activations go straight into the backward. Saving them
channels-last avoids a copy in each direction, but the backward must know. The AOT compiler
compiles the forward, then the backward of the same graph (their context graph ids differ in the
kind only); so the forward's code generation waits (:class:`DeferredForward`) until its backward
is compiled: the backward's context says how many of its leading inputs are saved values, the
forward is generated with those outputs channels-last, and the backward is generated with those
inputs in the forward's layout. A forward called before any backward of its graph was compiled
generates with eager's strides on every output.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from fractions import Fraction
from typing import Any, Callable, Sequence

import torch

__all__ = ["LayoutPlan", "plan_for", "channels_last_stride", "DeferredForward",
           "defer_forward", "take_forward", "CONV_OPS", "LAYOUT_OPS", "lower_with_layout"]

log = logging.getLogger("ember.inductor.layout")

aten = torch.ops.aten

CONV_OPS = (aten.convolution.default, aten.convolution_backward.default)

#: ``conv``: convolutions (forward or backward) lowered channels-last; ``var_mean``: one-pass
#: channel statistics; ``paired``: training forwards generated with their backward's knowledge;
#: ``saved_channels_last``: saved activations handed channels-last from forward to backward
counters: Counter[str] = Counter()


def rules(meta: Any) -> Any:
    """The device's :class:`~ember_inductor.codegen.target.ConvLayoutRules` for a tensor (None:
    its device has no plan): which dtypes go channels-last, which library paths exist."""
    from .codegen.target import conv_layout_rules

    dev = getattr(meta, "device", None)
    return conv_layout_rules(dev) if dev is not None else None


def channels_last_stride(size: Sequence[Any]) -> tuple[int, ...]:
    n, c, h, w = size
    return (c * h * w, 1, w * c, c)


def _same(size: Sequence[Any], a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Equal strides, ignoring size-1 dims (any stride is equivalent there)."""
    return len(a) == len(b) and all(s == 1 or x == y for s, x, y in zip(size, a, b))


def _static_4d(meta: Any, any_dtype: bool = False) -> bool:
    """A 4-d strided tensor with static sizes whose dtype the device's plan takes
    (``any_dtype``: any dtype, pooling indices too)."""
    if not (isinstance(meta, torch.Tensor) and meta.dim() == 4 and meta.layout == torch.strided
            and all(isinstance(s, int) for s in (*meta.shape, *meta.stride()))):
        return False
    if any_dtype:
        return True
    r = rules(meta)
    return r is not None and meta.dtype in r.dtypes


def _conv2d(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target not in CONV_OPS:
        return False
    if node.target is aten.convolution.default:
        x, transposed = node.args[0], node.args[6]
    else:
        x, transposed = node.args[1], node.args[7]
    return not transposed and isinstance(x, torch.fx.Node) and _static_4d(x.meta.get("val"))


def wants_channels_last(gm: torch.fx.GraphModule) -> bool:
    return any(_conv2d(n) for n in gm.graph.nodes)


class LayoutPlan:
    """The layout decisions of one graph.

    ``keep_outputs``: output positions that may stay channels-last (a training forward's saved
    activations); ``input_strides``: placeholder position -> the strides its tensor really has
    (a training backward's saved inputs, as the forward stored them). ``out_strides`` is filled
    while lowering: output position -> the strides the output was stored with."""

    def __init__(self, keep_outputs: Sequence[int] = (),
                 input_strides: dict[int, tuple[int, ...]] | None = None):
        self.keep_outputs = frozenset(keep_outputs)
        self.input_strides = dict(input_strides or {})
        self.out_strides: dict[int, tuple[int, ...]] = {}
        # fx ReLU node -> the convolution that computed it with the ReLU fused in
        self.fused: dict[Any, Any] = {}
        # convolution weights channels-last too: "none", "backward", "all"
        self.weights = "none"
        # forward convolutions through oneDNN's own entry: "auto" (timed), True, False
        self.onednn_conv: Any = "auto"

    def key(self) -> str:
        return repr((sorted(self.keep_outputs), sorted(self.input_strides.items())))

    # -- decisions ---------------------------------------------------------------------------
    @staticmethod
    def preferred_stride(meta: Any) -> tuple[int, ...] | None:
        """Channels-last strides for a 4-d float value the graph stores, else None."""
        if not _static_4d(meta):
            return None
        return channels_last_stride(meta.shape)

    @staticmethod
    def keepable(meta: Any) -> bool:
        """May a value with this metadata travel channels-last between a forward and its
        backward? (4-d static, any dtype: pooling indices too)"""
        return _static_4d(meta, any_dtype=True)

    @staticmethod
    def is_changed(value: Any, meta: Any) -> bool:
        """Is ``value`` (a stored IR value) in a layout other than the one its metadata (eager)
        describes, because this plan made it channels-last? (any dtype: pooling indices)"""
        from .ir import _LaidOut

        if not isinstance(value, _LaidOut) or not _static_4d(meta, any_dtype=True):
            return False
        lay = value.layout
        size = tuple(meta.shape)
        if tuple(lay.size) != size:
            return False
        return (_same(size, lay.stride, channels_last_stride(size))
                and not _same(size, lay.stride, meta.stride()))

    @staticmethod
    def exact_strides(value: Any, meta: Any) -> Any:
        """A stored 4-d ``value`` whose strides equal ``meta``'s but for size-1 dims, viewed with
        exactly ``meta``'s strides (an output must have eager's strides, size-1 dims too)."""
        from .ir import Layout, ReinterpretView, _LaidOut

        if not isinstance(value, _LaidOut) or not _static_4d(meta, any_dtype=True):
            return value
        lay, want = value.layout, tuple(meta.stride())
        if (tuple(lay.stride) == want or tuple(lay.size) != tuple(meta.shape)
                or not _same(lay.size, lay.stride, want)):
            return value
        return ReinterpretView(value.storage(), Layout(lay.size, want, lay.dtype, lay.device,
                                                       lay.offset))

    # -- lowering helpers --------------------------------------------------------------------
    @staticmethod
    def copy_to(g: Any, value: Any, stride: Sequence[Any]) -> Any:
        """``value`` stored with ``stride`` (a copy unless it already is)."""
        from .ir import Pointwise, _LaidOut

        size = list(value.get_size())
        if isinstance(value, _LaidOut):
            if _same(size, value.layout.stride, stride) and value.layout.offset == 0:
                return value
            # one copy per stored value and layout, however many consumers
            key = (value.storage().name, tuple(value.layout.stride), value.layout.offset,
                   tuple(stride))
            done = g._layout_copies.get(key)
            if done is None:
                src = Pointwise(value.device, value.dtype, size, value.make_loader(), 1,
                                origins=["layout_copy"])
                done = g._layout_copies[key] = g.realize(src, list(stride))
            return done
        return g.realize(value, list(stride))

    def to_channels_last(self, g: Any, value: Any) -> Any:
        return self.copy_to(g, value, channels_last_stride(value.get_size()))


def _random(shape: Sequence[int], dtype: torch.dtype, channels_last: bool,
            device: Any = "cpu") -> torch.Tensor:
    t = torch.randn(tuple(shape), dtype=dtype, device=device)
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t


def channels_last_chosen(gm: torch.fx.GraphModule) -> bool:
    """Are the 2-d convolutions of the inference graph ``gm`` faster on channels-last operands
    than on contiguous ones, on this machine?

    Timed once per machine and set of convolutions (:func:`ember_inductor.autotune.choose`,
    cached on disk): every distinct convolution of the graph (input and weight sizes, stride,
    padding, dilation, groups, dtype) run once with channels-last input and weight, as the plan
    would run it (frozen weights are stored channels-last, freezing.py), against once on
    contiguous ones. oneDNN is usually much faster channels-last, but not on every CPU and
    size (a 1x1 convolution on a small image, a depthwise one): the time of the convolutions is
    what decides, the pointwise work around them reads either layout. On a GPU the same, timed
    with CUDA events and cached under the GPU's key (cuDNN's channels-last kernels are the fast
    ones for float16/bfloat16 on tensor cores, but not for every size and GPU)."""
    from .autotune import choose

    convs: dict[tuple[Any, ...], None] = {}
    device: Any = "cpu"
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not aten.convolution.default or not _conv2d(n):
            continue
        x, w, b = n.args[0], n.args[1], n.args[2]
        xv, wv = x.meta.get("val"), w.meta.get("val") if isinstance(w, torch.fx.Node) else None
        if not isinstance(wv, torch.Tensor) or not all(isinstance(d, int) for d in wv.shape):
            continue
        convs[(tuple(xv.shape), tuple(wv.shape), str(xv.dtype), b is not None,
               *[tuple(a) if isinstance(a, (list, tuple)) else a for a in n.args[3:9]])] = None
        device = xv.device
    if not convs:
        return True
    sig = tuple(convs)
    where: dict[str, Any] = {}
    if getattr(device, "type", device) == "cuda":
        from .runtime.triton import machine_key

        where = {"device": "cuda", "machine_id": machine_key()}
    state: dict[bool, list[Any]] = {}

    def operands(cl: bool) -> list[Any]:
        if cl not in state:
            ops_ = []
            for xs, ws, dt, has_b, stride, pad, dil, tr, opad, groups in sig:
                dtype = getattr(torch, dt.replace("torch.", ""))
                ops_.append((_random(xs, dtype, cl, device), _random(ws, dtype, cl, device),
                             torch.randn(ws[0], dtype=dtype, device=device) if has_b else None,
                             stride, pad, dil, tr, opad, groups))
            state[cl] = ops_
        return state[cl]

    def run(cl: bool) -> Callable[[], Any]:
        def call() -> None:
            for args in operands(cl):
                aten.convolution.default(*args)
        return call

    with torch.no_grad():
        return choose("conv_layout", sig, {"channels_last": run(True),
                                           "contiguous": run(False)},
                      default="channels_last", **where) == "channels_last"


def decide_layout(gm: torch.fx.GraphModule, options: dict[str, Any]) -> bool:
    """Whether the plan makes ``gm``'s convolutions channels-last: ``options["layout_opt"]``
    when it is True or False; by default (``"auto"``) timed for an inference graph
    (:func:`channels_last_chosen`) and channels-last for a training graph (whose forward and
    backward must agree: they are generated as a pair, see below)."""
    opt = options.get("layout_opt", "auto")
    if opt != "auto":
        return bool(opt)
    if options.get("_layout_final") or not wants_channels_last(gm):
        return True
    return channels_last_chosen(gm)


def plan_for(gm: torch.fx.GraphModule, options: dict[str, Any]) -> LayoutPlan | None:
    """The plan for ``gm`` (None: no convolution, or :func:`decide_layout` says no).
    Also moves pure nodes next to their first use (:func:`sink_pure_nodes`)."""
    if not wants_channels_last(gm) or not decide_layout(gm, options):
        return None
    sink_pure_nodes(gm)
    lay = options.get("_layout") or {}
    plan = LayoutPlan(lay.get("keep", ()), lay.get("inputs"))
    plan.weights = str(options.get("layout_weights", "none"))
    plan.onednn_conv = options.get("onednn_conv", "auto")
    return plan


def sink_pure_nodes(gm: torch.fx.GraphModule) -> int:
    """Move each pure node (a lowered, non-random op) down to just before its first user.

    A training backward starts with the forward values it recomputes (BatchNorm + ReLU of every
    layer, from the saved convolution outputs): stored where they stand, all of them are live
    from the first kernel on, which sets the step's peak memory. Next to their use, each lives
    only while its layer's gradients are computed. Returns how many nodes moved; the graph's
    values are unchanged (its ``code`` is left as traced: the cache key is taken from it)."""
    from .lowering.registry import EXTERN_OPS, LOWERINGS

    nodes = list(gm.graph.nodes)
    for n in nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is not None and schema.is_mutable:
            return 0  # a write inside the graph: moving a read past it could change its value
    # positions as exact fractions: a moved node takes the midpoint of its new neighbours, and
    # floats run out of bits after ~50 moves before one node (ties, then a node moved past a
    # user: BEiT's backward, "where_4 used before it has been defined")
    order: dict[Any, Fraction] = {n: Fraction(i) for i, n in enumerate(nodes)}
    moved = 0
    for n in reversed(nodes):
        if (n.op != "call_function" or not n.users or n.target not in LOWERINGS
                or n.target in EXTERN_OPS):
            continue
        tags = getattr(n.target, "tags", ())
        if torch.Tag.nondeterministic_seeded in tags or torch.Tag.inplace_view in tags:
            continue
        first = min(n.users, key=lambda u: order[u])
        if first.op == "output" or order[first] == order[n] + 1:
            continue
        first.prepend(n)
        order[n] = ((order[n.prev] + order[first]) / 2 if n.prev.op != "root"
                    else order[first] - 1)
        moved += 1
    return moved


# -- lowering of the convolutions --------------------------------------------------------------

def lower_conv(g: Any, plan: LayoutPlan, node: torch.fx.Node, args: Sequence[Any],
               kwargs: dict[str, Any]) -> Any:
    """aten.convolution / convolution_backward with channels-last operands and results; None
    when the node is not a 2-d convolution this plan handles (the caller falls back)."""
    from .ir import ExternKernel, IRNode, Layout, NoneValue

    if kwargs or not _conv2d(node):
        return None
    args = list(args)
    origins = [node.name]
    meta = node.meta.get("val")
    if node.target is aten.convolution.default:
        x, w = args[0], args[1]
        if not isinstance(x, IRNode) or not isinstance(w, IRNode) or len(w.get_size()) != 4:
            return None
        # the weight stays as it is: ATen's result is channels-last for a channels-last
        # input whatever the weight's layout, and a weight copy per call buys little (but see
        # _weight_channels_last)
        args[0] = plan.to_channels_last(g, x)
        args[1] = (plan.to_channels_last(g, w)
                   if plan.weights == "all" or _weight_channels_last(w, meta) else g.realize(w))
        if isinstance(args[2], IRNode) and not isinstance(args[2], NoneValue):
            args[2] = g.realize(args[2])
        size = tuple(meta.shape)
        layout = Layout(size, _result_strides(node.target, args, [meta])[0], meta.dtype,
                        meta.device)
        r = rules(meta)
        fused = _relu_epilogue(g, plan, node, args, layout, origins) if r.onednn else None
        if fused is not None:
            return fused
        call, cargs = node.target, args
        if r.onednn and _onednn_conv_chosen(plan, node, args):
            # the same convolution through oneDNN directly (mkldnn._convolution_pointwise, no
            # post-op): where ATen would take another path (its channels-last 1x1 convolution
            # with a bias runs the slow im2col-free GEMM path, aten::_slow_conv2d_forward)
            x_, w_, b_, stride, padding, dilation, _, _, groups = args
            call = _mkldnn_pointwise().default
            cargs = [x_, w_, None if isinstance(b_, NoneValue) else b_, list(padding),
                     list(stride), list(dilation), groups, "none", [], None]
            counters["conv_onednn"] += 1
        buf = ExternKernel(g.new_name(), layout, call, cargs, {}, "extern", origins)
        g.operations.append(buf)
        counters["conv"] += 1
        return buf
    go, x, w = args[0], args[1], args[2]
    if not all(isinstance(a, IRNode) for a in (go, x, w)) or len(w.get_size()) != 4:
        return None
    x_meta = node.args[1].meta.get("val")
    if (rules(x_meta).strided_1x1_backward_contiguous and list(w.get_size()[2:]) == [1, 1]
            and any(st != 1 for st in args[4])):
        # ATen's channels-last backward of a strided 1x1 convolution corrupts the heap for
        # some sizes (torch 2.13, e.g. grad (3,16,5,4), input (3,8,10,8), stride 2: "free():
        # invalid next size"): this one runs on contiguous operands (contiguous results), and
        # its input gradient is copied back to channels-last for the layers below
        return _strided_1x1_backward(g, plan, node, args, origins, meta)
    args[0] = plan.to_channels_last(g, go)
    args[1] = plan.to_channels_last(g, x)
    args[2] = (plan.to_channels_last(g, w)
               if plan.weights in ("all", "backward") or _weight_channels_last(w, x_meta)
               else g.realize(w))
    strides = _result_strides(node.target, args, meta)
    outs = _extern_multi(g, node.target, args, origins, meta,
                         lambda i, m: (tuple(m.shape), strides[i]))
    counters["conv"] += 1
    return tuple(outs)


def _weight_channels_last(w: Any, meta: Any) -> bool:
    """Store a weight the graph computes (autocast's cast of a parameter: a lazy value) in
    channels-last order? Where the device's rules say so: cuDNN copies a contiguous weight to
    channels-last inside every channels-last convolution, and the cast writes either order at
    the same cost."""
    from .ir import Pointwise

    r = rules(meta)
    return r is not None and r.weights_channels_last and isinstance(w, Pointwise)


def _result_strides(op: Any, args: Sequence[Any], metas: Sequence[Any]) -> list[Any]:
    """Strides of each result of the convolution ``op`` (forward or backward) on ``args``, the
    lowered operands in the layouts the plan gives them.

    CPU (rules ``result_strides="channels_last"``): the input and weight gradients and the
    forward's result are channels-last, the bias gradient as its metadata says. Elsewhere
    (``"aten"``): ATen's own answer, from the same call on fake tensors of the operands' sizes,
    strides, dtypes and device, which runs ATen's choice of library and memory format (on a GPU,
    cuDNN's channels-last result; another CUDA kernel's contiguous one); the wrapper then reads
    exactly what the call returns."""
    first = next(m for m in metas if isinstance(m, torch.Tensor))
    r = rules(first)
    if r is None or r.result_strides == "channels_last":
        return [None if m is None else (channels_last_stride(m.shape) if i < 2
                                        else tuple(m.stride()))
                for i, m in enumerate(metas)]
    out = _fake_call(op, args, first)
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [None if m is None or o is None else tuple(int(v) for v in o.stride())
            for m, o in zip(metas, outs)]


def _fake_call(op: Any, args: Sequence[Any], like: torch.Tensor) -> Any:
    """``op`` on fake tensors with the geometry of the lowered IR values in ``args`` (other
    arguments as they are), in ``like``'s fake mode (a fresh one for a real tensor)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .ir import IRNode, NoneValue

    mode = getattr(like, "fake_mode", None) or FakeTensorMode()

    def fake(a: Any) -> Any:
        if isinstance(a, NoneValue):
            return None
        if isinstance(a, IRNode):
            lay = a.layout if hasattr(a, "layout") else None
            size = [int(v) for v in a.get_size()]
            stride = ([int(v) for v in lay.stride] if lay is not None
                      else list(torch.empty(size, device="meta").stride()))
            return torch.empty_strided(size, stride, dtype=a.dtype, device=like.device)
        if isinstance(a, (list, tuple)):
            return type(a)(fake(x) for x in a)
        return a

    with mode:
        return op(*[fake(a) for a in args])


def _extern_multi(g: Any, op: Any, args: Sequence[Any], origins: list[str],
                  metas: Sequence[Any],
                  layout_of: Callable[[int, torch.Tensor], tuple[Any, Any]]) -> list[Any]:
    """One ATen call with several results: the call, then one :class:`MultiOutput` per result
    (``layout_of(i, meta)`` -> its size and strides; a None meta, a result not asked for,
    becomes a :class:`NoneValue`)."""
    from .ir import ExternKernel, Layout, MultiOutput, NoneValue

    parent = ExternKernel(g.new_name(), None, op, list(args), {}, "extern", origins)
    g.operations.append(parent)
    outs: list[Any] = []
    for i, m in enumerate(metas):
        if m is None:
            outs.append(NoneValue())
            continue
        size, stride = layout_of(i, m)
        mo = MultiOutput(g.new_name(), Layout(size, stride, m.dtype, m.device), parent, (i,))
        g.operations.append(mo)
        outs.append(mo)
    return outs


def _strided_1x1_backward(g: Any, plan: LayoutPlan, node: torch.fx.Node, args: list[Any],
                          origins: list[str], meta: Any) -> Any:
    if list(args[5]) == [0, 0] and not any(args[8]) and args[7] is False:
        return _subsampled_1x1_backward(g, plan, node, args, origins, meta)
    return _contiguous_1x1_backward(g, plan, node, args, origins, meta)


def _subsampled_1x1_backward(g: Any, plan: LayoutPlan, node: torch.fx.Node, args: list[Any],
                             origins: list[str], meta: Any) -> Any:
    """A 1x1 convolution with stride s and no padding reads x[:, :, ::s, ::s] only: its
    backward is the stride-1 backward on that subsampled input (stored channels-last, 1/s^2 of
    x), and its input gradient is the stride-1 one at positions (s*i, s*j), zero elsewhere (a
    lazy value the consumer fuses)."""
    from .ir import Pointwise
    from .sizes import FloorDiv, ModularIndexing
    from .virtualized import ops

    go, x, w = args[0], args[1], args[2]
    sh, sw = args[4]
    n_, c_, h_, w_ = x.get_size()
    ho, wo = go.get_size()[2:]
    xl = x.make_loader()
    sub = Pointwise(x.device, x.dtype, [n_, c_, ho, wo],
                    lambda i: xl([i[0], i[1], i[2] * sh, i[3] * sw]), 1, origins=["layout_copy"])
    sub = g.realize(sub, list(channels_last_stride([n_, c_, ho, wo])))
    args = list(args)
    args[0] = plan.to_channels_last(g, go)
    args[1] = sub
    args[2] = g.realize(w)
    args[4] = [1, 1]

    def layout_of(i: int, m: torch.Tensor) -> tuple[Any, Any]:
        size = (n_, c_, ho, wo) if i == 0 else tuple(m.shape)
        return size, (channels_last_stride(size) if i < 2 else tuple(m.stride()))

    outs = _extern_multi(g, node.target, args, origins, meta, layout_of)
    if meta[0] is not None:
        gl = outs[0].make_loader()
        dt = meta[0].dtype

        def grad_in(idx: Any) -> Any:
            zero = ops.constant(0, torch.int64)
            on_h = ops.eq(ops.index_expr(ModularIndexing(idx[2], 1, sh), torch.int64), zero)
            on_w = ops.eq(ops.index_expr(ModularIndexing(idx[3], 1, sw), torch.int64), zero)
            v = gl([idx[0], idx[1], FloorDiv(idx[2], sh), FloorDiv(idx[3], sw)])
            z = ops.constant(0.0, dt)
            return ops.where(on_h, ops.where(on_w, v, z), z)
        outs[0] = Pointwise(meta[0].device, dt, list(meta[0].shape), grad_in, 6,
                            origins=["convolution_backward"])
    counters["conv_1x1_strided_backward"] += 1
    return tuple(outs)


def _contiguous_1x1_backward(g: Any, plan: LayoutPlan, node: torch.fx.Node, args: list[Any],
                             origins: list[str], meta: Any) -> Any:
    from .sizes import contiguous_strides

    for i in (0, 1):
        st = tuple(contiguous_strides(list(args[i].get_size())))
        v = plan.copy_to(g, args[i], st)
        args[i] = plan.copy_to(g, v, st)  # a lazy value stored channels-last before: copied
    args[2] = g.realize(args[2])
    outs = _extern_multi(g, node.target, args, origins, meta, lambda i, m: (
        tuple(m.shape), tuple(contiguous_strides(list(m.shape)))))
    if meta[0] is not None:
        outs[0] = plan.to_channels_last(g, outs[0])
    counters["conv_1x1_strided_backward"] += 1
    return tuple(outs)


def _single_user(node: torch.fx.Node, target: Any) -> torch.fx.Node | None:
    if len(node.users) != 1:
        return None
    (u,) = node.users
    return u if u.op == "call_function" and u.target is target else None


def _onednn_conv_chosen(plan: LayoutPlan, node: torch.fx.Node, args: Sequence[Any]) -> bool:
    """Run this channels-last float32 convolution through oneDNN's own entry
    (``mkldnn._convolution_pointwise``) rather than ``aten.convolution``? ``plan.onednn_conv``:
    True/False force it; ``"auto"`` times both on this machine with the real sizes, a
    channels-last input and the weight's layout (cached per machine: autotune.py)."""
    from .autotune import choose

    mode = plan.onednn_conv
    op = _mkldnn_pointwise()
    x, w, b, stride, padding, dilation, transposed, out_pad, groups = args
    xv, wv = node.args[0].meta.get("val"), node.args[1].meta.get("val") \
        if isinstance(node.args[1], torch.fx.Node) else None
    if (op is None or not mode or transposed or any(p != 0 for p in out_pad)
            or not isinstance(groups, int) or not _static_4d(xv) or xv.dtype != torch.float32
            or not isinstance(wv, torch.Tensor) or not all(
                isinstance(d, int) for d in (*wv.shape, *wv.stride()))):
        return False
    if mode is True or mode == "always":
        return True
    has_b = b is not None and type(b).__name__ != "NoneValue"
    sig = ("conv_library", tuple(xv.shape), tuple(wv.shape), tuple(wv.stride()), has_b,
           tuple(stride), tuple(padding), tuple(dilation), groups)
    state: dict[str, Any] = {}

    def operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if not state:
            state["x"] = _random(xv.shape, torch.float32, True)
            state["w"] = torch.empty_strided(tuple(wv.shape), tuple(wv.stride())).normal_()
            state["b"] = torch.randn(wv.shape[0]) if has_b else None
        return state["x"], state["w"], state["b"]

    def aten_call() -> Any:
        x_, w_, b_ = operands()
        return aten.convolution.default(x_, w_, b_, list(stride), list(padding),
                                        list(dilation), False, [0, 0], groups)

    def onednn_call() -> Any:
        x_, w_, b_ = operands()
        return op.default(x_, w_, b_, list(padding), list(stride), list(dilation), groups,
                          "none", [], None)

    with torch.no_grad():
        return choose("conv_library", sig, {"aten": aten_call, "onednn": onednn_call},
                      default="aten") == "onednn"


def _mkldnn_pointwise() -> Any:
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(getattr(torch.ops, "mkldnn", None), "_convolution_pointwise", None)


def _relu_epilogue(g: Any, plan: LayoutPlan, node: torch.fx.Node, args: list[Any],
                   layout: Any, origins: list[str]) -> Any:
    """``relu(conv(x))`` and ``relu(conv(x) + other)``, where the convolution's result has no
    other use, as one oneDNN call with the epilogue fused (``mkldnn._convolution_pointwise``,
    unary "relu" or binary "add" then "relu"): no separate pass over the result, no second
    buffer. Exact: ReLU, and the one addition, round as in eager (IEEE addition commutes).
    Where nothing reads ``other`` after the add (:func:`_dead_after`), the in-place variant
    adds the convolution into ``other``'s buffer: no fresh result, and a faster call (oneDNN's
    sum post-op; convnet inference: 0.4-0.9 ms less per call on one thread).
    The fused result is what the ReLU node lowers to (``plan.fused``)."""
    from .ir import ExternKernel, IRNode, NoneValue

    op = _mkldnn_pointwise()
    if op is None or layout.dtype != torch.float32:
        return None
    x, w, b, stride, padding, dilation, transposed, out_pad, groups = args
    if transposed or any(p != 0 for p in out_pad) or not isinstance(groups, int):
        return None
    if isinstance(b, NoneValue):
        b = None
    relu = _single_user(node, aten.relu.default)
    other = add = None
    if relu is None:
        add = _single_user(node, aten.add.Tensor)
        if add is None or add.kwargs or len(add.args) != 2:
            return None
        relu = _single_user(add, aten.relu.default)
        peer = add.args[1] if add.args[0] is node else add.args[0]
        if relu is None or peer is node or not isinstance(peer, torch.fx.Node):
            return None
        pm = peer.meta.get("val")
        other = g.env.get(peer)
        if (not _static_4d(pm) or pm.dtype != torch.float32 or tuple(pm.shape) != layout.size
                or not isinstance(other, IRNode) or isinstance(other, NoneValue)):
            return None
        other = plan.to_channels_last(g, other)
    common = [list(padding), list(stride), list(dilation), groups]
    # grouped: the in-place call rounds differently from the out-of-place one (1 ulp)
    inplace = other is not None and groups == 1 and _dead_after(g, other, add, layout)
    if other is None:
        call, cargs = op.default, [x, w, b, *common, "relu", [], None]
    elif inplace:
        # the shortcut is read by nothing after this call: oneDNN adds the convolution into it
        # (its "sum" post-op) and returns it, instead of a fresh result read with the shortcut
        call = torch.ops.mkldnn._convolution_pointwise_.binary
        cargs = [other, x, w, b, *common, "add", None, "relu", [], None]
    else:
        call, cargs = op.binary, [x, other, w, b, *common, "add", None, "relu", [], None]
    buf = ExternKernel(g.new_name(), layout, call, cargs, {}, "extern",
                       origins + [relu.name])
    g.operations.append(buf)
    plan.fused[relu] = buf
    counters["conv"] += 1
    counters["conv_relu" if other is None else "conv_add_relu"] += 1
    if inplace:
        counters["conv_add_relu_inplace"] += 1
    return buf


def _dead_after(g: Any, other: Any, add: torch.fx.Node, layout: Any) -> bool:
    """May the fused ``relu(conv + other)`` write into ``other``'s storage? Only when that
    storage is a buffer this graph computed (not an input, constant or view), in exactly the
    result's layout, and every fx value lowered to it is read by nothing but ``add`` and by
    ATen calls already emitted (lowered before this node: ATen calls run in program order)."""
    from .ir import ComputedBuffer, ExternKernel

    if (not isinstance(other, (ComputedBuffer, ExternKernel)) or getattr(other, "multi", False)
            or not any(op is other for op in g.operations)):
        return False
    if isinstance(other, ExternKernel) and _returns_alias(other.op):
        return False  # a view or an in-place result: other names reach the same storage
    lay = other.layout
    if (tuple(lay.size) != tuple(layout.size) or lay.offset != 0 or lay.dtype != layout.dtype
            or not _same(layout.size, lay.stride, layout.stride)):
        return False
    holders = [n for n, v in g.env.items() if v is other]
    if not holders:
        return False
    for n in holders:
        if n.op != "call_function":
            return False
        for u in n.users:
            if u is add or u in holders:  # a fused epilogue's nodes hold the same buffer
                continue
            if u.target is aten.add.Tensor and u.users and all(v in holders for v in u.users):
                continue  # the add inside a fused epilogue: lowered lazily, never computed
            if (u.op != "call_function" or u not in g.env
                    or u.target not in (aten.convolution.default,)):
                return False
    return True


def _returns_alias(op: Any) -> bool:
    schema = getattr(op, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def lower_var_mean(g: Any, plan: LayoutPlan, node: torch.fx.Node, args: Sequence[Any],
                   kwargs: dict[str, Any]) -> Any:
    """Per-channel ``var_mean`` of a channels-last 4-d float32 value (batch-norm statistics in
    training): one pass, summing ``x`` and ``x*x`` in float64, instead of a mean pass and a
    centered pass. Both sums share one loop over the input, channels innermost (vectorized
    accumulator tiles), where the two-pass form walks the input twice with a stride of C.
    float64 sums of float32 values and squares are exact to ~1e-16 relative, so
    ``E[x^2] - E[x]^2`` in float64 loses nothing that matters at float32 unless
    ``mean^2 / var`` exceeds ~1e8 (then the centered form in float32 is no better)."""
    from .ir import IRNode, Pointwise, Reduction, _LaidOut
    from .virtualized import ops

    x = args[0] if args else None
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    correction = kwargs.get("correction", 1)
    keepdim = kwargs.get("keepdim", False)
    if len(args) > 2 or set(kwargs) - {"dim", "correction", "keepdim"}:
        return None
    arg0 = node.args[0] if node.args else None
    meta = arg0.meta.get("val") if isinstance(arg0, torch.fx.Node) else None
    if (not _static_4d(meta) or meta.dtype != torch.float32 or not rules(meta).f64_statistics
            or not isinstance(x, IRNode) or list(x.get_size()) != list(meta.shape)
            or not isinstance(correction, int) or isinstance(correction, bool)):
        return None
    if sorted(d % 4 for d in (dims or ())) != [0, 2, 3]:
        return None
    n_, c_, h_, w_ = meta.shape
    count = n_ * h_ * w_
    if count - correction <= 0 or c_ < 2:
        return None
    if isinstance(x, Pointwise):
        x = g.realize(x, list(channels_last_stride(meta.shape)))
    if not isinstance(x, _LaidOut) or not _same(meta.shape, x.layout.stride,
                                                 channels_last_stride(meta.shape)):
        return None
    f64 = torch.float64
    load = x.make_loader()

    # per image and channel first (loops [N, C] outside, [H, W] inside: a group of its own,
    # channels innermost), then over the images (small; joins the statistics' epilogue)
    def sums(square: bool) -> Any:
        def inner(idx: Sequence[Any], ridx: Sequence[Any]) -> Any:
            v = ops.to_dtype(load([idx[0], idx[1], ridx[0], ridx[1]]), f64)
            return ops.mul(v, v) if square else v
        part = g.realize(Reduction(x.device, f64, [n_, c_], [h_, w_], "sum", inner, f64,
                                   origins=["var_mean"]))
        pl = part.make_loader()
        red = Reduction(x.device, f64, [1, c_, 1, 1], [n_], "sum",
                        lambda idx, ridx: pl([ridx[0], idx[1]]), f64, origins=["var_mean"])
        return g.realize(red)

    s1, s2 = sums(False), sums(True)
    l1, l2 = s1.make_loader(), s2.make_loader()
    def c(v: float) -> Any:
        return ops.constant(v, f64)

    def mean_at(i: Sequence[Any]) -> Any:
        return ops.truediv(l1(i), c(float(count)))

    def var_at(i: Sequence[Any]) -> Any:
        m = mean_at(i)
        v = ops.sub(ops.truediv(l2(i), c(float(count))), ops.mul(m, m))
        v = ops.maximum(v, c(0.0))
        if correction:
            v = ops.mul(v, c(count / (count - correction)))
        return v

    if keepdim:
        shape = [1, c_, 1, 1]

        def at(i: Sequence[Any]) -> list[Any]:
            return list(i)
    else:
        shape = [c_]

        def at(i: Sequence[Any]) -> list[Any]:
            return [0, i[0], 0, 0]
    var = Pointwise(x.device, torch.float32, shape,
                    lambda i: ops.to_dtype(var_at(at(i)), torch.float32), 6, origins=["var_mean"])
    mean = Pointwise(x.device, torch.float32, shape,
                     lambda i: ops.to_dtype(mean_at(at(i)), torch.float32), 2,
                     origins=["var_mean"])
    counters["var_mean"] += 1
    # stored once per channel (every element of the normalization reads them)
    return (g.realize(var), g.realize(mean))


def lower_mean(g: Any, plan: LayoutPlan, node: torch.fx.Node, args: Sequence[Any],
               kwargs: dict[str, Any]) -> Any:
    """``mean`` over the spatial dims of a channels-last 4-d float value (global average
    pooling): one reduction over ``[H, W]`` per image and channel, channels innermost, whose
    body scales each element by ``1/(H*W)`` in float64 (so the sum needs no division after it:
    left in the same loop nest as a division, the reduction reads the input with a stride of C
    instead of running vectorized over the channels; convnet training forward: 10 ms -> under
    1 ms on one thread). Float64 accumulation of ``x/(H*W)`` rounds once, to float32 at the
    end: at least as accurate as eager's float32 sum divided by ``H*W``."""
    from .ir import IRNode, Pointwise, Reduction, _LaidOut
    from .virtualized import ops

    x = args[0] if args else None
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if len(args) > 3 or set(kwargs) - {"dim", "keepdim"} or not isinstance(keepdim, bool):
        return None
    arg0 = node.args[0] if node.args else None
    meta = arg0.meta.get("val") if isinstance(arg0, torch.fx.Node) else None
    if (not _static_4d(meta) or not rules(meta).f64_statistics or not isinstance(x, IRNode)
            or not isinstance(dims, (list, tuple)) or list(x.get_size()) != list(meta.shape)):
        return None
    if sorted(d % 4 for d in dims) != [2, 3] or len(dims) != 2:
        return None
    n_, c_, h_, w_ = meta.shape
    count = h_ * w_
    if count < 2 or c_ < 2:
        return None
    if isinstance(x, _LaidOut):
        # stored: only a channels-last value reads contiguously along the channels
        if not _same(meta.shape, x.layout.stride, channels_last_stride(meta.shape)):
            return None
    elif not isinstance(x, Pointwise):
        return None
    f64 = torch.float64
    load = x.make_loader()
    scale = 1.0 / count

    if keepdim:
        ranges = [n_, c_, 1, 1]
    else:
        ranges = [n_, c_]

    def inner(idx: Sequence[Any], ridx: Sequence[Any]) -> Any:
        v = ops.to_dtype(load([idx[0], idx[1], ridx[0], ridx[1]]), f64)
        return ops.mul(v, ops.constant(scale, f64))

    red = Reduction(x.device, meta.dtype, ranges, [h_, w_], "sum", inner, f64,
                    origins=[node.name])
    counters["mean"] += 1
    return g.realize(red)


#: pooling ops (ATen kernels) -> the tensor arguments given channels-last; every tensor result
#: is channels-last then (checked by tests/inductor/test_layout.py over kernels, strides,
#: paddings, ceil_mode, batches, dtypes)
POOL_OPS = {
    aten.max_pool2d_with_indices.default: (0,),
    aten.max_pool2d_with_indices_backward.default: (0, 1, 7),
    aten.avg_pool2d.default: (0,),
    aten.avg_pool2d_backward.default: (0, 1),
}


def lower_pool(g: Any, plan: LayoutPlan, node: torch.fx.Node, args: Sequence[Any],
               kwargs: dict[str, Any]) -> Any:
    """2-d pooling (forward and backward) on channels-last operands, results channels-last: no
    copy between a convolution and a pooling layer in either direction."""
    from .ir import ExternKernel, IRNode, Layout

    which = POOL_OPS[node.target]
    args = list(args)
    if kwargs or any(i >= len(args) or not isinstance(args[i], IRNode) for i in which):
        return None
    for i in which:
        a = node.args[i]
        m = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if not isinstance(m, torch.Tensor) or m.dim() != 4 or not all(
                isinstance(v, int) for v in (*m.shape, *m.stride())):
            return None
        # ATen's channels-last pooling kernels are checked on the CPU only
        if i == which[0] and (not _static_4d(m) or m.device.type != "cpu"):
            return None
    for i in which:
        args[i] = plan.to_channels_last(g, args[i])
    meta = node.meta.get("val")
    origins = [node.name]

    def lay(m: torch.Tensor) -> Any:
        return Layout(tuple(m.shape), channels_last_stride(m.shape), m.dtype, m.device)

    if isinstance(meta, torch.Tensor):
        buf = ExternKernel(g.new_name(), lay(meta), node.target, args, {}, "extern", origins)
        g.operations.append(buf)
        counters["pool"] += 1
        return buf
    outs = _extern_multi(g, node.target, args, origins, meta, lambda i, m: (
        tuple(m.shape), channels_last_stride(m.shape)))
    counters["pool"] += 1
    return tuple(outs)


def lower_with_layout(g: Any, plan: LayoutPlan, node: torch.fx.Node, args: Sequence[Any],
                      kwargs: dict[str, Any]) -> Any:
    if node.target in POOL_OPS:
        # pooling lowered to generated code (lowering/pooling.py) reads any layout and is stored
        # channels-last like every 4-d float value of the plan; what it does not handle runs as
        # ATen's channels-last kernel
        from .lowering.registry import LOWERINGS, Unsupported

        fn = LOWERINGS.get(node.target)
        if fn is not None:
            try:
                result = fn(*args, **kwargs)
            except Unsupported:
                result = None
            if result is not None:
                counters["pool"] += 1
                if isinstance(result, tuple):
                    return result  # read through getitem nodes, realized there
                return g._maybe_realize(node, result)
        return lower_pool(g, plan, node, args, kwargs)
    if node.target is aten.relu.default or node.target is aten.add.Tensor:
        # the ReLU of a fused convolution epilogue (the add in between lowers as usual and,
        # unused, is dropped)
        return plan.fused.get(node)
    if node.target is aten.var_mean.correction:
        return lower_var_mean(g, plan, node, args, kwargs)
    if node.target is aten.mean.dim:
        return lower_mean(g, plan, node, args, kwargs)
    return lower_conv(g, plan, node, args, kwargs)


LAYOUT_OPS = (*CONV_OPS, aten.var_mean.correction, aten.mean.dim, aten.relu.default,
              *POOL_OPS)


# -- training: the forward waits for its backward ------------------------------------------------

_pending: dict[str, "DeferredForward"] = {}
_lock = threading.Lock()


def _pair_key(graph_id: str, kind: str) -> str:
    """``m_f_3_0.forward2`` and ``m_f_3_0.backward2`` -> the same key."""
    stem, _, last = graph_id.rpartition(".")
    return f"{stem}.{last.replace(kind, '', 1)}" if last.startswith(kind) else graph_id


class DeferredForward:
    """A training forward whose code is generated when its backward is compiled (or, failing
    that, on its first call, with eager's strides on every output)."""

    def __init__(self, compile_fn: Callable[..., Any], gm: torch.fx.GraphModule,
                 example_inputs: Sequence[Any], context: Any, options: dict[str, Any]):
        self._compile_fn = compile_fn
        self.gm = gm
        self._example = list(example_inputs)
        self._context = context
        self._options = dict(options)
        self.fn: Callable[..., Any] | None = None
        self.saved_strides: dict[int, tuple[int, ...]] = {}

    def n_outputs(self) -> int:
        out = next(n for n in reversed(self.gm.graph.nodes) if n.op == "output")
        res = out.args[0]
        return len(res) if isinstance(res, (list, tuple)) else 1

    def output_nodes(self) -> list[Any]:
        out = next(n for n in reversed(self.gm.graph.nodes) if n.op == "output")
        res = out.args[0]
        return list(res) if isinstance(res, (list, tuple)) else [res]

    def output_metas(self) -> list[Any]:
        return [a.meta.get("val") if isinstance(a, torch.fx.Node) else a
                for a in self.output_nodes()]

    def generate(self, keep: Sequence[int] = ()) -> dict[int, tuple[int, ...]]:
        """Compile now; ``keep``: output positions that may stay channels-last. Returns the
        strides each kept output was stored with."""
        plan_opts = {**self._options, "_layout": {"keep": tuple(sorted(keep))},
                     "_layout_final": True}
        fn = self._compile_fn(self.gm, self._example, context=self._context, **plan_opts)
        # a kept output is always stored channels-last (a copy where its value is not)
        metas = self.output_metas()
        self.saved_strides = {p: channels_last_stride(metas[p].shape) for p in keep}
        self.fn = fn
        self._example = []  # the example inputs are not needed any more
        return self.saved_strides

    def __call__(self, *args: Any) -> Any:
        if self.fn is None:
            with _lock:
                _pending.pop(_pair_key(getattr(self._context, "graph_id", ""), "forward"), None)
            self.generate(())
        return self.fn(*args)  # type: ignore[misc]


def defer_forward(compile_fn: Callable[..., Any], gm: torch.fx.GraphModule,
                  example_inputs: Sequence[Any], context: Any,
                  options: dict[str, Any]) -> DeferredForward:
    d = DeferredForward(compile_fn, gm, example_inputs, context, options)
    with _lock:
        _pending[_pair_key(context.graph_id, "forward")] = d
    return d


def take_forward(context: Any, gm: torch.fx.GraphModule) -> dict[int, tuple[int, ...]] | None:
    """For a backward graph: generate its pending forward with the saved activations
    channels-last; return {backward input position: strides} for the backward's inputs that
    the forward stores in a layout other than their metadata's (None: no pending forward)."""
    with _lock:
        fw = _pending.pop(_pair_key(context.graph_id, "backward"), None)
    if fw is None or fw.fn is not None:
        return None
    n_saved = sum(1 for i in context.inputs if i.kind != "tangent")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    n_out = fw.n_outputs()
    metas = fw.output_metas()
    onodes = fw.output_nodes()
    first = n_out - n_saved
    ok = 0 <= first and n_saved <= len(placeholders)
    keep: list[int] = []
    if ok:
        for j in range(n_saved):
            om, im = metas[first + j], placeholders[j].meta.get("val")
            if isinstance(om, torch.Tensor) != isinstance(im, torch.Tensor):
                ok = False
                break
            if isinstance(om, torch.Tensor):
                if tuple(om.shape) != tuple(im.shape) or om.dtype != im.dtype:
                    ok = False
                    break
                # a forward input saved as it is (a weight, the batch) keeps its own layout:
                # making it channels-last would be a copy per step
                src = onodes[first + j]
                if LayoutPlan.keepable(im) and not (isinstance(src, torch.fx.Node)
                                                    and src.op == "placeholder"):
                    keep.append(first + j)
    if not ok:
        log.debug("layout: forward/backward of %s do not pair; eager strides", context.graph_id)
        fw.generate(())
        return None
    strides = fw.generate(keep)
    counters["paired"] += 1
    counters["saved_channels_last"] += len(keep)
    out: dict[int, tuple[int, ...]] = {}
    for pos, st in strides.items():
        j = pos - first
        im = placeholders[j].meta.get("val")
        if not _same(tuple(im.shape), st, im.stride()):
            out[j] = tuple(st)
    return out
