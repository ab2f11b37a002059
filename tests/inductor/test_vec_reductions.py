"""Vectorization of reduction kernels (LayerNorm backward and friends): loads that do not move
along a reduction's inner loop are read once before it (inside an OpenMP-outlined loop gcc cannot
move them itself and then leaves the whole loop scalar), and sums over rows whose values are
strided (weight/bias gradients) run as tiles of column accumulators shared by every thread.

The checks build the generated C++ with the product's flags plus ``-fopt-info-vec`` and read
gcc's own report of which loops it vectorized: they fail if a change makes gcc give up again."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.compile_fx import generate_source, load_wrapper
from ember_inductor.decompositions import decompositions
from ember_inductor.runtime.cache import BASE_FLAGS

aten = torch.ops.aten

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _gen(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[Any, str]:
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    src, _ = generate_source(gm, key="test_vec")
    return gm, src


def _cpp(src: str) -> list[str]:
    m = re.search(r"^CPP_SOURCES = (\[.*?^\])", src, re.S | re.M)
    assert m, "no C++ in the wrapper"
    return ast.literal_eval(m.group(1))


def _vector_report(cpp: str, tmp_path: Path) -> tuple[list[str], set[int]]:
    """(source lines, numbers of the lines holding a loop gcc vectorized)."""
    f = tmp_path / "k.cpp"
    f.write_text(cpp)
    r = subprocess.run(["g++", *BASE_FLAGS, "-fopt-info-vec-optimized", str(f), "-o",
                        str(tmp_path / "k.so")], capture_output=True, text=True, check=True)
    done = {int(m.group(1)) for m in re.finditer(rf"{re.escape(str(f))}:(\d+):\d+: optimized: "
                                                 r"loop vectorized", r.stderr)}
    return cpp.splitlines(), done


def _inner_reduction_loops(lines: list[str]) -> list[int]:
    """Line numbers (1-based) of the innermost loops over the reduction variable r0 (not the
    outer r0 loop of a column reduction, whose inner loop runs over outputs, after the values
    read once per row)."""
    return [i + 1 for i, s in enumerate(lines) if s.strip().startswith("for (int64_t r0 = 0;")
            and not any(t.strip().startswith("for (int64_t x")
                        for t in _loop_body(lines, i + 1)[1:])]


def _vectorized(lines: list[str], ln: int, reported: set[int]) -> bool:
    """gcc reports the loop starting at line ``ln`` as vectorized: at the ``for``, at its "omp
    simd" pragma, or (a loop under the pragma) at its first statement."""
    at = {ln}
    if lines[ln - 2].strip().startswith("#pragma omp simd"):
        at |= {ln - 1, ln + 1}
    return bool(at & reported)


def _loop_body(lines: list[str], start: int) -> list[str]:
    depth = 0
    body = []
    for s in lines[start - 1:]:
        depth += s.count("{") - s.count("}")
        body.append(s)
        if depth == 0 and len(body) > 1:
            break
    return body


def _ln_backward(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                 w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return aten.native_layer_norm_backward(g, x, [x.shape[-1]], mean, rstd, w, b,
                                           [True, True, True])


def _ln_inputs(rows: int, cols: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    x = torch.randn(rows, cols)
    w, b = torch.randn(cols), torch.randn(cols)
    _, mean, rstd = aten.native_layer_norm(x, [cols], w, b, 1e-5)
    return torch.randn(rows, cols), x, mean, rstd, w, b


@pytest.mark.parametrize("rows,cols", [(512, 256), (96, 300)])
def test_layer_norm_backward_loops_vectorized(rows: int, cols: int, tmp_path: Path) -> None:
    inputs = _ln_inputs(rows, cols)
    gm, src = _gen(_ln_backward, *inputs)
    (cpp,) = _cpp(src)
    lines, vectorized = _vector_report(cpp, tmp_path)
    loops = _inner_reduction_loops(lines)
    assert loops, cpp
    # the per-row values (mean, rstd) are read before the loops over the row, never inside
    mean_arg, rstd_arg = "arg2", "arg3"  # kernel parameters are named by graph input
    for ln in loops:
        body = "\n".join(_loop_body(lines, ln))
        assert f"{mean_arg}[" not in body and f"{rstd_arg}[" not in body, body
        assert _vectorized(lines, ln, vectorized), f"gcc left the loop at line {ln} scalar:\n" + body
    # the weight and bias gradients: column accumulators over a vectorized loop
    assert "accumulator tiles" in cpp
    simd_cols = [i + 2 for i, s in enumerate(lines) if s.strip() == "#pragma omp simd"]
    assert simd_cols and all(_vectorized(lines, ln, vectorized) for ln in simd_cols), cpp
    out = load_wrapper(src, gm, "test_vec")(*inputs)
    for a, e in zip(out, _ln_backward(*inputs)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


def test_layer_norm_backward_nan_inf_as_eager() -> None:
    g, x, mean, rstd, w, b = _ln_inputs(64, 40)
    g[3, 5] = float("nan")
    inputs = (g, x, mean, rstd, w, b)
    gm, src = _gen(_ln_backward, *inputs)
    out = load_wrapper(src, gm, "test_vec")(*inputs)
    for a, e in zip(out, _ln_backward(*inputs)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4, equal_nan=True)
        assert torch.equal(a.isnan(), e.isnan())
    # infinities: the decomposition (torch's, as torch.compile uses it) is not ATen's kernel
    # there (inf - inf in its sums); the generated code computes exactly that program
    x = x.clone()
    x[7, 1] = float("inf")
    rstd = rstd.clone()
    rstd[9] = float("inf")
    inputs = (g, x, mean, rstd, w, b)
    gm, src = _gen(_ln_backward, *inputs)
    out = load_wrapper(src, gm, "test_vec")(*inputs)
    for a, e in zip(out, gm(*inputs)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4, equal_nan=True)
        assert torch.equal(a.isnan(), e.isnan()) and torch.equal(a.isinf(), e.isinf())


def _bias_grad(g: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor]:
    # a sum over rows of values scaled by a per-row value: strided along the reduction, with one
    # load (s) contiguous in it that does not move along the outputs
    return ((g * s[:, None]).sum(0),)


@pytest.mark.parametrize("cols", [256, 37, 700])
def test_column_sum_with_row_values(cols: int, tmp_path: Path) -> None:
    torch.manual_seed(0)
    inputs = (torch.randn(300, cols), torch.randn(300))
    gm, src = _gen(_bias_grad, *inputs)
    (cpp,) = _cpp(src)
    assert "accumulator tiles" in cpp, cpp
    if 300 * cols >= 32768:  # parallel: tiles sized at run time so that every thread gets work
        assert "omp_get_max_threads()" in cpp and "xt += e_tile" in cpp, cpp
    lines, vectorized = _vector_report(cpp, tmp_path)
    simd = [i + 2 for i, s in enumerate(lines) if s.strip() == "#pragma omp simd"]
    assert simd and all(_vectorized(lines, ln, vectorized) for ln in simd), cpp
    out = load_wrapper(src, gm, "test_vec")(*inputs)
    torch.testing.assert_close(out[0], _bias_grad(*inputs)[0], atol=1e-4, rtol=1e-4)


def test_masked_load_not_hoisted() -> None:
    # a padded row: the load of the padding's source sits under a mask and must stay there
    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        p = torch.nn.functional.pad(x, (0, 0, 1, 1))  # rows -1 and n are zeros
        return ((p[:, :, None] * y).sum(-1),)

    torch.manual_seed(0)
    inputs = (torch.randn(5, 3), torch.randn(7, 3, 64))
    gm, src = _gen(fn, *inputs)
    out = load_wrapper(src, gm, "test_vec")(*inputs)
    torch.testing.assert_close(out[0], fn(*inputs)[0], atol=1e-5, rtol=1e-5)


def _three_column_sums(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # a linear's bias gradient next to a LayerNorm's weight and bias gradients: separate loop
    # blocks of one group, independent sums over the same rows
    return (a.sum(0), (b * s[:, None]).sum(0), b.sum(0))


def test_independent_column_sums_share_the_row_loop(tmp_path: Path) -> None:
    torch.manual_seed(0)
    inputs = (torch.randn(300, 256), torch.randn(300, 256), torch.randn(300))
    gm, src = _gen(_three_column_sums, *inputs)
    (cpp,) = _cpp(src)
    assert cpp.count("accumulator tiles") == 1 and "acc2[" in cpp, cpp
    assert "reduction(+:" not in cpp, cpp  # no strided per-column loop left
    lines, vectorized = _vector_report(cpp, tmp_path)
    simd = [i + 2 for i, s in enumerate(lines) if s.strip() == "#pragma omp simd"]
    assert len(simd) == 1 and _vectorized(lines, simd[0], vectorized), cpp
    out = load_wrapper(src, gm, "test_vec")(*inputs)
    for a, e in zip(out, _three_column_sums(*inputs)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


def test_dependent_reductions_stay_in_order() -> None:
    # a sum that reads another sum of the same group (a mean, then the centered squares): the
    # column form would run them side by side, so it must not be used for them together
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        m = x.mean(0, keepdim=True)
        return (((x - m) ** 2).sum(0), m)

    torch.manual_seed(0)
    inputs = (torch.randn(200, 96) * 3 + 1,)
    gm, src = _gen(fn, *inputs)
    out = load_wrapper(src, gm, "test_vec")(*inputs)
    for a, e in zip(out, fn(*inputs)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


def _column_sums_of_two_ranges(a: torch.Tensor, g: torch.Tensor,
                               s: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # bert's pooler: the bias gradient of a linear on the first token ([4, 256] summed over 4)
    # next to the last LayerNorm's weight/bias gradients (summed over 4 x 128)
    return (a.sum(0), (g * s[..., None]).sum((0, 1)), g.sum((0, 1)))


def test_column_sums_over_different_ranges_each_vectorized(tmp_path: Path) -> None:
    torch.manual_seed(0)
    inputs = (torch.randn(4, 256), torch.randn(4, 128, 256), torch.randn(4, 128))
    gm, src = _gen(_column_sums_of_two_ranges, *inputs)
    (cpp,) = _cpp(src)
    assert cpp.count("accumulator tiles") == 2, cpp
    assert "reduction(+:" not in cpp, cpp
    lines, vectorized = _vector_report(cpp, tmp_path)
    simd = [i + 2 for i, s in enumerate(lines) if s.strip() == "#pragma omp simd"]
    assert len(simd) == 2 and all(_vectorized(lines, ln, vectorized) for ln in simd), cpp
    out = load_wrapper(src, gm, "test_vec")(*inputs)
    for a, e in zip(out, _column_sums_of_two_ranges(*inputs)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
