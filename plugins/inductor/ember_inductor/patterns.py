"""Graph rewrites before lowering: attention written out by hand becomes one attention kernel,
and float32 matrix multiplies go to oneDNN where it is the faster library on this machine, by
timing (:func:`fuse_linears`).

``softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v`` reaches inductor, after AOT autograd's
decompositions, as two ``bmm`` calls on copies of q, k and v (``expand``/``clone``/``view`` into
3-d batches), a scaled ``_softmax`` in between, and a ``view`` of the result back to 4-d. On the
CPU that costs two matmul library calls, a softmax kernel over the whole ``[B, H, T, S]`` score
tensor and three copies; ATen's fused attention kernel
(``_scaled_dot_product_flash_attention_for_cpu``, the one ``F.scaled_dot_product_attention``
runs) reads q, k and v where they are (strided views of the projection's output) and never
stores the scores. :func:`fuse_attention` replaces the first by the second.

The rewrite is exact up to floating-point summation order (the fused kernel's online softmax).
It applies only where nothing else reads the intermediates (the scores, the probabilities, the
copies): in a training forward graph they are saved for the backward, so it leaves those alone.
Static shapes only; no mask, no dropout.
"""

from __future__ import annotations

import logging
import math
import operator
from typing import Any

import torch
import torch.fx

__all__ = ["fuse_attention", "fuse_linears", "linear_op", "onednn_chosen", "rewrite_graph",
           "flash_meta"]

log = logging.getLogger("ember.inductor.patterns")

aten = torch.ops.aten

_VIEW = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_CLONE = {aten.clone.default}
_EXPAND = {aten.expand.default}
#: view ops through which a tensor keeps its (meta) strides exactly in the lowering
_LAYOUT_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.permute.default,
                 aten.transpose.int, aten.t.default, aten.slice.Tensor, aten.select.int,
                 aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim,
                 aten.alias.default, operator.getitem, aten.split.Tensor,
                 aten.split_with_sizes.default}
_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def _static(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and all(isinstance(s, int) for s in t.shape) and all(
        isinstance(s, int) for s in t.stride())


def _only_user(n: torch.fx.Node, user: torch.fx.Node) -> bool:
    return len(n.users) == 1 and next(iter(n.users)) is user


def _call(n: Any, ops: set[Any]) -> bool:
    return isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target in ops


def _batched_4d(n3: Any, dead: list[torch.fx.Node]) -> torch.fx.Node | None:
    """The 4-d tensor ``[B, H, a, b]`` a 3-d bmm operand ``[B*H, a, b]`` was copied or viewed
    from (``view(clone(expand(x)))`` with each step optional but the view), or None."""
    if not _call(n3, _VIEW):
        return None
    v3 = _val(n3)
    chain = [n3]
    cur = n3.args[0]
    if _call(cur, _CLONE) and _only_user(cur, chain[-1]):
        mf = cur.kwargs.get("memory_format", torch.contiguous_format)
        if mf not in (torch.contiguous_format, torch.preserve_format):
            return None
        chain.append(cur)
        cur = cur.args[0]
    if _call(cur, _EXPAND) and _only_user(cur, chain[-1]):
        if list(_val(cur.args[0]).shape) != list(_val(cur).shape):
            return None  # a real broadcast (shared heads): not this pattern
        chain.append(cur)
        cur = cur.args[0]
    x4 = _val(cur)
    if not (_static(x4) and _static(v3)) or x4.dim() != 4 or v3.dim() != 3:
        return None
    if x4.shape[0] * x4.shape[1] != v3.shape[0] or list(x4.shape[2:]) != list(v3.shape[1:]):
        return None
    dead.extend(chain)
    return cur


def _lowered_as_meta(n: torch.fx.Node) -> bool:
    """Will the lowering give ``n`` the strides its meta value has? True when ``n`` is a chain
    of views over a graph input, an extern kernel's output or a value whose meta is contiguous
    (what a stored intermediate gets)."""
    cur = n
    while _call(cur, _LAYOUT_VIEWS):
        cur = cur.args[0]
    if not isinstance(cur, torch.fx.Node):
        return False
    if cur.op == "placeholder":
        return True
    v = _val(cur)
    if cur.op == "call_function" and (cur.target in (aten.addmm.default, aten.mm.default,
                                                     aten.bmm.default, FLASH)
                                      or cur.target is linear_op()):
        return True
    return isinstance(v, torch.Tensor) and v.is_contiguous()


def _unit_inner_stride(n: torch.fx.Node) -> bool:
    v = _val(n)
    return v.shape[-1] == 1 or v.stride(-1) == 1


def flash_meta(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``meta["val"]`` of the fused kernel's (output, logsumexp) for a query ``q`` (fake when
    ``q`` is): the output laid out like ``q`` (``empty_like``), logsumexp ``[B, H, T]`` stored as
    ``[B, T, H]``, as ATen's kernel allocates them."""
    b, h, t, _ = q.shape
    lse_dtype = torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.empty_like(q),
                torch.empty((b, t, h), dtype=lse_dtype, device=q.device).transpose(1, 2))

    mode = getattr(q, "fake_mode", None)
    if mode is not None:
        with mode:
            return make()
    return make()


def _same_geometry(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
                and a.device == b.device)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_geometry(x, y) for x, y in zip(a, b))
    return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor)


def _repropagate(root: torch.fx.Node, new_val: torch.Tensor) -> dict[torch.fx.Node, Any] | None:
    """The new ``meta["val"]`` of the views downstream of ``root`` when ``root``'s value gets
    ``new_val``'s strides; None when some op that is not a view would then produce another
    geometry than it was traced with (its consumers, and the lowering, rely on that)."""
    order = {n: i for i, n in enumerate(root.graph.nodes)}
    env: dict[torch.fx.Node, Any] = {root: new_val}
    todo = dict.fromkeys(root.users)
    updates: dict[torch.fx.Node, Any] = {}
    while todo:
        u = min(todo, key=order.__getitem__)
        del todo[u]
        if u.op != "call_function":
            return None

        def val(a: Any) -> Any:
            return env[a] if a in env else _val(a) if isinstance(a, torch.fx.Node) else a

        try:
            nv = u.target(*torch.fx.node.map_aggregate(u.args, val),
                          **torch.fx.node.map_aggregate(u.kwargs, val))
        except Exception:
            return None
        if u.target in _LAYOUT_VIEWS and u.target is not operator.getitem:
            env[u] = updates[u] = nv
            todo.update(dict.fromkeys(u.users))
        elif not _same_geometry(nv, _val(u)):
            return None
    return updates


def fuse_attention(gm: torch.fx.GraphModule) -> int:
    """Rewrite hand-written attention in ``gm`` (in place) into the fused attention kernel;
    returns how many were rewritten (the graph is recompiled when any was)."""
    g = gm.graph
    done = 0
    for bmm2 in list(g.nodes):
        if not (_call(bmm2, {aten.bmm.default}) and len(bmm2.users) == 1):
            continue
        out_view = next(iter(bmm2.users))
        dead: list[torch.fx.Node] = [bmm2]
        # probabilities: view(expand(_softmax(scores)))
        a3 = bmm2.args[0]
        if not _call(a3, _VIEW) or not _only_user(a3, bmm2):
            continue
        dead.append(a3)
        p = a3.args[0]
        if _call(p, _EXPAND) and _only_user(p, a3):
            if list(_val(p.args[0]).shape) != list(_val(p).shape):
                continue
            dead.append(p)
            p = p.args[0]
        if not (_call(p, {aten._softmax.default}) and len(p.users) == 1):
            continue
        pv = _val(p)
        if not _static(pv) or pv.dim() != 4 or p.args[1] not in (-1, 3) or p.args[2]:
            continue
        if pv.dtype not in _DTYPES:
            continue
        dead.append(p)
        s = p.args[0]
        scale = 1.0
        if _call(s, {aten.mul.Tensor, aten.div.Tensor}) and _only_user(s, p) \
                and isinstance(s.args[1], (int, float)) and not isinstance(s.args[1], bool):
            c = float(s.args[1])
            if s.target is aten.div.Tensor:
                if c == 0:
                    continue
                c = 1.0 / c
            scale = c
            dead.append(s)
            s = s.args[0]
        if not (_call(s, _VIEW) and _only_user(s, dead[-1]) and list(_val(s).shape)
                == list(pv.shape)):
            continue
        dead.append(s)
        bmm1 = s.args[0]
        if not (_call(bmm1, {aten.bmm.default}) and _only_user(bmm1, s)):
            continue
        dead.append(bmm1)
        q4 = _batched_4d(bmm1.args[0], dead)
        kt4 = _batched_4d(bmm1.args[1], dead)
        v4 = _batched_4d(bmm2.args[1], dead)
        if q4 is None or kt4 is None or v4 is None:
            continue
        qv, ktv, vv = _val(q4), _val(kt4), _val(v4)
        b, h, t, d = qv.shape
        sk = ktv.shape[3]
        if list(ktv.shape) != [b, h, d, sk] or list(vv.shape[:3]) != [b, h, sk] \
                or vv.shape[3] != d or list(pv.shape) != [b, h, t, sk]:
            continue
        if len({qv.dtype, ktv.dtype, vv.dtype, pv.dtype}) != 1:
            continue
        ov = _val(out_view)
        if not (_call(out_view, _VIEW) and _static(ov) and list(ov.shape) == [b, h, t, d]):
            continue
        # k itself: undo the transpose (a permute of a permute is the tensor it started from)
        k_src = None
        if _call(kt4, {aten.permute.default}) and list(kt4.args[1]) == [0, 1, 3, 2]:
            k_src = kt4.args[0]
        elif _call(kt4, {aten.transpose.int}) and sorted(
                a % 4 for a in kt4.args[1:3]) == [2, 3]:
            k_src = kt4.args[0]
        # the fused kernel reads its inputs with unit inner stride (it assumes it): make sure
        # the lowering gives them that layout
        if not all(_lowered_as_meta(n) for n in (q4, kt4, v4)):
            continue
        if not _unit_inner_stride(q4) or not _unit_inner_stride(v4):
            continue
        kv_strides = list(ktv.stride())
        if kv_strides[2] != 1 and ktv.shape[2] != 1:
            continue
        fused_val = flash_meta(qv)
        out_val = fused_val[0]
        updates = _repropagate(out_view, out_val)
        if updates is None and not ov.is_contiguous():
            continue
        with g.inserting_before(out_view):
            if k_src is None:
                k_src = g.call_function(aten.permute.default, (kt4, [0, 1, 3, 2]))
                k_src.meta["val"] = ktv.permute(0, 1, 3, 2)
            fused = g.call_function(FLASH, (q4, k_src, v4), {"scale": scale})
            # output [B, H, T, D] stored as [B, T, H, D]; logsumexp [B, H, T] stored as [B, T, H]
            fused.meta["val"] = fused_val
            out = g.call_function(operator.getitem, (fused, 0))
            out.meta["val"] = out_val
            if updates is None:
                # a consumer would see other strides than it was traced with: give it the
                # contiguous tensor the view was
                out = g.call_function(aten.clone.default, (out,),
                                      {"memory_format": torch.contiguous_format})
                out.meta["val"] = ov
        for n, v in (updates or {}).items():
            n.meta["val"] = v
        for n in [out, *(updates or {})]:
            # a copy into the layout the fused kernel's output already has (the heads merged
            # back, ``transpose(1, 2).reshape(b, t, d)``) is a view of it now
            for c in list(n.users):
                if _call(c, _CLONE) and _same_geometry(_val(c), _val(n)):
                    c.replace_all_uses_with(n)
                    g.erase_node(c)
        out_view.replace_all_uses_with(out)
        g.erase_node(out_view)
        order = {n: i for i, n in enumerate(g.nodes)}
        for n in sorted(set(dead), key=order.__getitem__, reverse=True):  # consumers first
            if not n.users:
                g.erase_node(n)
        done += 1
    if done:
        g.lint()
        gm.recompile()
        log.debug("fused %d hand-written attention(s) into %s", done, FLASH)
    return done


# -- matrix multiply through oneDNN -----------------------------------------------------------

def linear_op() -> Any:
    """oneDNN's linear kernel (``mkldnn._linear_pointwise``), or None where torch lacks it."""
    try:
        if not torch.backends.mkldnn.is_available():
            return None
        return torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        return None


def _weight_nk(b: torch.fx.Node, g: torch.fx.Graph) -> torch.fx.Node:
    """The ``[N, K]`` weight whose transpose is the ``[K, N]`` matmul operand ``b``: ``W`` itself
    when ``b`` is ``W.t()`` (a linear layer's weight), else a transposed view of ``b``."""
    if _call(b, {aten.t.default}) or (_call(b, {aten.permute.default})
                                      and list(b.args[1]) == [1, 0]):
        w = b.args[0]
        if isinstance(w, torch.fx.Node) and _static(_val(w)) and _val(w).dim() == 2:
            return w
    wt = g.call_function(aten.t.default, (b,))
    wt.meta["val"] = _val(b).t()
    return wt


#: products of at most this many multiply-adds stay on ATen's kernel untimed: they take a few
#: microseconds, where timer noise is larger than any difference (and oneDNN's fixed cost per
#: call, about 13 us, is more than their run time)
UNTIMED_MACS = 1 << 18


def _strided_random(meta: torch.Tensor) -> torch.Tensor:
    t = torch.empty_strided(tuple(meta.shape), tuple(meta.stride()), dtype=meta.dtype)
    return t.normal_()


def onednn_chosen(xv: torch.Tensor, bv: torch.Tensor, biasv: torch.Tensor | None,
                  attr: str = "none", algorithm: str = "") -> bool:
    """Is oneDNN's linear faster than ATen's ``addmm``/``mm`` (MKL's sgemm) on this machine for
    ``x @ b (+ bias)`` with these operands' sizes and strides (and a gelu after it when
    ``attr == "gelu"``: oneDNN's post-op against ATen's product then eager's gelu)?

    Decided by timing both on random operands of the real geometry, once per machine
    (:func:`ember_inductor.autotune.choose`, cached on disk by CPU model, ISA, thread count and
    torch version). No fixed rule holds across CPUs: on this project's AMD EPYC (AVX-512)
    oneDNN won by 10-40% from 64 rows on where both widths are >= 256 (gpt2's head ``[512, 256]
    x [256, 8192]``: 12 vs 21 ms), while on an Intel Xeon the same rule made a transformer block
    0.37x eager (oneDNN about 1.1 ms a call where sgemm was faster). Tiny products
    (:data:`UNTIMED_MACS`) keep ATen's kernel without timing."""
    from .autotune import choose

    m, k = xv.shape
    n = bv.shape[1]
    if m * k * n <= UNTIMED_MACS:
        return False
    op = linear_op()
    sig = ("linear_library", (m, k, n), tuple(xv.stride()), tuple(bv.stride()),
           biasv is not None, attr, algorithm)
    state: dict[str, Any] = {}

    def operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if not state:
            state["x"] = _strided_random(xv)
            state["b"] = _strided_random(bv)
            state["bias"] = (torch.randn(n, dtype=xv.dtype) if biasv is not None else None)
        return state["x"], state["b"], state["bias"]

    def aten_call() -> Any:
        x, b, bias = operands()
        y = torch.mm(x, b) if bias is None else torch.addmm(bias, x, b)
        if attr == "gelu":
            y = torch.nn.functional.gelu(y, approximate=algorithm or "none")
        return y

    def onednn_call() -> Any:
        x, b, bias = operands()
        return op(x, b.t(), bias, attr, [], algorithm)

    return choose("linear_library", sig, {"aten": aten_call, "onednn": onednn_call},
                  default="aten") == "onednn"


def _scalar_is(v: Any, c: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v - c) <= 1e-7 * abs(c)


def _mul_by(n: Any, x: Any, c: float) -> bool:
    """Is ``n`` ``x * c`` (either order)?"""
    if not (_call(n, {aten.mul.Tensor}) and len(n.args) == 2):
        return False
    a0, a1 = n.args
    return (a0 is x and _scalar_is(a1, c)) or (a1 is x and _scalar_is(a0, c))


def _tanh_gelu_chain(v: torch.fx.Node) -> torch.fx.Node | None:
    """The last node of ``0.5 * v * (1 + tanh(sqrt(2 / pi) * (v + 0.044715 * v ** 3)))`` (the
    tanh form of gelu as Hugging Face's ``gelu_new`` writes it) when ``v``'s readers are exactly
    that formula's and each step has one reader; else None."""
    users = list(v.users)
    if len(users) != 3:
        return None
    half = next((u for u in users if _mul_by(u, v, 0.5)), None)
    cube = next((u for u in users if _call(u, {aten.pow.Tensor_Scalar}) and u.args[0] is v
                 and _scalar_is(u.args[1], 3.0)), None)
    if half is None or cube is None or len(half.users) != 1 or len(cube.users) != 1:
        return None
    q = next(iter(cube.users))
    if not _mul_by(q, cube, 0.044715) or len(q.users) != 1:
        return None
    r = next(iter(q.users))
    if not (_call(r, {aten.add.Tensor}) and len(r.args) == 2 and set(r.args) == {v, q}
            and not r.kwargs and r in users and len(r.users) == 1):
        return None
    sc = next(iter(r.users))
    if not _mul_by(sc, r, math.sqrt(2.0 / math.pi)) or len(sc.users) != 1:
        return None
    t = next(iter(sc.users))
    if not (_call(t, {aten.tanh.default}) and len(t.users) == 1):
        return None
    one = next(iter(t.users))
    if not (_call(one, {aten.add.Tensor}) and len(one.args) == 2 and not one.kwargs
            and ((one.args[0] is t and _scalar_is(one.args[1], 1.0))
                 or (one.args[1] is t and _scalar_is(one.args[0], 1.0)))
            and len(one.users) == 1):
        return None
    out = next(iter(one.users))
    if not (_call(out, {aten.mul.Tensor}) and len(out.args) == 2
            and set(out.args) == {half, one} and _same_geometry(_val(out), _val(v))):
        return None
    return out


def _erase_unused(g: torch.fx.Graph, last: torch.fx.Node) -> None:
    """Erase ``last`` and, consumers first, every node feeding it that is left unread."""
    todo = [last]
    while todo:
        n = todo.pop()
        if n.users or n.op != "call_function":
            continue
        ins = n.all_input_nodes
        g.erase_node(n)
        todo.extend(ins)


def _sole_gelu(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, str] | None:
    """``(input, output, approximate)`` of the gelu that is the only reader of ``node``'s
    result, directly or through one reshaping view that has no other reader (a linear layer on
    3-d input: ``view(addmm)``): ``aten.gelu`` or the tanh form written out
    (:func:`_tanh_gelu_chain`)."""
    cur = node
    if len(cur.users) == 1:
        v = next(iter(cur.users))
        if _call(v, _VIEW) and v.args[0] is cur and _val(v) is not None:
            cur = v
    chain = _tanh_gelu_chain(cur)
    if chain is not None:
        return cur, chain, "tanh"
    if len(cur.users) != 1:
        return None
    act = next(iter(cur.users))
    if not (_call(act, {aten.gelu.default}) and act.args[0] is cur and len(act.args) == 1
            and set(act.kwargs) <= {"approximate"}
            and act.kwargs.get("approximate", "none") in ("none", "tanh")
            and _same_geometry(_val(act), _val(cur))):
        return None
    return cur, act, act.kwargs.get("approximate", "none")


def fuse_linears(gm: torch.fx.GraphModule, mode: Any = "auto") -> int:
    """Route float32 ``addmm(bias, x, B)`` / ``mm(x, B)`` to oneDNN's linear kernel
    (``mkldnn._linear_pointwise(x, B.t(), bias)``) where it is faster; returns how many were
    rewritten.

    Why: which of torch's default CPU matmul (MKL's sgemm, what ``addmm`` runs) and oneDNN is
    faster depends on the CPU and the sizes: ``mode="auto"`` rewrites where timing both on this
    machine says so (:func:`onednn_chosen`), ``mode="always"`` every eligible one. oneDNN computes the same product in another summation order (errors
    against float64 within 2-3x of sgemm's). Eligible: static 2-d float32 operands, a 1-d bias
    of the output's width that is a dense graph input, alpha = beta = 1; the result is a fresh
    contiguous tensor, as addmm's. A ``gelu`` that is the product's only reader becomes
    oneDNN's post-op (its error against float64 is eager's: oneDNN computes it on the float32
    result as well). A node whose
    ``meta["ember_linear"]`` is ``"aten"`` (max-autotune chose it) is left alone."""
    op = linear_op()
    if op is None:
        return 0
    g = gm.graph
    done = 0
    for node in list(g.nodes):
        if not _call(node, {aten.addmm.default, aten.mm.default}):
            continue
        if node.meta.get("ember_linear") == "aten":
            continue
        if node.target is aten.addmm.default:
            if len(node.args) != 3 or any(node.kwargs.get(k, 1) != 1 for k in ("alpha", "beta")):
                continue
            bias, x, b = node.args
            bv = _val(bias)
        else:
            if node.kwargs:
                continue
            bias, bv = None, None
            x, b = node.args
        xv, wv, yv = _val(x), _val(b), _val(node)
        if not all(_static(t) and t.dtype == torch.float32 and t.dim() == 2
                   for t in (xv, wv, yv)):
            continue
        m, k = xv.shape
        n = wv.shape[1]
        if min(m, k, n) == 0 or not yv.is_contiguous() or list(yv.shape) != [m, n]:
            continue
        # oneDNN reads the bias as contiguous whatever its strides (a strided one gave wrong
        # sums): only a graph input (whose layout the graph was traced with) laid out densely
        if bias is not None and not (isinstance(bias, torch.fx.Node) and bias.op == "placeholder"
                                     and _static(bv) and bv.dtype == torch.float32
                                     and list(bv.shape) == [n] and (n == 1 or bv.stride(0) == 1)):
            continue
        attr, algorithm, act = "none", "", _sole_gelu(node)
        if act is not None:
            # the activation as oneDNN's post-op, applied to each result in registers (gelu's
            # input has no other reader, so it is never stored: it is not a training forward)
            attr, algorithm = "gelu", act[2]
        if mode != "always" and not onednn_chosen(xv, wv, bv, attr, algorithm):
            continue
        with g.inserting_before(node):
            w = _weight_nk(b, g)
            new = g.call_function(op, (x, w, bias, attr, [], algorithm))
        new.meta["val"] = yv
        if act is not None:
            # gelu(view(mm)) -> view(mm with gelu): the view now reads the activated product
            act[1].replace_all_uses_with(act[0])
            _erase_unused(g, act[1])
        node.replace_all_uses_with(new)
        g.erase_node(node)
        done += 1
    if done:
        g.eliminate_dead_code()
        g.lint()
        gm.recompile()
        log.debug("routed %d matrix multiplies to %s", done, op)
    return done


def rewrite_graph(gm: torch.fx.GraphModule,
                  options: dict[str, Any] | None = None) -> torch.fx.GraphModule:
    """``gm`` with the rewrites above applied: a copy when anything changed, else ``gm``.
    Attention first: it recognizes its inputs by the ``addmm``/``mm`` that computed them.
    Option ``onednn_linear``: ``"auto"`` (default: where timing on this machine says oneDNN is
    faster),
    ``"always"``, or False (matrix multiplies stay on ``addmm``/``mm``)."""
    linear_mode = (options or {}).get("onednn_linear", "auto")
    if linear_mode is True:
        linear_mode = "always"
    mm = {aten.addmm.default, aten.mm.default} if linear_mode else set()
    if not any(_call(n, {aten._softmax.default} | mm) for n in gm.graph.nodes):
        return gm
    import copy

    new = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    changed = 0
    if any(_call(n, {aten._softmax.default}) for n in new.graph.nodes):
        changed += fuse_attention(new)
    if mm:
        changed += fuse_linears(new, linear_mode)
    return new if changed else gm
