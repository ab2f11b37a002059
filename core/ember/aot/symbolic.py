"""Symbolic sizes in AOT autograd: reading symbols back from real inputs, evaluating size
expressions and checking the guards AOT's own tracing added.

Under dynamic shapes the graph's placeholders carry symbolic FakeTensors and SymInts made by
capture in one ``FakeTensorMode`` / ``ShapeEnv``. AOT traces with exactly those values (no new
symbols but unbacked ones: the sizes of data-dependent results such as ``nonzero`` or ``x[mask]``,
which live inside the graphs and are read from their tensors at run time; static graphs get them
from :func:`unbacked_mode`). What the runtime needs as concrete numbers (the geometry of an output that is a view of
an input, a guard a decomposition added) is a sympy expression over those symbols, evaluated from
the real inputs of each call: every symbol is bound to the place it was read from (a size, a
stride or a storage offset of a tensor input, or an int input).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import torch


class _LazySympy:
    """sympy, imported on first use: a warm start of a static graph never needs it (0.4 s)."""

    def __getattr__(self, name: str) -> Any:
        import sympy as real

        return getattr(real, name)


sympy = _LazySympy()

__all__ = ["SymbolBinder", "ShapeEnvWatch", "is_sym", "hint", "expr_of", "to_hint", "example_hint",
           "has_unbacked", "unbacked_mode", "allow_unbacked", "discard_unbacked"]

log = logging.getLogger("ember.aot")

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_sym(v: Any) -> bool:
    return isinstance(v, _SYM_TYPES)


def hint(v: Any) -> Any:
    """The example value of a SymInt (the value its symbols had when capture made them), read
    without adding a guard; plain values are returned as they are."""
    if isinstance(v, _SYM_TYPES):
        node = v.node
        h = node.hint
        if h is None:
            h = node.shape_env.size_hint(node.expr, allow_none=True)
        if h is None:
            raise RuntimeError(f"symbolic value {v} has no example value (a data-dependent size)")
        return type(h)(h) if not isinstance(h, _SYM_TYPES) else hint(h)
    return v


def to_hint(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(hint(v) for v in values)


#: The example value an unbacked symbol (a data-dependent size) takes in example inputs and in
#: the partitioner's cost estimates, clamped to the symbol's known range. Nothing depends on it
#: being right: examples are never computed with.
UNBACKED_EXAMPLE = 8


def _is_unbacked(s: Any) -> bool:
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    return symbol_is_type(s, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT))


def has_unbacked(v: Any) -> bool:
    """Does a value (a SymInt, a tensor's sizes/strides, a tuple of those) mention an unbacked
    symbol (a size that depends on tensor data: ``nonzero``, ``x[mask]``, ``.item()``)?"""
    if isinstance(v, torch.Tensor):
        return any(has_unbacked(s) for s in (*v.shape, *v.stride()))
    if isinstance(v, (tuple, list)):
        return any(has_unbacked(x) for x in v)
    if isinstance(v, _SYM_TYPES):
        return any(_is_unbacked(s) for s in v.node.expr.free_symbols)
    return False


def example_hint(v: Any) -> Any:
    """:func:`hint`, except that a value depending on unbacked symbols gets an example value
    (each unbacked symbol :data:`UNBACKED_EXAMPLE` clamped to its range) instead of raising."""
    if not isinstance(v, _SYM_TYPES) or not has_unbacked(v):
        return hint(v)
    node = v.node
    env = node.shape_env
    subs = {}
    for s in node.expr.free_symbols:
        if _is_unbacked(s):
            r = env.var_to_range.get(s)
            val = UNBACKED_EXAMPLE
            if r is not None:
                lo, hi = r.lower, r.upper
                if lo.is_finite and val < lo:
                    val = int(lo) if not isinstance(v, torch.SymFloat) else float(lo)
                if hi.is_finite and val > hi:
                    val = int(hi) if not isinstance(v, torch.SymFloat) else float(hi)
            subs[s] = sympy.Integer(val) if isinstance(val, int) else sympy.Float(val)
        else:
            subs[s] = sympy.sympify(env.var_to_val[s])
    out = node.expr.xreplace(subs)
    if isinstance(v, torch.SymBool):
        return bool(out)
    return float(out) if isinstance(v, torch.SymFloat) else int(out)


def unbacked_mode() -> Any:
    """A FakeTensorMode for tracing with static shapes in which data-dependent ops (``nonzero``,
    ``x[mask]``, ``masked_select``, ``.item()``) give unbacked symbols instead of raising: every
    input size is a constant (``static_shapes=True``); only those ops' results are symbolic."""
    from torch._subclasses import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv(allow_scalar_outputs=True, allow_dynamic_output_shape_ops=True)
    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=env, static_shapes=True)


def discard_unbacked(mode: Any) -> Any:
    """Unbacked symbols made by a fake run outside make_fx (AOT's analysis of the graph) belong
    to no graph: make_fx would otherwise look for them in the first op it records and fail."""
    import contextlib

    env = getattr(mode, "shape_env", None)
    return env.ignore_fresh_unbacked_symbols() if env is not None else contextlib.nullcontext()


class allow_unbacked:
    """Within: the (capture's) ShapeEnv lets data-dependent ops make unbacked symbols; its
    settings are restored on exit (capture's own tracing keeps breaking the graph on them)."""

    def __init__(self, shape_env: Any):
        self.env = shape_env

    def __enter__(self) -> None:
        self.saved = self.env.settings
        self.env.settings = dataclasses.replace(self.saved, allow_scalar_outputs=True,
                                                allow_dynamic_output_shape_ops=True)

    def __exit__(self, *exc: Any) -> None:
        self.env.settings = self.saved


def expr_of(v: Any) -> Any:
    """A SymInt's sympy expression (replacements applied); a plain int as is."""
    if isinstance(v, _SYM_TYPES):
        return v.node.expr
    return v


class SymbolBinder:
    """Where each symbol of a graph's inputs is read from at run time, and evaluation of size
    expressions over them, cached per distinct tuple of symbol values."""

    def __init__(self, metas: Sequence[Any]):
        self.places: dict[sympy.Symbol, tuple[str, int, int]] = {}
        for i, v in enumerate(metas):
            if isinstance(v, torch.SymInt):
                self._bind(v, ("int", i, 0))
            elif isinstance(v, torch.Tensor):
                for d, s in enumerate(v.size()):
                    self._bind(s, ("size", i, d))
                for d, s in enumerate(v.stride()):
                    self._bind(s, ("stride", i, d))
                self._bind(v.storage_offset(), ("offset", i, 0))
        self.symbols = tuple(self.places)

    def _bind(self, v: Any, place: tuple[str, int, int]) -> None:
        if not isinstance(v, torch.SymInt):
            return
        # the raw symbol (before any replacement the ShapeEnv made later) and the replaced one:
        # an expression may mention either, and at run time both are read from this input
        for e in (getattr(v.node, "_expr", None), v.node.expr):
            if isinstance(e, sympy.Symbol) and e not in self.places:
                self.places[e] = place

    def covers(self, expr: Any) -> bool:
        return not isinstance(expr, sympy.Basic) or expr.free_symbols <= set(self.places)

    def values(self, inputs: Sequence[Any]) -> tuple[int, ...]:
        """Every bound symbol's value in this call, in ``symbols`` order."""
        return self.reader(self.symbols)(inputs)

    def reader(self, symbols: Sequence[sympy.Symbol]) -> Any:
        """A function ``inputs -> tuple`` of the values of ``symbols`` (generated code: one
        ``size``/``stride`` read per symbol, it runs on every call)."""
        reads = []
        for sym in symbols:
            kind, i, d = self.places[sym]
            reads.append({"int": f"int(a[{i}])", "size": f"a[{i}].size({d})",
                          "stride": f"a[{i}].stride({d})",
                          "offset": f"a[{i}].storage_offset()"}[kind])
        return eval(f"lambda a: ({', '.join(reads)}{',' if reads else ''})")  # noqa: S307

    def substitute(self, values: tuple[int, ...],
                   symbols: Sequence[sympy.Symbol] | None = None
                   ) -> dict[sympy.Symbol, sympy.Integer]:
        return {s: sympy.Integer(v) for s, v in zip(symbols or self.symbols, values)}


def _symbols_of(exprs: Sequence[Any], binder: SymbolBinder) -> tuple[sympy.Symbol, ...]:
    used: set[sympy.Symbol] = set()
    for e in exprs:
        if isinstance(e, sympy.Basic):
            used |= e.free_symbols
    return tuple(s for s in binder.symbols if s in used)


class SizeExprs:
    """A fixed list of size expressions (ints or sympy expressions over a binder's symbols),
    evaluated to ints for the symbol values of a call; cached per distinct values."""

    _MAX_CACHE = 256

    def __init__(self, binder: SymbolBinder, exprs: Sequence[Any]):
        for e in exprs:
            if not binder.covers(e):
                raise NotImplementedError(
                    f"size expression {e} uses symbols that no graph input carries")
        self.binder = binder
        self.exprs = tuple(exprs)
        self.symbols = _symbols_of(self.exprs, binder)
        self.read = binder.reader(self.symbols)
        self.static = not self.symbols
        self._cache: dict[tuple[int, ...], tuple[int, ...]] = {}

    def __call__(self, inputs: Sequence[Any]) -> tuple[int, ...]:
        if self.static:
            return tuple(int(e) for e in self.exprs)
        vals = self.read(inputs)
        r = self._cache.get(vals)
        if r is None:
            subs = self.binder.substitute(vals, self.symbols)
            r = tuple(int(e.xreplace(subs)) if isinstance(e, sympy.Basic) else int(e)
                      for e in self.exprs)
            if len(self._cache) >= self._MAX_CACHE:
                self._cache.clear()
            self._cache[vals] = r
        return r


@dataclasses.dataclass
class GuardCheck:
    """Guards on sizes that AOT autograd's tracing added to the ShapeEnv (a decomposition or a
    meta function branching on a size): the compiled graphs are valid only where they hold.
    Capture may not have seen them (a variant traced at call time, after capture wrote its
    guards), so the runtime checks them on each call; a call where one fails runs eagerly."""

    binder: SymbolBinder
    guards: list[Any]  # sympy booleans
    sources: list[str]

    def __post_init__(self) -> None:
        self._cache: dict[tuple[int, ...], bool] = {}
        self.symbols = _symbols_of(self.guards, self.binder)
        self.read = self.binder.reader(self.symbols)

    def __call__(self, inputs: Sequence[Any]) -> bool:
        vals = self.read(inputs)
        ok = self._cache.get(vals)
        if ok is None:
            subs = self.binder.substitute(vals, self.symbols)
            ok = True
            for g in self.guards:
                try:
                    # a guard over concrete values evaluates to sympy's true/false; anything
                    # else (undecided) counts as failed
                    ok = g.xreplace(subs) is sympy.true
                except TypeError:
                    ok = False
                if not ok:
                    break
            if len(self._cache) >= 256:
                self._cache.clear()
            self._cache[vals] = ok
        return ok


class ShapeEnvWatch:
    """What AOT's tracing did to the shared ShapeEnv: guards it added and symbols it created
    (a fresh unbacked symbol means a data-dependent size or value: ``nonzero``, ``.item()``)."""

    def __init__(self, shape_env: Any):
        self.env = shape_env
        self.n_guards = len(shape_env.guards)
        self.symbols = set(shape_env.var_to_range)
        #: symbols made by traces that were abandoned (an opaque custom-op backward): in no graph
        self.ignored: set[Any] = set()

    def new_symbols(self) -> list[sympy.Symbol]:
        return [s for s in self.env.var_to_range
                if s not in self.symbols and s not in self.ignored]

    def new_guards(self) -> list[Any]:
        return list(self.env.guards[self.n_guards:])

    def new_unbacked(self) -> list[sympy.Symbol]:
        from torch.utils._sympy.symbol import SymT, symbol_is_type

        return [s for s in self.new_symbols()
                if symbol_is_type(s, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT))]

    def unbacked_description(self) -> str | None:
        unbacked = self.new_unbacked()
        if not unbacked:
            return None
        return ("an op whose output size, or a value read from a tensor, depends on tensor "
                f"data made the unbacked symbols {', '.join(sorted(map(str, unbacked)))}")

    def check_no_new_symbols(self, allow_unbacked: bool = False) -> None:
        """No symbol but the graph inputs' (``allow_unbacked``: and unbacked ones, the sizes of
        data-dependent results, which live inside the graphs and are read from tensors there)."""
        new = self.new_symbols()
        if allow_unbacked:
            unbacked = set(self.new_unbacked())
            new = [s for s in new if s not in unbacked]
        if not new:
            return
        what = self.unbacked_description()
        if what is not None and not allow_unbacked:
            raise DataDependentSymbols(what)
        raise NotImplementedError(
            f"AOT autograd's tracing created new symbols {sorted(map(str, new))}; it must use "
            "the graph inputs' symbols only")


class DataDependentSymbols(RuntimeError):
    """Tracing made unbacked symbols: a size or value that depends on tensor data."""


def guard_check(binder: SymbolBinder, guards: Sequence[Any]) -> GuardCheck | None:
    """A :class:`GuardCheck` for ShapeGuards ``guards`` (None when there are none)."""
    exprs = [g.expr for g in guards]
    if not exprs:
        return None
    for e in exprs:
        if not binder.covers(e):
            raise NotImplementedError(
                f"a guard AOT autograd's tracing added ({e}) uses symbols no graph input carries")
    srcs = []
    for g in guards:
        sloc = getattr(g, "sloc", None)
        srcs.append(str(sloc) if sloc is not None else "")
    return GuardCheck(binder, exprs, srcs)
