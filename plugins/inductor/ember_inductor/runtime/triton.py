"""Ember's Triton runtime: build the kernels of a graph ahead, cache the binaries and tuning
choices on disk, launch without Triton's per-call dispatch.

* :func:`load_kernels` (called once when a wrapper is loaded) imports the graph's kernel module
  (written once into the cache, content-addressed, so Triton can read its source) and returns one
  :class:`Launcher` per kernel. On a GPU the kernels are compiled ahead (a thread pool,
  ``EMBER_TRITON_COMPILE_THREADS``, default 1), with
  Triton's compile API (``triton.compile(ASTSource(...))``), each with its cached tuning choice
  or its default configuration.
* Binaries: each compiled kernel's files (cubin and metadata) are copied into
  ``<cache>/triton/<k[:2]>/<k>/`` with a manifest of their sha256 written last; ``k`` hashes the
  module source, the kernel, its configuration and the machine (GPU name and capability, CUDA
  driver, torch and Triton versions). A warm start rebuilds the ``CompiledKernel`` from those
  files: no Triton compilation. Entries are published by an atomic rename; a corrupt one is
  rebuilt. Nothing is pickled.
* Tuning (GPU only): at a kernel's first launch, when no choice is cached, its candidate
  configurations (block sizes, warps) are compiled and timed with CUDA events on the real
  arguments; the fastest is kept and stored in the text store (``triton-tune``), keyed like the
  binaries. Under the interpreter nothing is tuned.
* Launch: a :class:`Launcher` call computes the grid from the sizes the wrapper passes and calls
  the compiled kernel's launcher (``CompiledKernel.run``) positionally: no argument binding, no
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
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from ember import _store

from .triton_math import interpreting

__all__ = ["load_kernels", "Launcher", "counters", "machine_key"]

log = logging.getLogger("ember.inductor.triton")

FORMAT_VERSION = 1

#: what this process did: ``compiles`` (triton.compile runs), ``disk_hits`` (binaries loaded from
#: Ember's cache), ``tuned`` (kernels tuned by timing), ``tune_hits`` (choices read from the
#: cache), ``fast_launchers`` / ``jit_launchers`` (kernels launched by the precomputed path or
#: through Triton's JIT call), ``fallbacks`` (kernels whose ahead build failed: JIT call),
#: ``pool_builds`` (kernels compiled by worker processes, :func:`prebuild`).
counters: dict[str, int] = {"compiles": 0, "disk_hits": 0, "tuned": 0, "tune_hits": 0,
                            "fast_launchers": 0, "jit_launchers": 0, "fallbacks": 0,
                            "pool_builds": 0}

_modules: dict[str, Any] = {}
_lock = threading.Lock()


def _module_path(source: str) -> pathlib.Path:
    key = hashlib.sha256(source.encode()).hexdigest()
    return _store.cache_dir() / "triton" / "src" / key[:2] / f"k{key}.py"


def _module(source: str) -> Any:
    """The kernel module of ``source``: written once into the cache (Triton reads a kernel's
    source from its file), imported once per process."""
    key = hashlib.sha256(source.encode()).hexdigest()
    with _lock:
        mod = _modules.get(key)
        if mod is not None:
            return mod
        path = _module_path(source)
        if not path.exists() or path.read_text() != source:
            _store.atomic_write(path, source.encode())
        name = f"ember_triton_{key[:16]}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _modules[key] = mod
        return mod


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
        try:
            parts.append(f"driver={torch._C._cuda_getDriverVersion()}")
        except Exception:  # noqa: BLE001 - older torch: the CUDA runtime's version instead
            parts.append(f"cuda={torch.version.cuda}")
    return "\n".join(parts)


def _entry_key(source: str, name: str, config: dict[str, int]) -> str:
    h = hashlib.sha256()
    for part in (machine_key(), source, name, json.dumps(config, sort_keys=True)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _tune_key(source: str, name: str, sizes: Sequence[Any]) -> str:
    h = hashlib.sha256()
    for part in (machine_key(), source, name, repr(list(sizes))):
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

def _ast_source(fn: Any, spec: dict[str, Any], config: dict[str, int]) -> Any:
    from triton.compiler import ASTSource

    signature = {p: t for p, t in zip(spec["params"], spec["signature"])}
    consts = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
    for k in consts:
        signature[k] = "constexpr"
    # every pointer is 16-byte aligned (the launcher checks the graph's inputs each call)
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(spec["signature"])
             if t.startswith("*")}
    return ASTSource(fn, signature, constexprs=consts, attrs=attrs)


def _options(config: dict[str, int]) -> dict[str, int]:
    # fp fusion (a*b+c as one FMA) as Triton's default and nvcc's for eager's CUDA kernels;
    # explicit, as Triton 3.9 warns that its default will change
    return {"num_warps": int(config.get("num_warps", 4)),
            "num_stages": int(config.get("num_stages", 1)), "enable_fp_fusion": True}


def _compile(fn: Any, spec: dict[str, Any], config: dict[str, int]) -> Any:
    import triton

    counters["compiles"] += 1
    src = _ast_source(fn, spec, config)
    try:
        return triton.compile(src, options=_options(config))
    except (TypeError, KeyError, AssertionError) as e:
        # another Triton's form of the alignment attributes: compile without them
        log.debug("triton.compile with alignment attributes failed (%s); without them", e)
        src.attrs = {}
        return triton.compile(src, options=_options(config))


def _entry_dir(key: str) -> pathlib.Path:
    return _store.cache_dir() / "triton" / "bin" / key[:2] / key


def _sha(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
    """Copy ``ck``'s files (binary, metadata) into Ember's cache; publish by renaming the
    folder (a concurrent writer of the same key wrote the same content: theirs stays)."""
    d = _entry_dir(key)
    if (d / "manifest.json").exists():
        return
    group = getattr(ck, "metadata_group", None) or {}
    if not group:
        return
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{key}.", dir=d.parent))
    try:
        files = {}
        for fname, p in group.items():
            shutil.copyfile(p, tmp / fname)
            files[fname] = _sha(tmp / fname)
        _store.atomic_write(tmp / "manifest.json", json.dumps(
            {"format": FORMAT_VERSION, "hash": ck.hash, "files": files}).encode())
        if d.exists():  # an incomplete or corrupt entry: replace it
            shutil.rmtree(d, ignore_errors=True)
        try:
            os.rename(tmp, d)
        except OSError:
            pass  # another process published it first
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _build(source: str, fn: Any, spec: dict[str, Any], config: dict[str, int]) -> Any:
    key = _entry_key(source, spec["name"], config)
    ck = _load_binary(fn, spec, config, key)
    if ck is None:
        ck = _compile(fn, spec, config)
        try:
            _store_binary(ck, key)
        except OSError as e:
            log.warning("cannot store Triton binary in Ember's cache: %s", e)
    return ck


# -- building in worker processes -------------------------------------------------------------

#: a graph with at least this many kernels to compile builds them in worker processes
POOL_MIN_KERNELS = 4
_procs: list[Any] = []


def _workers_started(n: int) -> list[Any]:
    """``n`` live worker processes (``python -m ember_inductor.runtime.triton_worker``), started
    on first use and kept for the process's life (they exit when their stdin closes)."""
    import subprocess

    _procs[:] = [p for p in _procs if p.poll() is None]
    while len(_procs) < n:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        _procs.append(subprocess.Popen(
            [sys.executable, "-m", "ember_inductor.runtime.triton_worker"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1))
    return _procs[:n]


def _pool_workers() -> int:
    try:
        return int(os.environ.get("EMBER_TRITON_COMPILE_WORKERS",
                                  str(min(8, os.cpu_count() or 1))))
    except ValueError:
        return 1


def _worker_build(path: str, name: str, spec: dict[str, Any], config: dict[str, int],
                  target: tuple[str, int, int], key: str, cache_dir: str) -> str:
    """In a worker process: compile one kernel for ``target`` and publish its files in Ember's
    cache under ``key`` (the parent then loads them: nothing crosses the process boundary but
    these arguments and a word). Needs no GPU."""
    os.environ["EMBER_CACHE_DIR"] = cache_dir
    if (_entry_dir(key) / "manifest.json").exists():
        return "hit"
    import triton
    from triton.backends.compiler import GPUTarget

    modname = f"ember_triton_w_{pathlib.Path(path).stem[:17]}"
    mod = sys.modules.get(modname)
    if mod is None:
        spec_ = importlib.util.spec_from_file_location(modname, path)
        assert spec_ is not None and spec_.loader is not None
        mod = importlib.util.module_from_spec(spec_)
        sys.modules[modname] = mod
        spec_.loader.exec_module(mod)
    src = _ast_source(getattr(mod, name), spec, config)
    try:
        ck = triton.compile(src, target=GPUTarget(*target), options=_options(config))
    except (TypeError, KeyError, AssertionError):
        src.attrs = {}
        ck = triton.compile(src, target=GPUTarget(*target), options=_options(config))
    _store_binary(ck, key)
    return "built"


def _current_target() -> tuple[str, int, int]:
    from triton.runtime import driver

    t = driver.active.get_current_target()
    return (t.backend, t.arch, t.warp_size)


def prebuild(source: str, items: Sequence[tuple[dict[str, Any], dict[str, int]]],
             target: tuple[str, int, int] | None = None) -> int:
    """Compile, in worker processes (:mod:`.triton_worker`), the binaries of ``items`` (kernel spec,
    configuration) that Ember's cache lacks, when there are at least :data:`POOL_MIN_KERNELS`
    of them (``EMBER_TRITON_COMPILE_WORKERS`` processes; 0 turns the pool off). Returns how many
    were built there; a failure only logs (the kernel is then compiled in this process)."""
    workers = _pool_workers()
    missing = []
    for spec, config in items:
        key = _entry_key(source, spec["name"], config)
        if not (_entry_dir(key) / "manifest.json").exists() and (spec["name"], key) not in [
                (m[0]["name"], m[2]) for m in missing]:
            missing.append((spec, config, key))
    if workers < 1 or len(missing) < POOL_MIN_KERNELS:
        return 0
    path = _module_path(source)
    _module(source)  # written (and imported here too)
    t0 = time.perf_counter()
    target = target or _current_target()
    jobs = [json.dumps({"path": str(path), "name": spec["name"], "spec": spec, "config": config,
                        "target": list(target), "key": key,
                        "cache_dir": str(_store.cache_dir())})
            for spec, config, key in missing]
    with _lock:
        procs = _workers_started(min(workers, len(jobs)))
    # round-robin: each worker gets its share on stdin, answers one line per job
    shares: list[list[str]] = [[] for _ in procs]
    for i, job in enumerate(jobs):
        shares[i % len(procs)].append(job)
    built = 0
    for proc, share in zip(procs, shares):
        try:
            assert proc.stdin is not None
            proc.stdin.write("".join(j + "\n" for j in share))
            proc.stdin.flush()
        except OSError as e:
            log.warning("a Triton compile worker is gone (%s); compiling in-process", e)
            share.clear()
    for proc, share in zip(procs, shares):
        for _ in share:
            line = ""
            try:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                r = json.loads(line) if line else {"error": "worker exited"}
            except (OSError, ValueError) as e:
                r = {"error": str(e)}
            if r.get("ok") == "built":
                built += 1
            elif "error" in r:
                log.warning("a Triton compile worker failed (%s); compiling in-process",
                            r["error"][:300])
                if not line:
                    break
    counters["pool_builds"] = counters.get("pool_builds", 0) + built
    log.debug("built %d Triton kernels in %d worker processes in %.2fs", built, workers,
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
        try:
            runner = inspect.getsource(type(ck).__getitem__)
        except (OSError, TypeError):
            runner = ""
        ok = ("self.run(grid[0], grid[1], grid[2], stream, self.function, "
              "self.packed_metadata" in " ".join(runner.split()))
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
        self._fast: Any = None
        self._device = 0
        self._tuned = False

    def _grid(self, numels: Sequence[int], config: dict[str, int]) -> int:
        if self.spec["grid"] == "2d":
            y, x = numels
            return -(-y // config["YBLOCK"]) * -(-x // config["XBLOCK"])
        return -(-numels[0] // config["XBLOCK"])

    def prepare(self, config: dict[str, int] | None = None) -> None:
        """Build (or load) the binary of ``config`` (default: the current one)."""
        if config is not None:
            self.config = dict(config)
            self.consts = tuple(self.config[k] for k in self.const_names)
        self.ck = _build(self.source, self.fn, self.spec, self.config)
        self._run = _fast_path(self.ck)
        self._fast = self._specialize() if self._run is not None else None
        counters["fast_launchers" if self._run is not None else "jit_launchers"] += 1

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
        lines.append(f"        run(g, 1, 1, stream(dev), function, meta, None, None, None, "
                     f"{', '.join(names + [repr(c) for c in self.consts])})")
        ns: dict[str, Any] = {"run": self._run, "stream": _stream, "dev": self._device,
                              "function": self.ck.function, "meta": self.ck.packed_metadata,
                              "slow": self._slow_unaligned}
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
            tkey = _tune_key(self.source, self.name, numels)
            choice = get_text("triton-tune", tkey) if cands else None
            if choice is not None:
                counters["tune_hits"] += 1
                self.prepare(json.loads(choice))
                return
            if len(cands) > 1 and _tune_enabled() and all(getattr(a, "is_cuda", True) for a in args
                                      if hasattr(a, "data_ptr")):
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
    todo = []
    for ln in launchers.values():
        if not ln.spec.get("candidates"):
            todo.append((ln, None))
            continue
        try:  # static sizes: the tuning choice of an earlier run, if any
            numels = [int(n) for n in ln.spec["numels"]]
        except ValueError:
            continue
        choice = get_text("triton-tune", _tune_key(source, ln.name, numels))
        if choice is not None:
            counters["tune_hits"] += 1
            todo.append((ln, json.loads(choice)))

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
        try:
            prebuild(source, [(ln.spec, cfg if cfg is not None else ln.config)
                              for ln, cfg in todo])
        except Exception as e:  # noqa: BLE001 - the in-process build below still runs
            log.warning("Triton compile pool unavailable (%s: %s)", type(e).__name__, e)
        with ThreadPoolExecutor(max_workers=_workers(len(todo))) as pool:
            list(pool.map(ahead, todo))
        log.debug("built %d Triton kernels ahead in %.2fs", len(todo), time.perf_counter() - t0)
    return launchers
