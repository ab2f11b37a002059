"""2-d pooling lowered to generated code: ``max_pool2d_with_indices``, ``avg_pool2d``,
``_adaptive_avg_pool2d`` and their backward ops, with eager's (ATen's CPU kernels') semantics.

* Forward: each output element reads its window as unrolled loads in a pointwise body (so the
  pooling fuses with the pointwise work on either side, e.g. the ReLU before it). A window
  position that can fall outside the input (padding, ``ceil_mode``) is read at an index clamped
  into the input and replaced by the padding value (-inf for max, 0 for sums): a select, not a
  branch, so the loop stays vector code. Adaptive pooling with windows larger than
  ``UNROLL_LIMIT`` elements (a global average of a large map) is a reduction over the largest
  window instead.
* Backward: a gather, not a scatter: each input element sums the few output positions whose
  window holds it (``ceil(k*d/s)`` per dim), in ascending output order as ATen adds them.
  Max pooling's gradient goes where the saved index equals the element's own flat index.
* Max: NaN propagates (a NaN anywhere in the window is the result, its index the last NaN's),
  ties keep the first element (strict ``>``), an all -inf window gives the index of its first
  element inside the input; indices are int64 flat offsets into each ``H*W`` plane.
* Average: ``sum / divisor`` with ATen's divisor (``divisor_override``, else the window clipped
  to the padded input with ``count_include_pad``, else clipped to the input); adaptive pooling
  divides by the window height, then by its width, as ATen does.

Unbatched ``[C, H, W]`` and batched ``[N, C, H, W]`` inputs, any strides (the loads go through
each input's layout: channels-last reads contiguously along the channels). Symbolic sizes,
integer dtypes and windows past the unroll limits raise :class:`Unsupported` (the op runs as its
ATen kernel)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch

from ..ir import Pointwise, Reduction
from ..sizes import FloorDiv
from ..virtualized import ops
from .common import meta, shape_of
from .registry import Unsupported, current, register

aten = torch.ops.aten

#: windows of at most this many elements are unrolled loads in a pointwise body; larger adaptive
#: windows are reductions (max/avg pooling with such kernels runs as ATen's kernel)
UNROLL_LIMIT = 64
#: backward: at most this many output positions read per input element
GATHER_LIMIT = 64

_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _ints(v: Any, n: int = 2, default: Sequence[int] | None = None) -> list[int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        if default is None:
            raise Unsupported("missing pooling parameter")
        return list(default)
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    if len(v) == 1:
        v = v * n
    if len(v) != n or not all(isinstance(a, int) and not isinstance(a, bool) for a in v):
        raise Unsupported(f"pooling parameter {v}")
    return v


def _static(x: Any) -> list[int]:
    size = x.get_size()
    if len(size) not in (3, 4):
        raise Unsupported("pooling of a tensor that is not 3-d or 4-d")
    if not all(isinstance(s, int) or (isinstance(s, sympy.Integer)) for s in size):
        raise Unsupported("pooling with symbolic sizes")
    size = [int(s) for s in size]
    if any(s == 0 for s in size):
        raise Unsupported("empty pooling input")
    return size


def _calc_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in _FLOATS:
        raise Unsupported(f"pooling of {dtype}")
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _i(e: Any) -> Any:
    return ops.index_expr(e, torch.int64)


def _c(v: int) -> Any:
    return ops.constant(v, torch.int64)


def _and(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return ops.logical_and(a, b)


def _in_range(e: Any, lo: Any, hi: Any) -> Any:
    """An ops predicate ``lo <= e < hi`` (either bound None: not checked)."""
    cond = None
    if lo is not None:
        cond = ops.ge(_i(e), _i(lo) if not isinstance(lo, int) else _c(lo))
    if hi is not None:
        cond = _and(cond, ops.lt(_i(e), _i(hi) if not isinstance(hi, int) else _c(hi)))
    return cond


def _clamp(e: Any, n: int, lo: bool, hi: bool) -> Any:
    if lo:
        e = sympy.Max(e, 0)
    if hi:
        e = sympy.Min(e, n - 1)
    return e


class _Taps:
    """The positions ``o*s - p + j*d`` (j < k) of a window along one dim of size ``n``, for the
    outputs ``o < n_out``: which of them may leave the input (and need a clamp and a mask)."""

    def __init__(self, n: int, n_out: int, k: int, s: int, p: int, d: int):
        self.n, self.n_out, self.k, self.s, self.p, self.d = n, n_out, k, s, p, d
        self.low = [j * d - p < 0 for j in range(k)]
        self.high = [(n_out - 1) * s - p + j * d >= n for j in range(k)]

        # padding stored around the input (see _padded): taps read it at pos + lo, no masks
        self.lo = p if any(self.low) else 0
        self.hi = max(0, (n_out - 1) * s - p + (k - 1) * d + 1 - n)
        self.stored_pad = False

    def pos(self, o: Any, j: int) -> Any:
        return o * self.s - self.p + j * self.d

    def index(self, o: Any, j: int) -> Any:
        if self.stored_pad:
            return self.pos(o, j) + self.lo
        return _clamp(self.pos(o, j), self.n, self.low[j], self.high[j])

    def valid(self, o: Any, j: int, always: bool = False) -> Any:
        if not (self.low[j] or self.high[j]) or (self.stored_pad and not always):
            return None
        return _in_range(self.pos(o, j), 0 if self.low[j] else None,
                         self.n if self.high[j] else None)

    def first(self, o: Any) -> Any:
        """The first tap inside the input (an ops int64 value): ATen's initial max index."""
        if not any(self.low):
            return _i(self.pos(o, 0))
        out = _i(_clamp(self.pos(o, self.k - 1), self.n, self.low[-1], self.high[-1]))
        for j in reversed(range(self.k - 1)):
            v = self.valid(o, j, always=True)
            out = ops.where(v, _i(self.pos(o, j)), out) if v is not None else _i(self.pos(o, j))
        return out


def _padded(x: Any, th: _Taps, tw: _Taps, fill: float) -> Any:
    """``x`` stored with the windows' padding around it (``fill``: -inf for max, 0 for sums) when
    some tap can leave the input: the pooling kernel then reads every tap unmasked. (Clamped
    loads and selects on conditions that do not move along the channels left gcc's loop scalar:
    4-11x slower than ATen's kernel.) Returns the loader the taps read through."""
    if not (th.lo or th.hi or tw.lo or tw.hi):
        return x.make_loader()
    size = list(x.get_size())
    psize = size[:-2] + [size[-2] + th.lo + th.hi, size[-1] + tw.lo + tw.hi]
    ld = x.make_loader()
    dt = x.dtype

    def inner(idx: Sequence[Any]) -> Any:
        ih, iw = idx[-2] - th.lo, idx[-1] - tw.lo
        cond = None
        if th.lo or th.hi:
            cond = _in_range(ih, 0, th.n)
        if tw.lo or tw.hi:
            cond = _and(cond, _in_range(iw, 0, tw.n))
        # a load at the index clamped into the input, then a select: no branch in the loop
        # (a masked load's ``if`` left this copy scalar)
        sub = list(idx[:-2]) + [_clamp(ih, th.n, bool(th.lo), bool(th.hi)),
                                _clamp(iw, tw.n, bool(tw.lo), bool(tw.hi))]
        return ops.where(cond, ld(sub), ops.constant(fill, dt))

    pw = Pointwise(x.device, dt, psize, inner, x.op_count() + 3, origins=["pool_padding"])
    g = current()
    stride = None
    if len(psize) == 4 and (getattr(g, "layout_plan", None) is not None or _channels_last(x)):
        from ..layout import channels_last_stride
        stride = list(channels_last_stride(psize))
    th.stored_pad = tw.stored_pad = True
    return g.realize(pw, stride).make_loader()


def _bordered(x: Any, dtype: torch.dtype, lo_h: int, hi_h: int, lo_w: int, hi_w: int,
              fill: Any) -> Any:
    """``x`` (cast to ``dtype``) stored with ``fill`` around its last two dims; its loader."""
    size = list(x.get_size())
    H, W = size[-2], size[-1]
    psize = size[:-2] + [H + lo_h + hi_h, W + lo_w + hi_w]
    ld = x.make_loader()

    def inner(idx: Sequence[Any]) -> Any:
        ih, iw = idx[-2] - lo_h, idx[-1] - lo_w
        cond = _and(_in_range(ih, 0, H) if lo_h or hi_h else None,
                    _in_range(iw, 0, W) if lo_w or hi_w else None)
        v = ld(list(idx[:-2]) + [_clamp(ih, H, bool(lo_h), bool(hi_h)),
                                 _clamp(iw, W, bool(lo_w), bool(hi_w))])
        if x.dtype != dtype:
            v = ops.to_dtype(v, dtype)
        return ops.where(cond, v, ops.constant(fill, dtype)) if cond is not None else v

    pw = Pointwise(x.device, dtype, psize, inner, x.op_count() + 3, origins=["pool_border"])
    stride = None
    g = current()
    if len(psize) == 4 and (getattr(g, "layout_plan", None) is not None or _channels_last(x)):
        from ..layout import channels_last_stride
        stride = list(channels_last_stride(psize))
    return g.realize(pw, stride).make_loader()


def _channels_last(x: Any) -> bool:
    lay = getattr(x, "layout", None)
    if lay is None or len(lay.size) != 4:
        return False
    n, c, h, w = lay.size
    return c != 1 and lay.stride[1] == 1 and (h * w == 1 or lay.stride[-1] == c)


def _geometry(x: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any
              ) -> tuple[list[int], int, int, int, int, list[int], list[int], list[int], list[int]]:
    size = _static(x)
    k = _ints(kernel_size)
    s = _ints(stride, default=k)
    p = _ints(padding)
    d = _ints(dilation)
    if min(k) < 1 or min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise Unsupported("invalid pooling parameters")  # eager raises; let ATen say so
    out = shape_of(meta()[0] if isinstance(meta(), (list, tuple)) else meta())
    if not all(isinstance(v, int) for v in out):
        raise Unsupported("pooling with symbolic sizes")
    return size, size[-2], size[-1], out[-2], out[-1], k, s, p, d


def _shared(x: Any, reads: float) -> Any:
    """``x`` stored first when each of its elements would be computed ``reads`` times by the
    windows reading it lazily (overlapping windows over an expensive pointwise value), or when
    it is itself a window of loads (pooling of pooling: the second kernel would do all the work
    over few outputs, too few for the parallel loop)."""
    if not isinstance(x, Pointwise):
        return x
    if x.op_count() * max(reads - 1, 0) <= 4 and x.op_count() <= 8:
        return x
    g = current()
    plan = getattr(g, "layout_plan", None)
    size = x.get_size()
    stride = None
    if plan is not None and len(size) == 4 and x.dtype in (torch.float32, torch.float64):
        from ..layout import channels_last_stride
        stride = list(channels_last_stride(size))
    return g.realize(x, stride)


def _reads(k: Sequence[int], s: Sequence[int], d: Sequence[int] = (1, 1)) -> float:
    """How many windows read one input element, about."""
    out = 1.0
    for k_, s_, d_ in zip(k, s, d):
        out *= max(1.0, k_ / s_) if d_ == 1 or k_ == 1 else float(-(-k_ // s_))
    return out


def _pointwise(x: Any, dtype: torch.dtype, ranges: Sequence[Any], fn: Callable[[Any], Any],
               cost: int, origin: str) -> Pointwise:
    return Pointwise(x.device, dtype, list(ranges), fn, cost, origins=[origin])


# -- max pooling -------------------------------------------------------------------------------------
@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0,
                            dilation: Any = 1, ceil_mode: bool = False) -> Any:
    size, H, W, OH, OW, k, s, p, d = _geometry(x, kernel_size, stride, padding, dilation)
    calc = _calc_dtype(x.dtype)
    if k[0] * k[1] > UNROLL_LIMIT:
        raise Unsupported(f"max pooling window of {k[0] * k[1]} elements")
    x = _shared(x, _reads(k, s, d))
    th, tw = _Taps(H, OH, k[0], s[0], p[0], d[0]), _Taps(W, OW, k[1], s[1], p[1], d[1])
    ld = _padded(x, th, tw, float("-inf"))
    out_size = list(size[:-2]) + [OH, OW]
    neg_inf = float("-inf")
    dt = x.dtype

    def taps(idx: Sequence[Any]) -> Any:
        lead, oh, ow = list(idx[:-2]), idx[-2], idx[-1]
        for jh in range(k[0]):
            for jw in range(k[1]):
                v = ld(lead + [th.index(oh, jh), tw.index(ow, jw)])
                if calc != dt:
                    v = ops.to_dtype(v, calc)
                valid = _and(th.valid(oh, jh), tw.valid(ow, jw))
                if valid is not None:
                    v = ops.where(valid, v, ops.constant(neg_inf, calc))
                yield jh, jw, v

    def values(idx: Sequence[Any]) -> Any:
        m = None
        for _, _, v in taps(idx):
            m = v if m is None else _max(m, v)
        return ops.to_dtype(m, dt) if calc != dt else m

    def indices(idx: Sequence[Any]) -> Any:
        oh, ow = idx[-2], idx[-1]
        m = ops.constant(neg_inf, calc)
        at = ops.add(ops.mul(th.first(oh), _c(W)), tw.first(ow))
        for jh, jw, v in taps(idx):
            # ATen's ``v > m || isnan(v)``, as selects (a branch-free loop body vectorizes)
            here = _i(th.pos(oh, jh) * W + tw.pos(ow, jw))
            gt = ops.gt(v, m)
            m, at = ops.where(gt, v, m), ops.where(gt, here, at)
            nan = ops.isnan(v)
            m, at = ops.where(nan, v, m), ops.where(nan, here, at)
        return at

    n = k[0] * k[1]
    return (_pointwise(x, dt, out_size, values, x.op_count() * n + 2 * n, "max_pool2d"),
            _pointwise(x, torch.int64, out_size, indices, x.op_count() * n + 5 * n,
                       "max_pool2d"))


def _max(m: Any, v: Any) -> Any:
    """The running max of a window: NaN propagates, ties keep ``m`` (ATen's strict ``>``).
    Selects only: gcc leaves a loop scalar when an ``||`` (``e_max``'s) sits in a chain of them."""
    r = ops.where(ops.ge(m, v), m, v)  # v when v is NaN
    return ops.where(ops.isnan(m), m, r)


def _candidates(n_in: int, n_out: int, k: int, s: int, p: int, d: int) -> int:
    """How many outputs' windows (taps ``o*s - p + j*d``) can hold one input position."""
    return ((k - 1) * d) // s + 1


def _out_positions(i: Any, n_out: int, k: int, s: int, p: int, d: int, n: int
                   ) -> list[tuple[Any, Any, Any]]:
    """The outputs ``o`` whose window's span ``[o*s - p, o*s - p + (k-1)*d]`` holds input position
    ``i`` (of ``n``), ascending: (o clamped into [0, n_out), validity predicate or None, o).
    Bounds that hold for every ``i`` are neither clamped nor checked."""
    c = _candidates(0, n_out, k, s, p, d)
    hi = FloorDiv(i + p, s)  # the last output whose window starts at or before i
    out = []
    for j in range(c):
        m = c - 1 - j
        o = hi - m
        low = p // s - m < 0  # o < 0 for some i
        high = (n - 1 + p) // s - m > n_out - 1  # o >= n_out for some i
        conds = None
        if low:
            conds = _and(conds, ops.ge(_i(o), _c(0)))
        if high:
            conds = _and(conds, ops.lt(_i(o), _c(n_out)))
        out.append((_clamp(o, n_out, low, high), conds, o))
    return out


@register(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad: Any, x: Any, kernel_size: Any, stride: Any,
                                     padding: Any, dilation: Any, ceil_mode: bool,
                                     indices: Any) -> Any:
    size = _static(x)
    H, W = size[-2], size[-1]
    k = _ints(kernel_size)
    s = _ints(stride, default=k)
    p = _ints(padding)
    d = _ints(dilation)
    OH, OW = [int(v) for v in grad.get_size()[-2:]]
    calc = _calc_dtype(grad.dtype)
    ch, cw = _candidates(H, OH, k[0], s[0], p[0], d[0]), _candidates(W, OW, k[1], s[1], p[1], d[1])
    if ch * cw > GATHER_LIMIT:
        raise Unsupported("max pooling backward over many overlapping windows")
    if indices.dtype != torch.int64:
        raise Unsupported("indices dtype")
    reads = ch * cw * (H * W) / (OH * OW)
    grad, indices = _shared(grad, reads), _shared(indices, reads)
    dt = meta().dtype
    # candidate outputs outside [0, OH) x [0, OW): the gradient and the indices are stored with
    # a border around them (-0.0 and -1, an index no element has), so that the gather reads
    # every candidate unmasked (clamped loads of the indices left the loop scalar)
    lo_h, lo_w = max(0, ch - 1 - p[0] // s[0]), max(0, cw - 1 - p[1] // s[1])
    hi_h = max(0, (H - 1 + p[0]) // s[0] - (OH - 1))
    hi_w = max(0, (W - 1 + p[1]) // s[1] - (OW - 1))
    if lo_h or lo_w or hi_h or hi_w:
        gl = _bordered(grad, calc, lo_h, hi_h, lo_w, hi_w, -0.0)
        il = _bordered(indices, torch.int64, lo_h, hi_h, lo_w, hi_w, -1)
        offset = (lo_h, lo_w)
        g_dtype = calc
    else:
        gl, il = grad.make_loader(), indices.make_loader()
        offset = None
        g_dtype = grad.dtype

    def cands(i: Any, n_out: int, k_: int, s_: int, p_: int, d_: int, n: int, lo: int) -> Any:
        if offset is None:
            return _out_positions(i, n_out, k_, s_, p_, d_, n)
        return [(o + lo, None, o) for _, _, o in _out_positions(i, n_out, k_, s_, p_, d_, n)]

    def inner(idx: Sequence[Any]) -> Any:
        lead, ih, iw = list(idx[:-2]), idx[-2], idx[-1]
        me = _i(ih * W + iw)
        acc = ops.constant(0, calc)
        for oh, vh, _ in cands(ih, OH, k[0], s[0], p[0], d[0], H, lo_h):
            for ow, vw, _ in cands(iw, OW, k[1], s[1], p[1], d[1], W, lo_w):
                take = _and(_and(vh, vw), ops.eq(il(lead + [oh, ow]), me))
                g = gl(lead + [oh, ow])
                if g_dtype != calc:
                    g = ops.to_dtype(g, calc)
                # +0.0 (the sum starts at +0.0, so it never is -0.0): gcc vectorized this gather
                # with 0.0f, not with -0.0f (the padded copies are the other way round)
                acc = ops.add(acc, ops.where(take, g, ops.constant(0.0, calc)))
        return ops.to_dtype(acc, dt) if calc != dt else acc

    return _pointwise(grad, dt, size, inner, 4 * ch * cw + grad.op_count() + indices.op_count(),
                      "max_pool2d_backward")


# -- average pooling ---------------------------------------------------------------------------------
def _avg_divisor(oh: Any, ow: Any, H: int, W: int, OH: int, OW: int, k: list[int], s: list[int],
                 p: list[int], ceil_mode: bool, count_include_pad: bool,
                 divisor_override: Any) -> Any:
    """ATen's divisor of output (oh, ow) as an index expression (an int, when it is one)."""
    if divisor_override is not None:
        return int(divisor_override)

    def span(o: Any, n: int, n_out: int, k_: int, s_: int, p_: int) -> Any:
        start = o * s_ - p_
        # the window clipped to the padded input: only the last windows can overhang it
        over = (n_out - 1) * s_ - p_ + k_ > n + p_
        end = sympy.Min(start + k_, n + p_) if over else start + k_
        if count_include_pad:
            return end - start
        lo = sympy.Max(start, 0) if p_ > 0 else start
        hi = sympy.Min(end, n) if ((n_out - 1) * s_ - p_ + k_ > n) else end
        return hi - lo

    return sympy.expand(span(oh, H, OH, k[0], s[0], p[0])) * sympy.expand(
        span(ow, W, OW, k[1], s[1], p[1]))


@register(aten.avg_pool2d.default)
def avg_pool2d(x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Any = None) -> Any:
    size, H, W, OH, OW, k, s, p, _ = _geometry(x, kernel_size, stride, padding, 1)
    calc = _calc_dtype(x.dtype)
    if k[0] * k[1] > UNROLL_LIMIT:
        raise Unsupported(f"average pooling window of {k[0] * k[1]} elements")
    if divisor_override is not None and (not isinstance(divisor_override, int)
                                         or divisor_override == 0):
        raise Unsupported("divisor_override")
    x = _shared(x, _reads(k, s))
    th, tw = _Taps(H, OH, k[0], s[0], p[0], 1), _Taps(W, OW, k[1], s[1], p[1], 1)
    # -0.0: adding it changes nothing (the sum starts at +0.0 as ATen's), and gcc leaves a
    # loop with ``c ? x : 0.0f`` scalar (it does vectorize ``c ? x : -0.0f``)
    ld = _padded(x, th, tw, -0.0)
    out_size = list(size[:-2]) + [OH, OW]
    dt = x.dtype

    def inner(idx: Sequence[Any]) -> Any:
        lead, oh, ow = list(idx[:-2]), idx[-2], idx[-1]
        acc = ops.constant(0.0, calc)
        for jh in range(k[0]):
            for jw in range(k[1]):
                v = ld(lead + [th.index(oh, jh), tw.index(ow, jw)])
                if calc != dt:
                    v = ops.to_dtype(v, calc)
                valid = _and(th.valid(oh, jh), tw.valid(ow, jw))
                if valid is not None:
                    v = ops.where(valid, v, ops.constant(-0.0, calc))
                acc = ops.add(acc, v)
        div = _avg_divisor(oh, ow, H, W, OH, OW, k, s, p, ceil_mode, count_include_pad,
                           divisor_override)
        dv = ops.constant(int(div), calc) if isinstance(div, int) or getattr(
            div, "is_Integer", False) else ops.to_dtype(_i(div), calc)
        out = ops.truediv(acc, dv)
        return ops.to_dtype(out, dt) if calc != dt else out

    n = k[0] * k[1]
    return _pointwise(x, dt, out_size, inner, x.op_count() * n + 2 * n + 2, "avg_pool2d")


@register(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad: Any, x: Any, kernel_size: Any, stride: Any, padding: Any,
                        ceil_mode: bool, count_include_pad: bool, divisor_override: Any) -> Any:
    size = _static(x)
    H, W = size[-2], size[-1]
    k = _ints(kernel_size)
    s = _ints(stride, default=k)
    p = _ints(padding)
    OH, OW = [int(v) for v in grad.get_size()[-2:]]
    calc = _calc_dtype(grad.dtype)
    if divisor_override is not None and (not isinstance(divisor_override, int)
                                         or divisor_override == 0):
        raise Unsupported("divisor_override")
    ch, cw = _candidates(H, OH, k[0], s[0], p[0], 1), _candidates(W, OW, k[1], s[1], p[1], 1)
    if ch * cw > GATHER_LIMIT:
        raise Unsupported("average pooling backward over many overlapping windows")
    dt = meta().dtype
    gl0 = grad.make_loader()
    lead_size = list(grad.get_size()[:-2])

    # each output's gradient divided by its divisor (as ATen does before adding it to every
    # element of the window), stored with zeros around it: the gather then reads every
    # candidate output unmasked
    lo_h, lo_w = ch - 1, cw - 1
    hi_h = max(0, (H - 1 + p[0]) // s[0] - (OH - 1))
    hi_w = max(0, (W - 1 + p[1]) // s[1] - (OW - 1))

    def scaled(idx: Sequence[Any]) -> Any:
        oh, ow = idx[-2] - lo_h, idx[-1] - lo_w
        cond = _and(_in_range(oh, 0, OH) if lo_h or hi_h else None,
                    _in_range(ow, 0, OW) if lo_w or hi_w else None)

        def body() -> Any:
            g = gl0(list(idx[:-2]) + [_clamp(oh, OH, bool(lo_h), bool(hi_h)),
                                      _clamp(ow, OW, bool(lo_w), bool(hi_w))])
            if grad.dtype != calc:
                g = ops.to_dtype(g, calc)
            div = _avg_divisor(oh, ow, H, W, OH, OW, k, s, p, ceil_mode, count_include_pad,
                               divisor_override)
            dv = ops.constant(int(div), calc) if isinstance(div, int) or getattr(
                div, "is_Integer", False) else ops.to_dtype(_i(div), calc)
            return ops.truediv(g, dv)
        if cond is None:
            return body()
        return ops.where(cond, body(), ops.constant(-0.0, calc))

    psize = lead_size + [OH + lo_h + hi_h, OW + lo_w + hi_w]
    sp = Pointwise(grad.device, calc, psize, scaled, grad.op_count() + 4,
                   origins=["avg_pool2d_backward"])
    stride = None
    if len(psize) == 4 and (getattr(current(), "layout_plan", None) is not None
                            or _channels_last(grad)):
        from ..layout import channels_last_stride
        stride = list(channels_last_stride(psize))
    gl = current().realize(sp, stride).make_loader()

    def covers(i: Any, o: Any, k_: int, s_: int, p_: int) -> Any:
        # output o's window [o*s - p, o*s - p + k) holds i (o <= (i + p) // s: it starts at or
        # before i)
        return ops.lt(_i(i), _i(o * s_ - p_ + k_))

    def inner(idx: Sequence[Any]) -> Any:
        lead, ih, iw = list(idx[:-2]), idx[-2], idx[-1]
        acc = ops.constant(0, calc)
        for _, _, rh in _out_positions(ih, OH, k[0], s[0], p[0], 1, H):
            vh = covers(ih, rh, k[0], s[0], p[0]) if ch > 1 or k[0] < s[0] else None
            for _, _, rw in _out_positions(iw, OW, k[1], s[1], p[1], 1, W):
                vw = covers(iw, rw, k[1], s[1], p[1]) if cw > 1 or k[1] < s[1] else None
                g = gl(lead + [rh + lo_h, rw + lo_w])
                valid = _and(vh, vw)
                if valid is not None:
                    g = ops.where(valid, g, ops.constant(0.0, calc))
                acc = ops.add(acc, g)
        return ops.to_dtype(acc, dt) if calc != dt else acc

    return _pointwise(grad, dt, size, inner, 4 * ch * cw + grad.op_count(), "avg_pool2d_backward")


# -- adaptive average pooling ------------------------------------------------------------------------
def _start(o: Any, n: int, n_out: int) -> Any:
    return FloorDiv(o * n, n_out) if n % n_out else o * (n // n_out)


def _end(o: Any, n: int, n_out: int) -> Any:
    return FloorDiv((o + 1) * n + n_out - 1, n_out) if n % n_out else (o + 1) * (n // n_out)


def _max_window(n: int, n_out: int) -> int:
    return max((((o + 1) * n + n_out - 1) // n_out) - (o * n) // n_out for o in range(n_out))


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x: Any, output_size: Any) -> Any:
    size = _static(x)
    H, W = size[-2], size[-1]
    OH, OW = _ints(output_size)
    if OH < 1 or OW < 1:
        raise Unsupported("empty adaptive pooling output")
    calc = _calc_dtype(x.dtype)
    kh, kw = _max_window(H, OH), _max_window(W, OW)
    x = _shared(x, (kh * OH / H) * (kw * OW / W))
    ld = x.make_loader()
    out_size = list(size[:-2]) + [OH, OW]
    dt = x.dtype
    ragged_h, ragged_w = H % OH != 0, W % OW != 0

    def tap(lead: Any, oh: Any, ow: Any, jh: Any, jw: Any) -> Any:
        hs, ws = _start(oh, H, OH), _start(ow, W, OW)
        ih, iw = hs + jh, ws + jw
        if ragged_h:
            ih = sympy.Min(ih, H - 1)
        if ragged_w:
            iw = sympy.Min(iw, W - 1)
        v = ld(lead + [ih, iw])
        if calc != dt:
            v = ops.to_dtype(v, calc)
        valid = None
        if ragged_h:
            valid = ops.lt(_i(hs + jh), _i(_end(oh, H, OH)))
        if ragged_w:
            valid = _and(valid, ops.lt(_i(ws + jw), _i(_end(ow, W, OW))))
        if valid is not None:
            v = ops.where(valid, v, ops.constant(-0.0, calc))
        return v

    def divide(s_: Any, oh: Any, ow: Any) -> Any:
        def count(o: Any, n: int, n_out: int) -> Any:
            if n % n_out == 0:
                return ops.constant(n // n_out, calc)
            return ops.to_dtype(_i(_end(o, n, n_out) - _start(o, n, n_out)), calc)
        out = ops.truediv(ops.truediv(s_, count(oh, H, OH)), count(ow, W, OW))
        return ops.to_dtype(out, dt) if calc != dt else out

    if kh * kw <= UNROLL_LIMIT:
        def inner(idx: Sequence[Any]) -> Any:
            lead, oh, ow = list(idx[:-2]), idx[-2], idx[-1]
            acc = ops.constant(0.0, calc)
            for jh in range(kh):
                for jw in range(kw):
                    acc = ops.add(acc, tap(lead, oh, ow, jh, jw))
            return divide(acc, oh, ow)
        n = kh * kw
        return _pointwise(x, dt, out_size, inner, x.op_count() * n + 2 * n + 2,
                          "adaptive_avg_pool2d")

    if not ragged_h and not ragged_w:
        # equal windows (a global average): each element scaled by 1/(kh*kw) in float64 inside
        # the sum, which rounds once at the end (as layout.lower_mean): a division after the sum
        # in the same loop nest kept the reduction from running vectorized along the channels
        # (channels-last 32x32 -> 1: 0.29 ms vs ATen's 0.03)
        f64 = torch.float64
        scale = 1.0 / (kh * kw)

        def scaled(idx: Sequence[Any], ridx: Sequence[Any]) -> Any:
            v = tap(list(idx[:-2]), idx[-2], idx[-1], ridx[0], ridx[1])
            return ops.mul(ops.to_dtype(v, f64), ops.constant(scale, f64))

        red = Reduction(x.device, dt, out_size, [kh, kw], "sum", scaled, f64,
                        origins=["adaptive_avg_pool2d"])
        stride = None
        if len(out_size) == 4 and (getattr(current(), "layout_plan", None) is not None
                                   or _channels_last(x)):
            from ..layout import channels_last_stride
            stride = list(channels_last_stride(out_size))
        return current().realize(red, stride)

    # large ragged windows: a sum over the largest window, then the division
    def red_fn(idx: Sequence[Any], ridx: Sequence[Any]) -> Any:
        return tap(list(idx[:-2]), idx[-2], idx[-1], ridx[0], ridx[1])

    red = Reduction(x.device, calc, out_size, [kh, kw], "sum", red_fn, calc,
                    origins=["adaptive_avg_pool2d"])
    buf = current().realize(red)
    bl = buf.make_loader()
    return _pointwise(x, dt, out_size, lambda idx: divide(bl(idx), idx[-2], idx[-1]), 3,
                      "adaptive_avg_pool2d")


@register(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad: Any, x: Any) -> Any:
    size = _static(x)
    H, W = size[-2], size[-1]
    OH, OW = [int(v) for v in grad.get_size()[-2:]]
    calc = _calc_dtype(grad.dtype)
    dt = meta().dtype

    def n_cand(n: int, n_out: int) -> int:
        # outputs whose window holds input i: from start-of(i) on, while their window starts at
        # or before i
        best = 1
        for i in range(n):
            lo = (i * n_out) // n
            c = 0
            for o in range(lo, n_out):
                if (o * n) // n_out <= i:
                    c += 1
                else:
                    break
            best = max(best, c)
        return best

    ch, cw = n_cand(H, OH), n_cand(W, OW)
    if ch * cw > GATHER_LIMIT:
        raise Unsupported("adaptive pooling backward over many overlapping windows")
    grad = _shared(grad, ch * cw * (H * W) / (OH * OW))
    gl = grad.make_loader()

    def outs(i: Any, n: int, n_out: int, c: int) -> list[tuple[Any, Any]]:
        lo = FloorDiv(i, n // n_out) if n % n_out == 0 else FloorDiv(i * n_out, n)
        res = []
        for j in range(c):
            o = lo + j
            cond = None
            if j > 0:
                cond = _and(ops.lt(_i(o), _c(n_out)), ops.le(_i(_start(o, n, n_out)), _i(i)))
                o = sympy.Min(o, n_out - 1)
            res.append((o, cond))
        return res

    def count(o: Any, n: int, n_out: int) -> Any:
        if n % n_out == 0:
            return ops.constant(n // n_out, calc)
        return ops.to_dtype(_i(_end(o, n, n_out) - _start(o, n, n_out)), calc)

    def inner(idx: Sequence[Any]) -> Any:
        lead, ih, iw = list(idx[:-2]), idx[-2], idx[-1]
        acc = ops.constant(0.0, calc)
        for oh, vh in outs(ih, H, OH, ch):
            for ow, vw in outs(iw, W, OW, cw):
                g = gl(lead + [oh, ow])
                if grad.dtype != calc:
                    g = ops.to_dtype(g, calc)
                g = ops.truediv(ops.truediv(g, count(oh, H, OH)), count(ow, W, OW))
                valid = _and(vh, vw)
                if valid is not None:
                    g = ops.where(valid, g, ops.constant(-0.0, calc))
                acc = ops.add(acc, g)
        return ops.to_dtype(acc, dt) if calc != dt else acc

    return _pointwise(grad, dt, size, inner, 4 * ch * cw + grad.op_count(),
                      "adaptive_avg_pool2d_backward")
