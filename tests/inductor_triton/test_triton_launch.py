"""The GPU launch path's argument handling, without a GPU: a compiled kernel's launcher is
called positionally with the grid, the stream, the function, the metadata, no hooks, then the
pointers as integers and the constexprs in the kernel's order; a graph input that is not
16-byte aligned goes through Triton's JIT call instead; a launcher whose signature is not the
one expected is not used."""

from __future__ import annotations

import pytest
import torch

from triton_util import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="fakes the GPU launcher")


class FakeCK:
    function = "FUNCTION"
    packed_metadata = "META"

    def __init__(self):
        self.calls = []

        class Run:
            def __call__(s, gridX, gridY, gridZ, stream, function, kernel_metadata,  # noqa: N805
                         launch_metadata, launch_enter_hook, launch_exit_hook, *args):
                self.calls.append((gridX, gridY, gridZ, stream, function, kernel_metadata,
                                   launch_metadata, launch_enter_hook, launch_exit_hook, *args))
        self.run = Run()


def _launcher(monkeypatch):
    from ember_inductor.runtime import triton as rt

    spec = {"name": "k", "params": ["arg0", "buf1", "s0"], "signature": ["*fp32", "*fp32", "i64"],
            "grid": "1d", "config": {"XBLOCK": 64, "RBLOCK": 8, "num_warps": 4},
            "candidates": [], "checked": False, "numels": ["s0"]}
    ln = rt.Launcher("src", None, spec)
    ln._interpret = False
    ln._tuned = True
    ln.ck = FakeCK()
    ln._run = rt._fast_path(ln.ck)
    monkeypatch.setattr(rt, "_stream", lambda dev: 1234)
    ln._device = 0
    jit = []
    monkeypatch.setattr(ln, "_jit", lambda numels, args: jit.append((numels, args)))
    # a cached choice comes back as JSON with sorted keys: the constexprs keep the kernel's order
    ln.prepare_config = None
    return rt, ln, jit


@pytest.mark.parametrize("specialized", [True, False])
def test_fast_launch_arguments(monkeypatch, specialized):
    rt, ln, jit = _launcher(monkeypatch)
    assert ln._run is not None
    ln.config = {"RBLOCK": 8, "XBLOCK": 64, "num_warps": 4}
    ln.consts = tuple(ln.config[k] for k in ln.const_names)
    if specialized:  # the per-kernel function prepare() makes
        ln._fast = ln._specialize()
    x, y = torch.zeros(200), torch.zeros(200)
    ln(200, x, y, 200)
    assert ln.ck.calls == [(4, 1, 1, 1234, "FUNCTION", "META", None, None, None,
                            x.data_ptr(), y.data_ptr(), 200, 64, 8)]
    assert not jit
    ln(0, x, y, 0)  # an empty grid launches nothing
    assert len(ln.ck.calls) == 1


@pytest.mark.parametrize("specialized", [True, False])
def test_misaligned_input_uses_jit(monkeypatch, specialized):
    rt, ln, jit = _launcher(monkeypatch)
    if specialized:
        ln._fast = ln._specialize()
    base = torch.zeros(201)
    x = base[1:]  # 4 bytes past an aligned address
    ln(200, x, torch.zeros(200), 200)
    assert not ln.ck.calls and len(jit) == 1


def test_unknown_launcher_signature_is_not_used():
    from ember_inductor.runtime import triton as rt

    class Other:
        def run(self, a, b):
            pass

        def __getitem__(self, grid):
            return lambda *args: None
    assert rt._fast_path(Other()) is None


def test_interpreter_after_triton_was_imported(py):
    """Kernels use only Triton builtins and their own helpers, so they run under the
    interpreter even when something imported triton before TRITON_INTERPRET was set (as
    torch._inductor does in a test run)."""
    from pathlib import Path

    code = r"""
import os, sys, triton, torch
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.environ["EMBER_TEST_DIR"])
from triton_util import compile_triton
f = lambda x, y: (torch.softmax(x * y, -1), x.t().contiguous(), x.argmax(1), (x > 0).any(1),
                  torch.remainder(x, 0.3))
x, y = torch.randn(20, 24), torch.randn(24)
out, ref = compile_triton(f)(x, y), f(x, y)
print("OK" if all(torch.allclose(a, b, atol=1e-5) for a, b in zip(out, ref)) else "WRONG")
"""
    env = {"EMBER_TEST_DIR": str(Path(__file__).parent), "TRITON_INTERPRET": "0"}
    r = py(code, env=env, pythonpath=[str(Path(__file__).parent)], timeout=300)
    assert r.stdout.strip().endswith("OK"), r.stdout[-1000:] + r.stderr[-3000:]
