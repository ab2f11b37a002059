"""Frames that run eagerly while the modules they call are compiled.

A graph break inside a loop cannot be resumed, so such a frame is *skipped*: it runs eagerly.
A compiler with a frame-evaluation hook still compiles every frame the skipped one calls, each on
its own, and users expect that. A Hugging Face decoder whose layer loop branches on a tensor (LayerDrop:
``if torch.rand([]) < self.layerdrop: continue``) therefore still runs its layers compiled.

Ember has no frame-evaluation hook. It gets the same effect for the calls that matter, calls of
``nn.Module`` instances: while a skipped frame runs, :func:`scope` routes ``module(...)`` calls
made *by eager code in this thread* to a compiled version of that module (one per module and
backend, compiled like ``ember.compile(module)``). Plain function calls run eagerly (a
frame-evaluation hook would compile those too; Ember then has fewer graphs, never different
results).

The routing is a ``__call__`` set on each module class reachable from the skipped frame's module
for as long as any thread is inside a scope (counted per class, restored by the last one out).
It checks a thread-local: other threads, Ember's own tracing (which never goes through
``__call__``) and calls re-entering the module being dispatched all get ``nn.Module.__call__``.
"""

from __future__ import annotations

import threading
import types
import weakref
from typing import Any, Callable, Iterator

import torch

__all__ = ["scope", "active"]


class _State(threading.local):
    #: (backend, options, dynamic) of the skipped frames this thread is running, innermost last
    scopes: list[tuple[Any, dict[str, Any], Any]]
    #: modules being dispatched now (a compiled module that runs eagerly calls itself again)
    busy: set[int]

    def __init__(self) -> None:
        self.scopes = []
        self.busy = set()


_tls = _State()
_lock = threading.Lock()
#: class -> (number of scopes that patched it, the ``__call__`` in its own __dict__ before, if any)
_patched: dict[type, tuple[int, Any]] = {}
_MISSING = object()
#: module -> {backend key: the compiled callable}
_compiled: "weakref.WeakKeyDictionary[torch.nn.Module, dict[Any, Callable[..., Any]]]" = \
    weakref.WeakKeyDictionary()


def active() -> bool:
    return bool(_tls.scopes)


def _dispatch(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    if not _tls.scopes or id(self) in _tls.busy or _from_ember() or \
            torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
        # (under saved-tensor hooks, e.g. inside an eager torch.utils.checkpoint region: the
        # recomputation must run the very code the forward ran, and entries shared by the
        # instances of a class may not be the one the forward took)
        return torch.nn.Module.__call__(self, *args, **kwargs)
    backend, options, dynamic = _tls.scopes[-1]
    fn = _compiled_for(self, backend, options, dynamic)
    if fn.cache.given_up is not None and fn.cache is not fn.__dict__.get("_own_cache"):
        # The class's shared entries hit the recompile limit (each instance differs in a value
        # its forward reads: a per-layer int attribute): this instance gets entries of its own.
        from .frame import CodeCache
        fn.cache = fn._own_cache = CodeCache(fn.cache.code)
    _tls.busy.add(id(self))
    try:
        return fn(*args, **kwargs)
    finally:
        _tls.busy.discard(id(self))


_dispatch._ember_nested_dispatch = True  # type: ignore[attr-defined]


def _from_ember() -> bool:
    from .frame import is_compiling

    return is_compiling()


def _compiled_for(m: torch.nn.Module, backend: Any, options: dict[str, Any],
                  dynamic: Any) -> Callable[..., Any]:
    from .frame import CompiledFunction, _module_call_fn

    key = (getattr(backend, "name", None), id(backend), repr(sorted(options.items())), dynamic)
    per = _compiled.setdefault(m, {})
    fn = per.get(key)
    if fn is None:
        own_call = _own_call(type(m))
        if own_call is not None:
            # a class with its own __call__ (transformers' GradientCheckpointingLayer): that
            # frame is compiled, as a frame hook would; it reaches forward via super().__call__
            inner = CompiledFunction(own_call, backend, options, bound_self=m, dynamic=dynamic)
        elif m._forward_pre_hooks or m._forward_hooks or "forward" in m.__dict__:
            inner = CompiledFunction(_module_call_fn(type(m)), backend, options, bound_self=m,
                                     dynamic=dynamic)
        else:
            inner = CompiledFunction(type(m).forward, backend, options, bound_self=m,
                                     dynamic=dynamic)
        # The instances of a class share the entries of its forward: the first instance is
        # specialized on, a second one makes ``self`` guarded by class (FrameState.see_module),
        # and that entry serves every further instance: the layers of a model, the experts of
        # a mixture compile twice, not once each (and never run into the recompile limit).
        fn = per[key] = inner
    return fn


def _classes(root: Any) -> set[type]:
    """Module classes whose instances the skipped frame may call: those under its module."""
    if not isinstance(root, torch.nn.Module):
        return set()
    return {type(m) for m in root.modules() if m is not root and _routable(type(m))}


def _routable(cls: type) -> bool:
    """Frames of torch's own modules (``nn.Linear.forward``) are not compiled on their own, only
    user code (the same rule as for skipped files); a class whose own ``__call__`` is not a
    Python function defined outside torch is left alone too."""
    if (cls.__module__ or "").split(".", 1)[0] == "torch":
        return False
    call = cls.__call__
    if call is torch.nn.Module.__call__ or getattr(call, "_ember_nested_dispatch", False):
        return True
    return _own_call(cls) is not None


def _own_call(cls: type) -> Any:
    """The ``__call__`` a module class defines above ``nn.Module`` (before any routing replaced
    it), when it is a Python function outside torch; None for ``nn.Module.__call__``."""
    for c in cls.__mro__:
        if c is torch.nn.Module:
            return None
        patched = _patched.get(c)
        call = patched[1] if patched is not None else c.__dict__.get("__call__", _MISSING)
        if call is _MISSING:
            continue
        if not isinstance(call, types.FunctionType) or \
                (getattr(call, "__module__", "") or "").split(".", 1)[0] == "torch":
            return None
        return call
    return None


class scope:
    """``with scope(backend, options, dynamic, root): fn(...)``: run a skipped frame eagerly with
    the module calls it makes compiled. ``root``: the frame's ``self`` (its submodules' classes
    are routed); nothing is routed when it is not a module."""

    def __init__(self, backend: Any, options: dict[str, Any], dynamic: Any, root: Any):
        self.entry = (backend, dict(options), dynamic)
        self.classes = _classes(root)

    def __enter__(self) -> None:
        with _lock:
            for cls in self.classes:
                n, before = _patched.get(cls, (0, _MISSING))
                if n == 0:
                    before = cls.__dict__.get("__call__", _MISSING)
                    cls.__call__ = _dispatch  # type: ignore[method-assign]
                _patched[cls] = (n + 1, before)
        _tls.scopes.append(self.entry)

    def __exit__(self, *exc: Any) -> None:
        _tls.scopes.pop()
        with _lock:
            for cls in self.classes:
                n, before = _patched[cls]
                if n > 1:
                    _patched[cls] = (n - 1, before)
                    continue
                del _patched[cls]
                if before is _MISSING:
                    del cls.__call__  # type: ignore[misc]
                else:
                    cls.__call__ = before  # type: ignore[method-assign]


def reset() -> None:
    """Forget the compiled modules (``ember.reset()``)."""
    _compiled.clear()


def patched_classes() -> Iterator[type]:
    """Classes routed now (tests check that nothing is left behind)."""
    return iter(list(_patched))
