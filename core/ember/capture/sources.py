"""Sources: where a value seen while tracing comes from, as structured values.

A source is a frozen dataclass that prints as the Python expression fetching the value again
inside the generated entry function (``str(Attr(Local("self"), "fc"))`` is ``self.fc``). Guards
and the entry are written with those expressions; code that needs to know *what* a source is
(a parameter? a buffer? which module path?) asks its type, never searches its text.

Every source is a :class:`torch._guards.Source`, so torch's ``ShapeEnv`` accepts them (symbolic
sizes are named after the source they were read from: ``x.size()[0]``). torch 2.13 reads
``source.name`` (a property); older releases call ``source.name()``: :class:`Source` provides
whichever the installed torch's base class uses, and :func:`source_name` reads it either way.
Only ``torch._guards`` is used from torch's internals.

The printed forms are exactly the strings capture wrote before sources were structured (golden
snapshots of guards and entries depend on them), parentheses included: an element of a
container is ``(x)[0]``, a global ``___G['w']``, a parameter ``self._parameters['weight']``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Iterator

import torch._guards as _tg

__all__ = [
    "Source", "Local", "NamespaceRef", "ChainedSource", "Attr", "GetItem", "Global",
    "ModuleChild", "Param", "Buffer", "ClosureCell", "CellContents", "Defaults", "KwDefaults",
    "TensorSize", "TensorStride", "source_name", "NAME_IS_PROPERTY",
]

#: torch's ``Source.name`` is a property (torch >= 2.12) rather than a method (older releases).
NAME_IS_PROPERTY: bool = not inspect.isfunction(inspect.getattr_static(_tg.Source, "name", None))

_GuardSource = _tg.GuardSource


def _like_torch(attr: str) -> Any:
    """A decorator making a method a cached property or leaving it a method, as torch's
    ``Source.<attr>`` is in the installed release (``name`` and ``guard_source`` became
    cached properties in newer torch; torch's own code reads them accordingly)."""
    is_method = inspect.isfunction(inspect.getattr_static(_tg.Source, attr, None))
    return (lambda f: f) if is_method else functools.cached_property


def _source_class(cls: type) -> type:
    """A frozen dataclass with :class:`Source`'s equality and hash (see there)."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    cls.__eq__ = Source.__eq__  # type: ignore[method-assign]
    cls.__hash__ = Source.__hash__  # type: ignore[method-assign]
    return cls


@dataclasses.dataclass(frozen=True)
class Source(_tg.Source):
    """Base class. Subclasses implement :meth:`_render`; ``str()`` gives the expression."""

    # -- printing ----------------------------------------------------------------------------
    def _render(self) -> str:
        raise NotImplementedError

    @functools.cached_property
    def _text(self) -> str:
        return self._render()

    def __str__(self) -> str:
        return self._text

    def __format__(self, spec: str) -> str:
        return format(self._text, spec)

    # Two sources are equal when they are of the same kind and print alike (the printers of
    # one kind are one-to-one, so this is structural equality; it also tells ``(x)[1]`` from
    # ``(x)[True]``, which field equality would not). The hash is that of the text, computed
    # once, so keys of any type (a slice in ``obj[1:2]``) stay hashable. A source never equals
    # a string: code that has a string compares ``str(source)`` explicitly.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, Source):
            return type(self) is type(other) and self._text == other._text
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._text)

    @_like_torch("name")
    def name(self) -> str:  # type: ignore[override]
        """The expression (what torch's ShapeEnv prints in its guards)."""
        return self._text

    @property
    def _name_template(self) -> str:
        # torch's Source.get_value evaluates this (our sources are not torch ChainedSources:
        # the whole expression, no ``{0}`` placeholder)
        return self._text

    @_like_torch("guard_source")
    def guard_source(self) -> _GuardSource:  # type: ignore[override]
        return _GuardSource.LOCAL

    # -- structure ---------------------------------------------------------------------------
    # ``base``: the source this one is read from; None for a root (a local, a namespace
    # name), a dataclass field of :class:`ChainedSource`.
    base = None  # a class attribute here: Source has no dataclass fields of its own

    def chain(self) -> Iterator["Source"]:
        """This source, then its base, its base's base, ... down to the root."""
        s: Source | None = self
        while s is not None:
            yield s
            s = s.base

    @property
    def root(self) -> "Source":
        *_, last = self.chain()
        return last

    def is_parameter(self) -> bool:
        """Read as ``module._parameters[name]``."""
        return False

    def is_buffer(self) -> bool:
        """Read as ``module._buffers[name]``."""
        return False

    def in_module_state(self) -> bool:
        """This source or one it is read from is a module's parameter or buffer."""
        return any(s.is_parameter() or s.is_buffer() for s in self.chain())

    def module_state(self) -> "Param | Buffer | None":
        """The nearest parameter or buffer access in the chain (self first), or None."""
        for s in self.chain():
            if isinstance(s, (Param, Buffer)):
                return s
        return None

    def module_path(self) -> str | None:
        """The dotted path of this source below its root module (``"fc.weight"`` for
        ``self._modules['fc']._parameters['weight']``), as ``named_parameters()`` spells it;
        None when the chain has anything but module children, parameters and buffers."""
        parts: list[str] = []
        for s in self.chain():
            if not isinstance(s, (ModuleChild, Param, Buffer)):
                break
            parts.append(str(s.key))
        return ".".join(reversed(parts)) or None

    def module_source(self) -> "Source | None":
        """The source of the module that ``module_path()`` is relative to."""
        for s in self.chain():
            if not isinstance(s, (ModuleChild, Param, Buffer)):
                return s if s is not self else None
        return None  # pragma: no cover - the loop ends at a root

    def rebase(self, old: "Source", new: "Source") -> "Source":
        """This source with ``old`` (an ancestor, or self) replaced by ``new``."""
        if self == old:
            return new
        return self


def source_name(source: Any) -> str:
    """The expression of a source: ours, torch's (``name`` property or method), or a string."""
    if isinstance(source, str):
        return source
    if isinstance(source, Source):
        return str(source)
    name = getattr(source, "name")
    return name() if callable(name) else name


# ---- roots -----------------------------------------------------------------------------------

@_source_class
class Local(Source):
    """A parameter of the entry function (``x``, ``self``, ``___fn``)."""

    local: str

    def _render(self) -> str:
        return self.local


@_source_class
class NamespaceRef(Source):
    """A name in the entry's namespace (``___G``, an object kept as ``___Linear_3``)."""

    ref: str

    def _render(self) -> str:
        return self.ref

    @_like_torch("guard_source")
    def guard_source(self) -> _GuardSource:  # type: ignore[override]
        return _GuardSource.GLOBAL


# ---- chained ---------------------------------------------------------------------------------

@_source_class
class ChainedSource(Source):
    """A source read from another one (``base``)."""

    base: Source = dataclasses.field()  # type: ignore[assignment]

    @_like_torch("guard_source")
    def guard_source(self) -> _GuardSource:  # type: ignore[override]
        gs = self.base.guard_source
        return gs() if callable(gs) else gs

    def rebase(self, old: Source, new: Source) -> Source:
        if self == old:
            return new
        return dataclasses.replace(self, base=self.base.rebase(old, new))

    def get_base(self) -> Source:  # torch's ChainedSource API
        return self.root


@_source_class
class Attr(ChainedSource):
    """``base.attr`` (``(base).attr`` when ``paren``)."""

    attr: str
    paren: bool = False

    def _render(self) -> str:
        return f"({self.base}).{self.attr}" if self.paren else f"{self.base}.{self.attr}"


@_source_class
class GetItem(ChainedSource):
    """``(base)[key]``, an element of a container (``base[key]`` when not ``paren``)."""

    key: Any
    paren: bool = True

    def _render(self) -> str:
        return f"({self.base})[{self.key!r}]" if self.paren else f"{self.base}[{self.key!r}]"


@_source_class
class Global(ChainedSource):
    """A global ``name`` of the globals dict ``base`` (``___G['name']``)."""

    key: str

    def _render(self) -> str:
        return f"{self.base}[{self.key!r}]"

    @_like_torch("guard_source")
    def guard_source(self) -> _GuardSource:  # type: ignore[override]
        return _GuardSource.GLOBAL


@_source_class
class ModuleChild(ChainedSource):
    """``module._modules[key]``."""

    key: str

    def _render(self) -> str:
        return f"{self.base}._modules[{self.key!r}]"


@_source_class
class Param(ChainedSource):
    """``module._parameters[key]``."""

    key: str

    def _render(self) -> str:
        return f"{self.base}._parameters[{self.key!r}]"

    def is_parameter(self) -> bool:
        return True


@_source_class
class Buffer(ChainedSource):
    """``module._buffers[key]``."""

    key: str

    def _render(self) -> str:
        return f"{self.base}._buffers[{self.key!r}]"

    def is_buffer(self) -> bool:
        return True


@_source_class
class ClosureCell(ChainedSource):
    """``fn.__closure__[index]``: the cell object itself."""

    index: int

    def _render(self) -> str:
        return f"{self.base}.__closure__[{self.index}]"


@_source_class
class CellContents(ChainedSource):
    """``cell.cell_contents``."""

    def _render(self) -> str:
        return f"{self.base}.cell_contents"


@_source_class
class Defaults(ChainedSource):
    """``fn.__defaults__``; ``.item(j)`` is ``fn.__defaults__[j]``."""

    def _render(self) -> str:
        return f"{self.base}.__defaults__"

    def item(self, j: int) -> GetItem:
        return GetItem(self, j, paren=False)

    def kwdefaults(self) -> "KwDefaults":
        return KwDefaults(self.base)


@_source_class
class KwDefaults(ChainedSource):
    """``fn.__kwdefaults__``; ``.item(name)`` is ``fn.__kwdefaults__[name]``."""

    def _render(self) -> str:
        return f"{self.base}.__kwdefaults__"

    def item(self, name: str) -> GetItem:
        return GetItem(self, name, paren=False)


@_source_class
class MethodRead(ChainedSource):
    """``owner.method(base, *args)``: a read-only method of a builtin container class called
    on a real object (``dict.get(reg, 'k')`` for a dict subclass whose own ``get`` calls
    ``super().get``), ``list(...)`` of it where ``as_list`` (``keys``/``values``/``items``).
    ``owner`` and ``args`` are printed expressions (namespace names, reprs of constants)."""

    owner: str
    method: str
    args: tuple = ()
    as_list: bool = False

    def _render(self) -> str:
        call = f"{self.owner}.{self.method}({', '.join((str(self.base), *self.args))})"
        return f"list({call})" if self.as_list else call


@_source_class
class TensorSize(ChainedSource):
    """``t.size()[dim]`` (torch's spelling, so ShapeEnv guards read the same)."""

    dim: int

    def _render(self) -> str:
        return f"{self.base}.size()[{self.dim}]"


@_source_class
class TensorStride(ChainedSource):
    """``t.stride()[dim]``."""

    dim: int

    def _render(self) -> str:
        return f"{self.base}.stride()[{self.dim}]"
