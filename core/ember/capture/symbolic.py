"""Dynamic shapes in capture: symbolic sizes from ``torch.fx.experimental.symbolic_shapes``.

A dynamic compile (``dynamic=True``, :func:`mark_dynamic`, or automatic dynamic after a size or
int change) gets one :class:`SymbolicShapes`: a ``ShapeEnv`` and the ``FakeTensorMode`` over it.
Tensor inputs are fakified with symbolic sizes for their dynamic dims (0 and 1 stay specialized),
dynamic Python ints become ``SymInt`` placeholders. While the user's code runs symbolically, the
``ShapeEnv`` records a guard each time Python looks at a relation between sizes (``if n > 64``,
broadcasting two sizes together); :class:`SymbolicShapes` notes the user's file:line for each, so a
recompile names the guard and the line that introduced it. :meth:`SymbolicShapes.guards` renders
them as Python over the entry's arguments (``(x).size(1) <= 64``).

A size used inside the graph is rebuilt from its sympy expression: each symbol has a root (the
``size`` of a tensor input, or an int placeholder), and the expression becomes ``operator`` nodes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import linecache
import logging
import operator
import sys
from typing import Any, Callable

import sympy
import torch
import torch.fx
from torch._guards import GuardSource, Source
from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                   StatelessSymbolicContext)
from torch.utils._sympy.printers import PythonPrinter

from ..exc import EmberError

__all__ = ["EmberSource", "SymbolicShapes", "DynamicShapeError", "mark_dynamic", "mark_static",
           "source_name", "is_symbolic", "dynamic_marks", "static_marks"]

log = logging.getLogger("ember.dynamic")

_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


class DynamicShapeError(EmberError):
    """A size marked dynamic (``ember.mark_dynamic``) was forced to a constant by the user's
    code. The message names the dimension, the line, and what to do."""


def is_symbolic(v: Any) -> bool:
    return isinstance(v, _SYM)


# ---------------------------------------------------------------------------------------------
# Sources ShapeEnv accepts (torch._guards.Source); ``name`` is a cached_property in torch 2.13
# and a method in earlier releases: support both.
# ---------------------------------------------------------------------------------------------

_NAME_IS_ATTR = isinstance(inspect.getattr_static(Source, "name", None),
                           (property, functools.cached_property))


def source_name(src: Any) -> str:
    """``src.name`` as a string, whether ``name`` is an attribute or a method."""
    n = src.name
    return n() if callable(n) else n


if _NAME_IS_ATTR:
    @dataclasses.dataclass(frozen=True)
    class EmberSource(Source):
        """Where an input comes from: a Python expression over the entry's arguments."""

        expr: str

        @property
        def _name_template(self) -> str:
            return self.expr

        @property
        def guard_source(self) -> GuardSource:  # type: ignore[override]
            return GuardSource.LOCAL
else:  # pragma: no cover - torch < 2.13
    @dataclasses.dataclass(frozen=True)
    class EmberSource(Source):  # type: ignore[no-redef]
        """Where an input comes from: a Python expression over the entry's arguments."""

        expr: str

        def name(self) -> str:  # type: ignore[override]
            return self.expr

        def guard_source(self) -> GuardSource:  # type: ignore[override]
            return GuardSource.LOCAL


def _source_expr(src: Any) -> str:
    """An Ember guard expression for a ShapeEnv source: ``(x).size(1)`` rather than torch's
    ``x.size()[1]``."""
    if isinstance(src, EmberSource):
        return src.expr
    prop = getattr(src, "prop", None)
    base = getattr(src, "base", None)
    if prop is not None and base is not None:
        b = _source_expr(base)
        kind = getattr(prop, "name", str(prop))
        if kind == "SIZE":
            return f"({b}).size({src.idx})"
        if kind == "STRIDE":
            return f"({b}).stride({src.idx})"
        if kind == "STORAGE_OFFSET":
            return f"({b}).storage_offset()"
    return source_name(src)


# ---------------------------------------------------------------------------------------------
# mark_dynamic / mark_static
# ---------------------------------------------------------------------------------------------

def mark_dynamic(t: torch.Tensor, dim: int | list[int] | tuple[int, ...], min: int | None = None,
                 max: int | None = None) -> None:
    """Compile ``t``'s dimension ``dim`` with a symbolic size from the first compile, in any
    ``dynamic`` mode. ``min``/``max`` bound the sizes the graph serves (a size outside them
    recompiles). Sizes 0 and 1 are still specialized: a call with size 1 compiles its own graph.
    If the compiled code forces the size to a constant, compiling raises
    :class:`ember.DynamicShapeError` naming the line."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"ember.mark_dynamic expects a tensor, got {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    marks = dict(getattr(t, "_ember_dynamic", {}))
    for d in dims:
        d = _check_dim(t, d, "mark_dynamic")
        if min is not None and max is not None and min > max:
            raise ValueError(f"ember.mark_dynamic: min={min} > max={max}")
        marks[d] = (min, max)
    t._ember_dynamic = marks  # type: ignore[attr-defined]
    static = set(getattr(t, "_ember_static", ())) - set(marks)
    t._ember_static = static  # type: ignore[attr-defined]


def mark_static(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Always compile ``t``'s dimension ``dim`` with its concrete size (a new size recompiles),
    even under ``dynamic=True`` or after automatic dynamic made it symbolic."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"ember.mark_static expects a tensor, got {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    static = set(getattr(t, "_ember_static", ()))
    marks = dict(getattr(t, "_ember_dynamic", {}))
    for d in dims:
        d = _check_dim(t, d, "mark_static")
        static.add(d)
        marks.pop(d, None)
    t._ember_static = static  # type: ignore[attr-defined]
    t._ember_dynamic = marks  # type: ignore[attr-defined]


def _check_dim(t: torch.Tensor, d: int, what: str) -> int:
    if not isinstance(d, int) or not -t.dim() <= d < max(t.dim(), 1):
        raise IndexError(f"ember.{what}: dimension {d!r} out of range for a tensor of "
                         f"{t.dim()} dimension(s)")
    return d % t.dim() if t.dim() else 0


def dynamic_marks(t: torch.Tensor) -> dict[int, tuple[int | None, int | None]]:
    return getattr(t, "_ember_dynamic", None) or {}


def static_marks(t: torch.Tensor) -> set[int]:
    return getattr(t, "_ember_static", None) or set()


# ---------------------------------------------------------------------------------------------
# Guards with the user's location
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Located:
    """One ShapeEnv guard and the user's line that introduced it."""

    guard: Any  # ShapeGuard
    where: str  # "file:line"
    text: str  # that line's source

    @property
    def origin(self) -> str:
        return f"{self.where}: {self.text}" if self.text else self.where


class _LocatedGuards(list):
    """ShapeEnv.guards, noting the user's position each time the ShapeEnv adds a guard."""

    def __init__(self, where: Callable[[], tuple[str, str]]):
        super().__init__()
        self.where = where
        self.located: list[Located] = []

    def append(self, g: Any) -> None:  # type: ignore[override]
        super().append(g)
        try:
            w, text = self.where()
        except Exception:
            w, text = "<unknown>", ""
        self.located.append(Located(g, w, text))


class _Printer(PythonPrinter):
    def __init__(self, names: dict[sympy.Symbol, str]):
        super().__init__()
        self.names = names

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        name = self.names.get(expr)
        if name is None:
            raise KeyError(f"no source for the symbol {expr}")
        return name


# ---------------------------------------------------------------------------------------------
# One dynamic compile
# ---------------------------------------------------------------------------------------------

class SymbolicShapes:
    """The ShapeEnv, the FakeTensorMode over it, and what capture knows about each symbol."""

    def __init__(self, where: Callable[[], tuple[str, str]]):
        from torch._subclasses.fake_tensor import FakeTensorMode

        # Data-dependent sizes (nonzero, .item() as a size) raise while tracing: a graph break,
        # never an unbacked symbol that guards cannot check.
        self.shape_env = ShapeEnv(allow_scalar_outputs=False,
                                  allow_dynamic_output_shape_ops=False,
                                  specialize_zero_one=True)
        self._guards = _LocatedGuards(where)
        self.shape_env.guards = self._guards
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=False)
        self.where = where
        #: symbol -> (fx node of the tensor placeholder, dim) or (fx node of an int placeholder,
        #: None): where the graph reads that size
        self.roots: dict[sympy.Symbol, tuple[torch.fx.Node, int | None, Any]] = {}
        #: symbol -> (description, min, max) for dims the user marked dynamic
        self.marked: dict[sympy.Symbol, tuple[str, int | None, int | None]] = {}
        #: int-argument sources made symbolic (their guard is ``type(src) is int``)
        self.int_sources: list[str] = []
        self._memo: dict[Any, torch.fx.Node] = {}

    @property
    def has_symbols(self) -> bool:
        return bool(self.roots)

    # -- inputs -------------------------------------------------------------------------------
    def fakify(self, value: torch.Tensor, source: str, dynamic_dims: set[int],
               marked: dict[int, tuple[int | None, int | None]]) -> torch.Tensor:
        # A marked size outside its [min, max] is compiled for that size (its own graph).
        marked = {d: (lo, hi) for d, (lo, hi) in marked.items()
                  if (lo is None or value.size(d) >= lo) and (hi is None or value.size(d) <= hi)}
        dims = [DimDynamic.DYNAMIC if d in dynamic_dims or d in marked else DimDynamic.STATIC
                for d in range(value.dim())]
        ctx = StatelessSymbolicContext(dynamic_sizes=dims, constraint_sizes=[None] * value.dim())
        fake = self.fake_mode.from_tensor(value, source=EmberSource(str(source)),
                                          symbolic_context=ctx)
        for d, (lo, hi) in marked.items():
            s = fake.size(d)
            if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                sym = s.node.expr
                if lo is not None or hi is not None:
                    vr = self.shape_env.var_to_range.get(sym)
                    cur_lo = int(vr.lower) if vr is not None and isinstance(
                        vr.lower, sympy.Integer) else 2
                    self.shape_env.constrain_symbol_range(
                        sym, compiler_min=max(cur_lo, lo if lo is not None else cur_lo),
                        compiler_max=hi if hi is not None else sys.maxsize - 1)
                self.marked[sym] = (f"dimension {d} of {source}", lo, hi)
        return fake

    def register_tensor(self, node: torch.fx.Node, fake: torch.Tensor) -> None:
        """Roots for the symbols first seen in the sizes of the input ``node``."""
        for d, s in enumerate(fake.shape):
            if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                self.roots.setdefault(s.node.expr, (node, d, s))

    def symint_input(self, value: int, source: str) -> torch.SymInt:
        sym = self.shape_env.create_unspecified_symint_and_symbol(
            value, EmberSource(str(source)), DimDynamic.DYNAMIC)
        self.int_sources.append(source)
        return sym

    def register_int(self, node: torch.fx.Node, value: torch.SymInt) -> None:
        if isinstance(value.node.expr, sympy.Symbol):
            self.roots.setdefault(value.node.expr, (node, None, value))

    # -- sizes inside the graph ------------------------------------------------------------
    def node_for(self, value: Any, create: Callable[..., torch.fx.Node]) -> Any:
        """The fx argument standing for ``value`` (a SymInt/SymFloat/SymBool, or a plain
        number): an int when the ShapeEnv knows it is constant, else nodes rebuilding its
        expression from the symbols' roots. ``create(op, target, args, kwargs)`` adds a node."""
        if not isinstance(value, _SYM):
            return value
        expr = self.shape_env.replace(value.node.expr)
        if getattr(expr, "is_number", False):
            if isinstance(value, torch.SymBool):
                return bool(expr)
            return int(expr) if isinstance(value, torch.SymInt) else float(expr)
        return self._build(expr, create)

    def _build(self, expr: Any, create: Callable[..., torch.fx.Node]) -> Any:
        from ..exc import Unsupported

        memo = self._memo.get(expr)
        if memo is not None:
            return memo
        if isinstance(expr, sympy.Integer):
            return int(expr)
        if isinstance(expr, sympy.Number):
            return float(expr)
        if isinstance(expr, sympy.Symbol):
            root = self.roots.get(expr)
            if root is None:
                raise Unsupported(f"a symbolic size ({expr}) with no input it comes from")
            node, dim, sym = root
            if dim is None:
                res = node
            else:
                res = create("call_method", "size", (node, dim), {})
                res.meta["example_value"] = res.meta["val"] = sym
            self._memo[expr] = res
            return res
        fn: Any = None
        args = [self._build(a, create) for a in expr.args]
        name = type(expr).__name__
        if name == "Abs" and len(args) == 1:
            node = create("call_function", operator.abs, (args[0],), {})
            v = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else args[0]
            node.meta["example_value"] = node.meta["val"] = abs(v) if v is not None else None
            self._memo[expr] = node
            return node
        if isinstance(expr, sympy.Add):
            fn = operator.add
        elif isinstance(expr, sympy.Mul):
            fn = operator.mul
        elif name == "FloorDiv":
            fn = operator.floordiv
        elif name in ("PythonMod", "Mod"):
            fn = operator.mod
        elif name == "Max":
            fn = torch.sym_max
        elif name == "Min":
            fn = torch.sym_min
        elif name == "PowByNatural" or (isinstance(expr, sympy.Pow) and
                                        isinstance(expr.args[1], sympy.Integer) and
                                        int(expr.args[1]) >= 0):
            fn = operator.pow
        elif name in ("IntTrueDiv", "FloatTrueDiv"):
            fn = operator.truediv
        elif name == "ToFloat" and len(args) == 1:
            node = create("call_function", torch.sym_float, (args[0],), {})
            v = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else args[0]
            node.meta["example_value"] = node.meta["val"] = (
                torch.sym_float(v) if v is not None else None)
            self._memo[expr] = node
            return node
        if fn is None:
            raise Unsupported(f"a symbolic size expression Ember cannot rebuild ({expr})")
        res = args[0]
        for a in args[1:]:
            node = create("call_function", fn, (res, a), {})
            node.meta["example_value"] = node.meta["val"] = _eval(fn, res, a)
            res = node
        self._memo[expr] = res
        return res

    # -- guards --------------------------------------------------------------------------------
    def _names(self) -> dict[sympy.Symbol, str]:
        names = {}
        for sym, srcs in self.shape_env.var_to_sources.items():
            if srcs:
                names[sym] = _source_expr(srcs[0])
        return names

    def expr_source(self, value: Any) -> str:
        """A Python expression over the entry's arguments computing ``value`` (a SymInt)."""
        expr = self.shape_env.replace(value.node.expr)
        if getattr(expr, "is_number", False):
            return repr(int(expr) if isinstance(value, torch.SymInt) else expr)
        return "(" + _Printer(self._names()).doprint(expr) + ")"

    def guards(self) -> list[tuple[str, str]]:
        """(guard expression, where it came from) for everything the graph assumes about the
        symbols: int arguments are ints, every source of a symbol agrees, the symbols' ranges
        (sizes >= 2: 0 and 1 are specialized), and each relation user code looked at."""
        se = self.shape_env
        names = self._names()
        printer = _Printer(names)
        out: list[tuple[str, str]] = []
        for src in self.int_sources:
            out.append((f"type({src}) is int", "an int argument compiled as a symbolic int"))
        for sym, srcs in se.var_to_sources.items():
            first = names.get(sym)
            if first is None:
                continue
            for other in srcs[1:]:
                out.append((f"{_source_expr(other)} == {first}",
                            "two sizes that were equal when compiling (duck sizing)"))
        for loc in self._guards.located:
            try:
                text = printer.doprint(loc.guard.expr)
            except KeyError:
                from ..exc import Unsupported
                raise Unsupported(f"a guard on a size with no input it comes from "
                                  f"({loc.guard.expr}, at {loc.origin})")
            out.append((text, loc.origin))
        for sym in names:
            vr = se.var_to_range.get(sym)
            if vr is None:
                continue
            what = self.marked.get(sym)
            origin = (f"the range of {what[0]} (ember.mark_dynamic)" if what else
                      "sizes 0 and 1 are specialized; a symbolic size is >= 2")
            lo, hi = vr.lower, vr.upper
            if not what and (lo != 2 or isinstance(hi, sympy.Integer)):
                origin = "the range the guards above imply"
            lo_ok, hi_ok = isinstance(lo, sympy.Integer), isinstance(hi, sympy.Integer)
            if lo_ok and hi_ok and lo == hi:
                out.append((f"{names[sym]} == {int(lo)}", origin))
                continue
            if lo_ok:
                out.append((f"{names[sym]} >= {int(lo)}", origin))
            if hi_ok:
                out.append((f"{names[sym]} <= {int(hi)}", origin))
        return out

    def check_marked(self) -> None:
        """Raise :class:`DynamicShapeError` when user code forced a marked dim to a constant."""
        se = self.shape_env
        for sym, (what, lo, hi) in self.marked.items():
            r = se.replace(sym)
            vr = se.var_to_range.get(sym)
            const = r if getattr(r, "is_number", False) else (
                vr.lower if vr is not None and vr.lower == vr.upper else None)
            if const is None:
                continue
            culprit = next((loc for loc in self._guards.located
                            if sym in getattr(loc.guard.expr, "free_symbols", ())), None)
            where = culprit.origin if culprit is not None else "<unknown>"
            guard = (_Printer({sym: "size"}).doprint(culprit.guard.expr)
                     if culprit is not None and culprit.guard.expr.free_symbols == {sym}
                     else (str(culprit.guard.expr) if culprit is not None else ""))
            raise DynamicShapeError(
                f"{what} was marked dynamic (ember.mark_dynamic), but the compiled code forces it "
                f"to the constant {int(const)}:\n  {where}\n"
                + (f"  (the code requires {guard})\n" if guard else "") +
                "Rewrite that line so it does not depend on the exact size, or drop "
                "ember.mark_dynamic for this dimension (or use ember.mark_static) to let Ember "
                "compile one graph per size.")


def _eval(fn: Any, a: Any, b: Any) -> Any:
    av = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
    bv = b.meta.get("val") if isinstance(b, torch.fx.Node) else b
    try:
        return fn(av, bv)
    except Exception:
        return None


def _user_where(frames: list[Any]) -> tuple[str, str]:
    if not frames:  # after tracing: AOT autograd or the backend, under the same ShapeEnv
        return "the backend's compile (AOT autograd tracing the graph)", ""
    f = frames[-1]
    line = getattr(f, "lineno", None) or f.code.co_firstlineno
    return f"{f.code.co_filename}:{line}", linecache.getline(f.code.co_filename, line).strip()



def has_marks(args: tuple, kwargs: dict) -> bool:
    """Does an argument (or an item of a tuple/list/dict argument) carry mark_dynamic marks?"""
    def marked(v: Any) -> bool:
        return isinstance(v, torch.Tensor) and bool(getattr(v, "_ember_dynamic", None))

    for v in (*args, *kwargs.values()):
        if marked(v):
            return True
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (tuple, list)) else ()
        if any(marked(x) for x in items):
            return True
    return False


# Whether a backend takes symbolic graphs is the runtime's question (it knows AOT autograd,
# a later stage): ``ember.backends.takes_symbolic``, passed in as ``DynamicPolicy.allowed``.


def concrete(x: Any) -> Any:
    """``x`` with symbolic values replaced by their values (each read installs a guard: the
    graph is then specialized to that value, never silently)."""
    if isinstance(x, torch.SymInt):
        return int(x)
    if isinstance(x, torch.SymFloat):
        return float(x)
    if isinstance(x, torch.SymBool):
        return bool(x)
    if isinstance(x, (tuple, list)) and has_symbolic(x):
        items = [concrete(i) for i in x]
        if type(x) in (tuple, list, torch.Size):
            return type(x)(items)
        if hasattr(type(x), "_fields"):  # a namedtuple
            return type(x)(*items)
    return x


def has_symbolic(x: Any) -> bool:
    """Is ``x`` symbolic, or a tuple/list holding a symbolic value (at any depth)?"""
    if isinstance(x, _SYM):
        return True
    if isinstance(x, (tuple, list)):
        return any(has_symbolic(i) for i in x)
    return False


def call_on_consts(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)``; a Python function that does not take symbolic ints (divmod,
    round, str, ...) is called again with their values (specializing, with guards)."""
    try:
        return fn(*args, **kwargs)
    except TypeError:
        if not any(is_symbolic(a) or isinstance(a, (tuple, list)) and any(map(is_symbolic, a))
                   for a in (*args, *kwargs.values())):
            raise
    return fn(*[concrete(a) for a in args], **{k: concrete(v) for k, v in kwargs.items()})


def python_type(v: Any) -> type:
    """The Python type user code sees for ``v``: int for a SymInt (as for the value)."""
    if isinstance(v, torch.SymInt):
        return int
    if isinstance(v, torch.SymFloat):
        return float
    if isinstance(v, torch.SymBool):
        return bool
    return type(v)


def composite_dispatch() -> Any:
    """The context for running ops over symbolic FakeTensors: torch's Python dispatcher, so that
    composite ops take torch's Python decompositions (guard-free size tests) as make_fx's
    symbolic trace and torch.compile do. Some C++ CompositeImplicit kernels read concrete sizes:
    torch 2.11's ``matmul`` (and ``linear`` without bias, which calls it) reads
    ``sizes()``/``numel()``, which specializes every symbolic size of a >=3-d operand to its
    current value (``size(1) == N``: a sequence-length sweep then compiles a graph per length)
    or fails (``Cannot call numel() on tensor with symbolic sizes``). torch 2.13's kernels are
    symbolic-clean, and the decompositions agree with them on shapes and strides."""
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()
