"""Ember inductor's on-disk cache: C++ source -> shared library, and a small text store.

Everything is keyed by content. A compiled kernel library is found by the sha256 of

* the C++ source,
* the compiler (resolved path and ``--version`` text),
* the flags,
* the CPU instruction set the compiler targets (``-march=native`` resolved by the compiler itself,
  ``g++ -march=native -Q --help=target``; ``/proc/cpuinfo`` flags if the compiler cannot say) —
  code built for this CPU must never be loaded on another. A source whose first line is
  ``// ember-cpu-isa: x86-64-v3`` (the inductor option ``cpu_isa``, see codegen/cpp.py) is built
  with ``-march=x86-64-v3`` instead of ``-march=native``, and keyed by that target's resolution
  (the same on every CPU that runs it),
* the torch version and this cache's format version;

nothing else decides a hit. Writes are atomic (build into a unique temporary file in the entry's
folder, then ``os.replace``) and serialized per key with ``fcntl.flock``, so several processes
compiling the same source at once build it once and never see a half-written file. Each library
has a metadata file with the sha256 and size of its bytes; an entry whose bytes do not match is
rebuilt, never loaded. Nothing is pickled.

Layout under :func:`cache_dir`::

    cpp/<k[:2]>/<k>.cpp     the source (kept for error messages and debugging)
    cpp/<k[:2]>/<k>.so      the library
    cpp/<k[:2]>/<k>.json    {"format", "sha256", "size", "flags", ...}: written last (commit)
    cpp/<k[:2]>/<k>.lock    flock target while building
    text/<namespace>/<sha256(key)>.json   {"format", "key", "sha256", "text"}  (ember._store's
                                          text store, shared with the core's caches)

Flags (why): ``-O3 -march=native -fopenmp -shared -fPIC -std=c++17`` plus

* ``-ffp-contract=off``: no fused multiply-add unless the source asks for one (``std::fma``); a
  contracted ``a*b+c`` rounds once instead of twice and differs from eager in the last bit.
* ``-fno-math-errno``: math functions need not set ``errno``, so ``sqrt`` becomes one instruction
  and loops calling it can vectorize; the values are the same IEEE results.
* ``--param=vect-max-version-for-alias-checks=256``: inside an OpenMP region gcc no longer sees
  the kernels' ``__restrict__``, so a loop over many buffers is vectorized only behind run-time
  overlap checks, and past gcc's default of 10 checks it stays scalar (convnet's fused BatchNorm
  backward loop reads 12 buffers, bert's fused LayerNorm recomputation 24).
* ``-fno-trapping-math``: floating-point operations are assumed not to trap (they never do in the
  default environment; results are the same IEEE values): without it gcc keeps a compare-and-select
  (``x <= 0 ? 0 : g``, ReLU's backward, ``where``) as a branch and the whole loop stays scalar
  (convnet's BatchNorm+ReLU backward loops).
* ``--param=max-completely-peel-times=1 -fno-tree-vrp``: gcc 12 miscompiles some loops with
  conditional loads for AVX-512 targets (any ``-march`` with AVX-512, not AVX2): a padded or
  shifted read in a short inner loop (3, 5, 7 or 9 elements) that the vectorizer masks,
  fully unrolls, and whose masks it folds to constants, gets wrong masks and drops elements
  (``F.local_response_norm`` in training gave relative errors of 1e-3; tests/inductor/
  test_wrong_results.py test_masked_loads_in_short_loops). Either parameter alone avoids it in
  every case found; both are kept, since the fault is gcc's and its exact trigger unknown.
  Measured on 12 graphs of the zoo and the wide corpus (AMD EPYC, one thread): within 2%.
* never ``-ffast-math`` (or ``-ffinite-math-only``, ``-funsafe-math-optimizations``): those change
  NaN/infinity handling and reassociate sums, so results would differ from eager.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import ember
from ember import _store

__all__ = [
    "CompileError",
    "BASE_FLAGS",
    "FORMAT_VERSION",
    "cache_dir",
    "compile_cpp",
    "compile_cpp_many",
    "load_cpp",
    "cpp_key",
    "source_march",
    "get_text",
    "put_text",
    "info",
    "clear",
    "counters",
]

log = logging.getLogger("ember.inductor.cache")

#: Bump when the layout or the meaning of an entry changes: old entries become misses.
FORMAT_VERSION = 1

#: Flags every library is built with (see the module docstring for why each one).
BASE_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC",
                               "-std=c++17", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
                               "--param=vect-max-version-for-alias-checks=256",
                               "--param=max-completely-peel-times=1", "-fno-tree-vrp")

_KINDS = ("cpp", "text")
_lock = threading.Lock()
_built: dict[tuple[str, str, tuple[str, ...]], pathlib.Path] = {}
_loaded: dict[tuple[str, str, tuple[str, ...]], ctypes.CDLL] = {}
_by_path: dict[pathlib.Path, ctypes.CDLL] = {}

#: What this process did: ``disk_hits`` (a valid entry found on disk), ``builds`` (compiler
#: runs), ``rebuilds`` (of those, replacing a corrupt or incomplete entry). A warm start shows
#: ``builds == 0``. Per-process memo hits are not counted (they are a dictionary lookup).
counters: dict[str, int] = {"disk_hits": 0, "builds": 0, "rebuilds": 0}


class CompileError(ember.EmberError):
    """The C++ compiler failed; the message carries its (trimmed) stderr and the source path."""


# --------------------------------------------------------------------------------------------
# where, and with what


def cache_dir() -> pathlib.Path:
    """The root of Ember's on-disk cache (``ember._store.cache_dir``, one rule for every cache).

    ``EMBER_CACHE_DIR`` if set (read at each call), else ``ember.config.cache_dir`` if it was
    changed from its default, else ``$XDG_CACHE_HOME/ember`` or ``~/.cache/ember``.
    """
    return _store.cache_dir()


def _compiler() -> str:
    name = os.environ.get("CXX") or "g++"
    path = shutil.which(name)
    if path is None:
        raise CompileError(f"C++ compiler {name!r} not found on PATH; the inductor backend's CPU "
                           "code needs gcc (g++). Install it (e.g. apt-get install g++) or set "
                           "CXX to a compiler.")
    return os.path.realpath(path)


def _run_text(cmd: Sequence[str]) -> str:
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout + r.stderr if r.returncode == 0 else ""


@functools.lru_cache(maxsize=None)
def _toolchain(compiler: str, march: str = "native") -> str:
    """Everything about compiler, target CPU and torch that decides what a build produces."""
    import torch

    version = _run_text([compiler, "--version"])
    # The compiler's own resolution of -march=native: the target name and every -m flag it
    # enables. Hashing it means a different CPU (or a different gcc's idea of it) is a miss.
    # (A named -march resolves the same on every CPU.)
    target = _run_text([compiler, f"-march={march}", "-Q", "--help=target"])
    if not target.strip() and march == "native":
        from ember.precompile.runtime import cpu_flags  # one reader of /proc/cpuinfo

        target = "cpuinfo:" + cpu_flags()
    return "\n".join([f"format={FORMAT_VERSION}", f"compiler={compiler}", f"march={march}", version,
                      hashlib.sha256(target.encode()).hexdigest(), f"torch={torch.__version__}"])


#: the first line of a source built for a named instruction set rather than this CPU's
_ISA_LINE = re.compile(r"// ember-cpu-isa: ([A-Za-z0-9_.-]+)\n")


def source_march(source: str) -> str:
    """The ``-march`` a source is built with: ``native`` unless its first line names another
    (``// ember-cpu-isa: x86-64-v3``)."""
    m = _ISA_LINE.match(source)
    return m.group(1) if m else "native"


def _flags(extra_flags: Sequence[str], march: str = "native") -> tuple[str, ...]:
    base = BASE_FLAGS if march == "native" else tuple(
        f"-march={march}" if f == "-march=native" else f for f in BASE_FLAGS)
    return base + tuple(extra_flags)


def cpp_key(source: str, extra_flags: Sequence[str] = ()) -> str:
    """The cache key (hex sha256) of ``source`` built with :data:`BASE_FLAGS` + ``extra_flags``
    (``-march`` as :func:`source_march` says)."""
    march = source_march(source)
    tool = _toolchain(_compiler()) if march == "native" else _toolchain(_compiler(), march)
    h = hashlib.sha256()
    for part in (tool, "\0".join(_flags(extra_flags, march)), source):
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# small file helpers


def _sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_atomic_write = _store.atomic_write  # a unique temporary file, then os.replace
_unlink = _store.unlink


def _entry(key: str) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    d = cache_dir() / "cpp" / key[:2]
    return d / f"{key}.cpp", d / f"{key}.so", d / f"{key}.json"


def _valid(so: pathlib.Path, meta: pathlib.Path) -> bool:
    """The library exists and its bytes are those its metadata records."""
    try:
        m = json.loads(meta.read_text())
        if m.get("format") != FORMAT_VERSION or so.stat().st_size != m.get("size"):
            return False
        return _sha256_file(so) == m.get("sha256")
    except (OSError, ValueError, AttributeError):
        return False


class _FileLock:
    """An exclusive ``fcntl.flock`` on a lock file, released on exit (and by the OS on death)."""

    def __init__(self, path: pathlib.Path):
        self.path = path

    def __enter__(self) -> "_FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


# --------------------------------------------------------------------------------------------
# C++ -> shared library


def _build(key: str, source: str, flags: tuple[str, ...]) -> pathlib.Path:
    src, so, meta = _entry(key)
    if _valid(so, meta):
        counters["disk_hits"] += 1
        return so
    try:
        lock = _FileLock(so.with_suffix(".lock"))
        lock.__enter__()
    except OSError as e:
        raise CompileError(f"cannot write Ember's kernel cache under {cache_dir()}: {e}. Set "
                           "EMBER_CACHE_DIR to a writable folder.") from e
    try:
        if _valid(so, meta):  # another process built it while we waited
            counters["disk_hits"] += 1
            return so
        # Temporaries of this key are only written under its lock, which we hold: any left
        # are from a build that died (killed, out of disk); they would only take space.
        for stale in so.parent.glob(f".{key}.*"):
            _unlink(stale)
        if so.exists() or meta.exists():
            log.warning("cache entry %s is corrupt or incomplete; rebuilding", so)
            counters["rebuilds"] += 1
        counters["builds"] += 1
        _compile(src, so, meta, source, flags)
        return so
    finally:
        lock.__exit__()


def _compile(src: pathlib.Path, so: pathlib.Path, meta: pathlib.Path, source: str,
             flags: tuple[str, ...]) -> None:
    """Run the compiler into a temporary file, then publish: library first, metadata last."""
    t0 = time.perf_counter()
    _atomic_write(src, source.encode())
    fd, tmp = tempfile.mkstemp(prefix=f".{so.stem}.", suffix=".so.tmp", dir=so.parent)
    os.close(fd)
    try:
        cmd = [_compiler(), *flags, str(src), "-o", tmp]
        log.debug("building %s", " ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            err = (r.stderr or r.stdout).strip()
            if len(err) > 4000:
                err = err[:2000] + "\n  [...]\n" + err[-2000:]
            raise CompileError(f"C++ compilation failed (exit {r.returncode}) for {src}:\n"
                               f"{err}\n  command: {' '.join(cmd)}")
        digest, size = _sha256_file(pathlib.Path(tmp)), os.path.getsize(tmp)
        os.replace(tmp, so)
    except BaseException:
        _unlink(tmp)
        raise
    record = {"format": FORMAT_VERSION, "sha256": digest, "size": size, "flags": list(flags),
              "compiler": _compiler()}
    _atomic_write(meta, json.dumps(record, indent=1).encode())
    log.debug("built %s (%d bytes) in %.2f s", so, size, time.perf_counter() - t0)


def compile_cpp(source: str, extra_flags: Sequence[str] = ()) -> pathlib.Path:
    """Build C++ ``source`` into a shared library (or find it in the cache); return its path.

    Flags are :data:`BASE_FLAGS` followed by ``extra_flags`` (both part of the key). A second
    call with the same arguments in the same process is a dictionary lookup. Raises
    :class:`CompileError` with the compiler's stderr when the build fails.
    """
    flags = tuple(extra_flags)
    memo_key = (str(cache_dir()), source, flags)
    hit = _built.get(memo_key)
    if hit is not None and hit.exists():  # (gone if another process cleared the cache)
        return hit
    path = _build(cpp_key(source, flags), source, _flags(flags, source_march(source)))
    with _lock:
        _built[memo_key] = path
    return path


def compile_cpp_many(sources: Sequence[str], extra_flags: Sequence[str] = ()) -> list[pathlib.Path]:
    """:func:`compile_cpp` for each source; the missing ones build in parallel (one gcc each, up
    to ``os.cpu_count()`` at once). Returns the paths in the order of ``sources``."""
    unique = list(dict.fromkeys(sources))
    workers = min(len(unique), os.cpu_count() or 1)
    if workers <= 1:
        done = {s: compile_cpp(s, extra_flags) for s in unique}
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ember-cc") as pool:
            done = dict(zip(unique, pool.map(lambda s: compile_cpp(s, extra_flags), unique)))
    return [done[s] for s in sources]


def load_cpp(source: str, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """Build (or find) ``source`` and load it with ctypes; memoized per process (a loaded
    library stays usable even if its cache entry is later removed).

    The library is linked against ``libgomp.so.1``; torch is imported first (by ember), so the
    dynamic linker binds it to the OpenMP runtime torch already loaded: one thread pool for
    torch's kernels and ours, not two competing for the cores.
    """
    memo_key = (str(cache_dir()), source, tuple(extra_flags))
    lib = _loaded.get(memo_key)
    if lib is not None:
        return lib
    path = compile_cpp(source, extra_flags)
    with _lock:
        lib = _by_path.get(path)
        if lib is None:
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:
                raise CompileError(f"built library {path} does not load: {e}\n"
                                   f"  source: {path.with_suffix('.cpp')}") from e
            _by_path[path] = lib
        _loaded[memo_key] = lib
    return lib


# --------------------------------------------------------------------------------------------
# text store


def put_text(namespace: str, key: str, text: str) -> None:
    """Store ``text`` under ``(namespace, key)``, atomically (last writer wins); a failed write
    is logged, not raised. Ember's text store (``ember._store``), shared with the core's
    caches: one format, one folder."""
    _store.put_text(namespace, key, text)


def get_text(namespace: str, key: str) -> str | None:
    """The text stored under ``(namespace, key)``, or None when absent or corrupt."""
    return _store.get_text(namespace, key)


# --------------------------------------------------------------------------------------------
# inspection


def info() -> dict[str, Any]:
    """``{"dir", "entries": {kind: n}, "bytes": {kind: n}, "total_bytes", "text_namespaces":
    {namespace: n}}``; kinds: ``so`` (libraries), ``cpp`` (sources), ``meta``, ``text``,
    ``other`` (locks, leftover temporaries)."""
    root = cache_dir()
    entries: dict[str, int] = {k: 0 for k in ("so", "cpp", "meta", "text", "other")}
    sizes = dict.fromkeys(entries, 0)
    for top in _KINDS:
        for dirpath, _, files in os.walk(root / top):
            for name in files:
                kind = _kind(top, name)
                entries[kind] += 1
                try:
                    sizes[kind] += os.path.getsize(os.path.join(dirpath, name))
                except OSError:
                    pass
    namespaces: dict[str, int] = {}
    text_root = root / "text"
    if text_root.is_dir():
        for ns in sorted(text_root.iterdir()):
            if ns.is_dir():
                namespaces[ns.name] = sum(1 for p in ns.glob("*.json"))
    return {"dir": str(root), "entries": entries, "bytes": sizes,
            "total_bytes": sum(sizes.values()), "text_namespaces": namespaces}


def _kind(top: str, name: str) -> str:
    if name.startswith(".") or name.endswith((".tmp", ".lock")):
        return "other"
    if top == "text":
        return "text" if name.endswith(".json") else "other"
    return {".so": "so", ".cpp": "cpp", ".json": "meta"}.get(os.path.splitext(name)[1], "other")


def clear() -> int:
    """Remove every entry of this cache (only its own folders under :func:`cache_dir`); returns
    the number of files removed. Libraries already loaded in a process stay usable there."""
    root = cache_dir()
    removed = 0
    for top in _KINDS:
        base = root / top
        if not base.is_dir():
            continue
        for dirpath, _, files in os.walk(base):
            for name in files:
                try:
                    os.unlink(os.path.join(dirpath, name))
                    removed += 1
                except OSError:
                    pass
        shutil.rmtree(base, ignore_errors=True)
    _forget()
    return removed


def _forget() -> None:
    """Drop the per-process memo (the next call looks at the disk again, as a fresh process
    would); libraries already loaded stay loaded."""
    with _lock:
        _built.clear()
        _loaded.clear()
