"""Building for a lower instruction set than this CPU's (the inductor option ``cpu_isa``,
``EMBER_CPU_ISA``): the AVX2 build (``x86-64-v3``) and the plain x86-64 build run here, give
eager's results and use no register wider than their ISA has (read from the built library's
instructions); the kernel cache keys a native build by this CPU (never loaded on another) and a
named-ISA build by that ISA; bad values are refused with the valid ones named."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from typing import Any, Callable

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember_inductor.codegen import cpp as cppgen
from ember_inductor.compile_fx import generate_source, load_wrapper
from ember_inductor.decompositions import decompositions
from ember_inductor.runtime import cache

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _cpu_can(isa: str) -> bool:
    from ember.precompile.runtime import cpu_flags

    return set(cppgen.CPU_ISAS[isa]) <= set(cpu_flags().split())


def _step(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> Any:
    """Issue 21's pointwise chain: its input gradients (sin, cos, sigmoid recomputed in the
    backward kernel) and a softmax (max and sum reductions)."""
    xs, ys = x.detach().requires_grad_(), y.detach().requires_grad_()
    out = (torch.sin(xs) * torch.cos(ys) + torch.sigmoid(xs) * 0.5).relu().sum(-1)
    gx, gy = torch.autograd.grad(out, (xs, ys), g)
    return gx, gy, (x * 3).softmax(-1), torch.erf(y) * torch.exp(x)


def _build(isa: str) -> tuple[Callable[..., Any], list[str]]:
    torch.manual_seed(0)
    args = (torch.randn(32, 320) * 4, torch.randn(32, 320) * 4, torch.randn(32))
    gm = make_fx(_step, decomposition_table=decompositions())(*args)
    src, _ = generate_source(gm, key=f"test_vec_isa_{isa}", options={"cpu_isa": isa})
    m = re.search(r"^CPP_SOURCES = (\[.*?^\])", src, re.S | re.M)
    assert m
    sources = ast.literal_eval(m.group(1))
    fn = load_wrapper(src, gm, f"test_vec_isa_{isa}")
    got = fn(*args)
    for a, b in zip(got, _step(*args)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    return fn, sources


def _registers(sources: list[str]) -> set[str]:
    """The vector register kinds (xmm, ymm, zmm) the built libraries' instructions use."""
    seen: set[str] = set()
    for s in sources:
        so = cache.compile_cpp(s)  # built already: a cache lookup
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)],
                              capture_output=True, text=True, check=True).stdout
        seen |= set(re.findall(r"%([xyz]mm)\d+", text))
    return seen


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump")
@pytest.mark.parametrize("isa,allowed,needed", [
    ("x86-64-v3", {"xmm", "ymm"}, "ymm"),   # AVX2: 256-bit vectors, never AVX-512's zmm
    ("x86-64", {"xmm"}, "xmm"),             # SSE2 only
])
def test_lower_isa_build_runs_and_stays_in_its_registers(isa: str, allowed: set[str],
                                                         needed: str) -> None:
    if not _cpu_can(isa):
        pytest.skip(f"this CPU cannot run {isa} code")
    _, sources = _build(isa)
    assert all(s.startswith(f"// ember-cpu-isa: {isa}\n") for s in sources)
    regs = _registers(sources)
    assert needed in regs and regs <= allowed, (isa, regs)


def test_native_key_names_this_cpu_and_a_named_isa_does_not(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    src = 'extern "C" int f(int a) { return a + 1; }\n'
    v3 = "// ember-cpu-isa: x86-64-v3\n" + src
    assert cache.source_march(src) == "native" and cache.source_march(v3) == "x86-64-v3"
    real = cache._run_text
    keys = []
    for cpu in ("cpu A", "cpu B"):
        def fake(cmd: Any, cpu: str = cpu) -> str:
            return cpu if "-march=native" in cmd else real(cmd)
        monkeypatch.setattr(cache, "_run_text", fake)
        cache._toolchain.cache_clear()
        keys.append((cache.cpp_key(src), cache.cpp_key(v3)))
    cache._toolchain.cache_clear()
    monkeypatch.undo()
    (native_a, v3_a), (native_b, v3_b) = keys
    assert native_a != native_b  # a native build is never found on another CPU
    assert v3_a == v3_b          # an x86-64-v3 build is the same on any CPU
    assert native_a != v3_a
    assert "-march=x86-64-v3" in cache._flags((), "x86-64-v3")
    assert "-march=native" not in cache._flags((), "x86-64-v3")


def test_option_config_and_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cppgen.cpu_isa({}) == "native"
    with ember.config.patch(cpu_isa="x86-64"):
        assert cppgen.cpu_isa({}) == "x86-64"
        assert cppgen.cpu_isa({"cpu_isa": "native"}) == "native"  # the option wins
    with pytest.raises(ValueError, match=r"'avx2'.*valid values: 'native', 'x86-64'"):
        cppgen.cpu_isa({"cpu_isa": "avx2"})
    import ember.precompile.runtime as rt

    monkeypatch.setattr(rt, "cpu_flags", lambda: "fpu sse sse2")
    with pytest.raises(ValueError, match="this CPU lacks .*avx2"):
        cppgen.cpu_isa({"cpu_isa": "x86-64-v3"})


def test_ember_compile_takes_the_option() -> None:
    # declared in the backend's options (an undeclared key would be refused)
    if not _cpu_can("x86-64-v3"):
        pytest.skip("this CPU cannot run x86-64-v3 code")
    torch.manual_seed(0)
    x = torch.randn(16, 40)
    f = ember.compile(lambda t: (torch.sin(t) * 2).softmax(-1), backend="inductor",
                      options={"cpu_isa": "x86-64-v3"})
    with ember.config.patch(suppress_errors=False):  # a failed compile raises, not runs eagerly
        torch.testing.assert_close(f(x), (torch.sin(x) * 2).softmax(-1))
    with pytest.raises(ValueError, match="cpu_isa"):
        ember.compile(lambda t: t + 1, backend="inductor", options={"cpu_is": "x86-64-v3"})
