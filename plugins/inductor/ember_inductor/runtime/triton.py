"""Ember's Triton runtime: build the kernels of a graph ahead, cache the binaries and tuning
choices on disk, launch without Triton's per-call dispatch.

* :func:`load_kernels` (called once when a wrapper is loaded) imports the graph's kernel module
  (written once into the cache, content-addressed, so Triton can read its source) and returns one
  :class:`Launcher` per kernel. On a GPU every binary the first call needs (each kernel's
  cached tuning choice, or its default configuration and its tuning candidates) is compiled
  ahead, at once, in worker processes (:mod:`.triton_worker`: Triton without torch, one job at
  a time each, ``EMBER_TRITON_COMPILE_WORKERS``, default the CPU count up to 16), with Triton's
  compile API (``triton.compile(ASTSource(...))``); this process then loads them from the cache.
  Kernels identical but for their names (a model's repeated layers) share one binary and one
  tuning (:func:`_canonical`).
* Binaries: each compiled kernel's files (cubin and metadata) are copied into
  ``<cache>/triton/bin/<k[:2]>/<k>/`` with a manifest of their sha256 written last; ``k`` hashes
  the kernel's canonical text and parameter types, its configuration and the machine (GPU name and
  capability, CUDA driver, torch and Triton versions). A warm start rebuilds the
  ``CompiledKernel`` from those files: no Triton compilation. Entries are published by an atomic
  rename; a corrupt one is rebuilt. Nothing is pickled.
* Tuning (GPU only): at a kernel's first launch, when no choice is cached, its candidate
  configurations (block sizes, warps), compiled ahead by the workers, are loaded and timed with
  CUDA events on the real arguments (on copies of a kernel's in/out parameters, which each
  launch writes over); the fastest is kept and stored in the text store (``triton-tune``), keyed
  like the binaries. Under the interpreter nothing is tuned.
* ``ember.precompile``: :func:`artifact_entries` (the binaries and choices an artifact carries)
  and :func:`install_artifact` (into this machine's cache when the artifact loads).
* Launch: a :class:`Launcher` call computes the grid from the sizes the wrapper passes and calls
  Ember's C launcher (:mod:`.cuda_launch`: one C call to ``cuLaunchKernel``, the parameter list
  confirmed by the driver when the kernel loads), or where that is not available the compiled
  kernel's own launcher (``CompiledKernel.run``) positionally: no argument binding, no
  specialization and no cache lookup per call. Under ``TRITON_INTERPRET=1`` (CPU tensors) it
  calls the interpreted kernel (``kernel[grid](...)``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import pathlib
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from ember import _store

from .triton_math import interpreting
from .triton_worker import FORMAT_VERSION
from .triton_worker import ast_source as _ast_source
from .triton_worker import compile_kernel, store_binary, worker_command
from .triton_worker import options as _options
from .triton_worker import sha as _sha

__all__ = ["load_kernels", "Launcher", "counters", "machine_key", "capturing", "on_device"]

log = logging.getLogger("ember.inductor.triton")


#: what this process did: ``compiles`` (triton.compile runs), ``disk_hits`` (binaries loaded from
#: Ember's cache), ``tuned`` (kernels tuned by timing), ``tune_hits`` (choices read from the
#: cache), ``fast_launchers`` / ``jit_launchers`` (kernels launched by the precomputed path or
#: through Triton's JIT call; ``direct_launchers``: of the fast ones, those launched by Ember's
#: own C launcher, :mod:`.cuda_launch`), ``fallbacks`` (kernels whose ahead build failed: JIT call),
#: ``pool_builds`` (kernels compiled by worker processes, :func:`prebuild`).
counters: dict[str, int] = {"compiles": 0, "disk_hits": 0, "tuned": 0, "tune_hits": 0,
                            "fast_launchers": 0, "jit_launchers": 0, "fallbacks": 0,
                            "pool_builds": 0, "direct_launchers": 0}

_modules: dict[str, Any] = {}
_lock = threading.Lock()


def _module_path(source: str) -> pathlib.Path:
    key = hashlib.sha256(source.encode()).hexdigest()
    return _store.cache_dir() / "triton" / "src" / key[:2] / f"k{key}.py"


def _module_file(source: str) -> pathlib.Path:
    """The file of the kernel module of ``source`` in the cache, written if missing (the cache
    may have been cleared, or moved, since this process imported it)."""
    path = _module_path(source)
    if not path.exists() or path.read_text() != source:
        _store.atomic_write(path, source.encode())
    return path


def _module(source: str) -> Any:
    """The kernel module of ``source``: written once into the cache (Triton reads a kernel's
    source from its file), imported once per process."""
    key = hashlib.sha256(source.encode()).hexdigest()
    with _lock:
        mod = _modules.get(key)
        if mod is not None:
            return mod
        path = _module_file(source)
        name = f"ember_triton_{key[:16]}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _modules[key] = mod
        return mod


def capturing() -> bool:
    """Is the current CUDA stream recording a CUDA graph (``mode="reduce-overhead"``,
    ``backend="cudagraphs"``)? Then nothing may synchronize: no status read, no tuning."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


#: id of a CPU constant -> (weak reference, its version, the device copy)
_DEVICE_COPIES: dict[tuple[int, str], tuple[Any, int, Any]] = {}


def on_device(t: Any, device: str) -> Any:
    """``t`` (a constant of the graph that eager keeps on the CPU: a 0-d tensor the program
    made) on ``device``, copied once and kept: a copy per call would cost a host-to-device
    transfer each time and cannot be recorded into a CUDA graph. A constant changed in place
    since (its version moved) is copied again."""
    import weakref

    key = (id(t), device)
    hit = _DEVICE_COPIES.get(key)
    if hit is not None and hit[0]() is t and hit[1] == t._version:
        return hit[2]
    if capturing():
        raise RuntimeError("a graph constant reached a CUDA graph recording before its first "
                           "plain call copied it to the device")
    copy = t.to(device)
    _DEVICE_COPIES[key] = (weakref.ref(t, lambda _r, k=key: _DEVICE_COPIES.pop(k, None)),
                           t._version, copy)
    return copy


@functools.lru_cache(None)
def machine_key() -> str:
    """The GPU (name, capability), the CUDA driver, torch and Triton: what decides a binary and
    a tuning choice."""
    import torch
    import triton

    parts = [f"format={FORMAT_VERSION}", f"torch={torch.__version__}",
             f"triton={triton.__version__}"]
    if torch.cuda.is_available():
        dev = torch.cuda.current_device()
        parts.append(f"gpu={torch.cuda.get_device_name(dev)}")
        parts.append(f"cc={torch.cuda.get_device_capability(dev)}")
        # the split policy sizes reductions to the multiprocessors (a MIG slice: same name)
        parts.append(f"sms={torch.cuda.get_device_properties(dev).multi_processor_count}")
        try:
            parts.append(f"driver={torch._C._cuda_getDriverVersion()}")
        except Exception:  # noqa: BLE001 - older torch: the CUDA runtime's version instead
            parts.append(f"cuda={torch.version.cuda}")
    return "\n".join(parts)


@functools.lru_cache(maxsize=64)
def _canonical(source: str) -> dict[str, str]:
    """Each kernel of the module ``source`` -> a digest of what decides its binary: its text
    with its name and parameters renamed by position and comment lines dropped, and the
    module's imports and helpers (functions named ``_*``). Kernels that differ only in names
    (a GELU in each of a model's layers) share one binary, one compile and one tuning.
    Text, not an AST: a warm start computes this for every graph (a few ms, not 100s)."""
    base = hashlib.sha256()
    out: dict[str, str] = {}
    kernels = []
    for chunk in source.split("\n@triton.jit\n"):
        m = _DEF.match(chunk)
        if m is None or m.group(1).startswith("_"):
            base.update(chunk.encode())
            base.update(b"\0")
        else:
            kernels.append((m, chunk))
    head = base.hexdigest()
    for m, chunk in kernels:
        params = [p.split(":")[0].strip() for p in m.group(2).split(",")]
        index = {p: f"_p{i}" for i, p in enumerate(params) if p}
        rename = re.compile(r"\b(" + "|".join(map(re.escape, index)) + r")\b") if index else None
        lines = [ln for ln in chunk[m.end():].split("\n")
                 if ln.strip() and not ln.lstrip().startswith("#")]
        body = "\n".join(lines)
        sig = m.group(2)
        if rename is not None:
            body = rename.sub(lambda x: index[x.group(0)], body)
            sig = rename.sub(lambda x: index[x.group(0)], sig)
        out[m.group(1)] = hashlib.sha256(f"{head}\0{sig}\0{body}".encode()).hexdigest()
    return out


_DEF = re.compile(r"def (\w+)\(([^)]*)\):")


def _kernel_id(source: str, spec: dict[str, Any]) -> str:
    """The kernel's canonical digest (:func:`_canonical`) with its parameters' types, and the
    positions of its in/out parameters where it has any."""
    name = spec["name"]
    try:
        body = _canonical(source)[name]
    except KeyError:
        body = hashlib.sha256(f"{source}\0{name}".encode()).hexdigest()
    out = f"{body}\0{spec.get('signature')}\0{spec.get('grid')}"
    if spec.get("inout"):
        out += f"\0inout={[spec['params'].index(p) for p in spec['inout']]}"
    return out


def _entry_key(source: str, spec: dict[str, Any], config: dict[str, int]) -> str:
    h = hashlib.sha256()
    for part in (machine_key(), _kernel_id(source, spec), json.dumps(config, sort_keys=True)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _tune_key(source: str, spec: dict[str, Any], sizes: Sequence[Any]) -> str:
    h = hashlib.sha256()
    for part in (machine_key(), _kernel_id(source, spec),
                 json.dumps(spec.get("candidates"), sort_keys=True), repr(list(sizes))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _workers(n: int) -> int:
    """Threads compiling kernels at once: ``EMBER_TRITON_COMPILE_THREADS`` (default 1: Triton's
    compile holds the GIL for most of its passes, and concurrent compiles in one process were
    not validated on both Triton versions yet)."""
    try:
        want = int(os.environ.get("EMBER_TRITON_COMPILE_THREADS", "1"))
    except ValueError:
        want = 1
    return max(1, min(n, want))


def _tune_enabled() -> bool:
    """``EMBER_TRITON_TUNE=0`` keeps every kernel's heuristic configuration (tests)."""
    return os.environ.get("EMBER_TRITON_TUNE", "1") != "0"


# -- building ---------------------------------------------------------------------------------

def _compile(fn: Any, spec: dict[str, Any], config: dict[str, int]) -> Any:
    counters["compiles"] += 1
    return compile_kernel(fn, spec, config)


def _entry_dir(key: str) -> pathlib.Path:
    return _store.cache_dir() / "triton" / "bin" / key[:2] / key


#: binaries loaded in this process, by entry key (kernels identical but for names share one)
_loaded: dict[str, Any] = {}
_locks: dict[str, threading.Lock] = {}
_load_locks: dict[int, threading.Lock] = {}  # by id() of a CompiledKernel (kept alive)


def _load_binary(fn: Any, spec: dict[str, Any], config: dict[str, int], key: str) -> Any:
    """The CompiledKernel from Ember's cache, or None (absent, corrupt, other format)."""
    d = _entry_dir(key)
    manifest = d / "manifest.json"
    try:
        m = json.loads(manifest.read_text())
        if m.get("format") != FORMAT_VERSION:
            return None
        group = {}
        for fname, digest in m["files"].items():
            p = d / fname
            if _sha(p) != digest:
                log.warning("Triton cache entry %s is corrupt; rebuilding", d)
                return None
            group[fname] = str(p)
        from triton.compiler.compiler import CompiledKernel

        ck = CompiledKernel(_ast_source(fn, spec, config), group, m["hash"])
        counters["disk_hits"] += 1
        return ck
    except (OSError, ValueError, KeyError, StopIteration):
        return None


def _store_binary(ck: Any, key: str) -> None:
    store_binary(ck, _entry_dir(key))


def _build(source: str, fn: Any, spec: dict[str, Any], config: dict[str, int]) -> Any:
    key = _entry_key(source, spec, config)
    ck = _loaded.get(key)
    if ck is not None:
        return ck
    ck = _load_binary(fn, spec, config, key)
    if ck is None:
        ck = _compile(fn, spec, config)
        try:
            _store_binary(ck, key)
        except OSError as e:
            log.warning("cannot store Triton binary in Ember's cache: %s", e)
    _loaded[key] = ck
    return ck


# -- building in worker processes -------------------------------------------------------------

#: a graph with at least this many binaries to compile builds them in worker processes
POOL_MIN_KERNELS = 3
_procs: list[Any] = []


def _workers_started(n: int) -> list[Any]:
    """``n`` live worker processes (:mod:`.triton_worker`: Triton without torch), started on
    first use and kept for the process's life (they exit when their stdin closes)."""
    import subprocess

    _procs[:] = [p for p in _procs if p.poll() is None]
    while len(_procs) < n:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env.pop("TRITON_INTERPRET", None)
        _procs.append(subprocess.Popen(
            worker_command(), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, bufsize=1))
    return _procs[:n]


def _pool_workers() -> int:
    """``EMBER_TRITON_COMPILE_WORKERS`` (default: the CPU count, at most 16; 0: no pool)."""
    try:
        return int(os.environ.get("EMBER_TRITON_COMPILE_WORKERS",
                                  str(min(16, os.cpu_count() or 1))))
    except ValueError:
        return 1


def start_workers(jobs: int) -> None:
    """Start (without waiting) the workers a graph with ``jobs`` binaries to build would use;
    they import Triton meanwhile. A failure only logs: :func:`prebuild` tries again."""
    n = min(_pool_workers(), jobs)
    if n < 1 or jobs < POOL_MIN_KERNELS:
        return
    try:
        with _lock:
            _workers_started(n)
    except OSError as e:
        log.debug("cannot start Triton compile workers: %s", e)


def _current_target() -> tuple[str, int, int]:
    from triton.runtime import driver

    t = driver.active.get_current_target()
    return (t.backend, t.arch, t.warp_size)


def prebuild(source: str, items: Sequence[tuple[dict[str, Any], dict[str, int]]],
             target: tuple[str, int, int] | None = None) -> int:
    """Compile, in worker processes (:mod:`.triton_worker`), the binaries of ``items`` (kernel
    spec, configuration) that Ember's cache lacks (once per entry key: kernels identical but for
    names are built once), when there are at least :data:`POOL_MIN_KERNELS` of them
    (``EMBER_TRITON_COMPILE_WORKERS`` processes; 0 turns the pool off). Each worker takes the
    next job when it finishes one. Returns how many were built there; a failure only logs (the
    kernel is then compiled in this process)."""
    import queue

    workers = _pool_workers()
    missing: dict[str, tuple[dict[str, Any], dict[str, int]]] = {}
    for spec, config in items:
        key = _entry_key(source, spec, config)
        if key not in missing and key not in _loaded and not (
                _entry_dir(key) / "manifest.json").exists():
            missing[key] = (spec, config)
    if workers < 1 or len(missing) < POOL_MIN_KERNELS:
        return 0
    _module(source)  # imported here too
    path = _module_file(source)  # the workers import it from this file
    t0 = time.perf_counter()
    target = target or _current_target()
    jobs: Any = queue.Queue()
    for key, (spec, config) in missing.items():
        jobs.put(json.dumps({"path": str(path), "name": spec["name"], "spec": spec,
                             "config": config, "target": list(target),
                             "entry": str(_entry_dir(key))}))
    with _lock:
        procs = _workers_started(min(workers, len(missing)))
    results: list[dict[str, Any]] = []

    def serve(proc: Any) -> None:
        while True:
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(job + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                results.append(json.loads(line) if line else {"error": "worker exited"})
                if not line:
                    return
            except (OSError, ValueError) as e:
                results.append({"error": f"{type(e).__name__}: {e}"})
                return
    threads = [threading.Thread(target=serve, args=(p,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    built = sum(1 for r in results if r.get("ok") == "built")
    for r in results:
        if "error" in r:
            log.warning("a Triton compile worker failed (%s); compiling in-process",
                        r["error"][:300])
    counters["pool_builds"] = counters.get("pool_builds", 0) + built
    log.debug("built %d Triton binaries in %d worker processes in %.2fs", built, len(procs),
              time.perf_counter() - t0)
    return built


# -- launching --------------------------------------------------------------------------------

_FAST_PARAMS = ["gridX", "gridY", "gridZ", "stream", "function", "kernel_metadata",
                "launch_metadata", "launch_enter_hook", "launch_exit_hook"]


def _fast_path(ck: Any) -> Any:
    """``ck``'s launcher when it takes the arguments this module passes — grid, stream,
    function, packed metadata, launch metadata and the two hooks, then the kernel's arguments,
    as ``CompiledKernel.__getitem__``'s runner passes them (Triton 3.x): checked on the
    launcher's signature, or on the runner's source where the launcher takes ``*args``; else
    None (the runner is used)."""
    try:
        run = ck.run
        params = list(inspect.signature(run.__call__ if not inspect.isfunction(run) else run)
                      .parameters)
    except (TypeError, ValueError, AttributeError):
        return None
    ok = params[:len(_FAST_PARAMS)] == _FAST_PARAMS
    if not ok:
        ok = _runner_passes_positionally(type(ck))
    if not ok:
        return None
    try:
        from triton import knobs

        for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
            # a profiler's hook (Triton 3.9: a chain, empty unless one is added): Triton's own
            # path calls it (checked when the kernel is loaded)
            if hook is not None and getattr(hook, "calls", True):
                return None
    except (ImportError, AttributeError):
        pass
    return run


@functools.lru_cache(None)
def _runner_passes_positionally(cls: type) -> bool:
    """Whether ``CompiledKernel.__getitem__``'s runner passes the launcher what this module
    does (read once per process: reading a source costs milliseconds)."""
    try:
        runner = inspect.getsource(cls.__getitem__)
    except (OSError, TypeError):
        runner = ""
    return ("self.run(grid[0], grid[1], grid[2], stream, self.function, "
            "self.packed_metadata" in " ".join(runner.split()))


def _stream(device_index: int) -> int:
    import torch

    return torch._C._cuda_getCurrentRawStream(device_index)


class _Unaligned(Exception):
    """A graph input not 16-byte aligned: launched through Triton's JIT call instead."""


class Launcher:
    """One kernel: ``launcher(*numels, *args)`` (the sizes its grid covers, then its
    parameters, positionally as in the kernel's signature)."""

    def __init__(self, source: str, fn: Any, spec: dict[str, Any]):
        self.source = source
        self.fn = fn
        self.spec = spec
        self.name = spec["name"]
        self.n_numels = len(spec["numels"])
        self.config = dict(spec["config"])
        # the kernel's constexpr parameters, in its signature's order (a cached choice is JSON
        # with sorted keys: never rely on a config's key order)
        self.const_names = [k for k in spec["config"] if k not in ("num_warps", "num_stages")]
        self.consts = tuple(self.config[k] for k in self.const_names)
        self.ck = None
        self._run: Any = None
        self._interpret = interpreting()
        # graph inputs and constants may be views at any offset: checked for alignment per call
        # every pointer is compiled as 16-byte aligned; each call checks them all (a buffer may
        # be a view at an offset: a graph input, an element of a multi-output ATen result)
        self._check = [i for i, p in enumerate(spec["params"])
                       if spec["signature"][i].startswith("*")]
        self._ptrs = [i for i, t in enumerate(spec["signature"]) if t.startswith("*")]
        # parameters read and then written over (codegen/triton.py KernelSpec.inout)
        self._inout = [spec["params"].index(p) for p in spec.get("inout", ())]
        self._fast: Any = None
        self._plan: bytes | None = None  # cuda_launch.plan: launched by Ember's C launcher
        self._device = 0
        self._tuned = False

    def _grid(self, numels: Sequence[int], config: dict[str, int]) -> int:
        if self.spec["grid"] == "2d":
            y, x = numels
            return -(-y // config["YBLOCK"]) * -(-x // config["XBLOCK"])
        if self.spec["grid"] == "split":  # row tiles times the parts of each row
            return -(-numels[0] // config["XBLOCK"]) * numels[1]
        return -(-numels[0] // config["XBLOCK"])

    def prepare(self, config: dict[str, int] | None = None) -> None:
        """Build (or load) the binary of ``config`` (default: the current one)."""
        if config is not None:
            self.config = dict(config)
            self.consts = tuple(self.config[k] for k in self.const_names)
        key = _entry_key(self.source, self.spec, self.config)
        with _locks.setdefault(key, threading.Lock()):  # a binary shared by launchers in threads
            self.ck = _build(self.source, self.fn, self.spec, self.config)
        # Kernels that differ only in names share one compiled kernel, which Triton loads on
        # first use: its ``run`` property sets the launcher first and loads the function after
        # (Triton 3.6, CompiledKernel._init_handles), so a second thread asking for ``run``
        # meanwhile got the launcher with function=None (GPT-2 training on the H100:
        # "argument 5 must be int, not None"). One lock per compiled kernel (others still
        # load in parallel); a kernel still without a function takes Triton's launch path.
        with _load_locks.setdefault(id(self.ck), threading.Lock()):
            self._run = _fast_path(self.ck)  # loads the module and the launcher once
            if self._run is not None and getattr(self.ck, "function", None) is None:
                log.info("Triton kernel %s has no loaded function: Triton's launch path",
                         self.name)
                self._run = None
        self._plan = None
        if self._run is not None:
            # Ember's own C launcher where the driver confirms the kernel's parameters
            from . import cuda_launch

            self._plan = cuda_launch.plan(self.ck, self.spec["signature"], self._device)
        self._fast = self._specialize() if self._run is not None else None
        counters["fast_launchers" if self._run is not None else "jit_launchers"] += 1
        if self._plan is not None:
            counters["direct_launchers"] += 1

    def _specialize(self) -> Any:
        """A function made for this kernel and configuration: ``f(*numels, *args)`` computes
        the grid, checks the graph inputs' alignment, and calls the launcher with the pointers
        as integers — one Python frame, no loops, no lookups by name."""
        n = self.n_numels
        sig = self.spec["signature"]
        names = [f"a{i}" for i in range(len(sig))]
        nums = [f"n{i}" for i in range(n)]
        if self.spec["grid"] == "2d":
            grid = (f"-(-n0 // {self.config['YBLOCK']}) * -(-n1 // {self.config['XBLOCK']})")
        elif self.spec["grid"] == "split":
            grid = f"-(-n0 // {self.config['XBLOCK']}) * n1"
        else:
            grid = f"-(-n0 // {self.config['XBLOCK']})"
        lines = [f"def launch({', '.join(nums + names)}):"]
        for i in range(len(sig)):
            if sig[i].startswith("*"):
                lines.append(f"    a{i} = a{i}.data_ptr()")
        if self._check:
            cond = " or ".join(f"a{i} & 15" for i in self._check)
            lines.append(f"    if {cond}:")
            lines.append(f"        return slow(({', '.join(nums)},), ({', '.join(names)},))")
        lines.append(f"    g = {grid}")
        lines.append("    if g:")
        if self._plan is not None:  # Ember's launcher: the kernel's parameters only
            from .cuda_launch import module

            run = module().launch
            lines.append(f"        run(plan, g, stream(dev), {', '.join(names)})")
        else:  # Triton's launcher: its header arguments, then every argument, constexprs too
            run = self._run
            lines.append(f"        run(g, 1, 1, stream(dev), function, meta, None, None, None, "
                         f"{', '.join(names + [repr(c) for c in self.consts])})")
        ns: dict[str, Any] = {"run": run, "stream": _stream, "dev": self._device,
                              "function": self.ck.function, "meta": self.ck.packed_metadata,
                              "plan": self._plan, "slow": self._slow_unaligned}
        exec("\n".join(lines), ns)  # noqa: S102 - generated from the spec, no user input
        return ns["launch"]

    def _slow_unaligned(self, numels: Sequence[int], ptr_args: Sequence[Any]) -> None:
        raise _Unaligned

    def __call__(self, *a: Any) -> None:
        fast = self._fast
        if fast is not None:
            try:
                return fast(*a)
            except _Unaligned:
                return self._jit(a[:self.n_numels], a[self.n_numels:])
        numels, args = a[:self.n_numels], a[self.n_numels:]
        if self._interpret:
            grid = self._grid(numels, self.config)
            if grid:
                self.fn[(grid,)](*args, *self.consts)
            return
        if not self._tuned:
            self._first_call(numels, args)
        run = self._run
        if run is not None:
            # the fast path: pointers as integers (the C launcher then skips its per-pointer
            # attribute lookups), graph inputs checked for the 16-byte alignment compiled in
            args = list(args)
            for i in self._ptrs:
                args[i] = args[i].data_ptr()
            for i in self._check:
                if args[i] & 15:
                    return self._jit(numels, a[self.n_numels:])
            grid = self._grid(numels, self.config)
            if grid:
                ck = self.ck
                run(grid, 1, 1, _stream(self._device), ck.function, ck.packed_metadata, None,
                    None, None, *args, *self.consts)
            return None
        for i in self._check:
            if args[i].data_ptr() & 15:
                return self._jit(numels, args)
        grid = self._grid(numels, self.config)
        if grid == 0:
            return None
        if self.ck is not None:
            self.ck[(grid, 1, 1)](*args, *self.consts)
        else:
            self._jit(numels, args)
        return None

    def _jit(self, numels: Sequence[int], args: Sequence[Any]) -> None:
        grid = self._grid(numels, self.config)
        if grid:
            consts = {k: v for k, v in self.config.items()
                      if k not in ("num_warps", "num_stages")}
            self.fn[(grid,)](*args, **consts, num_warps=self.config.get("num_warps", 4))

    def _first_call(self, numels: Sequence[int], args: Sequence[Any]) -> None:
        """Tune (or read the cached choice), then build the chosen binary."""
        self._tuned = True
        dev = getattr(args[0], "device", None) if args else None
        self._device = dev.index if dev is not None and dev.index is not None else 0
        from .cache import get_text, put_text

        try:
            cands = [c for c in self.spec.get("candidates", [])]
            tkey = _tune_key(self.source, self.spec, numels)
            choice = get_text("triton-tune", tkey) if cands else None
            if choice is not None:
                counters["tune_hits"] += 1
                self.prepare(json.loads(choice))
                return
            if len(cands) > 1 and _tune_enabled() and not capturing() and all(
                    getattr(a, "is_cuda", True) for a in args if hasattr(a, "data_ptr")):
                # (a first launch inside a CUDA graph recording takes the default: timing syncs)
                best = self._tune(numels, args, cands)
                put_text("triton-tune", tkey, json.dumps(best, sort_keys=True))
                self.prepare(best)
                return
            if self.ck is None:
                self.prepare()
        except Exception as e:  # noqa: BLE001 - a user's program never fails for this
            log.warning("Triton kernel %s: ahead build/tuning failed (%s: %s); using Triton's "
                        "JIT call", self.name, type(e).__name__, e)
            counters["fallbacks"] += 1
            self.ck, self._run = None, None

    def _tune(self, numels: Sequence[int], args: Sequence[Any],
              cands: list[dict[str, int]]) -> dict[str, int]:
        import torch

        base = dict(self.config)
        if any(args[i].data_ptr() & 15 for i in self._check):
            return base  # a misaligned pointer: launched through the JIT, nothing to time
        if self._inout:
            # each timed launch would write over what the next one reads (and the call's own
            # launch after tuning must read the values as they were): timed on copies
            args = list(args)
            for i in self._inout:
                args[i] = args[i].clone()
        configs = [dict(c) for c in cands]
        if base not in configs:
            configs.insert(0, base)
        try:
            prebuild(self.source, [(self.spec, c) for c in configs])
        except Exception as e:  # noqa: BLE001
            log.debug("Triton compile pool unavailable: %s", e)
        with ThreadPoolExecutor(max_workers=_workers(len(configs))) as pool:
            built = list(pool.map(lambda c: self._try_build(c), configs))
        times = []
        stream = torch.cuda.current_stream()
        for cfg, ck in zip(configs, built):
            if ck is None:
                continue
            consts = tuple(cfg[k] for k in self.const_names)
            grid = self._grid(numels, cfg)
            if grid == 0:
                return base

            def launch() -> None:
                ck[(grid, 1, 1)](*args, *consts)
            try:
                launch()
                stream.synchronize()
                reps = 10
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                for _ in range(reps):
                    launch()
                end.record()
                end.synchronize()
                times.append((start.elapsed_time(end) / reps, cfg))
            except Exception as e:  # noqa: BLE001 - a candidate that does not run loses
                log.debug("candidate %s of %s failed: %s", cfg, self.name, e)
        counters["tuned"] += 1
        if not times:
            return base
        times.sort(key=lambda t: t[0])
        log.debug("tuned %s on %s: %s", self.name, list(numels),
                  ", ".join(f"{c}: {t * 1e3:.1f} us" for t, c in times))
        return times[0][1]

    def _try_build(self, cfg: dict[str, int]) -> Any:
        try:
            return _build(self.source, self.fn, self.spec, cfg)
        except Exception as e:  # noqa: BLE001 - e.g. out of resources for this block size
            log.debug("candidate %s of %s does not build: %s", cfg, self.name, e)
            return None


def load_kernels(source: str, specs: dict[str, dict[str, Any]]) -> dict[str, Launcher]:
    """Import the kernel module and make a :class:`Launcher` per kernel; on a GPU build every
    kernel whose tuning choice is cached (or which has no candidates) ahead, in parallel."""
    mod = _module(source)
    launchers = {name: Launcher(source, getattr(mod, name), spec) for name, spec in specs.items()}
    if interpreting():
        for ln in launchers.values():
            ln._tuned = True
        return launchers
    from .cache import get_text
    import torch

    dev = torch.cuda.current_device() if torch.cuda.is_available() else 0
    for ln in launchers.values():
        ln._device = dev
    todo = []  # (launcher, configuration): built ahead
    tuned_later = []  # tuned at their first launch: their candidates are compiled ahead
    tune = _tune_enabled()
    for ln in launchers.values():
        if not ln.spec.get("candidates") or not tune:
            todo.append((ln, None))
            continue
        try:  # static sizes: the tuning choice of an earlier run, if any
            numels = [int(n) for n in ln.spec["numels"]]
        except ValueError:
            tuned_later.append(ln)
            continue
        choice = get_text("triton-tune", _tune_key(source, ln.spec, numels))
        if choice is not None:
            counters["tune_hits"] += 1
            todo.append((ln, json.loads(choice)))
        else:
            tuned_later.append(ln)
    # every binary this graph's first call needs, compiled at once across worker processes:
    # the ahead builds below and the first launches' tunings then load them from the cache
    items = [(ln.spec, cfg if cfg is not None else ln.config) for ln, cfg in todo]
    items += [(ln.spec, c) for ln in tuned_later for c in [ln.config] + ln.spec["candidates"]]
    if items:
        try:
            prebuild(source, items)
        except Exception as e:  # noqa: BLE001 - the in-process builds still run
            log.warning("Triton compile pool unavailable (%s: %s)", type(e).__name__, e)

    def ahead(item: tuple[Launcher, Any]) -> None:
        ln, config = item
        try:
            ln.prepare(config)
            ln._tuned = True
        except Exception as e:  # noqa: BLE001 - falls back to the JIT call at first launch
            log.warning("Triton kernel %s does not build ahead (%s: %s)", item[0].name,
                        type(e).__name__, e)
    if todo:
        t0 = time.perf_counter()
        # every binary on disk: loading them (the module into the GPU context, and where Triton
        # 3.6 finds no launcher for a signature in its own cache, a C compiler run that releases
        # the GIL) overlaps in threads; a compile in this process stays one at a time
        present = all((_entry_dir(_entry_key(source, ln.spec, cfg or ln.config))
                       / "manifest.json").exists() for ln, cfg in todo)
        threads = min(8, len(todo)) if present else _workers(len(todo))
        if threads > 1:
            try:  # Triton's driver made once, here, not raced by the threads
                _current_target()
            except Exception:  # noqa: BLE001 - then one thread
                threads = 1
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(ahead, todo))
        log.debug("built %d Triton kernels ahead in %.2fs (%d threads)", len(todo),
                  time.perf_counter() - t0, threads)
    return launchers


# -- precompiled artifacts ----------------------------------------------------------------------

def _static(numels: Sequence[Any]) -> list[int] | None:
    try:
        return [int(n) for n in numels]
    except (TypeError, ValueError):
        return None


def artifact_entries(source: str, specs: dict[str, dict[str, Any]]) -> dict[str, bytes]:
    """What an ``ember.precompile`` artifact carries for one graph's kernels, from this
    machine's cache: each kernel's tuning choice (static sizes) as ``triton-tune/<key>``, and
    the files of every binary of it the cache holds (its choice, its default configuration,
    its candidates) as ``triton/<key>/<file>`` — raw bytes with their manifest, never pickled.
    The keys hold the machine (GPU, driver, torch, Triton): on another machine they miss and
    the kernels are compiled there."""
    from .cache import get_text

    out: dict[str, bytes] = {}
    for spec in specs.values():
        configs = [spec["config"]] + list(spec.get("candidates", []))
        numels = _static(spec.get("numels", []))
        if numels is not None:
            tkey = _tune_key(source, spec, numels)
            choice = get_text("triton-tune", tkey)
            if choice is not None:
                out[f"triton-tune/{tkey}"] = choice.encode()
                configs.insert(0, json.loads(choice))
        for cfg in configs:
            key = _entry_key(source, spec, cfg)
            d = _entry_dir(key)
            try:
                m = json.loads((d / "manifest.json").read_text())
                files = {f: (d / f).read_bytes() for f in m["files"]}
            except (OSError, ValueError, KeyError):
                continue
            if any(hashlib.sha256(b).hexdigest() != m["files"][f] for f, b in files.items()):
                continue
            for f, b in files.items():
                out[f"triton/{key}/{f}"] = b
            out[f"triton/{key}/manifest.json"] = (d / "manifest.json").read_bytes()
    return out


def install_artifact(entries: dict[str, bytes]) -> int:
    """Put an artifact's Triton entries (:func:`artifact_entries`) into this machine's cache,
    where :func:`load_kernels` finds them: binaries checked against their manifest and
    published atomically, tuning choices into the text store. Returns the binaries installed
    (present ones count too)."""
    from .cache import get_text, put_text

    groups: dict[str, dict[str, bytes]] = {}
    for k, v in entries.items():
        if k.startswith("triton-tune/"):
            key = k[len("triton-tune/"):]
            if get_text("triton-tune", key) is None:
                put_text("triton-tune", key, v.decode())
        elif k.startswith("triton/"):
            key, _, fname = k[len("triton/"):].partition("/")
            groups.setdefault(key, {})[fname] = v
    n = 0
    for key, files in groups.items():
        d = _entry_dir(key)
        if (d / "manifest.json").exists():
            n += 1
            continue
        try:
            m = json.loads(files["manifest.json"])
            if m.get("format") != FORMAT_VERSION or any(
                    hashlib.sha256(files[f]).hexdigest() != h for f, h in m["files"].items()):
                log.warning("a precompiled Triton binary (%s) is corrupt; not installed", key)
                continue
            d.parent.mkdir(parents=True, exist_ok=True)
            import shutil
            import tempfile

            tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{key}.", dir=d.parent))
            try:
                for f in m["files"]:
                    (tmp / f).write_bytes(files[f])
                (tmp / "manifest.json").write_bytes(files["manifest.json"])
                try:
                    os.rename(tmp, d)
                except OSError:
                    pass  # published by another process meanwhile
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            n += 1
        except (KeyError, ValueError, OSError) as e:
            log.warning("cannot install a precompiled Triton binary (%s): %s", key, e)
    return n
