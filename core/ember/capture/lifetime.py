"""What a compiled entry keeps alive, and how it dies.

An entry's guards identify user objects: ``(self) is ___Sequential_1``,
``(___Linear_2._parameters['weight']) is ___p_13``. Holding those objects in the entry's
namespace would keep every model ever compiled alive for the life of the process (the cache is
per code object, and ``Sequential.forward``'s code never dies). So the namespace holds *weak*
references to them, and an entry dies with the first object it identifies:

* The generated source is unchanged (``entry.source``, persisted captures and golden tests see
  the plain names). What runs is that source with a prologue that dereferences each weakly held
  name once per call into a local (``___Linear_2 = ___Linear_2__wr()``); every later use of the
  name is then a fast local read.
* When an identified object dies, a weakref callback kills the entry: its code is swapped for
  one that returns ``MISS`` (an id reused by a new object can never match a dead entry, even
  from a thread that still iterates an old entry list), its namespace is cleared (the backend's
  compiled callable, its frozen constants and pools, the graph, the strongly held parameters go
  with it) and it is dropped from its code object's entry list.

Which names are weak (:func:`weak_names`): objects of a kind a user owns (modules, tensors,
instances of user classes, closures and locally defined functions, compiled functions) that an
identity guard compares a source with, i.e. that were read from the call's arguments, globals or
closures. Objects Ember
made while tracing (resume functions, compiled callees, reconstructed values) are held only by
the entry and stay strong. A parameter or buffer read through a weakly held, identity-guarded
module is *owned* by it and held strongly: the entry dies with the module anyway, and a strong
reference keeps the per-call cost of a parameter at one identity check (a tensor does not refer
back to its module).
"""

from __future__ import annotations

import enum
import re
import types
import weakref
from typing import Any, Callable, Iterable

import torch

from . import stable, tensor_check

__all__ = ["weak_names", "make_entry", "namespace", "weak_of", "is_dead", "attach_cache"]

#: ``(source) is ___name``: the object was read from the call's inputs and is identified
_IDENTIFIED = re.compile(r"\bis (___\w+)\b")
_NAMES = re.compile(r"\b___\w+")

#: never user-owned, or permanent (held strongly whatever a guard says)
_STRONG_KINDS = (type, types.ModuleType, types.BuiltinFunctionType, types.BuiltinMethodType,
                 types.MethodDescriptorType, types.WrapperDescriptorType, types.CodeType,
                 types.MethodType, types.CellType, enum.Enum, torch.dtype, torch.device,
                 torch.layout, torch.memory_format, int, float, complex, str, bytes,
                 tuple, list, dict, set, frozenset, type(None))


def _weak_kind(obj: Any) -> bool:
    """Could this object belong to the user (and so must not be kept alive by an entry)?"""
    if isinstance(obj, (torch.nn.Module, torch.Tensor)):
        return True
    if isinstance(obj, types.FunctionType):
        # module-level functions live as long as their module; closures and functions made at
        # run time can hold anything (a model in a cell)
        q = obj.__qualname__
        return obj.__closure__ is not None or "<locals>" in q or "<lambda>" in q
    if isinstance(obj, _STRONG_KINDS) or isinstance(obj, torch._ops.OpOverload) or \
            isinstance(obj, torch._ops.OpOverloadPacket):
        return False
    mod = getattr(type(obj), "__module__", "") or ""
    return mod != "builtins"


def weak_names(ns: dict[str, Any], guards: Iterable[str], owned: Iterable[str] = ()
               ) -> list[str]:
    """The namespace names to hold weakly: user-owned objects that an identity guard compares
    a source with (so they were read from the call's inputs, and someone else holds them),
    except ``owned`` ones (state of a weakly held module). An object Ember made while tracing
    (a ``Sequential`` sliced in ``forward``) is only ever the base of a guard, never its
    right-hand side: the entry is all that holds it, so it stays strong."""
    skip = set(owned)
    out = []
    for name in sorted(set(_IDENTIFIED.findall("\n".join(guards)))):
        if name in skip or name not in ns:
            continue
        obj = ns[name]
        if not _weak_kind(obj):
            continue
        try:
            weakref.ref(obj)
        except TypeError:  # not weak-referenceable: held strongly (reported by the tests)
            continue
        out.append(name)
    return out


class _Life:
    """One entry's liveness: the weakrefs to what it identifies, and the cache it sits in. It
    is the callback of those weakrefs (the first object to die kills the entry)."""

    __slots__ = ("entry", "refs", "derived", "cache", "dead", "pending", "__weakref__")

    def __init__(self) -> None:
        self.entry: Any = None  # weakref to the entry function
        self.refs: dict[str, weakref.ref] = {}
        #: namespace dicts read through their weakly held owner (see instance_dicts)
        self.derived: dict[str, str] = {}
        self.cache: Any = None  # the CodeCache holding the entry, once added
        self.dead = False
        #: (source, filename) of an entry waiting for the guard extension (split_pending)
        self.pending: tuple[str, str] | None = None

    def __call__(self, _ref: Any = None) -> None:
        try:
            self.kill()
        except Exception:  # a weakref callback must not raise into unrelated code
            pass

    def kill(self) -> None:
        if self.dead:
            return
        self.dead = True
        entry = self.entry() if self.entry is not None else None
        self.refs, self.derived = {}, {}
        cache, self.cache = self.cache, None
        if entry is None:
            return
        if cache is not None:
            cache.entries = [e for e in cache.entries if e is not entry]
        explain = getattr(entry, "failed_guard", None)
        g = entry.__globals__
        entry.__code__ = _dead_entry.__code__
        if isinstance(explain, types.FunctionType) and explain.__globals__ is g:
            explain.__code__ = _dead_explain.__code__
        entry.__dict__.clear()
        entry._ember_life = self  # still recognisable as dead in a stale entry list
        g.clear()
        g["___MISS"] = _miss()


def _miss() -> Any:
    from .frame import MISS
    return MISS


def _dead_entry(*args: Any, **kwargs: Any) -> Any:  # the code of a killed entry
    return ___MISS  # noqa: F821  (the killed entry's namespace holds only this name)


def _dead_explain(*args: Any, **kwargs: Any) -> Any:
    return "the compiled entry died with an object it identified"


def instance_dicts(ns: dict[str, Any], weak: list[str]) -> dict[str, str]:
    """Namespace dicts that are the ``__dict__`` of a weakly held object (a module's, for
    ``'forward' not in ___dict_7``): name -> that object's name. Holding such a dict would hold
    everything the object holds (its hooks can be bound methods of the model's root); the entry
    reads it through the object instead."""
    owners = {}
    for name in weak:
        d = getattr(ns[name], "__dict__", None)
        if isinstance(d, dict):
            owners.setdefault(id(d), name)
    return {n: owners[id(v)] for n, v in ns.items()
            if type(v) is dict and id(v) in owners and n not in weak}


def _with_prologue(src: str, weak: list[str], derived: dict[str, str], *, guarded: bool
                   ) -> str:
    """``src`` (one function definition) dereferencing each weak name into a local first, and
    reading each ``derived`` dict from its owner. ``guarded``: the function's second line opens
    the ``try`` whose handler returns ``MISS`` (the entry); the prologue goes inside it, so a
    reference cleared while its callback has not run yet reads as a miss."""
    if not weak and not derived:
        return src
    lines = src.split("\n")
    inside = guarded and len(lines) > 1 and lines[1] == "    try:"
    pad = " " * (8 if inside else 4)
    pro = [f"{pad}{n} = {n}__wr()" for n in weak]
    if inside:
        pro += [f"{pad}{d} = {o}.__dict__" for d, o in derived.items()]
    else:
        pro += [f"{pad}{d} = getattr({o}, '__dict__', None)" for d, o in derived.items()]
    at = 2 if inside else 1
    return "\n".join(lines[:at] + pro + lines[at:])


def make_entry(src: str, explain_src: str, ns: dict[str, Any], filename: str,
               weak: list[str]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Execute the entry's source ``src`` (defining ``___entry``) and its explanation
    ``explain_src`` (``___failed_guard``) over ``ns``, holding the names ``weak`` through weak
    references. Returns the two functions; the entry dies with the first weak object."""
    life = _Life()
    derived = instance_dicts(ns, weak)
    g = {k: v for k, v in ns.items() if k not in weak and k not in derived}
    for name in weak:
        ref = weakref.ref(ns[name], life)
        life.refs[name] = ref
        g[f"{name}__wr"] = ref
    life.derived = derived
    code, split = _runtime_code(src, g, ns, weak, derived, filename)
    exec(code, g)
    exec(compile(_with_prologue(explain_src, weak, derived, guarded=False), filename, "exec"),
         g)
    entry, explain = g["___entry"], g["___failed_guard"]
    life.entry = weakref.ref(entry)
    entry._ember_life = life
    entry.failed_guard = explain
    if not split and weak and tensor_check._ext is None and stable.supported() and \
            tensor_check.state() != "failed":
        # the guard extension is not loaded yet: split this entry's guards once it is
        life.pending = (src, filename)
        _pending.add(life)
    if any(r() is None for r in life.refs.values()):
        life.kill()  # an object died while the entry was built
    return entry, explain


def _runtime_code(src: str, g: dict[str, Any], ns: dict[str, Any], weak: list[str],
                  derived: dict[str, str], filename: str) -> tuple[Any, bool]:
    """The code that runs for the entry source ``src``: its guards over state that has not
    changed checked by version where the guard extension is loaded (stable.py, which adds
    ``___stable_ok`` to ``g``; True second), and a prologue dereferencing the weak names it
    reads."""
    run = stable.split(src, g, ns, weak, derived) if weak else src
    if run is not src:
        used = set(_NAMES.findall(run))
        run_derived = {d: o for d, o in derived.items() if d in used}
        used.update(run_derived.values())
        run_weak = [n for n in weak if n in used]
    else:
        run_weak, run_derived = weak, derived
    try:
        code = compile(_with_prologue(run, run_weak, run_derived, guarded=True), filename,
                       "exec")
    except SyntaxError as e:  # an Ember bug: show what was generated
        raise SyntaxError(f"{e.msg} in generated entry line {e.lineno}: "
                          f"{src.splitlines()[(e.lineno or 1) - 1]!r}") from e
    return code, run is not src


#: entries built before the guard extension was loaded (their _Life), split once it is
_pending: "weakref.WeakSet[_Life]" = weakref.WeakSet()


def split_pending() -> int:
    """Give the entries built before the guard extension loaded their version-checked guards
    (called by tensor_check once it loads, from its thread): the entry's code is swapped, as a
    dying entry's is. Returns how many were split."""
    done = 0
    for life in list(_pending):
        _pending.discard(life)
        pending, life.pending = life.pending, None
        entry = life.entry() if life.entry is not None else None
        if pending is None or entry is None or life.dead:
            continue
        ns = namespace(entry)
        weak = sorted(life.refs)
        if any(ns.get(n) is None for n in weak):
            continue  # dying
        try:
            code, split = _runtime_code(pending[0], entry.__globals__, ns, weak,
                                        dict(life.derived), pending[1])
            if not split:
                continue
            fresh: dict[str, Any] = {}
            exec(code, entry.__globals__, fresh)
            if not life.dead:
                entry.__code__ = fresh["___entry"].__code__
                done += 1
        except Exception:  # noqa: BLE001 - the entry keeps its guards as they are
            continue
    return done


tensor_check.on_ready(split_pending)


def namespace(entry: Any) -> dict[str, Any]:
    """The entry's namespace as the generated source reads it (weak names dereferenced; a
    dead object reads as None)."""
    g = dict(getattr(entry, "__globals__", {}))
    life = getattr(entry, "_ember_life", None)
    if life is not None:
        for name, ref in life.refs.items():
            g.pop(f"{name}__wr", None)
            g[name] = ref()
        for name, owner in life.derived.items():
            g[name] = getattr(g.get(owner), "__dict__", None)
    return g


def weak_of(entry: Any) -> list[str]:
    """The names the entry holds weakly."""
    life = getattr(entry, "_ember_life", None)
    return sorted(life.refs) if life is not None else []


def is_dead(entry: Any) -> bool:
    life = getattr(entry, "_ember_life", None)
    return life is not None and life.dead


def attach_cache(entry: Any, cache: Any) -> bool:
    """Record the cache an entry is added to (a dying entry leaves it). False: the entry is
    dead already and must not be added."""
    life = getattr(entry, "_ember_life", None)
    if life is None:
        return True
    if life.dead:
        return False
    life.cache = cache
    return True
