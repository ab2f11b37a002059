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


def print_sum(e: Any, rec: Any) -> str:
    """A sympy sum as source (``rec`` prints each term: the C++ or the Triton printer): the
    constant last, negative terms as subtractions, parenthesized."""
    terms = sorted(e.args, key=lambda t: (t.is_Integer, str(t)))
    out = rec(terms[0])
    for t in terms[1:]:
        if t.is_Integer and int(t) < 0:
            out += f" - {-int(t)}"
        elif t.is_Mul and t.args[0].is_Integer and int(t.args[0]) < 0:
            out += f" - {rec(-t)}"
        else:
            out += f" + {rec(t)}"
    return f"({out})"


def operand(e: Any, rec: Any) -> str:
    """``e`` printed by ``rec`` as the operand of a division or a remainder: parenthesized
    unless a number, a symbol or already parenthesized. ``x // (32*s0)`` printed as
    ``x // 32*s0`` is ``(x // 32)*s0`` in C and Python: a wrong index (the Triton target's
    flattened indices divide by products of symbolic sizes)."""
    e = sympy.sympify(e)
    out = rec(e)
    if e.is_Integer or e.is_Symbol or isinstance(e, (FloorDiv, ModularIndexing)):
        return out
    return out if out.startswith("(") and out.endswith(")") and _balanced(out[1:-1]) \
        else f"({out})"


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


def _c(e: Any) -> str:
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if isinstance(e, FloorDiv):
        return f"({operand(e.args[0], _c)} / {operand(e.args[1], _c)})"
    if isinstance(e, ModularIndexing):
        a, d, m = e.args
        inner = operand(a, _c) if d == 1 else f"({operand(a, _c)} / {operand(d, _c)})"
        return f"({inner} % {operand(m, _c)})"
    if isinstance(e, (sympy.Max, sympy.Min)):
        op = ">" if isinstance(e, sympy.Max) else "<"
        out = _c(e.args[0])
        for a in e.args[1:]:
            b = _c(a)
            out = f"({out} {op} {b} ? {out} : {b})"
        return out
    if e.is_Add:
        return print_sum(e, _c)
    if e.is_Mul:
        parts = []
        for a in e.args:
            s = _c(a)
            parts.append(s)
        return "*".join(parts) if len(parts) > 1 else parts[0]
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return "*".join([_c(e.base)] * int(e.exp))
    raise NotImplementedError(f"cannot print index expression {e!r} as C")


# -- symbolic sizes ------------------------------------------------------------------------------
# A graph traced with symbolic shapes (``make_fx(tracing_mode="symbolic")``, or Ember's AOT under a
# ShapeEnv) has SymInt sizes. They become sympy expressions over symbols named as the ShapeEnv's
# (s0, s75, ...). Correctness never depends on the example values ("hints"); they only steer
# heuristics (loop order, whether a loop is worth running in parallel).

import contextlib  # noqa: E402
import threading  # noqa: E402
from typing import Iterator  # noqa: E402

__all__ += ["SizeEnv", "size_env", "current_size_env", "to_expr", "is_symbolic", "size_hint",
            "statically_true", "known_eq", "to_py", "SymbolicUnsupported", "free_size_symbols", "to_stride"]

_size_state = threading.local()


class SymbolicUnsupported(NotImplementedError):
    """A symbolic graph needs something this compiler only does for concrete sizes: the whole
    graph falls back (the backend raises), never a silent specialization."""


@functools.lru_cache(None)
def size_symbol(name: str) -> sympy.Symbol:
    """The IR's symbol for the ShapeEnv symbol ``name`` (same name and assumptions as torch's)."""
    return sympy.Symbol(name, integer=True, positive=True)


class SizeEnv:
    """The symbols of one graph: their example values (hints) and lower bounds."""

    def __init__(self) -> None:
        self.hints: dict[sympy.Symbol, int] = {}
        self.lower: dict[sympy.Symbol, int] = {}
        self.upper: dict[sympy.Symbol, Any] = {}
        self.shape_env: Any = None
        # what the ShapeEnv's guards say: compound sizes equal to constants (``s//(s//4) == 4``
        # after a view) and equalities between expressions (as expanded differences). Code
        # compiled for a graph is valid where its guards hold; capture checks them.
        self.consts: dict[Any, Any] = {}
        self.facts: set[Any] = set()

    def add_shape_env(self, shape_env: Any) -> None:
        if shape_env is None or self.shape_env is shape_env:
            return
        self.shape_env = shape_env
        for g in getattr(shape_env, "guards", []):
            e = getattr(g, "expr", None)
            if not isinstance(e, sympy.Eq):
                continue
            try:
                lhs, rhs = _convert(e.lhs, note=False), _convert(e.rhs, note=False)
            except SymbolicUnsupported:
                continue
            if rhs.is_Integer and not lhs.is_Symbol and not lhs.is_Integer:
                self.consts[lhs] = rhs
            elif lhs.is_Integer and not rhs.is_Symbol and not rhs.is_Integer:
                self.consts[rhs] = lhs
            else:
                self.facts.add(sympy.expand(lhs - rhs))
        if self.consts:
            self.facts = {sympy.expand(f.xreplace(self.consts)) for f in self.facts}

    def note(self, s: sympy.Symbol, torch_sym: Any) -> None:
        if s in self.hints:
            return
        env = self.shape_env
        if env is None:
            raise SymbolicUnsupported(f"symbol {s} without a ShapeEnv")
        vals = getattr(env, "backed_var_to_val", None) or env.var_to_val
        if torch_sym not in vals:
            raise SymbolicUnsupported(f"unbacked symbol {s} (a data-dependent size)")
        self.hints[s] = int(vals[torch_sym])
        vr = env.var_to_range.get(torch_sym)
        lo = 0
        hi: Any = None
        if vr is not None:
            lo = max(0, int(vr.lower)) if getattr(vr.lower, "is_Integer", False) else 0
            hi = int(vr.upper) if getattr(vr.upper, "is_Integer", False) else None
        self.lower[s] = lo
        self.upper[s] = hi


@contextlib.contextmanager
def size_env(env: SizeEnv | None) -> Iterator[SizeEnv | None]:
    prior = getattr(_size_state, "env", None)
    _size_state.env = env
    try:
        yield env
    finally:
        _size_state.env = prior


def current_size_env() -> SizeEnv | None:
    return getattr(_size_state, "env", None)


def _convert(e: Any, note: bool = True) -> Any:
    """torch's sympy expression (torch.utils._sympy.functions) -> this module's forms."""
    if e.is_Integer:
        return sympy.Integer(int(e))
    if e.is_Symbol:
        name = e.name
        if not name.startswith("s"):
            raise SymbolicUnsupported(f"symbol {name} (unbacked or not a size)")
        s = size_symbol(name)
        env = current_size_env()
        if env is not None and note:
            env.note(s, e)
        return s
    fname = type(e).__name__
    args = [_convert(a, note) for a in e.args]
    if e.is_Add:
        return sympy.Add(*args)
    if e.is_Mul:
        return sympy.Mul(*args)
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return sympy.Pow(args[0], args[1])
    if fname in ("FloorDiv", "CleanDiv"):
        return FloorDiv(args[0], args[1])
    if fname == "ModularIndexing":
        return ModularIndexing(*args)
    if fname in ("PythonMod", "Mod"):
        return ModularIndexing(args[0], 1, args[1])
    if fname == "CeilDiv":
        return FloorDiv(args[0] + args[1] - 1, args[1])
    if isinstance(e, (sympy.core.relational.Relational, sympy.And, sympy.Or, sympy.Not)):
        return e.func(*args)
    if fname == "Max":
        return sympy.Max(*args)
    if fname == "Min":
        return sympy.Min(*args)
    raise SymbolicUnsupported(f"size expression {e} ({fname})")


def to_expr(v: Any) -> Any:
    """An int, or a sympy expression for a SymInt (int for a SymInt that is a constant)."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, sympy.Expr):
        return int(v) if v.is_Integer else v
    node = getattr(v, "node", None)
    if node is None:
        raise SymbolicUnsupported(f"size of type {type(v).__name__}")
    if not hasattr(node, "expr"):
        raise SymbolicUnsupported(f"size of type {type(v).__name__}")
    env = current_size_env()
    if env is not None:
        env.add_shape_env(getattr(node, "shape_env", None))
    e = node.expr
    if e.is_number:
        if not e.is_Integer:
            raise SymbolicUnsupported(f"non-integer size {e}")
        return int(e)
    out = _convert(e)
    if env is not None and env.consts:
        out = out.xreplace(env.consts)
    return int(out) if out.is_Integer else out


def to_stride(v: Any) -> Any:
    """A stride: as :func:`to_expr`, with torch's ``Max(1, size)`` factors (which differ from
    ``size`` only for empty tensors, where strides do not matter) written as ``size``."""
    e = to_expr(v)
    if isinstance(e, int) or not e.has(sympy.Max):
        return e
    e = e.replace(lambda a: isinstance(a, sympy.Max) and len(a.args) == 2 and 1 in a.args,
                  lambda a: a.args[1] if a.args[0] == 1 else a.args[0])
    return int(e) if e.is_Integer else e


def is_symbolic(v: Any) -> bool:
    return isinstance(v, sympy.Basic) and bool(v.free_symbols)


def free_size_symbols(v: Any) -> set[sympy.Symbol]:
    if not isinstance(v, sympy.Basic):
        return set()
    return {s for s in v.free_symbols if s.name.startswith("s") and s.is_positive}


def size_hint(v: Any) -> int:
    """The example value of a size (heuristics only, never correctness)."""
    if isinstance(v, int):
        return v
    v = sympy.sympify(v)
    if v.is_Integer:
        return int(v)
    env = current_size_env()
    if env is None:
        raise SymbolicUnsupported(f"no hint for {v}")
    out = v.xreplace({s: sympy.Integer(h) for s, h in env.hints.items()})
    out = _eval_functions(out)
    if not out.is_Integer:
        raise SymbolicUnsupported(f"no hint for {v}")
    return int(out)


def _eval_functions(e: Any) -> Any:
    """FloorDiv/ModularIndexing of integers (xreplace does not re-run their eval)."""
    if not isinstance(e, sympy.Basic) or not e.args:
        return e
    args = [_eval_functions(a) for a in e.args]
    return e.func(*args)


def statically_true(cond: Any) -> bool:
    """True only if ``cond`` (a sympy relational over sizes, or a bool) holds for every value of
    the symbols allowed by their lower bounds; False when unknown."""
    if isinstance(cond, bool):
        return cond
    cond = sympy.sympify(cond)
    if cond in (sympy.true, sympy.false):
        return bool(cond)
    env = current_size_env()
    # s = lower + t with t >= 0: positivity of the difference then decides most size relations
    sub = {}
    for s in cond.free_symbols:
        lo = env.lower.get(s, 1) if env is not None else 1
        sub[s] = sympy.Symbol(f"_t_{s.name}", integer=True, nonnegative=True) + lo
    c = cond.xreplace(sub)
    try:
        if isinstance(c, sympy.core.relational.Relational):
            d = sympy.expand(c.lhs - c.rhs)
            if isinstance(c, (sympy.GreaterThan,)):
                r = d.is_nonnegative
            elif isinstance(c, sympy.StrictGreaterThan):
                r = d.is_positive
            elif isinstance(c, sympy.LessThan):
                r = d.is_nonpositive
            elif isinstance(c, sympy.StrictLessThan):
                r = d.is_negative
            elif isinstance(c, sympy.Eq):
                r = d == 0
            elif isinstance(c, sympy.Ne):
                r = d.is_nonzero
            else:
                r = None
            return bool(r)
        return bool(c == sympy.true)
    except TypeError:
        return False


def known_eq(a: Any, b: Any) -> bool:
    """``a == b`` for every value of the symbols (structural, after expansion)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    d = sympy.expand(sympy.sympify(a) - sympy.sympify(b))
    if d == 0:
        return True
    env = current_size_env()
    return env is not None and (d in env.facts or -d in env.facts)


def to_py(expr: Any) -> str:
    """Print a size expression as Python over the wrapper's symbol variables."""
    if isinstance(expr, (int, bool)):
        return str(int(expr))
    return _py(sympy.sympify(expr))


def _py(e: Any) -> str:
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if isinstance(e, FloorDiv):
        return f"({operand(e.args[0], _py)} // {operand(e.args[1], _py)})"
    if isinstance(e, ModularIndexing):
        a, d, m = e.args
        inner = operand(a, _py) if d == 1 else f"({operand(a, _py)} // {operand(d, _py)})"
        return f"({inner} % {operand(m, _py)})"
    if isinstance(e, (sympy.Max, sympy.Min)):
        f = "max" if isinstance(e, sympy.Max) else "min"
        return f"{f}({', '.join(_py(a) for a in e.args)})"
    if e.is_Add:
        return print_sum(e, _py)
    if e.is_Mul:
        return "*".join(_py(a) if not a.is_Add else f"{_py(a)}" for a in e.args)
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return "*".join([_py(e.base)] * int(e.exp))
    raise SymbolicUnsupported(f"cannot print size expression {e!r} as Python")
