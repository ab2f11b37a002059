"""The vectorizable float32 math of the generated C++ (codegen/vecmath.py: exp, erf, log, log2,
log10 inlined into the loops; tanh and the rest through libmvec): error in ulp against a float64
reference and against eager over a dense sweep of the whole float32 range, special values (NaN,
+-inf, +-0, overflow, underflow, subnormals) as libm gives them, and gcc's own report that a GELU
backward loop, which calls erf and exp, is vectorized with the calls inlined."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.codegen import vecmath
from ember_inductor.compile_fx import generate_source, load_wrapper
from ember_inductor.decompositions import decompositions
from ember_inductor.runtime.cache import BASE_FLAGS

aten = torch.ops.aten

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

NAN, INF = float("nan"), float("inf")
SUBNORMAL_MIN = 2.0 ** -149


def _compiled(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[Callable[..., Any], str]:
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    src, _ = generate_source(gm, key="test_vec_math")
    return load_wrapper(src, gm, "test_vec_math"), src


def _sweep() -> torch.Tensor:
    """About a million float32 values spread over every bit pattern (both signs, subnormals,
    NaN payloads), plus the values where the functions change behaviour."""
    bits = torch.arange(0, 2 ** 32, 4099, dtype=torch.int64)
    bits = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32)
    special = torch.tensor([0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 1e-45, -1e-45, 1.17549435e-38,
                            88.72283, 88.72284, 89.0, -87.33655, -103.27893, -103.972, -104.0,
                            0.99999994, 1.0000001, 3.921875, -3.921875, 3.9, 1.0, -1.0, 0.5])
    return torch.cat([bits.view(torch.float32), special])


def _ulps(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|got - ref| in units of the last place of ``ref`` rounded to float32 (the subnormal
    spacing below the normal range); 0 where both are the same non-finite value, inf where only
    one of them is."""
    ref_f = ref.float()
    _, e = torch.frexp(ref_f.abs())
    ulp = torch.clamp(torch.ldexp(torch.ones_like(ref), (e - 24).to(torch.float64)), min=SUBNORMAL_MIN)
    err = (got.double() - ref).abs() / ulp
    finite = torch.isfinite(ref_f)
    same_nonfinite = (torch.isnan(got) & torch.isnan(ref_f)) | (got == ref_f)
    err = torch.where(finite & torch.isfinite(got), err, torch.where(same_nonfinite, 0.0, INF))
    return err


# (function, max ulp against float64, max ulp against eager float32)
CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], float, float]] = {
    "exp": (torch.exp, 1.0, 2.0),
    "erf": (torch.erf, 1.3, 2.0),       # 1.05 with fma, 1.28 on a target without
    "log": (torch.log, 1.0, 2.0),
    "log2": (torch.log2, 1.0, 1.5),    # 0.83 measured
    "log10": (torch.log10, 1.0, 1.5),   # 0.80 measured
    "tanh": (torch.tanh, 2.0, 3.0),     # libmvec's tanhf (1.4 ulp) or libm's
    # 1 / (1 + exp(-x)), as eager computes it: 0 below x = -88.7 where exp(-x) overflows (eager
    # too), so against float64 only where the result is a normal float
    "sigmoid": (torch.sigmoid, 2.5, 3.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ulp_error_over_the_float_range(name: str) -> None:
    fn, max_true, max_eager = CASES[name]
    x = _sweep()
    compiled, src = _compiled(lambda t: (fn(t),), x)
    if name in vecmath.FLOAT_FUNCS:
        assert f"{vecmath.FLOAT_FUNCS[name]}(" in src
    got = compiled(x)[0]
    ref = fn(x.double())
    err = _ulps(got, ref)
    if name == "sigmoid":
        err = torch.where(ref.abs() >= 2.0 ** -126, err, 0.0)
    worst = int(err.argmax())
    assert err.max() <= max_true, (f"{name}({x[worst].item()!r}) = {got[worst].item()!r}, "
                                   f"float64 gives {ref[worst].item()!r}: "
                                   f"{err.max().item():.3f} ulp")
    eager = fn(x)
    err_e = _ulps(got, eager.double())
    worst = int(err_e.argmax())
    assert err_e.max() <= max_eager, (f"{name}({x[worst].item()!r}) = {got[worst].item()!r}, "
                                      f"eager {eager[worst].item()!r}")
    # NaN exactly where eager has NaN, infinities exactly where eager has them
    assert torch.equal(got.isnan(), eager.isnan())
    assert torch.equal(got[eager.isinf()], eager[eager.isinf()])


def _bits(t: torch.Tensor) -> list[int]:
    return t.contiguous().view(torch.int32).tolist()


@pytest.mark.parametrize("name,inputs,expected", [
    ("exp", [NAN, INF, -INF, 0.0, -0.0, 88.72284, 89.0, 1e30, -103.973, -104.0, -1e30],
     [NAN, INF, 0.0, 1.0, 1.0, INF, INF, INF, 0.0, 0.0, 0.0]),
    ("erf", [NAN, INF, -INF, 0.0, -0.0, 4.0, -4.0, 10.0, -1e30],
     [NAN, 1.0, -1.0, 0.0, -0.0, 1.0, -1.0, 1.0, -1.0]),
    ("log", [NAN, INF, -INF, 0.0, -0.0, -1.0, -1e-45, 1.0],
     [NAN, INF, NAN, -INF, -INF, NAN, NAN, 0.0]),
    ("log2", [NAN, INF, -INF, 0.0, -0.0, -1.0, -1e-45, 1.0, 8.0, 2.0 ** -149],
     [NAN, INF, NAN, -INF, -INF, NAN, NAN, 0.0, 3.0, -149.0]),
    ("log10", [NAN, INF, -INF, 0.0, -0.0, -1.0, 1.0, 1000.0],
     [NAN, INF, NAN, -INF, -INF, NAN, 0.0, 3.0]),
])
def test_special_values_exact(name: str, inputs: list[float], expected: list[float]) -> None:
    fn = CASES[name][0]
    # padded to more than one vector so that the special values go through the vector loop
    x = torch.tensor(inputs * 8, dtype=torch.float32)
    got = _compiled(lambda t: (fn(t),), x)[0](x)[0]
    exp_t = torch.tensor(expected * 8, dtype=torch.float32)
    nan = exp_t.isnan()
    assert torch.equal(got.isnan(), nan), (inputs, got[: len(inputs)].tolist())
    # bit for bit elsewhere: the sign of a zero counts
    assert _bits(got[~nan]) == _bits(exp_t[~nan]), (inputs, got[: len(inputs)].tolist())
    assert _bits(fn(x)[~nan]) == _bits(exp_t[~nan])  # eager agrees


def test_subnormal_inputs_and_results() -> None:
    # exp into the subnormal range, erf and log of subnormal inputs: within an ulp of float64
    x = torch.cat([torch.linspace(-103.9, -87.0, 4001),
                   torch.tensor([1e-45, 3e-45, 1e-40, 1e-39, 1.1e-38, -1e-40])])
    for fn in (torch.exp, torch.erf):
        got = _compiled(lambda t: (fn(t),), x)[0](x)[0]  # noqa: B023 (traced right away)
        assert _ulps(got, fn(x.double())).max() <= 1.0, fn
    pos = torch.tensor([1e-45, 3e-45, 1e-42, 1e-40, 1e-39, 1.1e-38, 1.17549435e-38] * 4)
    got = _compiled(lambda t: (torch.log(t),), pos)[0](pos)[0]
    assert _ulps(got, torch.log(pos.double())).max() <= 1.0


def test_half_precision_uses_the_float_functions() -> None:
    # bfloat16 and float16 compute in float: the same functions, rounded once when stored
    x = torch.linspace(-6, 6, 1001)
    for dt in (torch.bfloat16, torch.float16):
        xd = x.to(dt)
        got = _compiled(lambda t: (torch.exp(t) * torch.erf(t),), xd)[0](xd)[0]
        ref = (torch.exp(xd.float()) * torch.erf(xd.float())).to(dt)
        torch.testing.assert_close(got, ref, atol=0, rtol=1e-2 if dt == torch.bfloat16 else 1e-3)


def _gelu_backward(g: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
    return (aten.gelu_backward(g, x),)


def test_gelu_backward_loop_vectorized_with_inline_math(tmp_path: Path) -> None:
    torch.manual_seed(0)
    g, x = torch.randn(64, 1024), torch.randn(64, 1024) * 3
    gm = make_fx(_gelu_backward, decomposition_table=decompositions())(g, x)
    src, _ = generate_source(gm, key="test_vec_math")
    m = re.search(r"^CPP_SOURCES = (\[.*?^\])", src, re.S | re.M)
    assert m
    (cpp,) = eval(m.group(1))  # a list of string literals written by the generator
    body = cpp[cpp.index('extern "C" void kernel0'):]
    # the math is the inline functions, not libm (whose vector variants need libmvec)
    assert "e_verff(" in body and "e_vexpf(" in body, body
    assert not re.search(r"\b(erff|expf)\(", body), body
    f = tmp_path / "k.cpp"
    f.write_text(cpp)
    r = subprocess.run(["g++", *BASE_FLAGS, "-fopt-info-vec-optimized", str(f), "-o",
                        str(tmp_path / "k.so")], capture_output=True, text=True, check=True)
    # the innermost loop of the kernel: the last one opened
    loop = max(i + 1 for i, s in enumerate(cpp.splitlines()) if s.strip().startswith("for ("))
    # gcc names the loop's line or, for a loop OpenMP outlined, its first statement's
    assert re.search(rf"k\.cpp:({loop}|{loop + 1}):\d+: optimized: loop vectorized", r.stderr), \
        r.stderr[-2000:]
    out = load_wrapper(src, gm, "test_vec_math")(g, x)[0]
    torch.testing.assert_close(out, aten.gelu_backward(g, x), atol=1e-5, rtol=1e-5)
