"""A Triton compile worker, and the torch-free half of Ember's Triton runtime that it shares
with :mod:`.triton` (how a kernel is handed to ``triton.compile``, how its files are published
in Ember's cache).

A worker is a process of its own (not ``multiprocessing``, so a user's script is never
re-imported in it), started by :func:`worker_command`: it loads this file by its path and never
imports torch or Ember's packages (``ember_inductor``'s ``__init__`` imports torch: seconds per
worker), only Triton and the kernel module, whose one Ember import (``runtime.triton_math``) is
resolved without running the packages' ``__init__``. It reads one JSON job per line on stdin
(the arguments of :func:`worker_build`), compiles the kernel for the given GPU target, publishes
its files in Ember's cache, builds Triton's launcher for the kernel's signature where this
Triton compiles one per signature (Triton 3.6: a C file through the system compiler, cached in
Triton's own cache, which the parent then hits), and answers one JSON line
(``{"ok": "built" | "hit"}`` or ``{"error": ...}``)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
from typing import Any

#: the binaries' entry format and key scheme (2: kernels keyed by their canonical form)
FORMAT_VERSION = 2

#: ``python -c BOOT <this file>``: load this file as a plain module and run :func:`main`
BOOT = ("import sys, importlib.util as u; sys.path[:] = [p for p in sys.path if p]; "
        "s = u.spec_from_file_location('_ember_triton_worker', sys.argv[1]); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); m.main()")


def worker_command() -> list[str]:
    return [sys.executable, "-c", BOOT, str(pathlib.Path(__file__).resolve())]


def ast_source(fn: Any, spec: dict[str, Any], config: dict[str, int]) -> Any:
    from triton.compiler import ASTSource

    signature = {p: t for p, t in zip(spec["params"], spec["signature"])}
    consts = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
    for k in consts:
        signature[k] = "constexpr"
    # every pointer is 16-byte aligned (the launcher checks the graph's inputs each call)
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(spec["signature"])
             if t.startswith("*")}
    return ASTSource(fn, signature, constexprs=consts, attrs=attrs)


def options(config: dict[str, int]) -> dict[str, Any]:
    # fp fusion (a*b+c as one FMA) as Triton's default and nvcc's for eager's CUDA kernels;
    # explicit, as Triton 3.9 warns that its default will change
    return {"num_warps": int(config.get("num_warps", 4)),
            "num_stages": int(config.get("num_stages", 1)), "enable_fp_fusion": True}


def compile_kernel(fn: Any, spec: dict[str, Any], config: dict[str, int],
                   target: Any = None) -> Any:
    import triton

    kw = {"target": target} if target is not None else {}
    src = ast_source(fn, spec, config)
    try:
        return triton.compile(src, options=options(config), **kw)
    except (TypeError, KeyError, AssertionError):
        # another Triton's form of the alignment attributes: compile without them
        src.attrs = {}
        return triton.compile(src, options=options(config), **kw)


def sha(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def store_binary(ck: Any, d: pathlib.Path) -> None:
    """Copy ``ck``'s files (binary, metadata) into the entry folder ``d`` of Ember's cache,
    with a manifest of their sha256; published by renaming a temporary folder (a concurrent
    writer of the same key wrote the same content: theirs stays)."""
    if (d / "manifest.json").exists():
        return
    group = getattr(ck, "metadata_group", None) or {}
    if not group:
        return
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
    try:
        files = {}
        for fname, p in group.items():
            shutil.copyfile(p, tmp / fname)
            files[fname] = sha(tmp / fname)
        (tmp / "manifest.json").write_text(json.dumps(
            {"format": FORMAT_VERSION, "hash": ck.hash, "files": files}))
        if d.exists():  # an incomplete or corrupt entry: replace it
            shutil.rmtree(d, ignore_errors=True)
        try:
            os.rename(tmp, d)
        except OSError:
            pass  # another process published it first
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_launcher(ck: Any) -> bool:
    """Where this Triton compiles a C launcher per kernel signature (Triton 3.6's NVIDIA
    driver: ``make_launcher`` + ``compile_module_from_src``, cached in Triton's cache by its
    source), build it now, as ``CudaLauncher`` will when the parent loads the kernel: the
    parent then finds it in Triton's cache instead of running the C compiler itself. Triton
    3.9 has one generic launcher: nothing to do. False when not built (the parent builds it)."""
    try:
        from triton.backends.nvidia import driver as d
    except ImportError:
        return False
    make = getattr(d, "make_launcher", None)
    if make is None or getattr(ck.metadata.target, "backend", "cuda") != "cuda":
        return False
    src = ck.src
    constants = src.constants if hasattr(src, "constants") else {}
    arg_idx = lambda x: (src.fn.arg_names.index(x),) if isinstance(x, str) else x  # noqa: E731
    constants = {arg_idx(idx): value for idx, value in constants.items()}
    signature = dict(src.signature.items())
    c_src = make(constants, signature, getattr(ck.metadata, "tensordesc_meta", None))
    d.compile_module_from_src(src=c_src, name="__triton_launcher",
                              library_dirs=d.library_dirs(), include_dirs=d.include_dirs,
                              libraries=d.libraries)
    return True


def _light_packages() -> None:
    """Make ``ember_inductor.runtime.triton_math`` importable without running the packages'
    ``__init__`` (which import torch): namespace stand-ins pointing at the real folders."""
    import types

    here = pathlib.Path(__file__).resolve().parent
    for name, path in (("ember_inductor", here.parent), ("ember_inductor.runtime", here)):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [str(path)]  # type: ignore[attr-defined]
            sys.modules[name] = m


def worker_build(path: str, name: str, spec: dict[str, Any], config: dict[str, int],
                 target: tuple[str, int, int], entry: str, launcher: bool = True) -> str:
    """Compile one kernel of the module at ``path`` for ``target`` and publish its files in
    the cache folder ``entry`` (the parent then loads them: nothing crosses the process
    boundary but these arguments and a word). Needs no GPU (the launcher does: skipped
    without one)."""
    import importlib.util

    d = pathlib.Path(entry)
    if (d / "manifest.json").exists():
        return "hit"
    from triton.backends.compiler import GPUTarget

    modname = f"ember_triton_w_{pathlib.Path(path).stem}"
    mod = sys.modules.get(modname)
    if mod is None:
        spec_ = importlib.util.spec_from_file_location(modname, path)
        assert spec_ is not None and spec_.loader is not None
        mod = importlib.util.module_from_spec(spec_)
        sys.modules[modname] = mod
        try:
            spec_.loader.exec_module(mod)
        except BaseException:
            del sys.modules[modname]  # never keep a half-made module for the next job
            raise
    ck = compile_kernel(getattr(mod, name), spec, config, GPUTarget(*target))
    store_binary(ck, d)
    if launcher:
        try:
            build_launcher(ck)
        except Exception:  # noqa: BLE001 - no driver here (a CPU-only machine): the parent will
            pass
    return "built"


def main() -> None:
    _light_packages()
    try:  # while the parent is still generating code (runtime.triton.start_workers)
        import triton  # noqa: F401
        import triton.compiler  # noqa: F401
    except ImportError:
        pass
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            job = json.loads(line)
            job["target"] = tuple(job["target"])
            out = {"ok": worker_build(**job)}
        except Exception as e:  # noqa: BLE001 - reported to the parent, which compiles itself
            out = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
        out["torch"] = "torch" in sys.modules  # never, by design (tests check it)
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
