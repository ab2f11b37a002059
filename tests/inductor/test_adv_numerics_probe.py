"""Wrong results found by adversarial numeric probes (fused chains and edge values the OpInfo
samples do not reach), one test per cause, on both code generators (the Triton target under
Triton's interpreter here). Each asserts eager's answer and failed before its fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from inductor_util import compile_strict

CODEGENS = ["cpp", "triton"]


def _equal(got: Any, want: Any, close: bool = False) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
        if close and w.is_floating_point():
            torch.testing.assert_close(g, w, equal_nan=True)  # bfloat16's default tolerances
            continue
        assert torch.equal(g.isnan(), w.isnan()) if w.is_floating_point() else True
        keep = ~w.isnan() if w.is_floating_point() else torch.ones_like(w, dtype=torch.bool)
        assert torch.equal(g[keep], w[keep]), (g, w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("codegen", CODEGENS)
def test_python_scalars_are_rounded_to_16_bit_as_eager_rounds_them(codegen: str,
                                                                    dtype: torch.dtype) -> None:
    # Eager converts a Python number to the tensor's dtype before add, sub, the comparisons,
    # fmod, remainder and pow (mul and div read it unconverted). The kernels compute 16-bit
    # values in float32, where the constant kept all its bits: half(0.1) - 0.1 was -2.4e-5
    # (eager: 0), half(0.1) == 0.1 false (eager: true), fmod(half(pi), pi) was pi (eager: 0),
    # 1.0001 ** x not 1.
    def f(x: torch.Tensor) -> Any:
        return (x - 0.1, 0.1 - x, x + 0.1, torch.add(x, x, alpha=0.1), x == 0.1, x != 0.1,
                x < 0.1, x >= 3.14159265, torch.fmod(x, 3.14159265), torch.remainder(x, 0.1),
                x * 1.0001, x / 3.14159265, x == 1001, x.abs() ** 3.14159265, 1.0001 ** x)

    x = torch.tensor([0.1, 3.14159265, -0.1, 1.0, 1000.0, 1001.0, 65.0, 0.3], dtype=dtype)
    # Triton's interpreter converts float32 to bfloat16 by truncation (a GPU rounds): values
    # within bfloat16's tolerance there (an unrounded 0.1 still misses: 1e-4 from 0)
    _equal(compile_strict(f, {"cpu_codegen": codegen})(x), f(x),
           close=codegen == "triton" and dtype == torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("codegen", CODEGENS)
def test_16_bit_constants_from_python_numbers_are_values_of_their_dtype(codegen: str,
                                                                        dtype: torch.dtype) -> None:
    # a float16 full_like/where/masked_fill/clamp/pad of 0.1 holds half(0.1) in eager; the
    # kernels kept 0.1 in float32, so a fused ``- 0.1`` or ``== 0.1`` of the same number (itself
    # converted) missed by 2.4e-5, or compared false
    import torch.nn.functional as F

    def f(x: torch.Tensor) -> Any:
        return (torch.full_like(x, 0.1) - 0.1, torch.where(x > 0.5, x, 0.1) == 0.1,
                x.masked_fill(x < 0, 0.1) - 0.1, x.clamp(max=0.1) - 0.1, x.clamp(min=0.1) == 0.1,
                F.pad(x, (1, 2), value=0.1) - 0.1, F.hardtanh(x, -0.1, 0.1) - 0.1,
                x.new_full((3,), 0.1) == 0.1)

    x = torch.tensor([0.1, -0.5, 0.3, 2.0, -0.1, 0.2, 1.0, 0.1], dtype=dtype)
    _equal(compile_strict(f, {"cpu_codegen": codegen})(x), f(x),
           close=codegen == "triton" and dtype == torch.bfloat16)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_mean_of_float16_divides_before_rounding(codegen: str) -> None:
    # the float32 sum was rounded to float16 before the division: 24 values of 3000 have a sum
    # above 65504 and their mean was inf (eager: 3000)
    def f(x: torch.Tensor) -> Any:
        return (x.mean(), x.mean(0), x.view(4, 6).mean(1, keepdim=True), x.view(4, 6).mean(0))

    x = torch.full((24,), 3000.0, dtype=torch.float16)
    x[::5] = 2000.0
    got, want = compile_strict(f, {"cpu_codegen": codegen})(x), f(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("codegen", CODEGENS)
def test_emulate_precision_casts_rounds_each_16_bit_result(codegen: str, dtype: torch.dtype
                                                           ) -> None:
    # by default a fused float16/bfloat16 chain keeps float32 intermediates (torch.compile's
    # choice too): ones(half) * 0.1 == 0.1 is false there, true in eager, which stores
    # half(1 * 0.1). Option emulate_precision_casts rounds each op's result as eager stores it.
    if codegen == "triton" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter converts float32 to bfloat16 by truncation")

    def f(x: torch.Tensor) -> Any:
        return (torch.ones(3, dtype=x.dtype) * 0.1 == 0.1, torch.arange(4, dtype=x.dtype) * 0.1 - 0.1,
                (x * 3 - 0.1).float() * 0.1, ((x - 0.3) * 0.7 + 0.1) == 0.1,
                (x * 1000 + 3000).var())

    x = torch.tensor([0.1, -0.5, 0.3, 2.0, -0.1, 0.2, 1.0, 0.1], dtype=dtype)
    opts = {"cpu_codegen": codegen, "emulate_precision_casts": True}
    _equal(compile_strict(f, opts)(x), f(x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("codegen", CODEGENS)
def test_a_fused_16_bit_result_converted_to_another_dtype_is_rounded_first(
        codegen: str, dtype: torch.dtype) -> None:
    # a fused float16/bfloat16 op's result is held unrounded in float32; converted to another
    # dtype it was converted unrounded: (i - x).to(int32) truncated 6.99 where eager's float16
    # result is 7, (x * 1e-8).bool() was true where eager's float16 product is 0, (x / 3).double()
    # had float32's digits
    if codegen == "triton" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter converts float32 to bfloat16 by truncation")

    def f(x: torch.Tensor, i: torch.Tensor) -> Any:
        return ((i - x).to(torch.int32), (x * 1e-4 * 1e-4).bool(), (x / 3).double(),
                (x * 1.37).to(torch.bfloat16 if x.dtype == torch.float16 else torch.float16),
                (x * 1.01).to(torch.uint8))

    x = torch.tensor([3.0, 7.0, 100.0, 250.0, 0.1, 1e-3] * 3, dtype=dtype)
    i = torch.arange(18) * 7
    # (the interpreter's float16 -> bfloat16 truncates: floats within tolerance there)
    _equal(compile_strict(f, {"cpu_codegen": codegen})(x, i), f(x, i), close=codegen == "triton")


@pytest.mark.parametrize("codegen", CODEGENS)
def test_index_add_refuses_a_negative_index_as_eager(codegen: str) -> None:
    # torch's index_add decomposition is an index_put, which counts -1 from the end: the compiled
    # index_add added into the last row where eager raises IndexError
    def f(a: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return a.index_add(0, i, s, alpha=2) + 1

    a, s = torch.randn(5, 3), torch.randn(3, 3)
    cf = compile_strict(f, {"cpu_codegen": codegen})
    good = torch.tensor([1, 1, 4])
    torch.testing.assert_close(cf(a, good, s), f(a, good, s))
    bad = torch.tensor([1, -1, 4])
    with pytest.raises(IndexError):
        f(a, bad, s)
    with pytest.raises(IndexError):
        cf(a, bad, s)


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("case", ["mask_minus_scalar", "scalar_minus_mask", "float_minus_mask",
                                  "argmax_of_mask", "argmin_of_mask"])
def test_ops_eager_refuses_on_bool_raise_eagers_error(codegen: str, case: str) -> None:
    # the lowerings computed a value where ATen's kernel refuses a bool operand: subtraction
    # ("Subtraction, the `-` operator, with a bool tensor is not supported") and argmax/argmin
    # ("does not support bool input"); the compiled program now calls ATen there and raises
    fns = {"mask_minus_scalar": lambda x: ((x > 0) - 1.5) * 2,
           "scalar_minus_mask": lambda x: (1.5 - (x > 0)) * 2,
           "float_minus_mask": lambda x: (x - (x > 0)) * 2,
           "argmax_of_mask": lambda x: torch.argmax(x > 0, dim=0) + 1,
           "argmin_of_mask": lambda x: torch.argmin(x > 0, dim=0) + 1}
    f = fns[case]
    x = torch.randn(6)
    with pytest.raises(RuntimeError) as want:
        f(x)
    with pytest.raises(RuntimeError) as got:
        compile_strict(f, {"cpu_codegen": codegen})(x)
    assert str(got.value).split(".")[0] == str(want.value).split(".")[0]
    # a max over bool (values and indices) stays compiled: ATen accepts it
    g = lambda x: torch.max(x > 0, dim=0).indices + 1  # noqa: E731
    assert torch.equal(compile_strict(g, {"cpu_codegen": codegen})(x), g(x))
