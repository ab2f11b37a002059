"""Matrix multiplies whose sizes the GPU's fast kernels cannot take, padded where timing says so.

cuBLAS's tensor-core kernels want every operand's rows to start on 16-byte boundaries: a leading
dimension (the stride between rows) that is not a multiple of 8 half-precision or 4 single-
precision elements sends a product to slower kernels. GPT-2's vocabulary projection is the
classic case: ``[8192, 768] x [768, 50257]`` in bfloat16 writes rows of 50257 elements and ran
on an sm75 CUTLASS kernel at 6.6 ms on the H100 (eager, and Ember before this pass), where the
same product padded to 50264 columns takes 0.9 ms.

:func:`pad_matmuls` rewrites ``mm``/``addmm``/``bmm`` on CUDA tensors whose sizes are not
multiples of that alignment into the product of zero-padded operands, sliced back::

    mm(a, b)  ->  clone(slice(mm(pad(a), pad(b))))

Zeros add nothing to any dot product, so the sliced result holds the same sums (up to the
library's summation order, as any kernel choice). The pads and the ``clone`` are pointwise ops
for the lowering: the pads fuse into whatever produced the operands (under autocast, the cast
of the weight to bfloat16), and the ``clone`` -- whose metadata is the original product's, so
everything downstream keeps the geometry it was traced with -- fuses into the consumers, or is
stored in eager's strides where the result is a graph output.

Whether padding pays depends on the GPU, the library version and the sizes, not on a rule: each
product's two candidates (as traced, and padded with the pads' copies counted, and the copy back
to eager's strides where the graph returns the product) are timed with
CUDA events on random operands of the real geometry, once per GPU, driver, torch and Triton
version (:func:`ember_inductor.autotune.choose` with the GPU's key), and remembered on disk.
Products below :data:`UNTIMED_MACS` multiply-adds are left alone untimed (nothing to win that
would pay for the timing). Option ``pad_mm``: ``"auto"`` (default), ``"always"`` (tests: every
unaligned product on any device, untimed) or False. Static sizes only.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

__all__ = ["pad_matmuls", "UNTIMED_MACS"]

log = logging.getLogger("ember.inductor.padding")

aten = torch.ops.aten

_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: smaller products keep their kernel untimed
UNTIMED_MACS = 1 << 24
_BYTES = 16


def _static(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and all(
        isinstance(s, int) for s in (*v.shape, *v.stride(), v.storage_offset()))


def _plan(n: torch.fx.Node, forced: bool = False) -> tuple[int, int, int] | None:
    """(pad of M, pad of K, pad of N) for the product ``n``, or None to leave it alone: the
    sizes (and, for M, a column-major first operand's leading dimension) that are not
    multiples of the alignment are padded up to the next multiple. ``forced`` (option
    ``pad_mm="always"``, for tests): any device, any size."""
    if n.op != "call_function" or n.target not in _OPS or n.kwargs.get("out") is not None:
        return None
    a, b = n.args[-2], n.args[-1]
    vals = [x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in (a, b)]
    out = n.meta.get("val")
    if not all(_static(v) for v in (*vals, out)):
        return None
    av, bv = vals
    if av.dtype not in _DTYPES or bv.dtype != av.dtype:
        return None
    align = _BYTES // av.element_size()
    m, k = av.shape[-2:]
    nn = bv.shape[-1]
    if not forced and (av.device.type != "cuda"
                       or m * k * nn * (av.shape[0] if av.dim() == 3 else 1) < UNTIMED_MACS):
        return None

    def up(x: int) -> int:
        return -x % align

    pm = up(m) if av.stride(-2) == 1 and av.stride(-1) != 1 else 0
    pk, pn = up(k), up(nn)
    if n.target is aten.addmm.default:
        bias = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
        if not _static(bias) or bias.dim() > 2:
            return None
    return (pm, pk, pn) if (pm or pk or pn) else None


def _pad_list(v: torch.Tensor, rows: int, cols: int) -> list[int]:
    """constant_pad_nd's list for padding the last two dims of ``v`` (broadcast dims of size
    1, a bias's, are not padded)."""
    last = cols if v.shape[-1] != 1 else 0
    if v.dim() < 2:
        return [0, last]
    return [0, last, 0, rows if v.shape[-2] != 1 else 0]


def _padded(x: Any, rows: int, cols: int) -> Any:
    pads = _pad_list(x, rows, cols)
    return torch.nn.functional.pad(x, pads) if any(pads) else x


def _time_choice(n: torch.fx.Node, plan: tuple[int, int, int]) -> bool:
    """Is the padded product faster on this GPU (CUDA-event timing, cached per GPU)?"""
    from .autotune import choose, random_like
    from .runtime.triton import machine_key

    pm, pk, pn = plan
    metas = [x.meta["val"] for x in n.args]
    sig = (str(n.target), [tuple(v.shape) for v in metas], [tuple(v.stride()) for v in metas],
           str(metas[-1].dtype), plan, any(u.op == "output" for u in n.users))
    state: dict[str, Any] = {}

    def operands() -> list[torch.Tensor]:
        if not state:
            state["x"] = [random_like(v) for v in metas]
        return state["x"]

    op = n.target

    def direct() -> Any:
        return op(*operands())

    # a product the graph returns is stored back in eager's (unpadded, dense) strides: that
    # copy is the padded candidate's too (a consumer kernel otherwise reads the slice in place)
    returned = any(u.op == "output" for u in n.users)
    m_, n_ = metas[-2].shape[-2], metas[-1].shape[-1]

    def padded() -> Any:
        xs = operands()
        a, b = _padded(xs[-2], pm, pk), _padded(xs[-1], pk, pn)
        if op is aten.addmm.default:
            out = op(_padded(xs[0], pm, pn), a, b)
        else:
            out = op(a, b)
        return out[..., :m_, :n_].contiguous() if returned else out

    return choose("mm_pad", sig, {"direct": direct, "padded": padded}, default="direct",
                  device="cuda", machine_id=machine_key()) == "padded"


def pad_matmuls(gm: torch.fx.GraphModule, mode: Any = "auto") -> torch.fx.GraphModule:
    """``gm`` with the products that pay for it padded (see the module doc): a copy when any
    changed, else ``gm``."""
    if not mode:
        return gm
    plans = [(n, p) for n in gm.graph.nodes if (p := _plan(n, mode == "always")) is not None]
    if not plans:
        return gm
    if mode != "always":
        if not torch.cuda.is_available():  # traced with fake CUDA tensors: nothing to time
            return gm
        plans = [(n, p) for n, p in plans if _time_choice(n, p)]
        if not plans:
            return gm
    import copy

    new = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    by_name = {n.name: n for n in new.graph.nodes}
    for old, plan in plans:
        _rewrite(new.graph, by_name[old.name], plan)
    new.graph.lint()
    new.recompile()
    log.debug("padded %d matrix multiplies", len(plans))
    return new


def _rewrite(g: torch.fx.Graph, n: torch.fx.Node, plan: tuple[int, int, int]) -> None:
    pm, pk, pn = plan
    orig = n.meta["val"]

    def node(target: Any, args: tuple, val_args: tuple, kwargs: dict | None = None
             ) -> torch.fx.Node:
        out = g.call_function(target, args, kwargs or {})
        out.meta = {k: v for k, v in n.meta.items() if k != "val"}
        out.meta["val"] = target(*val_args, **(kwargs or {}))
        return out

    def pad(x: torch.fx.Node, rows: int, cols: int) -> torch.fx.Node:
        v = x.meta["val"]
        pads = _pad_list(v, rows, cols)
        if not any(pads):
            return x
        return node(aten.constant_pad_nd.default, (x, pads), (v, pads))

    with g.inserting_before(n):
        args = list(n.args)
        args[-2], args[-1] = pad(args[-2], pm, pk), pad(args[-1], pk, pn)
        if n.target is aten.addmm.default:
            args[0] = pad(args[0], pm, pn)
        vals = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
        prod = node(n.target, tuple(args), tuple(vals), dict(n.kwargs))
        out = prod
        rank = orig.dim()
        for dim, size, p in ((rank - 2, orig.shape[-2], pm), (rank - 1, orig.shape[-1], pn)):
            if p:
                out = node(aten.slice.Tensor, (out, dim, 0, size), (out.meta["val"], dim, 0, size))
        # the original product's geometry for everything downstream (a dense copy where the
        # lowering stores it; fused into consumers otherwise)
        out = node(aten.clone.default, (out,), (out.meta["val"],))
    if tuple(out.meta["val"].stride()) != tuple(orig.stride()):
        raise AssertionError(f"padded {n.target}: strides {out.meta['val'].stride()} where "
                             f"{orig.stride()} were traced")
    n.replace_all_uses_with(out)
    g.erase_node(n)
