"""One guard for the metadata of every parameter and buffer an entry is specialized on.

An entry specialized on a module checks, on every call, that each parameter and buffer it read
still has the dtype, device, shape, strides and ``requires_grad`` it was traced with (the same
Parameter object can hold another tensor: ``module.half()``, ``.to()``, ``p.data = t``). As
Python expressions that is about 0.35 us a tensor (five getters, two of them building a
``torch.Size`` and a tuple), a third of a large model's per-call guard time (ResNet-50: 267
tensors). The entry evaluates them as one guard instead::

    ___tensors_ok((___p_1, ___p_2, ...), ___tmeta_0)

``___tmeta_0`` is plain data, one ``(dtype, device, requires_grad, shape, strides)`` per
tensor (persisted captures store it as plain data: its namespace name starts with
:data:`NS_HINT`). :func:`tensors_ok` compares in C++ once Ember's small extension
(:data:`SOURCE`, built against the installed torch) is loaded: it reads each tensor's metadata
from the tensor itself (no Python objects made), about ten times faster.

The extension is loaded from Ember's cache (the key names its source, the torch build, the
Python ABI and the compiler), or built there in a background thread once guards of this kind
have run :data:`START_AFTER` times in the process (a short script never starts a compiler; one
process builds while the others see its file lock and try later; a compiler still running when
the process exits is stopped; a corrupt library is rebuilt). Until it loads, or where it cannot
be built (no compiler, no torch headers), the same comparison runs in Python, with the reason
logged once at INFO (:func:`state`). ``EMBER_TENSOR_CHECK=py`` turns the extension off. The
guard log and the explanation of a miss keep one guard per tensor.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from typing import Any, Sequence

import torch

from .stable import C_SOURCE as _STABLE_SOURCE

log = logging.getLogger("ember.capture")

__all__ = ["tensors_ok", "meta_of", "extension", "state", "SOURCE", "NS_HINT"]

#: the namespace hint of the metadata tuple (``___tmeta_N``), by which persistence knows it
NS_HINT = "tmeta"

_TENSOR_SOURCE = r"""
// Ember's tensor-metadata guard (ember/capture/tensor_check.py).
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <cstdint>
#include <cstring>
#include <vector>

// pack(metas) -> bytes: per tensor int64 words [scalar type, device type, device index,
// requires_grad, ndim, sizes..., strides...]
static PyObject *pack(PyObject *, PyObject *metas) {
  if (!PyTuple_Check(metas)) {
    PyErr_SetString(PyExc_TypeError, "pack(metas): a tuple");
    return NULL;
  }
  std::vector<int64_t> out;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(metas); i++) {
    PyObject *m = PyTuple_GET_ITEM(metas, i);
    if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 5) {
      PyErr_SetString(PyExc_TypeError, "a meta is (dtype, device, requires_grad, shape, strides)");
      return NULL;
    }
    PyObject *dt = PyTuple_GET_ITEM(m, 0), *dev = PyTuple_GET_ITEM(m, 1);
    PyObject *shape = PyTuple_GET_ITEM(m, 3), *strides = PyTuple_GET_ITEM(m, 4);
    if (!THPDtype_Check(dt) || !THPDevice_Check(dev) || !PyTuple_Check(shape) ||
        !PyTuple_Check(strides) || PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(strides)) {
      PyErr_SetString(PyExc_TypeError, "a meta is (dtype, device, bool, tuple, tuple)");
      return NULL;
    }
    const at::Device &d = ((THPDevice *)dev)->device;
    Py_ssize_t n = PyTuple_GET_SIZE(shape);
    out.push_back((int64_t)((THPDtype *)dt)->scalar_type);
    out.push_back((int64_t)d.type());
    out.push_back((int64_t)d.index());
    out.push_back(PyObject_IsTrue(PyTuple_GET_ITEM(m, 2)) ? 1 : 0);
    out.push_back((int64_t)n);
    for (Py_ssize_t k = 0; k < n; k++) out.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(shape, k)));
    for (Py_ssize_t k = 0; k < n; k++) out.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(strides, k)));
    if (PyErr_Occurred()) return NULL;
  }
  return PyBytes_FromStringAndSize((const char *)out.data(), (Py_ssize_t)(out.size() * sizeof(int64_t)));
}

// check(tensors, packed) -> bool: every tensor matches its packed metadata
static PyObject *check(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyBytes_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "check(tensors: tuple, packed: bytes)");
    return NULL;
  }
  PyObject *ts = args[0];
  const int64_t *w = (const int64_t *)PyBytes_AS_STRING(args[1]);
  const int64_t *end = w + PyBytes_GET_SIZE(args[1]) / sizeof(int64_t);
  try {  // a tensor that became sparse, nested, ... (no strides): a miss, never a crash
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ts); i++) {
      PyObject *o = PyTuple_GET_ITEM(ts, i);
      if (w + 5 > end || !THPVariable_Check(o)) Py_RETURN_FALSE;
      const at::Tensor &t = THPVariable_Unpack(o);
      if (!t.defined() || t.layout() != c10::kStrided || t.is_nested()) Py_RETURN_FALSE;
      const at::Device d = t.device();
      int64_t n = w[4];
      if ((int64_t)t.scalar_type() != w[0] || (int64_t)d.type() != w[1] ||
          (int64_t)d.index() != w[2] || (t.requires_grad() ? 1 : 0) != w[3] ||
          t.dim() != n || w + 5 + 2 * n > end)
        Py_RETURN_FALSE;
      c10::IntArrayRef sizes = t.sizes(), strides = t.strides();
      for (int64_t k = 0; k < n; k++)
        if (sizes[k] != w[5 + k] || strides[k] != w[5 + n + k]) Py_RETURN_FALSE;
      w += 5 + 2 * n;
    }
  } catch (...) {
    Py_RETURN_FALSE;
  }
  if (w != end) Py_RETURN_FALSE;
  Py_RETURN_TRUE;
}

"""

_MODULE = r"""
static PyMethodDef methods[] = {
    {"pack", (PyCFunction)pack, METH_O, "pack(metas) -> bytes"},
    {"check", (PyCFunction)(void (*)(void))check, METH_FASTCALL, "check(tensors, packed)"},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "ember_tensor_check", NULL, -1,
                                        methods};
PyMODINIT_FUNC PyInit_ember_tensor_check(void) {
  PyObject *m = PyModule_Create(&module_def);
  if (m && stable_ready(m) < 0) { Py_DECREF(m); return NULL; }
  return m;
}
"""

#: Ember's guard extension: the tensor-metadata check and the state-version check of
#: :mod:`ember.capture.stable`
SOURCE = _TENSOR_SOURCE + _STABLE_SOURCE + _MODULE


def meta_of(t: torch.Tensor) -> tuple[Any, ...]:
    """What the guard compares: ``(dtype, device, requires_grad, shape, strides)``."""
    return (t.dtype, t.device, bool(t.requires_grad), tuple(t.shape), tuple(t.stride()))


def _check_py(ts: Sequence[Any], metas: Sequence[tuple[Any, ...]]) -> bool:
    if len(ts) != len(metas):
        return False
    try:
        for t, (dtype, device, rg, shape, stride) in zip(ts, metas):
            if not (isinstance(t, torch.Tensor) and t.requires_grad is rg and t.dtype is dtype
                    and t.device == device and t.shape == shape and t.stride() == stride):
                return False
    except RuntimeError:  # no strides (sparse, nested): a miss
        return False
    return True


_ext: Any = None          # the loaded extension, once built
_state = "idle"           # idle -> building -> ready | failed (idle again: built elsewhere)
_lock = threading.Lock()
_packed: dict[int, tuple[Any, bytes]] = {}  # id(metas) -> (metas, packed): metas held alive
#: guard evaluations before the extension is loaded or built: a short-lived process (a script
#: calling a compiled function a few times, a test) never starts a compiler
START_AFTER = 64
_calls = 0
_next_try = START_AFTER
_proc: Any = None  # the compiler while it runs (stopped if the process exits first)


def tensors_ok(ts: tuple[Any, ...], metas: tuple[tuple[Any, ...], ...]) -> bool:
    """True when each tensor of ``ts`` has the metadata of the same position in ``metas``."""
    ext = _ext
    if ext is None:
        global _calls
        _calls += 1
        if _calls >= _next_try and _state == "idle":
            _start()
        return _check_py(ts, metas)
    hit = _packed.get(id(metas))
    if hit is None or hit[0] is not metas:
        if len(_packed) >= 4096:  # entries long dead keep theirs otherwise: start over
            _packed.clear()
        hit = (metas, ext.pack(metas))
        _packed[id(metas)] = hit
    return ext.check(ts, hit[1])


def extension(wait: float | None = None) -> Any:
    """The loaded extension (starting its build if needed); ``wait``: seconds to wait for a
    build in progress. None when it is not (yet) available."""
    if _state == "idle":
        _start()
    if wait:
        t = _thread
        if t is not None:
            t.join(wait)
    return _ext


def load_cached() -> Any:
    """The extension if it is loaded, or built already (by an earlier process) and loadable
    now without a compiler; else None (nothing is started)."""
    global _ext, _state
    if _ext is not None or _state != "idle":
        return _ext
    if _turned_off():
        return None
    loaded = False
    with _lock:
        if _ext is None and _state == "idle":
            try:
                path = _library_path()
                if path.exists():
                    _ext = _import(path)
                    _state = "ready"
                    loaded = True
            except Exception:  # noqa: BLE001 - corrupt: the background build replaces it
                pass
    if loaded:
        _loaded()
    return _ext


def state() -> str:
    """Where the check runs: "ready" (C++), "building", "idle" (not started yet, or another
    process is building) or "failed" (Python for good: turned off, or the build failed)."""
    return _state


_thread: threading.Thread | None = None


def _start() -> None:
    global _state, _thread
    with _lock:
        if _state != "idle":
            return
        if _turned_off():
            _state = "failed"
            return
        _state = "building"
        _thread = threading.Thread(target=_build_and_load, name="ember-tensor-check",
                                   daemon=True)
        _thread.start()


def _turned_off() -> bool:
    return os.environ.get("EMBER_TENSOR_CHECK", "").lower() in ("py", "python", "0", "off")


def _library_path() -> pathlib.Path:
    """Where the extension for this torch, Python and compiler lies in Ember's cache."""
    from .._store import cache_dir

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache_dir() / "ext" / f"ember_tensor_check_{_key()}{suffix}"


@functools.lru_cache(maxsize=None)  # (hashes the source: once per process, not per entry)
def _key() -> str:
    parts = [SOURCE, torch.__version__, str(getattr(torch.version, "git_version", "")),
             sys.version, sysconfig.get_config_var("EXT_SUFFIX") or "", platform.machine(),
             _compiler(), " ".join(_flags())]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _compiler() -> str:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or ""


def _flags() -> list[str]:
    return ["-O2", "-shared", "-fPIC", "-std=c++17", "-w", "-D_GLIBCXX_USE_CXX11_ABI="
            + str(int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))]


class _Busy(Exception):
    """Another process is building the extension: try again later."""


_ready_callbacks: list[Any] = []


def on_ready(fn: Any) -> None:
    """Call ``fn()`` once the extension is loaded (from the thread that loaded it)."""
    _ready_callbacks.append(fn)


def _loaded() -> None:
    for fn in list(_ready_callbacks):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a callback never undoes the load
            log.debug("ember: after loading the guard extension: %s", e)


def _build_and_load() -> None:
    global _ext, _state, _next_try
    try:
        _ext = _load_or_build()
        _state = "ready"
        log.debug("ember: tensor-metadata guards run in C++ (%s)", _ext.__file__)
        _loaded()
    except _Busy:
        _next_try = _calls + 16 * START_AFTER
        _state = "idle"
    except Exception as e:  # noqa: BLE001 - any failure: the Python comparison stays
        _state = "failed"
        log.info("ember: tensor-metadata guards stay in Python: %s", str(e)[:500])


def _stop_compiler() -> None:
    p = _proc
    if p is not None and p.poll() is None:
        p.kill()


atexit.register(_stop_compiler)  # no compiler left running by a process that exits first


def _load_or_build() -> Any:
    path = _library_path()
    folder = path.parent
    corrupt = False
    if path.exists():
        try:
            return _import(path)
        except Exception as e:  # noqa: BLE001 - corrupt or foreign: build again
            log.info("ember: rebuilding %s: %s", path.name, e)
            corrupt = True
    cxx = _compiler()
    if not cxx:
        raise RuntimeError("no C++ compiler (g++ or $CXX) found")
    folder.mkdir(parents=True, exist_ok=True)
    import fcntl

    with open(folder / f".{path.name}.lock", "a") as lock:
        try:  # one process builds; the others keep the Python comparison meanwhile
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise _Busy() from None
        if path.exists() and not corrupt:  # built by the process that held the lock before
            return _import(path)
        return _build(cxx, folder, path)


def _build(cxx: str, folder: pathlib.Path, path: pathlib.Path) -> Any:
    global _proc
    from torch.utils.cpp_extension import include_paths, library_paths

    from .._store import atomic_write

    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src = os.path.join(tmp, "ember_tensor_check.cpp")
        with open(src, "w") as fh:
            fh.write(SOURCE)
        so = os.path.join(tmp, "ember_tensor_check.so")
        cmd = [cxx, *_flags(), src, "-o", so,
               *[f"-I{p}" for p in include_paths()], f"-I{sysconfig.get_paths()['include']}",
               *[f"-L{p}" for p in library_paths()],
               *[f"-Wl,-rpath,{p}" for p in library_paths()],
               "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10"]
        _proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, err = _proc.communicate(timeout=600)
        finally:
            _stop_compiler()
            rc, _proc = _proc.returncode, None
        if rc != 0:
            raise RuntimeError(f"{cxx} failed ({rc}): {(err or '').strip()[-400:]}")
        atomic_write(path, pathlib.Path(so).read_bytes())  # others see the old one or this
    return _import(path)


def _import(path: Any) -> Any:
    loader = importlib.machinery.ExtensionFileLoader("ember_tensor_check", str(path))
    spec = importlib.util.spec_from_file_location("ember_tensor_check", str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    loader.exec_module(mod)
    # the extension must agree with the Python comparison on a tensor before it is trusted
    t = torch.zeros(2, 3)
    m = (meta_of(t),)
    if mod.check((t,), mod.pack(m)) is not True or mod.check((t.t(),), mod.pack(m)) is not False:
        raise RuntimeError(f"{path} disagrees with the Python comparison")
    return mod
