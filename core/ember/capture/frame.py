"""The runtime side of capture: per-code-object caches of compiled entries, guard dispatch,
recompilation and fallback to eager.

A compiled entry is one generated Python function with the *same signature* as the user's
function. Its body checks the guards (returning the ``MISS`` sentinel when one fails), fetches the
graph inputs by their sources, calls the backend's compiled graph, replays side effects and
rebuilds the return value. Dispatch is therefore a loop over entries with one native call each.
"""

from __future__ import annotations

import logging
import threading
import types
from typing import Any, Callable

from .. import config, events
from ..exc import EmberError, GraphBreakError, Unsupported

__all__ = ["CompiledFunction", "MISS", "reset_caches", "is_compiling", "mark_disabled",
           "mark_allow_in_graph"]

log = logging.getLogger("ember.capture")
fallback_log = logging.getLogger("ember.fallback")
recompile_log = logging.getLogger("ember.recompiles")
skip_log = logging.getLogger("ember.skips")


class _Miss:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISS"


MISS = _Miss()

class _State(threading.local):
    """Per-thread: capture depth (tracing now) and ember.disable depth. Class-level defaults
    make the per-call reads plain attribute loads."""

    depth = 0
    disabled = 0


_tls = _State()


class _QuietWhileTracing(logging.Filter):
    """FakeTensor logs a traceback when an op fails on fake inputs; while Ember traces, that
    failure is reported once (as a fallback reason, or as the user's own error from the eager
    call), so the traceback is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_tls, "depth", 0)


logging.getLogger("torch._subclasses.fake_tensor").addFilter(_QuietWhileTracing())


def is_compiling() -> bool:
    return getattr(_tls, "depth", 0) > 0


class _Compiling:
    def __enter__(self) -> None:
        _tls.depth = getattr(_tls, "depth", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        _tls.depth -= 1


#: Functions marked by ember.disable / allow_in_graph (by code object for functions).
_disabled: set[Any] = set()
_allow_in_graph: set[Any] = set()
#: All live CompiledFunction caches, so ember.reset() can clear them.
_all_caches: list["CodeCache"] = []


def _key(fn: Any) -> Any:
    return getattr(fn, "__code__", fn)


def mark_disabled(fn: Any, recursive: bool = True) -> Any:
    """ember.disable: ``fn`` is never compiled, and (recursive) nothing it calls is either."""
    import functools

    _disabled.add(_key(fn))
    if not recursive or not callable(fn) or isinstance(fn, type):
        return fn

    @functools.wraps(fn)
    def disabled(*args: Any, **kwargs: Any) -> Any:
        _tls.disabled = getattr(_tls, "disabled", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _tls.disabled -= 1
    _disabled.add(_key(disabled))
    return disabled


def is_disabled(fn: Any) -> bool:
    return _key(fn) in _disabled


def mark_allow_in_graph(fn: Any) -> Any:
    _allow_in_graph.add(_key(fn))
    return fn


def is_allowed_in_graph(fn: Any) -> bool:
    return _key(fn) in _allow_in_graph


class CodeCache:
    """Entries for one code object (one user function), most recent first."""

    __slots__ = ("code", "entries", "misses", "given_up", "lock", "frame_state", "skipped",
                 "__weakref__")

    def __init__(self, code: types.CodeType):
        from .output import FrameState

        self.code = code
        #: automatic dynamic: the sizes and ints earlier compiles saw
        self.frame_state = FrameState()
        #: replaced, never mutated in place, so a call iterates it without a lock
        self.entries: list[Callable[..., Any]] = []
        self.misses = 0
        self.given_up: str | None = None
        #: given up because of a graph break inside a loop: the frame runs eagerly with the
        #: modules it calls compiled (capture/nested.py)
        self.skipped = False
        #: held while compiling: threads missing at once compile once
        self.lock = threading.RLock()


_code_caches: dict[tuple, CodeCache] = {}  # (id(code), backend key) -> cache


def cache_for(code: types.CodeType, key: tuple = ()) -> CodeCache:
    """The entries of ``code`` compiled under ``key`` (backend, options, fullgraph): the same
    function compiled for two backends keeps two sets of entries."""
    # Keyed by the code object's identity: code objects compare equal by content (two
    # functions exec'd from one source under different file names would share a cache and its
    # recompile budget). The CodeCache holds ``code``, so its id is not reused meanwhile.
    c = _code_caches.get((id(code), key))
    if c is None or c.code is not code:
        c = _code_caches[(id(code), key)] = CodeCache(code)
    return c


def _cache_key(backend: Any, options: dict[str, Any], fullgraph: bool,
               dynamic: bool | None = None) -> tuple:
    try:
        opts = tuple(sorted((k, repr(v)) for k, v in options.items()))
    except Exception:
        opts = (repr(options),)
    key = (getattr(backend, "name", None), id(getattr(backend, "compile", backend)), opts,
           bool(fullgraph))
    return key if dynamic is None else (*key, ("dynamic", dynamic))


def reset_caches() -> None:
    from . import artifact, convert, nested

    artifact.clear()
    nested.reset()
    convert._graph_counts.clear()
    for c in _code_caches.values():
        c.entries = []
        c.misses = 0
        c.given_up = None
        c.skipped = False
    _code_caches.clear()


def _user_location(fn: Any) -> str:
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    return f"{code.co_filename}:{code.co_firstlineno} in {code.co_name}"


class CompiledFunction:
    """What ``ember.compile(fn)`` returns (for modules, what OptimizedModule calls)."""

    def __init__(self, fn: Callable[..., Any], backend: Any, options: dict[str, Any], *,
                 fullgraph: bool = False, bound_self: Any = None, dynamic: bool | None = None):
        self.fn = fn
        self.backend = backend
        self.options = options
        self.fullgraph = fullgraph
        self.bound_self = bound_self
        self._traced_error: BaseException | None = None
        #: compiles calls through Module.__call__ once the root module has hooks
        self._hooked: CompiledFunction | None = None
        #: fn is the forward of the module bound_self, called without Module.__call__
        self._root_module = isinstance(bound_self, _nn_module()) and \
            getattr(type(bound_self), "forward", None) is fn
        self.dynamic = dynamic
        code = getattr(fn, "__code__", None)
        if code is None:
            raise TypeError(f"ember.compile: cannot compile {fn!r}: it has no Python bytecode "
                            "(builtin or C function). Compile the Python function that calls it.")
        self.cache = cache_for(code, _cache_key(backend, options, fullgraph, dynamic))
        self._code_key = code

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.bound_self is not None:
            args = (self.bound_self, *args)
        fn = self.fn
        code = fn.__code__
        if code is not self._code_key:  # fn.__code__ was replaced: its own entries
            self._rebind(code)
        if _tls.depth or _tls.disabled or code in _disabled:
            return fn(*args, **kwargs)
        cache = self.cache
        entries = cache.entries
        try:
            for entry in entries:
                out = entry(fn, *args, **kwargs)
                if out is not MISS:
                    return out
        except TypeError:
            if not _defaults_added(fn, entries):
                raise
        if cache.given_up is not None:
            return self._eager(args, kwargs)
        return self._compile_and_call(args, kwargs, entries)

    def _rebind(self, code: types.CodeType) -> None:
        self._code_key = code
        self.cache = cache_for(code, _cache_key(self.backend, self.options, self.fullgraph,
                                                self.dynamic))

    def _compile_and_call(self, args: tuple, kwargs: dict, seen: list | None = None) -> Any:
        """Every entry missed (``seen``: the entry list that was tried): compile a new entry,
        once per code object even when several threads miss at the same time."""
        m = self.bound_self
        if self._root_module:
            from torch.nn.modules import module as _mm
            if (m._forward_pre_hooks or m._forward_hooks or "forward" in m.__dict__
                    or m._backward_hooks or m._backward_pre_hooks
                    or _mm._global_forward_hooks or _mm._global_forward_pre_hooks
                    or _mm._global_backward_hooks or _mm._global_backward_pre_hooks):
                # Hooks or a forward set on the instance: the entries of the class's forward do
                # not serve this call; a call through Module.__call__ (hooks traced) does.
                if self._hooked is None:
                    self._hooked = CompiledFunction(
                        _module_call_fn(type(m)), self.backend, self.options,
                        fullgraph=self.fullgraph, bound_self=m, dynamic=self.dynamic)
                return self._hooked(*args[1:], **kwargs)
            fwd = type(m).forward
            if fwd is not self.fn and isinstance(fwd, types.FunctionType):
                # The class's forward was replaced after compiling: compile the new one.
                self.fn = fwd
                self._rebind(fwd.__code__)
                return self(*args[1:], **kwargs)
        cache = self.cache
        if seen is None:
            seen = cache.entries
        while True:
            with cache.lock:
                current = cache.entries
                if current is seen and cache.given_up is None:
                    entry = self._compile_locked(args, kwargs)
                    break
            if cache.given_up is not None:
                return self._eager(args, kwargs)
            # Another thread compiled while this one waited: try its entries first.
            for e in current:
                if not any(e is s for s in seen):
                    out = e(self.fn, *args, **kwargs)
                    if out is not MISS:
                        return out
            seen = current
        if entry is None:
            traced_error = self._traced_error
            self._traced_error = None
            if traced_error is None:
                return self._eager(args, kwargs)
            try:
                return self.fn(*args, **kwargs)
            except type(traced_error):
                # Tracing met the user's own error (a shape mismatch): it surfaces once, from
                # the eager call, and a later call with good inputs compiles.
                with cache.lock:
                    cache.given_up = None
                raise
        out = entry(self.fn, *args, **kwargs)
        if out is MISS:  # guards must hold on the inputs they were built from
            log.warning("ember: fresh entry for %s rejected its own inputs; running eagerly",
                        _user_location(self.fn))
            with cache.lock:
                cache.entries = [e for e in cache.entries if e is not entry]
                # counted as a recompile: an entry that never serves (an object it identifies
                # died at once) must not be compiled again on every call
                cache.misses += 1
                if cache.misses >= config.recompile_limit:
                    cache.given_up = "a fresh entry rejected its own inputs"
            return self.fn(*args, **kwargs)
        return out

    def _compile_locked(self, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
        """Under the cache's lock: a new entry (added to the cache), or None to run eagerly."""
        cache = self.cache
        if cache.entries:
            cache.misses += 1
            events.counters["stats"]["recompiles"] += 1
            reason = self._failed_guard(args, kwargs)
            recompile_log.info("recompiling %s: guard failed: %s", _user_location(self.fn), reason)
            events.emit("recompile", function=_user_location(self.fn), reason=reason)
            if cache.misses >= config.recompile_limit:
                cache.given_up = reason
                log.warning(
                    "ember: %s hit the recompile limit (%d); it now runs eagerly. The guard that "
                    "kept failing: %s. Raise ember.config.recompile_limit or make that value "
                    "stable across calls.", _user_location(self.fn), config.recompile_limit, reason)
                return None
        try:
            entry = self._compile(args, kwargs)
        except (GraphBreakError, Unsupported) as e:
            if self.fullgraph:
                raise self._fullgraph_error(e, args, kwargs) from None
            self._fallback(e)
            cause = e.__cause__
            if isinstance(cause, Exception) and not isinstance(cause, EmberError):
                self._traced_error = cause
            return None
        except EmberError as e:
            if self.fullgraph or not config.suppress_errors or _is_user_error(e):
                raise
            self._fallback(e)
            return None
        except Exception as e:  # internal error: never crash the user's program
            if not config.suppress_errors:
                raise
            self._fallback(e, internal=True)
            return None
        if entry is not None:
            from . import lifetime
            if not lifetime.attach_cache(entry, cache):
                return None  # an object it identifies died while it was compiled
            # copy on write: readers hold no lock; entries whose objects died are dropped
            cache.entries = [entry, *(e for e in cache.entries if not lifetime.is_dead(e))]
        return entry

    def _fullgraph_error(self, e: BaseException, args: tuple, kwargs: dict) -> GraphBreakError:
        if isinstance(e, GraphBreakError):
            return e
        from .convert import list_breaks
        try:
            with _Compiling():
                found = list_breaks(self.fn, args, kwargs) or [e]
        except Exception:
            found = [e]
        items = "\n".join(f"  {i}. {b}" for i, b in enumerate(found, 1))
        err = GraphBreakError(
            f"ember.compile(fullgraph=True): {_user_location(self.fn)} does not capture as one "
            f"graph; {len(found)} graph break(s):\n{items}\n"
            "Remove or rewrite these (the hint under each says how), or compile without "
            "fullgraph=True to let Ember split the function around them.")
        err.breaks = found  # type: ignore[attr-defined]
        return err

    def _eager(self, args: tuple, kwargs: dict) -> Any:
        """Run the function itself: the frame was given up (or this call could not compile)."""
        if self.cache.skipped:
            from .nested import scope
            with scope(self.backend, self.options, self.dynamic, args[0] if args else None):
                return self.fn(*args, **kwargs)
        return self.fn(*args, **kwargs)

    def _fallback(self, e: BaseException, internal: bool = False) -> None:
        if getattr(e, "skip_frame", False):
            # the frame is skipped, and what it calls is compiled (capture/nested.py)
            events.counters["stats"]["skipped_frames"] += 1
            skip_log.info("ember: %s runs as Python (skipped), with the modules it calls "
                          "compiled: %s", _user_location(self.fn), e)
            events.emit("skip", function=_user_location(self.fn), reason=str(e))
            self.cache.given_up = str(e)
            self.cache.skipped = True
            return
        events.counters["stats"]["fallbacks"] += 1
        from ..exc import BackendCompilerFailed
        if isinstance(e, BackendCompilerFailed):
            log.warning("ember: %s runs eagerly: %s (set ember.config.suppress_errors = False to "
                        "raise instead)", _user_location(self.fn), e)
        kind = "internal error" if internal else "unsupported"
        fallback_log.info("ember: running %s eagerly (%s): %s", _user_location(self.fn), kind, e,
                          exc_info=config.verbose or internal and log.isEnabledFor(logging.DEBUG))
        if internal:
            log.warning("ember: internal error while compiling %s; running it eagerly: %s: %s",
                        _user_location(self.fn), type(e).__name__, e)
        events.emit("fallback", function=_user_location(self.fn), reason=str(e))
        self.cache.given_up = str(e)

    def _failed_guard(self, args: tuple, kwargs: dict) -> str:
        for entry in self.cache.entries:
            explain = getattr(entry, "failed_guard", None)
            if explain is not None:
                try:
                    r = explain(self.fn, *args, **kwargs)
                except TypeError:
                    return "the function's defaults changed"
                if r:
                    return r
        return "<unknown>"

    def _compile(self, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
        from ..backends import compile_graph  # the runtime hands captures to the backends
        from . import persist  # opt-in: a warm start's first call rebuilt without tracing
        from .convert import convert_frame

        with _Compiling(), _saved_tensor_hooks_suspended():
            entry = persist.load(self, args, kwargs, compile_graph) if persist.enabled() else None
            if entry is not None:
                self._saw_modules(args)  # as a traced capture would have
                return entry
            policy = self._policy(args, kwargs)
            try:
                entry = convert_frame(self.fn, args, kwargs, backend=self.backend,
                                      options=self.options, compile_graph=compile_graph,
                                      fullgraph=self.fullgraph, root_module=self._root_module,
                                      policy=policy)
            except Exception as e:
                if not _retry_static(policy, e):
                    raise
                # A dynamic capture is never worse than a static one: what symbolic sizes made
                # fail (a SymInt where Python wants a hashable int, ...) compiles static shapes.
                log.info("ember: dynamic-shape capture of %s failed (%s: %s); compiling static "
                         "shapes", _user_location(self.fn), type(e).__name__, e)
                policy.allowed = False
                entry = convert_frame(self.fn, args, kwargs, backend=self.backend,
                                      options=self.options, compile_graph=compile_graph,
                                      fullgraph=self.fullgraph, root_module=self._root_module,
                                      policy=policy)
            if entry is not None and persist.enabled():
                persist.save(self, entry, args, kwargs)
            return entry

    def _saw_modules(self, args: tuple) -> None:
        """Record the module arguments of an entry rebuilt without tracing, so that a second
        instance makes the argument generic as after a traced first capture (see
        ``FrameState.see_module``)."""
        code = self.fn.__code__
        state = self.cache.frame_state
        for name, value in zip(code.co_varnames[:code.co_argcount], args):
            if isinstance(value, _nn_module()):
                state.see_module(name, value)

    def _policy(self, args: tuple, kwargs: dict) -> Any:
        """How this compile treats sizes (see ``output.DynamicPolicy``)."""
        from .output import DynamicPolicy
        from ..backends import takes_symbolic
        from .symbolic import has_marks

        code = self.fn.__code__
        n = code.co_argcount + code.co_kwonlyargcount
        return DynamicPolicy(mode=self.dynamic, state=self.cache.frame_state,
                             recompile=bool(self.cache.entries),
                             allowed=takes_symbolic(self.backend),
                             marked=has_marks(args, kwargs),
                             root_args=tuple(code.co_varnames[:n]))


class _saved_tensor_hooks_suspended:
    """Compiling runs (fake) tensor code: it must not reach saved-tensor hooks the caller has
    installed (``torch.utils.checkpoint`` counts what its forward saves, and a compile inside a
    checkpointed function would add to the count). Pops them for the compile, then restores."""

    def __enter__(self) -> None:
        import torch

        a = torch._C._autograd
        self.hooks = []
        while (top := a._top_saved_tensors_default_hooks(True)) is not None:
            self.hooks.append(top)
            a._pop_saved_tensors_default_hooks()

    def __exit__(self, *exc: Any) -> None:
        import torch

        for pack, unpack in reversed(self.hooks):
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)


def _retry_static(policy: Any, e: BaseException) -> bool:
    """Should a failed dynamic-shape capture be retried with static shapes? Not when the user
    marked dims dynamic (their error must surface), nor for a user error or a fullgraph break."""
    from .symbolic import DynamicShapeError

    if policy is None or not policy.symbolic or policy.marked:
        return False
    return not isinstance(e, (DynamicShapeError, GraphBreakError)) and not _is_user_error(e)


def _defaults_added(fn: Any, entries: list) -> bool:
    """``fn`` has defaults (or keyword defaults) that an entry built without any lacks: the
    entry could not bind the call, which is a miss, not the user's error."""
    return any((e.__defaults__ is None and fn.__defaults__ is not None) or
               (e.__kwdefaults__ is None and fn.__kwdefaults__ is not None) for e in entries)


def _nn_module() -> type:
    import torch

    return torch.nn.Module


def _call_module(self: Any, *args: Any, **kwargs: Any) -> Any:
    return self(*args, **kwargs)


_module_call_fns: dict[type, types.FunctionType] = {}


def _module_call_fn(cls: type) -> types.FunctionType:
    """``lambda self, *a, **k: self(*a, **k)`` with a code object of its own per module class
    (caches are per code object: classes must not share entries and recompile budgets)."""
    fn = _module_call_fns.get(cls)
    if fn is None:
        name = "".join(c if c.isalnum() else "_" for c in cls.__qualname__)
        code = _call_module.__code__.replace(co_name=f"{name}__call__",
                                             co_qualname=f"{cls.__qualname__}.__call__")
        fn = _module_call_fns[cls] = types.FunctionType(code, _call_module.__globals__)
    return fn


def _is_user_error(e: BaseException) -> bool:
    from ..exc import (BackendLoadError, BackendNotFound, DeviceUnavailable,
                       InferenceOnlyBackend, NotImplementedYet, RankDivergence)
    from .symbolic import DynamicShapeError

    return isinstance(e, (BackendNotFound, BackendLoadError, NotImplementedYet,
                          InferenceOnlyBackend, DynamicShapeError, RankDivergence,
                          DeviceUnavailable))
