"""Ember's own CUDA launcher for compiled Triton kernels: one C call per launch.

Triton's launcher costs several microseconds per launch before the driver is reached: a Python
``__call__`` (two closures, the scratch allocators consulted) and then argument parsing against
a per-signature format. A kernel of Ember's knows its parameters when the wrapper loads (device
pointers and 64-bit sizes, in the order of the kernel's signature), so this module launches it
with one C function, :func:`launch` (``METH_FASTCALL``: no tuple built, no format parsed)::

    launch(plan, grid, stream, *params)      # params: Python ints, one per kernel parameter

``plan`` is a ``bytes`` object made once per kernel by :func:`plan`: the CUfunction, the block
(32 x warps), the dynamic shared memory, the device, and one type code per parameter, followed
by the trailing scratch pointers this Triton appends to every kernel (passed as null: kernels
that need scratch memory are refused).

Nothing is assumed about the kernel's parameter list from Triton's version: :func:`plan` asks
the driver (``cuFuncGetParamInfo``, CUDA 12.4+) for the loaded function's parameters, and
refuses (returns None, and the caller keeps Triton's launcher) unless they are exactly the
kernel's own parameters, 8 bytes each, followed by zero to two 8-byte scratch pointers. The
extension is C source built with the system compiler into Ember's cache (keyed by its source,
flags and this machine); it opens ``libcuda.so.1`` itself (``EMBER_LIBCUDA`` names another, for
tests), and makes the device's primary context current on a thread that has none, as Triton's
launcher does. Without a compiler, a driver, or the driver entry points, nothing changes:
Triton's launcher is used and the reason is logged once.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import struct
import sysconfig
import threading
from typing import Any, Sequence

log = logging.getLogger("ember.inductor.triton")

#: the most parameters a kernel may have (more: Triton's launcher)
MAX_PARAMS = 128

#: a parameter type of Ember's kernel signatures -> (code, bytes)
_CODES = {"*": ("p", 8), "i64": ("l", 8), "i32": ("i", 4), "fp32": ("f", 4), "fp64": ("d", 8)}

#: plan header: function (u64), block_x, shared bytes, device, params, scratch, 0 (u32 each):
#: the C struct ``Plan``, 32 bytes with no padding
_HEADER = struct.Struct("<QIIiIII")

SOURCE = r"""
// Ember's CUDA launcher for Triton kernels (ember_inductor/runtime/cuda_launch.py).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUfunction;
typedef void *CUstream;

static CUresult (*p_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, unsigned, CUstream, void **, void **);
static CUresult (*p_cuCtxGetCurrent)(CUcontext *);
static CUresult (*p_cuCtxSetCurrent)(CUcontext);
static CUresult (*p_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*p_cuGetErrorName)(CUresult, const char **);
static CUresult (*p_cuFuncGetParamInfo)(CUfunction, size_t, size_t *, size_t *);

#define MAX_PARAMS 128

// the header of a plan (cuda_launch.py _HEADER), then one type code per parameter
typedef struct {
  uint64_t function;
  uint32_t block_x;
  uint32_t shared;
  int32_t device;
  uint32_t n_params;
  uint32_t n_scratch;
  uint32_t reserved;
} Plan;

static int cuda_error(CUresult r, const char *what) {
  const char *name = NULL;
  if (p_cuGetErrorName == NULL || p_cuGetErrorName(r, &name) != 0 || name == NULL)
    name = "unknown error";
  PyErr_Format(PyExc_RuntimeError, "CUDA error %d (%s) in %s (Ember's kernel launcher)",
               (int)r, name, what);
  return -1;
}

static int current_context(int device) {
  CUcontext ctx = NULL;
  CUresult r = p_cuCtxGetCurrent(&ctx);
  if (r != 0) return cuda_error(r, "cuCtxGetCurrent");
  if (ctx != NULL) return 0;
  r = p_cuDevicePrimaryCtxRetain(&ctx, device);  // a thread with no context: the device's own
  if (r != 0) return cuda_error(r, "cuDevicePrimaryCtxRetain");
  r = p_cuCtxSetCurrent(ctx);
  if (r != 0) return cuda_error(r, "cuCtxSetCurrent");
  return 0;
}

// open(path): load the driver's entry points; True, or a string saying what is missing
static PyObject *open_driver(PyObject *self, PyObject *arg) {
  const char *path = PyUnicode_AsUTF8(arg);
  if (path == NULL) return NULL;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return PyUnicode_FromFormat("cannot open %s: %s", path, dlerror());
#define SYM(name)                                                             \
  *(void **)(&p_##name) = dlsym(h, #name);                                    \
  if (p_##name == NULL) return PyUnicode_FromFormat("%s has no %s", path, #name);
  SYM(cuLaunchKernel) SYM(cuCtxGetCurrent) SYM(cuCtxSetCurrent) SYM(cuDevicePrimaryCtxRetain)
  SYM(cuGetErrorName) SYM(cuFuncGetParamInfo)
#undef SYM
  Py_RETURN_TRUE;
}

// param_sizes(function, device): the byte sizes of a loaded kernel's parameters, as the driver
// reports them (cuFuncGetParamInfo until it refuses the index)
static PyObject *param_sizes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "param_sizes(function, device)");
    return NULL;
  }
  CUfunction f = (CUfunction)(uintptr_t)PyLong_AsUnsignedLongLong(args[0]);
  int device = (int)PyLong_AsLong(args[1]);
  if (PyErr_Occurred()) return NULL;
  if (current_context(device)) return NULL;
  PyObject *out = PyList_New(0);
  if (out == NULL) return NULL;
  for (size_t i = 0; i <= MAX_PARAMS; i++) {
    size_t offset = 0, size = 0;
    if (p_cuFuncGetParamInfo(f, i, &offset, &size) != 0) break;
    PyObject *v = PyLong_FromSize_t(size);
    if (v == NULL || PyList_Append(out, v)) {
      Py_XDECREF(v);
      Py_DECREF(out);
      return NULL;
    }
    Py_DECREF(v);
  }
  return out;
}

// launch(plan, grid, stream, *params): one launch of grid x 1 x 1 blocks
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 3 || !PyBytes_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "launch(plan: bytes, grid, stream, *params)");
    return NULL;
  }
  const char *raw = PyBytes_AS_STRING(args[0]);
  Plan plan;
  memcpy(&plan, raw, sizeof(Plan));
  const char *codes = raw + sizeof(Plan);
  if ((Py_ssize_t)plan.n_params != nargs - 3 ||
      (size_t)PyBytes_GET_SIZE(args[0]) != sizeof(Plan) + plan.n_params) {
    PyErr_Format(PyExc_TypeError, "kernel launch: %u parameters expected, %zd given",
                 plan.n_params, nargs - 3);
    return NULL;
  }
  unsigned long grid = PyLong_AsUnsignedLong(args[1]);
  CUstream stream = (CUstream)(uintptr_t)PyLong_AsUnsignedLongLong(args[2]);
  if (PyErr_Occurred()) return NULL;
  if (grid == 0) Py_RETURN_NONE;
  if (grid > 0x7fffffffUL) {
    PyErr_Format(PyExc_ValueError, "kernel launch: a grid of %lu blocks exceeds CUDA's limit",
                 grid);
    return NULL;
  }
  uint64_t slots[MAX_PARAMS + 2];
  void *params[MAX_PARAMS + 2];
  uint32_t n = plan.n_params;
  for (uint32_t i = 0; i < n; i++) {
    PyObject *a = args[3 + i];
    params[i] = &slots[i];
    switch (codes[i]) {
      case 'p': slots[i] = PyLong_AsUnsignedLongLong(a); break;
      case 'l': { int64_t v = PyLong_AsLongLong(a); memcpy(&slots[i], &v, 8); break; }
      case 'i': { int32_t v = (int32_t)PyLong_AsLong(a); memcpy(&slots[i], &v, 4); break; }
      case 'f': { float v = (float)PyFloat_AsDouble(a); memcpy(&slots[i], &v, 4); break; }
      case 'd': { double v = PyFloat_AsDouble(a); memcpy(&slots[i], &v, 8); break; }
      default:
        PyErr_Format(PyExc_ValueError, "kernel launch: unknown parameter type %c", codes[i]);
        return NULL;
    }
  }
  if (PyErr_Occurred()) return NULL;  // a parameter of the wrong kind (not an int, overflow)
  for (uint32_t j = 0; j < plan.n_scratch; j++) {  // Triton's scratch pointers: null
    slots[n + j] = 0;
    params[n + j] = &slots[n + j];
  }
  if (current_context(plan.device)) return NULL;
  CUresult r;
  Py_BEGIN_ALLOW_THREADS;
  r = p_cuLaunchKernel((CUfunction)(uintptr_t)plan.function, (unsigned)grid, 1, 1, plan.block_x,
                       1, 1, plan.shared, stream, params, NULL);
  Py_END_ALLOW_THREADS;
  if (r != 0) {
    cuda_error(r, "cuLaunchKernel");
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"open", (PyCFunction)open_driver, METH_O, "load the CUDA driver's entry points"},
    {"param_sizes", (PyCFunction)(void (*)(void))param_sizes, METH_FASTCALL,
     "a loaded kernel's parameter sizes"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch a kernel"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ember_cuda_launch", NULL, -1,
                                    methods};

extern "C" PyObject *PyInit__ember_cuda_launch(void) { return PyModule_Create(&module); }
"""


_lock = threading.Lock()
_opened: dict[str, Any] = {}


def module() -> Any:
    """The built and loaded extension with the driver opened, or None (the reason logged);
    once per process (``module.cache_clear()`` forgets it)."""
    if "mod" not in _opened:
        with _lock:  # kernels load in threads: one build, one load
            if "mod" not in _opened:
                _opened["mod"] = _open()
    return _opened["mod"]


module.cache_clear = _opened.clear  # type: ignore[attr-defined]


def _open() -> Any:
    path = os.environ.get("EMBER_LIBCUDA", "libcuda.so.1")
    try:
        from .cache import compile_cpp

        so = compile_cpp(SOURCE, (f"-I{sysconfig.get_paths()['include']}",))
        loader = importlib.machinery.ExtensionFileLoader("_ember_cuda_launch", str(so))
        spec = importlib.util.spec_from_file_location("_ember_cuda_launch", str(so),
                                                      loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        opened = mod.open(path)
    except Exception as e:  # noqa: BLE001 - no compiler, no headers: Triton's launcher
        log.info("Ember's CUDA launcher is not available (%s: %s); Triton's launcher is used",
                 type(e).__name__, str(e)[:300])
        return None
    if opened is not True:
        log.info("Ember's CUDA launcher is not available (%s); Triton's launcher is used",
                 opened)
        return None
    return mod


def enabled() -> bool:
    return os.environ.get("EMBER_TRITON_LAUNCHER", "ember") != "triton"


def plan(ck: Any, signature: Sequence[str], device: int) -> bytes | None:
    """The launch plan of a loaded compiled kernel ``ck`` whose parameters have the types
    ``signature`` (Ember's kernel spec), or None where this launcher cannot launch it exactly as
    Triton's would (the reason logged at debug level)."""
    def refuse(why: str) -> None:
        log.debug("kernel %s keeps Triton's launcher: %s", getattr(ck, "name", "?"), why)
        return None

    if not enabled():
        return refuse("EMBER_TRITON_LAUNCHER=triton")
    mod = module()
    if mod is None:
        return refuse("no launcher")
    md = ck.metadata
    function = getattr(ck, "function", None)
    if function is None:
        return refuse("no loaded function")
    if getattr(md, "num_ctas", 1) != 1 or any(d != 1 for d in getattr(md, "cluster_dims", ())):
        return refuse("thread-block clusters")
    for flag in ("launch_cooperative_grid", "launch_pdl"):
        if getattr(md, flag, False):
            return refuse(flag)
    for size in ("global_scratch_size", "profile_scratch_size"):
        if getattr(md, size, 0):
            return refuse(f"needs {size}")
    if getattr(md, "tensordesc_meta", None):
        return refuse("tensor descriptors")
    try:
        sizes = mod.param_sizes(int(function), device)
    except RuntimeError as e:
        return refuse(str(e))
    layout = param_layout(signature, sizes)
    if isinstance(layout, str):
        return refuse(layout)
    codes, n_scratch = layout
    head = _HEADER.pack(int(function), 32 * int(md.num_warps), int(md.shared), device,
                        len(codes), n_scratch, 0)
    return head + codes.encode()


def param_layout(signature: Sequence[str], sizes: Sequence[int]) -> tuple[str, int] | str:
    """``(type codes, scratch pointers)`` of a kernel whose parameters have Ember's types
    ``signature`` and, as compiled, the byte sizes ``sizes`` (the driver's report, or the
    PTX's ``.param`` list); or why it cannot be launched here. The compiled list must be the
    kernel's own parameters with their sizes, then at most two 8-byte scratch pointers (what
    Triton appends: none, a global scratch, and a profiler's scratch, by version)."""
    codes = []
    for t in signature:
        c = _CODES.get("*" if t.startswith("*") else t)
        if c is None:
            return f"parameter type {t}"
        codes.append(c)
    if len(codes) > MAX_PARAMS:
        return "too many parameters"
    extra = list(sizes[len(codes):])
    if [n for _, n in codes] != list(sizes[:len(codes)]) or len(extra) > 2 or any(
            n != 8 for n in extra):
        return f"the compiled kernel has parameters of {list(sizes)} bytes for {list(signature)}"
    return "".join(c for c, _ in codes), len(extra)
