"""Saving and loading precompiled artifacts. Loading executes the artifact's source."""

from __future__ import annotations

import linecache
import logging
import os
import platform
import tempfile
import types
from typing import Any

import torch

from . import container
from .container import CacheError
from .errors import PrecompileError

__all__ = ["save", "load", "Loaded", "SOURCE_NAME", "CACHE_NAME"]

log = logging.getLogger("ember.precompile")

SOURCE_NAME = "artifact.py"
CACHE_NAME = "artifact.cache"


def _atomic_write(path: str, data: bytes) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save(artifact: Any, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    _atomic_write(os.path.join(path, SOURCE_NAME), artifact.source.encode("utf-8"))
    _atomic_write(os.path.join(path, CACHE_NAME), artifact.cache)


class Loaded:
    """The callable ``ember.precompile.load`` returns: call it with ``fn``'s arguments.

    ``source`` is the artifact's source, ``meta`` its ARTIFACT dict, ``used_cache`` whether the
    cache's entries were used (False: everything was built from the source), ``check(*args)``
    runs the call-time checks alone.
    """

    def __init__(self, fn: Any, module: types.ModuleType, used_cache: bool):
        self._fn = fn
        self.module = module
        self.source: str = module.__dict__["__ember_source__"]
        self.meta: dict[str, Any] = module.__dict__.get("ARTIFACT", {})
        self.used_cache = used_cache
        self.check = fn.check

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def __repr__(self) -> str:
        return (f"<ember precompiled {self.meta.get('function')} backend="
                f"{self.meta.get('backend')!r} ({self.meta.get('kind')})>")


def _cache_fits(plat: dict[str, Any]) -> str | None:
    """Why cached binaries do not fit this machine (None: they fit)."""
    if plat.get("torch") != torch.__version__:
        return f"built with torch {plat.get('torch')}, this is torch {torch.__version__}"
    if plat.get("machine") != platform.machine():
        return f"built on {plat.get('machine')}, this machine is {platform.machine()}"
    from .runtime import cpu_flags

    if "cpu_flags_sha256" in plat and plat["cpu_flags_sha256"] != container.sha256(cpu_flags()):
        return "built on a CPU with another instruction set"
    return None


def load(path: str | None = None, *, source: str | None = None,
         cache: bytes | None = None) -> Loaded:
    """Load a precompiled artifact: ``load(path)`` (a folder written by ``Artifact.save``) or
    ``load(source=..., cache=...)``.

    The source is executed (an artifact is code: load only what you would import). The cache is
    checked (container format and version, every entry's sha256, the sha256 of this source) and
    refused with :class:`CacheError` when it is corrupt, truncated or belongs to another source.
    A missing cache, or one built for another torch version or machine, is not an error: the
    backend builds what it needs from the source.
    """
    filename = "<ember precompiled artifact>"
    if path is not None:
        if source is not None:
            raise TypeError("ember.precompile.load: pass a path or source=, not both")
        src_path = os.path.join(path, SOURCE_NAME) if os.path.isdir(path) else path
        if not os.path.exists(src_path):
            raise FileNotFoundError(f"ember.precompile.load: no artifact source at {src_path}")
        with open(src_path, "rb") as f:
            source = f.read().decode("utf-8")
        filename = os.path.abspath(src_path)
        cache_path = os.path.join(os.path.dirname(src_path), CACHE_NAME)
        if cache is None and os.path.exists(cache_path):
            with open(cache_path, "rb") as f:
                cache = f.read()
    if source is None:
        raise TypeError("ember.precompile.load: pass the artifact's folder or source=")
    digest = container.sha256(source)
    entries: dict[str, bytes] | None = None
    if cache is not None:
        entries, plat = container.unpack(cache, source_sha256=digest)
        why = _cache_fits(plat)
        if why is not None:
            log.info("ember.precompile.load: cache not used (%s); building from the source", why)
            entries = None
    else:
        log.info("ember.precompile.load: no cache; building from the source")
    module = types.ModuleType("ember_precompiled_artifact")
    module.__dict__["__file__"] = filename
    module.__dict__["__ember_source__"] = source
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)  # tracebacks show lines
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as e:
        raise PrecompileError(f"ember.precompile.load: the artifact source is not valid Python "
                              f"({e})") from None
    exec(code, module.__dict__)
    make = module.__dict__.get("make")
    if not callable(make):
        raise PrecompileError("ember.precompile.load: the source defines no make(cache)")
    fn = make(entries)
    return Loaded(fn, module, bool(entries))  # True: compiled binaries came from the cache


__all__ += ["CacheError"]
