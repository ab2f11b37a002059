"""Index arithmetic: sympy expressions over integer loop variables, so that symbolic sizes fit the
same code paths later. ``FloorDiv`` and ``ModularIndexing`` are the only non-polynomial forms."""

from __future__ import annotations

import functools
from typing import Any, Sequence

import sympy

__all__ = ["FloorDiv", "ModularIndexing", "var", "rvar", "contiguous_strides", "product",
           "to_c", "sym"]


class FloorDiv(sympy.Function):
    """Integer floor division of a non-negative index."""
    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, a: Any, b: Any) -> Any:
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv):
            return FloorDiv(a.args[0], a.args[1] * b)
        return None


class ModularIndexing(sympy.Function):
    """``(a // div) % mod`` of a non-negative index."""
    nargs = (3,)
    is_integer = True

    @classmethod
    def eval(cls, a: Any, div: Any, mod: Any) -> Any:
        if a == 0 or mod == 1:
            return sympy.Integer(0)
        if a.is_Integer and div.is_Integer and mod.is_Integer:
            return sympy.Integer((int(a) // int(div)) % int(mod))
        return None


@functools.lru_cache(None)
def var(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"x{i}", integer=True, nonnegative=True)


@functools.lru_cache(None)
def rvar(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"r{i}", integer=True, nonnegative=True)


def sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True)


def product(xs: Sequence[Any]) -> Any:
    out: Any = 1
    for x in xs:
        out = out * x
    return out


def contiguous_strides(size: Sequence[Any]) -> list[Any]:
    strides: list[Any] = []
    acc: Any = 1
    for s in reversed(list(size)):
        strides.append(acc)
        acc = acc * s
    return list(reversed(strides))


def to_c(expr: Any) -> str:
    """Print an index expression as C (int64 arithmetic)."""
    if isinstance(expr, int):
        return str(expr)
    return _c(sympy.sympify(expr))


def _c(e: Any) -> str:
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if isinstance(e, FloorDiv):
        return f"({_c(e.args[0])} / {_c(e.args[1])})"
    if isinstance(e, ModularIndexing):
        a, d, m = e.args
        inner = _c(a) if d == 1 else f"({_c(a)} / {_c(d)})"
        return f"({inner} % {_c(m)})"
    if e.is_Add:
        terms = sorted(e.args, key=lambda t: (t.is_Integer, str(t)))
        out = _c(terms[0])
        for t in terms[1:]:
            if t.is_Integer and int(t) < 0:
                out += f" - {-int(t)}"
            elif t.is_Mul and t.args[0].is_Integer and int(t.args[0]) < 0:
                out += f" - {_c(-t)}"
            else:
                out += f" + {_c(t)}"
        return f"({out})"
    if e.is_Mul:
        parts = []
        for a in e.args:
            s = _c(a)
            parts.append(s)
        return "*".join(parts) if len(parts) > 1 else parts[0]
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return "*".join([_c(e.base)] * int(e.exp))
    raise NotImplementedError(f"cannot print index expression {e!r} as C")
