"""The public entry points: ``ember.compile`` and friends."""

from __future__ import annotations

import functools
import sys
import types
from typing import Any, Callable, TypeVar

import torch

from .plugins import Backend, get_backend

__all__ = ["compile", "disable", "reset", "is_compiling", "OptimizedModule", "SUPPORTED_PYTHONS",
           "last_capture", "captures", "mark_dynamic", "mark_static",
           "cudagraph_mark_step_begin"]

F = TypeVar("F", bound=Callable[..., Any])

SUPPORTED_PYTHONS = ((3, 11), (3, 12))

_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _check_python() -> None:
    v = sys.version_info[:2]
    if v not in SUPPORTED_PYTHONS:
        if v > SUPPORTED_PYTHONS[-1]:
            raise RuntimeError(
                f"ember.compile is not supported on Python {v[0]}.{v[1]}: Ember's bytecode capture "
                "supports CPython 3.11 and 3.12 only (Python 3.13+ is not supported yet). "
                "Use Python 3.11 or 3.12, or run the model without ember.compile.")
        raise RuntimeError(
            f"ember.compile is not supported on Python {v[0]}.{v[1]}: Ember's bytecode capture "
            "supports CPython 3.11 and 3.12 only. Use Python 3.11 or 3.12.")


class OptimizedModule(torch.nn.Module):
    """Wraps an ``nn.Module``: calls go through Ember, everything else reaches the original.

    Parameters, ``state_dict``, ``train()``/``eval()`` and attribute reads pass through to
    ``_orig_mod``; ``state_dict`` keys are those of the original module (no prefix).
    """

    def __init__(self, mod: torch.nn.Module, compiled_call: Callable[..., Any]):
        super().__init__()
        self._orig_mod = mod
        self.__dict__["_ember_call"] = compiled_call

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["_ember_call"](*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Not through Module.__call__: the compiled call runs the original module's hooks and
        # the global ones (register_module_forward_hook) once, as ``model(x)`` does; only
        # hooks registered on this wrapper itself need Module.__call__.
        if (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks
                or self._backward_pre_hooks):
            return super().__call__(*args, **kwargs)
        return self.__dict__["_ember_call"](*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        return getattr(self._modules["_orig_mod"], name)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def train(self, mode: bool = True) -> "OptimizedModule":
        self._orig_mod.train(mode)
        super().train(mode)
        return self

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"


def compile(model: Any = None, *, backend: str | Callable[..., Any] | Backend = "inductor",
            mode: str | None = None, options: dict[str, Any] | None = None,
            fullgraph: bool = False, dynamic: bool | None = None, disable: bool = False) -> Any:
    """Compile a function or ``nn.Module`` with Ember.

    Usable as ``fast = ember.compile(model, backend="eager")`` and as a decorator
    (``@ember.compile`` or ``@ember.compile(backend="eager")``). The result returns what the
    original returns; what Ember cannot compile runs eagerly, with the reason logged
    (``EMBER_LOGS=graph_breaks,fallback``). ``fullgraph=True`` makes any break an error.
    ``backend`` is a name from :func:`ember.list_backends`, an :class:`ember.Backend`, or a
    callable ``(gm, example_inputs) -> callable``.

    ``dynamic``: ``None`` (default) compiles static shapes first and, when a call recompiles
    because a tensor size (or an int argument) changed, compiles again with that size symbolic;
    ``True`` makes every size of the arguments (and every int argument) symbolic from the first
    compile; ``False`` always compiles static shapes. :func:`mark_dynamic` / :func:`mark_static`
    decide per dimension. Sizes 0 and 1 are always specialized (docs/dynamic_shapes.md).
    """
    if model is None:
        return functools.partial(compile, backend=backend, mode=mode, options=options,
                                 fullgraph=fullgraph, dynamic=dynamic, disable=disable)
    if mode not in _MODES:
        raise ValueError(f"ember.compile: unknown mode {mode!r}; expected one of {_MODES[1:]}")
    if options is not None and mode is not None:
        raise ValueError("ember.compile: pass either mode= or options=, not both (as torch.compile)")
    if disable:
        return model
    _check_python()
    be = get_backend(backend)  # unknown names fail here, at compile(), with the list of backends
    opts = dict(options or {})
    be.check_options(opts)  # and unknown options, naming close matches and the valid keys
    if mode is not None:
        opts["mode"] = mode
    from .capture.frame import CompiledFunction

    if isinstance(model, torch.nn.Module):
        from .distributed.routing import routed_compile
        routed = routed_compile(model, be, opts, fullgraph, dynamic)
        if routed is not None:
            # DDP's bookkeeping and FSDP's hooks run as Python around compiled forwards
            return OptimizedModule(model, routed)
        inner = CompiledFunction(type(model).forward, be, opts, fullgraph=fullgraph,
                                 bound_self=model, dynamic=dynamic)
        # The compiled model keeps entries of its own: two models of one class compiled
        # separately are each specialized on (parameters constant, frozen by inductor), not
        # made to share one graph as two instances passed to one compiled function are.
        from .capture.frame import CodeCache
        inner.cache = CodeCache(inner.cache.code)
        return OptimizedModule(model, inner)
    return _compile_callable(model, be, opts, fullgraph, dynamic)


def _describe(obj: Any) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return f"the builtin {getattr(obj, '__qualname__', obj)!r}"
    return f"a {type(obj).__module__}.{type(obj).__qualname__} object"


def _compile_callable(model: Any, be: Backend, opts: dict[str, Any], fullgraph: bool,
                      dynamic: bool | None) -> Any:
    """A Python function, a ``functools.partial`` of something compilable, or an instance whose
    class defines ``__call__`` in Python (as torch.compile accepts them)."""
    from .capture.frame import CompiledFunction

    if isinstance(model, types.FunctionType):
        return functools.wraps(model)(CompiledFunction(model, be, opts, fullgraph=fullgraph,
                                                       dynamic=dynamic))
    if isinstance(model, types.MethodType) and isinstance(model.__func__, types.FunctionType):
        inner = CompiledFunction(model.__func__, be, opts, fullgraph=fullgraph,
                                 bound_self=model.__self__, dynamic=dynamic)
        return functools.wraps(model)(_Bound(inner))
    if isinstance(model, functools.partial):
        inner = _compile_callable(model.func, be, opts, fullgraph, dynamic)
        return functools.update_wrapper(functools.partial(inner, *model.args, **model.keywords),
                                        model.func)
    if isinstance(model, torch.nn.Module):
        return compile(model, backend=be, options=opts or None, fullgraph=fullgraph,
                       dynamic=dynamic)
    call = getattr(type(model), "__call__", None)
    if not isinstance(model, type) and isinstance(call, types.FunctionType):
        inner = CompiledFunction(call, be, opts, fullgraph=fullgraph, bound_self=model,
                                 dynamic=dynamic)
        wrapped = _Bound(inner)
        functools.update_wrapper(wrapped, call, updated=())
        return wrapped
    raise TypeError(
        f"ember.compile cannot compile {_describe(model)}: it expects a Python function, an "
        "nn.Module, a functools.partial of one, or an object whose class defines __call__ in "
        "Python." + (" Compile an instance of the class, or a function that uses it."
                     if isinstance(model, type) else
                     " Compile the Python function that calls it." if callable(model) else ""))


class _Bound:
    """A compiled bound method or callable object: calls the compiled function with its self."""

    def __init__(self, inner: Any):
        self._ember_call = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._ember_call(*args, **kwargs)


def disable(fn: F | None = None, *, recursive: bool = True) -> Any:
    """Never compile ``fn`` nor (``recursive=True``, the default) anything it calls; inside a
    compiled region a call to it is a graph break that runs it eagerly. With
    ``recursive=False`` only ``fn`` itself is excluded: ember-compiled functions it calls still
    run compiled. Usable as a decorator."""
    if fn is None:
        return functools.partial(disable, recursive=recursive)
    from .capture.frame import mark_disabled

    return mark_disabled(fn, recursive=recursive)


def reset() -> None:
    """Forget every compiled entry, guard and counter (as torch.compiler.reset())."""
    from . import events
    from .capture.frame import reset_caches

    reset_caches()
    events.counters.clear()


def is_compiling() -> bool:
    """True while Ember is tracing (inside a compiled region's capture), else False."""
    from .capture.frame import is_compiling as _ic

    return _ic()


def last_capture() -> Any:
    """The most recent :class:`ember.capture.artifact.Capture` in this process (any function),
    or None: its ``graph`` (torch-level ``fx.GraphModule``), ``inputs`` (source, kind, whether
    the address is stable), ``guards`` and ``entry_source``; ``readable()`` prints them all."""
    from .capture.artifact import last_capture as _last

    return _last()


def _compiled_function(obj: Any) -> Any:
    from .capture.frame import CompiledFunction

    for _ in range(4):
        if isinstance(obj, CompiledFunction):
            return obj
        if isinstance(obj, OptimizedModule):
            obj = obj.__dict__["_ember_call"]
        elif isinstance(obj, functools.partial):
            obj = obj.func
        else:
            obj = getattr(obj, "_ember_call", None)
    return None


def captures(fn: Any) -> list[Any]:
    """The captures behind ``fn`` (what :func:`compile` returned): one per cached entry, most
    recent first, followed by those of the functions its graph breaks continue in (resume
    functions and compiled callees), depth first."""
    from .capture.frame import CompiledFunction

    cf = _compiled_function(fn)
    if cf is None:
        raise TypeError(f"ember.captures expects what ember.compile returned, got "
                        f"{type(fn).__name__}")
    out: list[Any] = []
    seen: set[int] = set()

    from .capture.lifetime import namespace

    def visit(c: Any) -> None:
        if id(c.cache) in seen:
            return
        seen.add(id(c.cache))
        for entry in c.cache.entries:
            cap = getattr(entry, "capture", None)
            if cap is not None:
                out.append(cap)
            for v in namespace(entry).values():
                if isinstance(v, CompiledFunction):
                    visit(v)

    visit(cf)
    return out


def mark_dynamic(t: torch.Tensor, dim: int | list[int] | tuple[int, ...], min: int | None = None,
                 max: int | None = None) -> None:
    """Compile ``t``'s dimension(s) ``dim`` with a symbolic size from the first compile (in
    every ``dynamic`` mode). ``min``/``max`` bound the sizes the graph serves; a size outside
    them recompiles. Sizes 0 and 1 are still specialized. If the compiled code forces the size
    to a constant, compiling raises :class:`ember.DynamicShapeError` naming the line."""
    from .capture.symbolic import mark_dynamic as _mark

    _mark(t, dim, min=min, max=max)


def mark_static(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Always compile ``t``'s dimension(s) ``dim`` with their concrete size (a new size
    recompiles), even with ``dynamic=True`` or after automatic dynamic."""
    from .capture.symbolic import mark_static as _mark

    _mark(t, dim)


#: Steps marked by :func:`cudagraph_mark_step_begin` (read by the cudagraphs runtime).
_cudagraph_steps = 0


def cudagraph_mark_step_begin() -> None:
    """Mark the beginning of a step (an inference call, a training iteration) for CUDA graphs
    (``backend="cudagraphs"``, ``mode="reduce-overhead"``): outputs of replays before this call
    are no longer needed, so a later replay may reuse their memory (accessing one afterwards
    raises an error instead of reading overwritten values). Ember marks steps itself where it
    can (each call of a graph with no backward pending); call this where it cannot tell, e.g.
    before each call when the program keeps the autograd graph of a forward it never
    differentiates."""
    global _cudagraph_steps
    _cudagraph_steps += 1
