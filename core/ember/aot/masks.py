"""Attention masks that mask nothing, dropped before AOT autograd traces the graph.

A model written for ``F.scaled_dot_product_attention`` often builds its mask from positions
alone. Hugging Face's masking utilities do so whenever they run under a compiler: in eager they
look at the padding mask's values and pass no mask when nothing is padded, but under
``torch.compiler.is_compiling()`` they cannot branch on values and pass a materialized mask, for
an encoder without padding ``(arange(q)[None, None, :, None] >= 0).expand(b, 1, q, k)``: all
True. ATen picks the attention kernel from the arguments, and such a mask costs much more than
its reading: on an H100 (bf16 autocast, BERT-base 16x512) eager ran cuDNN's flash attention,
while the traced graph with the mask (its last dim broadcast, stride 0, which the fused kernels
refuse) ran the math fallback, two float32 batched matrix multiplies and a softmax: BERT-base
inference 0.70x eager for Ember and 0.72x for torch.compile.

:func:`drop_constant_masks` evaluates a mask that depends on no graph input (only on constants:
``arange``/``ones``/``full`` of static sizes, comparisons, views) once at compile time, and
removes it where it changes nothing: a boolean mask that is all True, a float mask that is all
zero (``x + 0.0`` is ``x`` for every score; ``-0.0`` becomes ``+0.0``, which ``exp`` cannot
tell apart), and replaces one that is exactly SDPA's causal mask (the lower triangle of the
``[L, S]`` scores, top-left aligned, over every batch and head; boolean, or 0/-inf) by
``is_causal=True``: a decoder's mask under a compiler (GPT-2's, built from positions) then runs
the causal flash kernels, which skip the masked half, instead of a kernel reading a bias. The
rewrite is exact. With symbolic sizes (``dynamic=True``) the mask depends on a size and cannot
be computed once; bounds on its values prove the common all-True case for every size instead
(``arange(s) + 0 >= 0``: :func:`_bounds`). A mask computed from an input's values, from random or
uninitialized values, from a parameter or buffer (their values may change between calls), or
larger than :data:`MAX_ELEMENTS`, is left alone.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

__all__ = ["drop_constant_masks", "MAX_ELEMENTS"]

log = logging.getLogger("ember.aot")

#: the largest mask evaluated at compile time (elements of the tensors computed for it)
MAX_ELEMENTS = 1 << 24

_SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention,
         torch.ops.aten.scaled_dot_product_attention.default}
#: callables whose result is not a function of their arguments, or that change state: names
#: containing one of these, starting with one of the prefixes, or equal to one of the names
_IMPURE_PARTS = ("rand", "bernoulli", "dropout", "normal", "multinomial", "poisson",
                 "exponential", "uniform", "cauchy", "geometric", "empty", "seed", "grad",
                 "backward", "synchronize", "record")
_IMPURE_PREFIXES = ("set_", "_set")
_IMPURE_NAMES = {"item", "tolist", "numpy", "data_ptr", "print"}
_INPLACE_OPERATORS = {"iadd", "iand", "iconcat", "ifloordiv", "ilshift", "imatmul", "imod",
                      "imul", "ior", "ipow", "irshift", "isub", "itruediv", "ixor"}


def _name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", repr(target))


def _pure(n: torch.fx.Node) -> bool:
    if n.op not in ("call_function", "call_method"):
        return False
    name = _name(n.target)
    operator_module = getattr(n.target, "__module__", "") in ("_operator", "operator")
    if operator_module:
        if name in _INPLACE_OPERATORS or name in ("setitem", "delitem"):
            return False  # (operator.and_ and or_ are not in place)
    elif name.endswith("_") and not name.endswith("__"):
        return False  # an in-place op
    if n.op == "call_function" and not (
            operator_module or (getattr(n.target, "__module__", None) or "").startswith("torch")
            or n.target in (getattr,)):
        return False  # a Python function the capture kept: it may do anything
    if "out" in n.kwargs:
        return False
    schema = getattr(n.target, "_schema", None)  # an ATen op the user called: "add_.Tensor"
    if schema is not None and getattr(schema, "is_mutable", False):
        return False
    return not (any(p in name for p in _IMPURE_PARTS) or name.startswith(_IMPURE_PREFIXES)
                or name in _IMPURE_NAMES)


def _constant_value(root: torch.fx.Node, position: dict[torch.fx.Node, int]) -> Any:
    """The value of ``root`` when it depends on constants only (evaluated here), else None.
    ``position``: each node's place in the graph (the order to evaluate in)."""
    order: list[torch.fx.Node] = []
    seen: set[torch.fx.Node] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if not _pure(n):
            return None
        shape = _shape(n)
        if shape is not None and math.prod(shape) > MAX_ELEMENTS:
            return None  # not computed here: too large (a broadcast view counts in full)
        order.append(n)
        stack.extend(n.all_input_nodes)
    env: dict[torch.fx.Node, Any] = {}
    for n in sorted(order, key=position.__getitem__):
        args = torch.fx.node.map_arg(n.args, env.__getitem__)
        kwargs = torch.fx.node.map_arg(n.kwargs, env.__getitem__)
        try:
            with torch.no_grad():
                if n.op == "call_method":
                    v = getattr(args[0], n.target)(*args[1:], **kwargs)
                else:
                    v = n.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - not evaluable here: leave the mask alone
            return None
        if isinstance(v, torch.Tensor) and (v.layout != torch.strided
                                            or v.untyped_storage().nbytes()
                                            > MAX_ELEMENTS * 8):
            return None
        env[n] = v
    return env[root]


def _shape(n: Any) -> tuple[int, ...] | None:
    v = n.meta.get("example_value", n.meta.get("val")) if isinstance(n, torch.fx.Node) else None
    if isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape):
        return tuple(v.shape)
    return None


def _kind(v: Any, q: tuple[int, ...] | None, k: tuple[int, ...] | None) -> str | None:
    """"none" for a mask that masks nothing, "causal" for exactly SDPA's ``is_causal`` mask
    (top-left aligned lower triangle of the [L, S] scores, over every batch and head), else
    None."""
    if not isinstance(v, torch.Tensor) or v.dim() < 2 or q is None or k is None:
        return None
    if v.dim() > len(q) or any(m not in (1, d) for m, d in zip(v.shape[-3::-1],
                                                               q[-3::-1])):
        return None  # the mask would broadcast the result to more dims: keep it
    if v.dtype == torch.bool:
        if bool(v.all()):
            return "none"
        keep = v
    elif v.is_floating_point():
        if not bool(v.any()):
            return "none"  # all zero (either sign): x + 0.0 leaves every score's softmax as is
        finite = torch.isfinite(v)
        if bool((v[finite] != 0).any()) or bool((v[~finite] != float("-inf")).any()):
            return None
        keep = finite  # 0 where kept, -inf where masked: exactly a boolean mask
    else:
        return None
    L, S = q[-2], k[-2]
    if tuple(keep.shape[-2:]) != (L, S):
        return None
    causal = torch.ones(L, S, dtype=torch.bool, device=keep.device).tril()
    return "causal" if bool((keep == causal).all()) else None


# -- masks with symbolic sizes: all True for every size --------------------------------------
#
# With dynamic shapes the mask depends on a size (``arange(s)``) and cannot be computed once.
# A small abstract interpretation proves the common case instead: every value of a node is
# bounded (integers: a range [lo, hi]) or, for a boolean node, True everywhere. ``arange`` with a
# non-negative start is >= that start; adding a bounded value shifts the bounds; indexing,
# broadcasting and views keep them; a comparison whose bounds decide it is True everywhere;
# ``&`` of two such, ``|`` with one such; ``ones``/``new_ones``/``full(.., True)`` of bool.

_SAME_VALUES = {"expand", "expand_as", "view", "reshape", "unsqueeze", "squeeze", "permute",
                "transpose", "contiguous", "clone", "flatten", "unflatten", "broadcast_to",
                "getitem", "detach", "alias", "repeat", "narrow", "select", "t"}
_CMP = {"ge": lambda a, b: a[0] >= b[1], "gt": lambda a, b: a[0] > b[1],
        "le": lambda a, b: a[1] <= b[0], "lt": lambda a, b: a[1] < b[0]}
_INF = float("inf")


def _bounds(x: Any, memo: dict[Any, Any]) -> Any:
    """``True`` for a boolean node that is True everywhere, ``(lo, hi)`` for a number or an
    integer node whose values are bounded so, else None."""
    if isinstance(x, bool):
        return True if x else None
    if isinstance(x, (int, float)):
        return (x, x)
    if not isinstance(x, torch.fx.Node):
        return None
    if x in memo:
        return memo[x]
    memo[x] = None  # (no cycles in a graph; a guard all the same)
    memo[x] = out = _bounds_of(x, memo)
    return out


def _bounds_of(n: torch.fx.Node, memo: dict[Any, Any]) -> Any:
    if n.op not in ("call_function", "call_method"):
        return None
    name = _name(n.target)
    args = n.args
    if name in _SAME_VALUES and args:
        if any(isinstance(a, torch.dtype) for a in (*args[1:], *n.kwargs.values())):
            return None  # view(dtype) reinterprets the bits
        return _bounds(args[0], memo)
    if name == "to" and args and all(isinstance(a, (torch.device, str)) for a in args[1:]) \
            and set(n.kwargs) <= {"device", "non_blocking", "copy"}:
        return _bounds(args[0], memo)  # a device move (a dtype, or another tensor's, is not)
    if name == "arange":
        if n.kwargs.get("dtype") not in (None, torch.int64) or \
                len(args) > 2 or "step" in n.kwargs:
            return None
        start = args[0] if len(args) == 2 else n.kwargs.get("start", 0)
        return (start, _INF) if isinstance(start, int) and start >= 0 else None
    if name in ("add", "sub") and len(args) == 2 and not n.kwargs:  # (no alpha)
        a, b = _bounds(args[0], memo), _bounds(args[1], memo)
        if not (isinstance(a, tuple) and isinstance(b, tuple)):
            return None
        lo, hi = (a[0] + b[0], a[1] + b[1]) if name == "add" else (a[0] - b[1], a[1] - b[0])
        return (lo, hi) if max(abs(lo), abs(hi) if hi != _INF else 0) < 2 ** 62 else None
    if name in _CMP and len(args) == 2:
        a, b = _bounds(args[0], memo), _bounds(args[1], memo)
        if isinstance(a, tuple) and isinstance(b, tuple) and _CMP[name](a, b):
            return True
        return None
    if name in ("and_", "__and__", "logical_and", "bitwise_and") and len(args) == 2:
        return True if _bounds(args[0], memo) is True and _bounds(args[1], memo) is True \
            else None
    if name in ("or_", "__or__", "logical_or", "bitwise_or") and len(args) == 2:
        return True if _bounds(args[0], memo) is True or _bounds(args[1], memo) is True \
            else None
    if name in ("ones", "new_ones", "ones_like") and n.kwargs.get("dtype") is torch.bool:
        return True
    if name in ("full", "new_full"):
        at = 1 if name == "full" else 2
        fill = args[at] if len(args) > at else n.kwargs.get("fill_value")
        return True if fill is True and n.kwargs.get("dtype") in (None, torch.bool) else None
    return None


def _broadcasts_within(mask: torch.fx.Node, q: Any) -> bool:
    """Does the mask broadcast to the scores without adding or growing a batch dim (so that
    dropping it cannot change the result's shape)? Symbolic sizes compared by their
    expressions, without guards."""
    mv = mask.meta.get("example_value", mask.meta.get("val"))
    qv = q.meta.get("example_value", q.meta.get("val")) if isinstance(q, torch.fx.Node) else None
    if not isinstance(mv, torch.Tensor) or not isinstance(qv, torch.Tensor):
        return False
    if mv.dim() > qv.dim():
        return False

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        ea, eb = getattr(getattr(a, "node", None), "expr", a), getattr(getattr(b, "node", None),
                                                                          "expr", b)
        return str(ea) == str(eb)

    return all(same(m, 1) or same(m, d) for m, d in zip(mv.shape[-3::-1], qv.shape[-3::-1]))


def drop_constant_masks(gm: torch.fx.GraphModule) -> int:
    """Remove the ``attn_mask`` of every attention call whose mask is a compile-time constant
    that masks nothing, and replace one that is exactly the causal mask by ``is_causal=True``
    (see the module's docstring); returns how many masks were removed."""
    dropped = 0
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    values: dict[torch.fx.Node, Any] = {}  # a mask several attention calls share: computed once
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in _SDPA:
            continue
        if "attn_mask" in n.kwargs:
            mask, where = n.kwargs["attn_mask"], "kw"
        elif len(n.args) > 3:
            mask, where = n.args[3], "arg"
        else:
            continue
        if not isinstance(mask, torch.fx.Node):
            continue
        if mask not in values:
            values[mask] = _constant_value(mask, position)
        value = values[mask]
        kind = _kind(value, _shape(n.args[0]), _shape(n.args[1]) if len(n.args) > 1 else None)
        how = {"none": "a constant that masks nothing", "causal": "exactly the causal mask"}
        if kind is None and value is None and _bounds(mask, {}) is True \
                and _broadcasts_within(mask, n.args[0]):
            kind = "none"  # all True for every size (symbolic sizes: not computable here)
            how = {"none": "True for every size"}
        if kind is None:
            continue
        causal_given = n.kwargs.get("is_causal", n.args[5] if len(n.args) > 5 else False)
        if kind == "causal" and causal_given is not False:
            continue  # (a mask with is_causal=True is an error ATen reports)
        if where == "kw":
            n.kwargs = {**n.kwargs, "attn_mask": None}
        else:
            n.args = (*n.args[:3], None, *n.args[4:])
        if kind == "causal":
            if len(n.args) > 5:
                n.args = (*n.args[:5], True, *n.args[6:])
            else:
                n.kwargs = {**n.kwargs, "is_causal": True}
        dropped += 1
        log.info("ember: attention %s: its mask %s is %s; dropped%s", n.name, mask.name,
                 how[kind], "" if kind == "none" else " for is_causal=True")
        _erase_unused(mask)
    if dropped:
        gm.recompile()
    return dropped


def _erase_unused(root: torch.fx.Node) -> None:
    """Erase ``root`` and its (pure, checked) inputs that nothing else uses any more."""
    stack = [root]
    while stack:
        n = stack.pop()
        if n.users or not _pure(n):
            continue
        inputs = n.all_input_nodes
        n.graph.erase_node(n)
        stack.extend(inputs)
