"""What a precompiled artifact's source imports besides torch: the call-time checks and the
small pieces of AOT autograd's runtime (the autograd.Function glue) written as plain functions.

Nothing here captures, traces or builds FakeTensors. Every check raises
:class:`InputMismatchError` naming the argument (or parameter), what the artifact was built for
and what it was given.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .._views import input_alias, output_alias  # noqa: F401  (generated sources use them)
from ..exc import EmberError

__all__ = ["InputMismatchError", "check_state", "check_tensor", "check_value", "check_module",
           "no_autocast", "tangents", "copy_back", "Constants"]


class InputMismatchError(EmberError, ValueError):
    """A precompiled artifact was called with inputs or a model unlike those it was built for."""


def _fail(what: str, expected: Any, given: Any, hint: str = "") -> None:
    msg = f"precompiled artifact: {what}: expected {expected}, given {given}"
    if hint:
        msg += f". {hint}"
    raise InputMismatchError(msg)


_STATE_HINT = "Call the artifact in the state it was precompiled in, or precompile again"


def check_state(grad_enabled: bool, default_dtype: torch.dtype,
                autocast: Sequence[tuple[str, bool, torch.dtype]]) -> None:
    """Grad mode, default dtype and autocast as when the graph was traced."""
    if torch.is_grad_enabled() is not grad_enabled:
        _fail("grad mode", "enabled" if grad_enabled else "disabled (torch.no_grad())",
              "enabled" if torch.is_grad_enabled() else "disabled", _STATE_HINT)
    if torch.get_default_dtype() is not default_dtype:
        _fail("torch default dtype", default_dtype, torch.get_default_dtype(), _STATE_HINT)
    for dev, enabled, dtype in autocast:
        now = torch.is_autocast_enabled(dev)
        if now is not enabled or (enabled and torch.get_autocast_dtype(dev) is not dtype):
            _fail(f"autocast on {dev}", f"{'enabled, ' + str(dtype) if enabled else 'disabled'}",
                  f"{'enabled, ' + str(torch.get_autocast_dtype(dev)) if now else 'disabled'}",
                  _STATE_HINT)


def _device_str(d: torch.device) -> str:
    return str(d)


def check_tensor(name: str, t: Any, shape: tuple, stride: tuple, dtype: torch.dtype,
                 device: str, layout: torch.layout, requires_grad: bool) -> None:
    """A tensor argument as traced: shape, dtype, device, layout (strides) and requires_grad."""
    if not isinstance(t, torch.Tensor):
        _fail(f"argument {name!r}", "a Tensor", type(t).__name__)
    if t.dtype is not dtype:
        _fail(f"argument {name!r} dtype", dtype, t.dtype)
    if _device_str(t.device) != device:
        _fail(f"argument {name!r} device", device, t.device)
    if t.layout is not layout:
        _fail(f"argument {name!r} layout", layout, t.layout)
    if tuple(t.shape) != shape:
        _fail(f"argument {name!r} shape", shape, tuple(t.shape),
              "Shapes are static: precompile again for this shape")
    if tuple(t.stride()) != stride:
        _fail(f"argument {name!r} strides (memory layout)", stride, tuple(t.stride()),
              "Pass a tensor with the traced layout (e.g. .contiguous())")
    if t.requires_grad is not requires_grad:
        _fail(f"argument {name!r} requires_grad", requires_grad, t.requires_grad)


def check_value(name: str, v: Any, expected: Any) -> None:
    """A non-tensor argument the graph was specialized on (an int, a flag, a string...)."""
    if type(v) is not type(expected) or v != expected:
        _fail(f"argument {name!r}", repr(expected), repr(v),
              "The graph was specialized on this value: precompile again for another one")


def check_module(name: str, m: Any, cls: str, state: dict[str, tuple], modes: dict[str, bool],
                 hooked: frozenset = frozenset()) -> dict[str, torch.Tensor]:
    """A model argument: its class, the train/eval mode of every submodule, whether it has
    forward hooks, and its parameters
    and buffers (names, shapes, dtypes, devices, requires_grad). Returns name -> tensor, read
    now (the weights are those of the model passed, not stored in the artifact)."""
    if not isinstance(m, torch.nn.Module):
        _fail(f"argument {name!r}", f"an nn.Module ({cls})", type(m).__name__)
    got_cls = f"{type(m).__module__}.{type(m).__qualname__}"
    if got_cls != cls:
        _fail(f"argument {name!r} class", cls, got_cls)
    tensors: dict[str, torch.Tensor] = {}
    for prefix, sub in m.named_modules(remove_duplicate=False):
        want = modes.get(prefix)
        if want is not None and sub.training is not want:
            _fail(f"{name}.{prefix or '<root>'} mode", "train()" if want else "eval()",
                  "train()" if sub.training else "eval()")
        if bool(sub._forward_hooks or sub._forward_pre_hooks) is not (prefix in hooked):
            _fail(f"{name}.{prefix or '<root>'} forward hooks",
                  "some" if prefix in hooked else "none", "some" if prefix not in hooked else
                  "none", "The precompiled graph holds the hooks present when it was traced")
        dot = prefix + "." if prefix else ""
        for k, v in sub._parameters.items():
            if v is not None:
                tensors[dot + k] = v
        for k, v in sub._buffers.items():
            if v is not None:
                tensors[dot + k] = v
    if len(tensors) != len(state) or tensors.keys() != state.keys():
        missing = [k for k in state if k not in tensors]
        extra = [k for k in tensors if k not in state]
        _fail(f"argument {name!r} parameters and buffers",
              f"the names it was precompiled with (missing: {missing[:8]})",
              f"extra: {extra[:8]}", "The model's architecture differs")
    for key, (shape, dtype, device, requires_grad) in state.items():
        t = tensors[key]
        if tuple(t.shape) != shape:
            _fail(f"{name}.{key} shape", shape, tuple(t.shape))
        if t.dtype is not dtype:
            _fail(f"{name}.{key} dtype", dtype, t.dtype)
        if _device_str(t.device) != device:
            _fail(f"{name}.{key} device", device, t.device)
        if t.requires_grad is not requires_grad:
            _fail(f"{name}.{key} requires_grad", requires_grad, t.requires_grad)
    return tensors


def check_guard(expr: str, holds: Any) -> None:
    """A Python value the graph was specialized on (a module attribute, a flag) is unchanged."""
    try:
        ok = holds() is True
    except Exception as e:  # an attribute that no longer exists, ...
        ok, why = False, f"{type(e).__name__}: {e}"
    else:
        why = "False"
    if not ok:
        _fail(f"guard `{expr}`", "True (the graph was specialized on this value)", why,
              "Call with a model/arguments configured as when precompiled, or precompile again")


def check_alias(name: str, t: Any, first: Any) -> None:
    """Two places that held one tensor when traced (a tied weight, a tensor passed twice) must
    still hold one: the graph reads it once."""
    if t is not first:
        _fail(f"{name}", "the same tensor object as when precompiled (tied / passed twice)",
              "a different tensor", "The graph reads it once: tie it again, or precompile again")


def check_strides(name: str, t: torch.Tensor, stride: tuple) -> None:
    if tuple(t.stride()) != stride:
        _fail(f"{name} strides (memory layout)", stride, tuple(t.stride()))


def no_autocast() -> Any:
    """The ATen graphs already hold autocast's casts: run them with autocast off."""
    return torch._C._DisableAutocast()


def tangents(grads: Sequence[Any], diff_outs: Sequence[int], meta: Sequence[tuple]
             ) -> tuple[list[torch.Tensor], set[int]]:
    """The backward graph's tangents from autograd's gradients: zeros for outputs unused in the
    loss, contiguous and in the traced dtype otherwise. Also returns which were present."""
    out, present = [], set()
    for j, (k, (shape, stride, dtype, device)) in enumerate(zip(diff_outs, meta)):
        g = grads[k]
        if g is None:
            g = torch.zeros(shape, dtype=dtype, device=device)
        else:
            present.add(j)
            if tuple(g.stride()) != stride or g.dtype != dtype:
                g = g.to(dtype).contiguous()
        out.append(g)
    return out, present


def copy_back(dst: torch.Tensor, new: torch.Tensor) -> None:
    """An input the program mutates gets its new value (as the eager in-place op would)."""
    if new.requires_grad and torch.is_grad_enabled():
        dst.copy_(new)
    else:
        with torch.no_grad():
            dst.copy_(new)


class Constants:
    """The ``self`` of a graph function: holds its tensor constants as attributes."""

    def __init__(self, **values: Any):
        self.__dict__.update(values)


_loaded_libraries: list[Any] = []


def load_shared_library(data: bytes, name: str = "kernels") -> Any:
    """Load a shared library from the artifact's cache bytes with ctypes (written to a private
    temporary file, unlinked once loaded; the library stays mapped for the process)."""
    import ctypes
    import os
    import tempfile

    fd, path = tempfile.mkstemp(prefix=f"ember-precompiled-{name}-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        lib = ctypes.CDLL(path)
    finally:
        os.unlink(path)
    _loaded_libraries.append(lib)
    return lib


def cpu_flags() -> str:
    """The CPU's instruction-set flags (Linux /proc/cpuinfo), part of a cache's platform."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ""


def patch_imports(source: str, module: str, provider: str) -> str:
    """Replace ``from <module> import a, b as c`` lines of ``source`` by reads of those names
    from the object named ``provider`` (in the namespace the source runs in)."""
    import re

    pattern = re.compile(r"^(\s*)from\s+" + re.escape(module) + r"\s+import\s+\(?([\w\s,]+)\)?\s*$",
                         re.M)

    def bind(item: str) -> str:
        name, _, alias = (p.strip() for p in item.partition(" as "))
        return f"{alias or name} = {provider}.{name}"

    def repl(m: Any) -> str:
        items = [" ".join(n.split()) for n in m.group(2).split(",") if n.strip()]
        return m.group(1) + "; ".join(bind(n) for n in items)

    return pattern.sub(repl, source)


class CachedLibraries:
    """Stands for a backend's kernel-build module (e.g. ``ember_inductor.runtime.cache``) in a
    loaded artifact: libraries whose C++ source is in the artifact's cache are loaded from the
    cached bytes (keyed by the source's sha256) and never built; anything else is delegated to
    the real module, imported on first need."""

    def __init__(self, libraries: dict[str, bytes], module: str):
        self._libraries = libraries
        self._module_name = module
        self._loaded: dict[str, Any] = {}
        self._paths: dict[str, Any] = {}

    def _real(self) -> Any:
        import importlib

        return importlib.import_module(self._module_name)

    @staticmethod
    def _key(source: str) -> str:
        import hashlib

        return hashlib.sha256(source.encode("utf-8")).hexdigest()

    def load_cpp(self, source: str, *args: Any, **kwargs: Any) -> Any:
        key = self._key(source)
        data = self._libraries.get(key)
        if data is None:
            return self._real().load_cpp(source, *args, **kwargs)
        lib = self._loaded.get(key)
        if lib is None:
            lib = self._loaded[key] = load_shared_library(data, key[:12])
        return lib

    def compile_cpp(self, source: str, *args: Any, **kwargs: Any) -> Any:
        key = self._key(source)
        data = self._libraries.get(key)
        if data is None:
            return self._real().compile_cpp(source, *args, **kwargs)
        path = self._paths.get(key)
        if path is None:
            import os
            import pathlib
            import tempfile

            fd, name = tempfile.mkstemp(prefix=f"ember-precompiled-{key[:12]}-", suffix=".so")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            path = self._paths[key] = pathlib.Path(name)
        return path

    def compile_cpp_many(self, sources: Any, *args: Any, **kwargs: Any) -> Any:
        missing = [s for s in sources if self._key(s) not in self._libraries]
        if missing:
            self._real().compile_cpp_many(missing, *args, **kwargs)
        return [self.compile_cpp(s, *args, **kwargs) for s in sources]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._real(), name)
