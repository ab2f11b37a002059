"""Symbolic values tracked by the interpreter.

Every value on the symbolic stack is a ``Var``. A Var that came from the outside world (an
argument, a global, an attribute of one) carries a ``source`` (:mod:`ember.capture.sources`): a
structured value that prints as the Python expression fetching it again inside the generated entry
function. Sources are what guards are written against and what the output code uses to rebuild
values that leave the frame.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import torch

from ..exc import Unsupported
from .sources import Source

__all__ = [
    "Var", "ConstVar", "TensorVar", "TupleVar", "ListVar", "DictVar", "SetVar", "NullVar",
    "IteratorVar", "NNModuleVar", "FunctionVar", "NestedFunctionVar", "BoundMethodVar",
    "BuiltinVar", "ObjectVar", "PyModuleVar", "ClassVar", "CellVar", "SuperVar", "GradModeVar",
    "DataclassVar", "TensorMethodVar", "ContainerMethodVar", "AutocastVar",
    "ExitVar", "PyRaise",
]


def _expr(source: Source | None) -> str | None:
    return None if source is None else str(source)


class PyRaise(Unsupported):
    """The traced program raises the Python exception ``exc`` (a dict lookup of a missing key,
    ``next()`` on an exhausted iterator, a ``raise`` statement). The frames' exception tables
    route it to the program's own ``except`` clause; one nothing catches is a graph break at the
    root frame's instruction, as any other unsupported operation."""

    def __init__(self, exc: BaseException, msg: str | None = None):
        super().__init__(msg or f"the program raises {type(exc).__name__}: {exc}")
        self.exc = exc


class Var:
    source: Source | None = None

    def python_type(self) -> type:
        raise Unsupported(f"type of {self!r} is not known while tracing")

    def is_const(self) -> bool:
        return False

    def as_const(self) -> Any:
        raise Unsupported(f"{self.describe()} is not a Python constant here")

    def describe(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return f"{type(self).__name__}(source={_expr(self.source)!r})"


class NullVar(Var):
    """CPython's NULL stack marker (PUSH_NULL / LOAD_GLOBAL with the low bit set)."""


class ConstVar(Var):
    """A Python constant. One read from the outside world carries its guard *pending*: the
    guard is installed the first time tracing looks at the value, so a constant that is only
    passed through (to a call at a graph break, to the return value) does not specialize."""

    __slots__ = ("_value", "source", "_pending")

    def __init__(self, value: Any, source: Source | None = None, pending: Any = None):
        self._value = value
        self.source = source
        self._pending = pending

    @property
    def value(self) -> Any:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending()
        return self._value

    def peek(self) -> Any:
        """The value without installing its guard (for code that only forwards it)."""
        return self._value

    @property
    def guard_pending(self) -> bool:
        return self._pending is not None

    def python_type(self) -> type:
        v = self.value
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):  # dynamic shapes
            return {torch.SymInt: int, torch.SymFloat: float}.get(type(v), bool)
        return type(v)

    def is_const(self) -> bool:
        return True

    def as_const(self) -> Any:
        return self.value

    def describe(self) -> str:
        return f"constant {self._value!r}"

    def __repr__(self) -> str:
        return f"ConstVar({self._value!r})"


class TensorVar(Var):
    """A tensor in the graph: its fx node plus the FakeTensor that carries its metadata."""

    __slots__ = ("node", "fake", "source", "cls", "is_param")

    def __init__(self, node: torch.fx.Node, fake: torch.Tensor, source: Source | None = None,
                 cls: type = torch.Tensor, is_param: bool = False):
        self.node = node
        self.fake = fake
        self.source = source
        self.cls = cls
        self.is_param = is_param

    def python_type(self) -> type:
        return self.cls

    def describe(self) -> str:
        f = self.fake
        return f"tensor {tuple(f.shape)} {f.dtype}"

    def __repr__(self) -> str:
        return f"TensorVar({self.node.name}, {tuple(self.fake.shape)}, {self.fake.dtype})"


class _SeqVar(Var):
    items: list[Var]

    def is_const(self) -> bool:
        return all(i.is_const() for i in self.items)


class TupleVar(_SeqVar):
    """A tuple; ``cls`` is set for namedtuples, torch.Size and torch.return_types."""

    def __init__(self, items: list[Var] | tuple[Var, ...], source: Source | None = None,
                 cls: type = tuple):
        self.items = list(items)
        self.source = source
        self.cls = cls

    def python_type(self) -> type:
        return self.cls

    def as_const(self) -> Any:
        vals = [i.as_const() for i in self.items]
        if self.cls is tuple:
            return tuple(vals)
        if self.cls is torch.Size:
            return torch.Size(vals)
        if hasattr(self.cls, "_fields"):
            return self.cls(*vals)
        return self.cls(vals)

    def __repr__(self) -> str:
        return f"TupleVar({self.items!r})"


class ListVar(_SeqVar):
    def __init__(self, items: list[Var], source: Source | None = None, cls: type = list):
        self.items = list(items)
        self.source = source
        self.mutated = False
        self.cls = cls

    def python_type(self) -> type:
        return self.cls

    def as_const(self) -> Any:
        return [i.as_const() for i in self.items]

    def __repr__(self) -> str:
        return f"ListVar({self.items!r})"


class DictVar(Var):
    """A dict with Python-constant keys (insertion order kept)."""

    def __init__(self, items: dict[Any, Var], source: Source | None = None, cls: type = dict):
        self.items = dict(items)
        self.source = source
        self.mutated = False
        self.cls = cls

    def python_type(self) -> type:
        return self.cls

    def is_const(self) -> bool:
        return all(v.is_const() for v in self.items.values())

    def as_const(self) -> Any:
        return self.cls((k, v.as_const()) for k, v in self.items.items())


class SetVar(Var):
    def __init__(self, items: list[Var], source: Source | None = None, cls: type = set,
                 real: Any = None):
        self.items = list(items)
        self.source = source
        self.mutated = False
        self.cls = cls
        #: the set read from the outside world (``items`` are in its order): a set built anew
        #: from them may iterate in another order (collisions depend on insertion history)
        self.real = real
        #: a set made while tracing: a real set that went through the same insertions and copies
        #: as the program's (``containers.set_add``/``set_update``), while every item is a
        #: constant; None once an item is not. It is what the program's set iterates like.
        self.shadow: set | None = set() if not items and real is None else None

    def python_type(self) -> type:
        return self.cls

    def is_const(self) -> bool:
        return all(i.is_const() for i in self.items)

    def as_const(self) -> Any:
        if self.real is not None and not self.mutated:
            # a copy of a set keeps its table, and so the order ``''.join(s)`` reads it in
            return self.real if self.cls is frozenset else self.real.copy()
        if self._shadow_in_sync():
            # the mirror itself: a copy of a table with deleted slots can iterate in another
            # order (set_merge re-inserts then), as the program's set does not
            return self.shadow if self.cls is set else self.cls(self.shadow)
        return self.cls(i.as_const() for i in self.items)

    def _shadow_in_sync(self) -> bool:
        sh = self.shadow
        return sh is not None and len(sh) == len(self.items) and \
            all(isinstance(i, ConstVar) and i.value in sh for i in self.items)

    def ordered(self) -> list[Var]:
        """The items in the order Python iterates the real set (hash order, not insertion
        order): a set of constants is rebuilt by the same insertions to read it."""
        if (self.source is not None and not self.mutated) or \
                not all(isinstance(i, ConstVar) for i in self.items):
            return list(self.items)  # a real set's items were read in its own order
        if self._shadow_in_sync():
            by_value: dict[Any, Var] = {}
            for i in self.items:
                by_value.setdefault(i.value, i)
            return [by_value[x] for x in self.shadow]
        try:
            real: set = set()
            by_value = {}
            for i in self.items:
                real.add(i.value)
                by_value.setdefault(i.value, i)
            return [by_value[x] for x in real]
        except TypeError:  # unhashable
            return list(self.items)


class IteratorVar(Var):
    """An iterator over already-known items (lists, ranges, zip, enumerate, dict views...)."""

    def __init__(self, items: list[Var]):
        self.items = list(items)
        self.index = 0

    def python_type(self) -> type:
        return type(iter([]))

    def next(self) -> Var | None:
        if self.index >= len(self.items):
            return None
        v = self.items[self.index]
        self.index += 1
        return v

    def remaining(self) -> list[Var]:
        out = self.rest()
        self.index = len(self.items)
        return out

    def rest(self) -> list[Var]:
        """The items not consumed yet, without consuming them."""
        return self.items[self.index:]


class GeneratorVar(IteratorVar):
    """A generator created while tracing: its frame runs lazily, one ``next()`` at a time."""

    def __init__(self, frame: Any):
        super().__init__([])
        self.frame = frame
        self.started = False
        self.done = False

    def _advance(self) -> bool:
        from .interpreter import _Yield
        if self.done:
            return False
        if self.started:
            self.frame.push(ConstVar(None))  # the value `yield` evaluates to
        self.started = True
        try:
            self.frame.run()
        except _Yield as y:
            self.items.append(y.value)
            return True
        self.done = True
        return False

    def next(self) -> Var | None:
        if self.index >= len(self.items) and not self._advance():
            return None
        return super().next()

    def rest(self) -> list[Var]:
        while self._advance():
            pass
        return self.items[self.index:]

    def describe(self) -> str:
        return f"generator {self.frame.code.co_qualname}"


class CountVar(IteratorVar):
    """itertools.count(start, step): infinite, so only next() and islice() consume it."""

    def __init__(self, start: Any, step: Any):
        super().__init__([])
        self.value_next = start
        self.step = step

    def next(self) -> Var | None:
        v = ConstVar(self.value_next)
        self.value_next += self.step
        return v

    def rest(self) -> list[Var]:
        from ..exc import Unsupported
        raise Unsupported("materializing an infinite itertools.count()")


class NNModuleVar(Var):
    def __init__(self, module: torch.nn.Module, source: Source | None):
        self.value = module
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        return f"module {type(self.value).__name__}"

    def __repr__(self) -> str:
        return f"NNModuleVar({type(self.value).__name__}, source={_expr(self.source)!r})"


class FunctionVar(Var):
    """A real Python function (inlined when called)."""

    def __init__(self, fn: types.FunctionType, source: Source | None = None):
        self.value = fn
        self.source = source

    def python_type(self) -> type:
        return types.FunctionType

    def describe(self) -> str:
        return f"function {getattr(self.value, '__qualname__', self.value)}"

    def __repr__(self) -> str:
        return f"FunctionVar({getattr(self.value, '__qualname__', self.value)})"


class CellVar(Var):
    """A closure cell created inside the traced region (or wrapping a real cell)."""

    def __init__(self, value: Var | None = None, real_cell: Any = None, source: Source | None = None):
        self.value = value
        self.real_cell = real_cell
        self.source = source


class NestedFunctionVar(Var):
    """A function created by MAKE_FUNCTION while tracing."""

    def __init__(self, code: types.CodeType, fn_globals: dict, defaults: TupleVar | None,
                 kwdefaults: DictVar | None, closure: tuple[CellVar, ...] | None,
                 globals_source: Source | None):
        self.code = code
        self.fn_globals = fn_globals
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure
        self.globals_source = globals_source

    def python_type(self) -> type:
        return types.FunctionType

    def describe(self) -> str:
        return f"function {self.code.co_qualname}"


class BoundMethodVar(Var):
    def __init__(self, fn: Var, self_var: Var):
        self.fn = fn
        self.self_var = self_var

    def python_type(self) -> type:
        return types.MethodType


class BuiltinVar(Var):
    """A callable that is not inlined: builtins, torch functions, C functions."""

    def __init__(self, fn: Any, source: Source | None = None):
        self.value = fn
        self.source = source

    def python_type(self) -> type:
        v = self.value
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):  # dynamic shapes
            return {torch.SymInt: int, torch.SymFloat: float}.get(type(v), bool)
        return type(v)

    def is_const(self) -> bool:
        return True

    def as_const(self) -> Any:
        return self.value

    def describe(self) -> str:
        return f"callable {getattr(self.value, '__qualname__', None) or self.value!r}"

    def __repr__(self) -> str:
        return f"BuiltinVar({getattr(self.value, '__name__', self.value)})"


class TensorMethodVar(Var):
    def __init__(self, tensor: TensorVar, name: str):
        self.tensor = tensor
        self.name = name


class ContainerMethodVar(Var):
    """A method of a list/dict/set/tuple Var, or of a constant (``"a".join``)."""

    def __init__(self, obj: Var, name: str):
        self.obj = obj
        self.name = name


class ObjectVar(Var):
    """A user object from outside the frame: attribute reads are guarded and traced."""

    def __init__(self, value: Any, source: Source | None):
        self.value = value
        self.source = source
        self.pending: dict[str, Var] = {}

    def python_type(self) -> type:
        return type(self.value)

    def describe(self) -> str:
        return f"object of type {type(self.value).__qualname__}"

    def __repr__(self) -> str:
        return f"ObjectVar({type(self.value).__name__}, source={_expr(self.source)!r})"


class DataclassVar(Var):
    """An instance created while tracing by calling a class whose construction we understand
    (dataclasses, HF ModelOutput, plain classes with a simple __init__): a bag of fields."""

    def __init__(self, cls: type, fields: dict[str, Var]):
        self.cls = cls
        self.fields = dict(fields)
        self.source = None

    def python_type(self) -> type:
        return self.cls

    def describe(self) -> str:
        return f"{self.cls.__qualname__} instance"


class PyModuleVar(Var):
    def __init__(self, module: types.ModuleType, source: Source | None):
        self.value = module
        self.source = source

    def python_type(self) -> type:
        return types.ModuleType

    def is_const(self) -> bool:
        return True

    def as_const(self) -> Any:
        return self.value

    def __repr__(self) -> str:
        return f"PyModuleVar({self.value.__name__})"


class ClassVar(Var):
    def __init__(self, cls: type, source: Source | None):
        self.value = cls
        self.source = source

    def python_type(self) -> type:
        v = self.value
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):  # dynamic shapes
            return {torch.SymInt: int, torch.SymFloat: float}.get(type(v), bool)
        return type(v)

    def is_const(self) -> bool:
        return True

    def as_const(self) -> Any:
        return self.value

    def __repr__(self) -> str:
        return f"ClassVar({self.value.__qualname__})"


class SuperVar(Var):
    def __init__(self, cls: type, obj: Var):
        self.cls = cls
        self.obj = obj


@dataclasses.dataclass
class GradModeVar(Var):
    """torch.no_grad() / enable_grad() / set_grad_enabled(b) / inference_mode() objects."""

    enabled: bool
    source: Source | None = None

    def python_type(self) -> type:
        return torch.no_grad if not self.enabled else torch.enable_grad


@dataclasses.dataclass
class AutocastVar(Var):
    device_type: str
    dtype: Any
    enabled: bool
    source: Source | None = None


class ExitVar(Var):
    """The bound ``__exit__`` that BEFORE_WITH leaves on the stack."""

    def __init__(self, ctx: Var, restore: Any):
        self.ctx = ctx
        self.restore = restore


class PartialVar(Var):
    """functools.partial created while tracing."""

    def __init__(self, fn: Var, args: list[Var], kwargs: dict[str, Var]):
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.source = None

    def python_type(self) -> type:
        import functools
        return functools.partial
