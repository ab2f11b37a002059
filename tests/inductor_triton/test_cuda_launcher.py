"""Ember's C launcher for Triton kernels (ember_inductor/runtime/cuda_launch.py), without a GPU:
the extension is built for real and opens a fake CUDA driver (a C library of this test that
records each ``cuLaunchKernel`` and reports the parameter sizes it is told to), so what reaches
the driver is checked byte for byte: the grid, block, shared memory, stream, function, every
parameter and the trailing null scratch pointers. A kernel whose compiled parameters are not
exactly Ember's keeps Triton's launcher."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import types

import pytest
import torch

from triton_util import DEVICE

pytestmark = [pytest.mark.skipif(DEVICE != "cpu", reason="fakes the CUDA driver"),
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]

FAKE_DRIVER = r"""
#include <stdint.h>
#include <string.h>
#include <stddef.h>
static size_t sizes[256];
static int nsizes = 0, ctx = 1, fail = 0, retained = -1;
static long long launches = 0;
static uint64_t last[8 + 256];  // function, grid x y z, block x, shared, stream, count; params
void fake_set_params(int n, const size_t *s) { nsizes = n; memcpy(sizes, s, n * sizeof(size_t)); }
void fake_set_ctx(int c) { ctx = c; }
int fake_retained(void) { return retained; }
void fake_fail(int code) { fail = code; }
long long fake_launches(void) { return launches; }
const uint64_t *fake_last(void) { return last; }
int cuCtxGetCurrent(void **c) { *c = ctx ? (void *)0x1234 : 0; return 0; }
int cuCtxSetCurrent(void *c) { ctx = c != 0; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { retained = d; *c = (void *)0x1234; return 0; }
int cuGetErrorName(int r, const char **s) { *s = "CUDA_ERROR_LAUNCH_FAILED"; return 0; }
int cuFuncGetParamInfo(void *f, size_t i, size_t *off, size_t *size) {
  if ((int)i >= nsizes) return 1;
  *size = sizes[i]; *off = 8 * i; return 0;
}
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
  if (fail) { int r = fail; fail = 0; return r; }
  launches++;
  last[0] = (uint64_t)(uintptr_t)f; last[1] = gx; last[2] = gy; last[3] = gz; last[4] = bx;
  last[5] = shared; last[6] = (uint64_t)(uintptr_t)stream; last[7] = nsizes;
  for (int i = 0; i < nsizes; i++) { uint64_t v = 0; memcpy(&v, params[i], sizes[i]); last[8 + i] = v; }
  return 0;
}
"""


@pytest.fixture
def driver(tmp_path, monkeypatch):
    """The fake driver, opened by Ember's launcher; yields a ctypes handle to its controls."""
    from ember_inductor.runtime import cuda_launch

    src = tmp_path / "fake_cuda.c"
    src.write_text(FAKE_DRIVER)
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    monkeypatch.setenv("EMBER_LIBCUDA", str(lib))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    cuda_launch.module.cache_clear()
    fake = ctypes.CDLL(str(lib))
    fake.fake_last.restype = ctypes.POINTER(ctypes.c_uint64)
    fake.fake_launches.restype = ctypes.c_longlong

    def params(*sizes):
        fake.fake_set_params(len(sizes), (ctypes.c_size_t * len(sizes))(*sizes))
    fake.params = params
    fake.last = lambda n: [fake.fake_last()[i] for i in range(8 + n)]
    assert cuda_launch.module() is not None
    yield fake
    cuda_launch.module.cache_clear()  # later tests open the real driver (or none) again


def _ck(**md):
    meta = dict(num_warps=4, shared=2048, num_ctas=1, cluster_dims=(1, 1, 1),
                launch_cooperative_grid=False, launch_pdl=False, global_scratch_size=0,
                profile_scratch_size=0)
    meta.update(md)
    return types.SimpleNamespace(metadata=types.SimpleNamespace(**meta), function=0xF00D, name="k")


SIG = ["*fp32", "*bf16", "*i64", "i64"]


@pytest.mark.parametrize("scratch", [0, 1, 2])
def test_plan_follows_the_driver(driver, scratch):
    from ember_inductor.runtime import cuda_launch

    driver.params(*[8] * (len(SIG) + scratch))
    plan = cuda_launch.plan(_ck(), SIG, 0)
    assert plan is not None and plan.endswith(b"pppl")
    mod = cuda_launch.module()
    mod.launch(plan, 5, 77, 0x1000, 0x2010, 0x3020, -3)
    got = driver.last(len(SIG) + scratch)
    assert got[:8] == [0xF00D, 5, 1, 1, 128, 2048, 77, len(SIG) + scratch]
    assert got[8:] == [0x1000, 0x2010, 0x3020, 2 ** 64 - 3] + [0] * scratch


@pytest.mark.parametrize("case", ["sizes", "too_many_extra", "extra_not_pointer", "scratch_used",
                                  "profile_scratch", "clusters", "cooperative", "pdl", "dtype",
                                  "switched_off"])
def test_plan_refuses_what_it_cannot_launch_exactly(driver, case, monkeypatch):
    from ember_inductor.runtime import cuda_launch

    sig, ck = SIG, _ck()
    driver.params(*[8] * (len(SIG) + 2))
    if case == "sizes":  # the driver says a parameter is 4 bytes
        driver.params(8, 8, 8, 4, 8, 8)
    elif case == "too_many_extra":
        driver.params(*[8] * (len(SIG) + 3))
    elif case == "extra_not_pointer":
        driver.params(*[8] * len(SIG), 4)
    elif case == "scratch_used":
        ck = _ck(global_scratch_size=128)
    elif case == "profile_scratch":
        ck = _ck(profile_scratch_size=64)
    elif case == "clusters":
        ck = _ck(num_ctas=2)
    elif case == "cooperative":
        ck = _ck(launch_cooperative_grid=True)
    elif case == "pdl":
        ck = _ck(launch_pdl=True)
    elif case == "dtype":
        sig = SIG[:-1] + ["u16"]
    elif case == "switched_off":
        monkeypatch.setenv("EMBER_TRITON_LAUNCHER", "triton")
    assert cuda_launch.plan(ck, sig, 0) is None


def test_launch_errors_are_raised(driver):
    from ember_inductor.runtime import cuda_launch

    driver.params(8, 8, 8, 8, 8, 8)
    plan = cuda_launch.plan(_ck(), SIG, 0)
    mod = cuda_launch.module()
    with pytest.raises(TypeError, match="4 parameters expected, 3 given"):
        mod.launch(plan, 5, 0, 1, 2, 3)
    with pytest.raises(TypeError):
        mod.launch(plan, 5, 0, 1, 2, "three", 4)
    with pytest.raises(ValueError, match="exceeds CUDA's limit"):
        mod.launch(plan, 2 ** 31, 0, 1, 2, 3, 4)
    driver.fake_fail(719)
    with pytest.raises(RuntimeError, match=r"CUDA error 719 \(CUDA_ERROR_LAUNCH_FAILED\) in "
                                           "cuLaunchKernel"):
        mod.launch(plan, 5, 0, 1, 2, 3, 4)
    n = driver.fake_launches()
    mod.launch(plan, 0, 0, 1, 2, 3, 4)  # an empty grid launches nothing
    assert driver.fake_launches() == n


def test_thread_without_context_gets_the_devices_primary_context(driver):
    from ember_inductor.runtime import cuda_launch

    driver.params(8, 8, 8, 8, 8, 8)
    plan = cuda_launch.plan(_ck(), SIG, 3)
    driver.fake_set_ctx(0)
    cuda_launch.module().launch(plan, 1, 0, 1, 2, 3, 4)
    assert driver.fake_retained() == 3 and driver.fake_launches() >= 1


def _launcher(monkeypatch, driver):
    """A Launcher of a kernel (two tensors, a size) prepared as on the GPU, with the fake
    driver: prepare() takes Ember's launcher where the driver confirms the parameters."""
    from ember_inductor.runtime import triton as rt

    spec = {"name": "k", "params": ["arg0", "buf1", "s0"], "signature": ["*fp32", "*fp32", "i64"],
            "grid": "1d", "config": {"XBLOCK": 64, "RBLOCK": 8, "num_warps": 4},
            "candidates": [], "checked": False, "numels": ["s0"]}
    ln = rt.Launcher("src", None, spec)
    ln._interpret = False
    ln._tuned = True
    ck = _ck()
    ck.packed_metadata = "META"
    ck.run = lambda *a: pytest.fail("Triton's launcher was called")
    monkeypatch.setattr(rt, "_build", lambda *a: ck)
    monkeypatch.setattr(rt, "_fast_path", lambda ck: ck.run)
    monkeypatch.setattr(rt, "_stream", lambda dev: 4321)
    driver.params(8, 8, 8, 8, 8)
    before = rt.counters["direct_launchers"]
    ln.prepare()
    assert ln._plan is not None and rt.counters["direct_launchers"] == before + 1
    jit = []
    monkeypatch.setattr(ln, "_jit", lambda numels, args: jit.append((numels, args)))
    return ln, jit


def test_launcher_uses_the_c_launcher(driver, monkeypatch):
    ln, jit = _launcher(monkeypatch, driver)
    x, y = torch.zeros(200), torch.zeros(200)
    ln(200, x, y, 200)
    assert driver.last(5) == [0xF00D, 4, 1, 1, 128, 2048, 4321, 5,
                              x.data_ptr(), y.data_ptr(), 200, 0, 0]
    assert not jit
    base = torch.zeros(201)
    n = driver.fake_launches()
    ln(200, base[1:], y, 200)  # a graph input 4 bytes past alignment: Triton's JIT call
    assert driver.fake_launches() == n and len(jit) == 1


def test_kernel_the_driver_disagrees_with_keeps_tritons_launcher(driver, monkeypatch):
    from ember_inductor.runtime import triton as rt

    ln, _ = _launcher(monkeypatch, driver)
    driver.params(8, 8, 4)  # the compiled kernel is not what the spec says
    calls = []
    ln.ck.run = lambda *a: calls.append(a)
    monkeypatch.setattr(rt, "_fast_path", lambda ck: ck.run)
    ln.prepare()
    assert ln._plan is None
    x, y = torch.zeros(64), torch.zeros(64)
    ln(64, x, y, 64)
    assert calls == [(1, 1, 1, 4321, 0xF00D, "META", None, None, None,
                      x.data_ptr(), y.data_ptr(), 64, 64, 8)]
