"""Reductions over outer (strided) axes in the column form, chains of reductions that read each
other (a variance after its mean, softmax's max then sum over dim 0) in one tile loop, softmax
along rows computing ``exp(x - max)`` once, values read before the inner loop, and the column
tile chosen by a timing kept per machine (issue 21).

Correctness against eager on every axis of 2-D/3-D/4-D inputs of odd sizes (not multiples of
the vector width), keepdim, NaN/-0.0/±inf, integer and bool inputs and non-contiguous inputs;
each graph computes many reductions at once so that few C++ builds are needed."""

from __future__ import annotations

import ast
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.compile_fx import generate_source
from ember_inductor.decompositions import decompositions
from ember_inductor.runtime.cache import BASE_FLAGS

from inductor_util import assert_same, compile_strict

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _cpp(fn: Callable[..., Any], *args: torch.Tensor) -> str:
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    src, _ = generate_source(gm, key="test_reduce_layout")
    m = re.search(r"^CPP_SOURCES = (\[.*?^\])", src, re.S | re.M)
    assert m, "no C++ in the wrapper"
    return "\n".join(ast.literal_eval(m.group(1)))


def _special(x: torch.Tensor) -> torch.Tensor:
    """``x`` with a NaN, both infinities and a -0.0 somewhere inside (odd positions)."""
    flat = x.reshape(-1)
    n = flat.numel()
    for i, v in ((n // 3, math.nan), (n // 2, math.inf), (n // 5, -math.inf), (n // 7, -0.0)):
        flat[i] = v
    return x


def _all_axes(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    outs: list[torch.Tensor] = []
    for d in range(a.dim()):
        for keep in (False, True):
            outs += [a.sum(d, keepdim=keep), a.amax(d, keepdim=keep), a.amin(d, keepdim=keep)]
        outs += [a.mean(d), torch.var(a, d), torch.std(a, d, keepdim=True), a.prod(d),
                 torch.logsumexp(a, d), torch.softmax(a, d), torch.log_softmax(a, d),
                 torch.softmax(a, d).sum(d)]
    if a.dim() >= 3:
        outs += [a.sum((0, 2)), a.amax((0, a.dim() - 1)), torch.var_mean(a, (0, 1))[0]]
    return tuple(outs)


SHAPES = [(37, 19), (5, 23, 19), (3, 5, 7, 37)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_every_axis_float(shape: tuple[int, ...], layout: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape)
    if layout == "transposed":  # a non-contiguous input: the last two dims swapped in memory
        x = torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    fn = compile_strict(_all_axes)
    assert_same(fn(x), _all_axes(x), atol=1e-4, rtol=1e-4)
    y = _special(x.clone())
    for a, e in zip(fn(y), _all_axes(y)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4, equal_nan=True)
        assert torch.equal(a.isnan(), e.isnan())


def _int_axes(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    outs: list[torch.Tensor] = []
    for d in range(a.dim()):
        outs += [a.sum(d), a.amax(d, keepdim=True), a.amin(d), (a > 0).any(d), (a > -3).all(d),
                 (a > 0).sum(d)]
    return tuple(outs)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_every_axis_integer_and_bool(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-5, 6, (3, 17, 35), generator=g).to(dtype)
    fn = compile_strict(_int_axes)
    assert_same(fn(x), _int_axes(x))


def _assert_tile_loops_vectorized(cpp: str, tmp_path: Path) -> None:
    """Every vector loop over a tile of outputs is one gcc reports vectorized."""
    f = tmp_path / "k.cpp"
    f.write_text(cpp)
    r = subprocess.run(["g++", *BASE_FLAGS, "-fopt-info-vec-optimized", str(f), "-o",
                        str(tmp_path / "k.so")], capture_output=True, text=True, check=True)
    lines = cpp.splitlines()
    vec = {int(n) for n in re.findall(rf"{re.escape(str(f))}:(\d+):\d+: optimized: loop vectorized",
                                      r.stderr)}
    simd = [i + 1 for i, s in enumerate(lines) if s.strip() == "#pragma omp simd"
            and lines[i + 1].strip().startswith("for (int64_t x")]
    assert simd, cpp
    for ln in simd:  # the vector loop over the tile: gcc reports it at the pragma or the loop
        assert {ln, ln + 1, ln + 2} & vec, f"loop at line {ln + 1} left scalar:\n{cpp}"


def _chains(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * 1.5
    var, mean = torch.var_mean(y, 1)
    return (var, mean, torch.softmax(y, 0), y.amax(0) - torch.logsumexp(y, 0))


def test_dependent_reductions_over_an_outer_axis_run_in_one_tile_loop(tmp_path: Path) -> None:
    x = torch.randn(6, 45, 67)
    cpp = _cpp(_chains, x)
    # the max and the sum of exp(x - max) over dim 0, the sum and the sum of squares over dim 1:
    # accumulator tiles, the first result kept in a tile of values for the second
    assert cpp.count("reductions over strided values") >= 2, cpp
    assert "val0[" in cpp, cpp
    # no reduction loop runs along a strided axis innermost any more
    for m in re.finditer(r"for \(int64_t r0 = 0; r0 < (\d+); r0\+\+\) \{\n(.*?)\n", cpp):
        body = m.group(2)
        assert "#pragma omp simd" in body or "float tmp" in body or "for (" in body
    _assert_tile_loops_vectorized(cpp, tmp_path)
    fn = compile_strict(_chains)
    assert_same(fn(x), _chains(x), atol=1e-4, rtol=1e-4)


def _softmax_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.softmax(x * 2.0, -1), torch.log_softmax(x, -1)


@pytest.mark.parametrize("cols", [37, 5000])
def test_softmax_along_rows_computes_exp_once(cols: int) -> None:
    x = torch.randn(9, cols)
    cpp = _cpp(lambda a: torch.softmax(a * 2.0, -1), x)
    kernel = cpp[cpp.index('extern "C" void kernel0'):]
    assert kernel.count("e_vexpf(") == 1, kernel  # not recomputed by the normalization
    x[2, 3] = math.nan
    x[4] = -math.inf   # a row of -inf: NaN, as eager
    x[5, :3] = math.inf
    x[6, 1] = -0.0
    fn = compile_strict(_softmax_rows)
    for a, e in zip(fn(x), _softmax_rows(x)):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_softmax_rows_other_dtypes_and_debug_fill(dtype: torch.dtype) -> None:
    """bfloat16: exp(x - max) in float kept in a stack row (not the bfloat16 output); both run
    with the NaN-fill debug mode, which finds any buffer a kernel should write and does not."""
    import ember

    x = torch.randn(7, 45).to(dtype)
    fn = ember.compile(_softmax_rows, options={"debug_fill": True})
    with ember.config.patch(suppress_errors=False):
        out = fn(x)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    assert_same(out, _softmax_rows(x), **tol)
    if dtype == torch.bfloat16:
        cpp = _cpp(lambda a: torch.softmax(a, -1), x)
        assert "row_buf" in cpp, cpp


def _embed_pool(ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.embedding(ids, w)
    h = torch.nn.functional.layer_norm(h, (w.shape[1],))
    keep = (ids != 0).unsqueeze(-1).to(h.dtype)
    return (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)


def test_embedding_index_checked_before_the_vector_loop() -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (5, 11), generator=g)
    ids[1, 7:] = 0
    w = torch.randn(50, 37)
    cpp = _cpp(_embed_pool, ids, w)
    lines = cpp.splitlines()
    for i, s in enumerate(lines):
        if s.strip().startswith("#pragma omp simd"):
            depth, j = 0, i + 1
            while True:  # the loop under the pragma: no range check (scalar work) inside
                depth += lines[j].count("{") - lines[j].count("}")
                assert "e_status" not in lines[j], "\n".join(lines[i:j + 1])
                j += 1
                if depth == 0:
                    break
    fn = compile_strict(_embed_pool)
    assert_same(fn(ids, w), _embed_pool(ids, w), atol=1e-5, rtol=1e-5)
    bad = ids.clone()
    bad[2, 3] = 50
    with pytest.raises(IndexError):
        fn(bad, w)


def test_column_tile_is_timed_once_and_cached(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    from ember_inductor import calibrate

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(calibrate, "tile_override", [None])
    monkeypatch.setattr(torch, "get_num_threads", lambda: 5)  # a machine key of its own
    calls = []

    def fake() -> dict[int, float]:
        calls.append(1)
        return {64: 3.0, 128: 1.01, 256: 1.0, 512: 1.2, 1024: 2.0}

    monkeypatch.setattr(calibrate, "_measure_tiles", fake)
    calibrate._tile_calibrated.cache_clear()
    assert calibrate.column_tile() == 128  # within 2% of the fastest: the smaller tile
    calibrate._tile_calibrated.cache_clear()  # a new process: read from disk, not timed
    assert calibrate.column_tile() == 128 and len(calls) == 1
    calibrate._tile_calibrated.cache_clear()
    # the generated code uses the tile it is given
    monkeypatch.setattr(calibrate, "tile_override", [64])
    cpp = _cpp(lambda a: a.sum(0), torch.randn(33, 300))
    assert "acc0[64]" in cpp and "tiles of up to 64" in cpp, cpp


def _long_columns(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    var, mean = torch.var_mean(a, 0)
    return a.sum(0), var, mean, b.sum((0, 1)), (b * 2.0).sum(1), b.amax((0, 1))


def test_long_column_sums_in_float_chunks() -> None:
    """Column sums over at least 1024 values: float tiles per chunk added to double tiles (the
    chunk loop's bounds: lengths not multiples of the chunk, a chunk of several rows)."""
    torch.manual_seed(0)
    a = torch.randn(1500, 37) + 3.0
    b = torch.randn(5, 450, 19)
    cpp = _cpp(_long_columns, a, b)
    assert "accp0[" in cpp and "double acc0[" in cpp, cpp
    fn = compile_strict(_long_columns)
    out = fn(a, b)
    ref = _long_columns(a.double(), b.double())
    for o, e in zip(out, ref):
        torch.testing.assert_close(o, e.float(), atol=1e-4, rtol=1e-5)


def _bn_train(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.batch_norm(x, None, None, w, b, training=True).relu()


@pytest.mark.parametrize("n", [1, 3])
def test_batch_norm_statistics_channels_last(n: int) -> None:
    """Training BatchNorm on channels-last activations: the per-channel statistics are sums
    over strided values (every 37th), in the column form (with reductions over a size-1 dim
    between the sums when the batch is 1)."""
    torch.manual_seed(0)
    x = torch.randn(n, 37, 9, 7).to(memory_format=torch.channels_last)
    w, b = torch.randn(37), torch.randn(37)
    cpp = _cpp(_bn_train, x, w, b)
    assert "reductions over strided values" in cpp, cpp
    fn = compile_strict(_bn_train)
    assert_same(fn(x, w, b), _bn_train(x, w, b), atol=1e-4, rtol=1e-4)
    # a training step: the forward graph's statistics (sums in double after a size-1 batch)
    # and the backward's per-channel gradient sums
    args = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    g = torch.randn_like(x)
    (fn(*args) * g).sum().backward()
    (_bn_train(*ref) * g).sum().backward()
    for a, e in zip(args, ref):
        torch.testing.assert_close(a.grad, e.grad, atol=1e-4, rtol=1e-4)


def _size1_between(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.sum(0, keepdim=True)
    t = s.amax(0)   # a reduction over a size-1 dim, between two column sums
    return t, (x * t).sum(0)


def test_reduction_over_a_size1_dim_inside_a_column_chain() -> None:
    torch.manual_seed(0)
    x = torch.randn(403, 37)
    x[5, 3] = math.nan
    cpp = _cpp(_size1_between, x)
    assert "reductions over strided values" in cpp and "e_max(-__builtin_inff(), val0" in cpp, cpp
    fn = compile_strict(_size1_between)
    for a, e in zip(fn(x), _size1_between(x)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4, equal_nan=True)


def _masked_softmax(s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(s.masked_fill(mask, float("-inf")) * 0.5, -1)


def test_bool_mask_read_as_bytes() -> None:
    """A causal mask (bool) read in the softmax's loops: as bytes (gcc leaves any loop that
    loads a C++ bool scalar), with eager's results, rows fully masked included (NaN)."""
    t = 37
    s = torch.randn(3, t, t)
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    mask[5] = True  # a fully masked row
    cpp = _cpp(_masked_softmax, s, mask)
    kernel = cpp[cpp.index('extern "C"'):]
    assert "((const uint8_t*)" in kernel and not re.search(r"bool tmp\d+ = arg\d+\[", kernel), kernel
    fn = compile_strict(_masked_softmax)
    torch.testing.assert_close(fn(s, mask), _masked_softmax(s, mask), equal_nan=True)


def _two_norms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w) + x   # a residual, read again below
    return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * 2.0 - x


def test_row_value_read_by_a_later_loop_kept_in_a_stack_row() -> None:
    """A value of a row computed in one reduction's loop and read by later loops of the same
    row (a residual between two norms) is kept in a row on the stack, not in a buffer."""
    torch.manual_seed(0)
    x, w = torch.randn(3, 5, 77), torch.randn(77)
    cpp = _cpp(_two_norms, x, w)
    assert "row_buf" in cpp, cpp
    assert cpp.count("float* __restrict__ buf") == 1, cpp  # only the output is written
    import ember

    fn = ember.compile(_two_norms, options={"debug_fill": True})
    with ember.config.patch(suppress_errors=False):
        assert_same(fn(x, w), _two_norms(x, w), atol=1e-5, rtol=1e-5)


def _max_grad(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    # a max's gradient summed over the batch: (x == max) as a number, in a column sum
    return ((x == x.amax(-1, keepdim=True)).to(x.dtype) * g).sum(0)


def test_bool_to_number_inside_a_vector_loop(tmp_path: Path) -> None:
    """A bool converted to a number is a select: gcc vectorizes no loop that casts a C++ bool
    (this left a training step's whole backward reduction scalar)."""
    x, g = torch.randn(40, 33, 7), torch.randn(40, 33, 7)
    x[3, 4, :2] = 5.0  # a tie
    cpp = _cpp(_max_grad, x, g)
    assert not re.search(r"= \(float\)tmp\d+;", cpp) or "? (float)1 : (float)0" in cpp, cpp
    _assert_tile_loops_vectorized(cpp, tmp_path)
    fn = compile_strict(_max_grad)
    assert_same(fn(x, g), _max_grad(x, g), atol=1e-5, rtol=1e-5)


def test_gathered_row_index_read_before_the_innermost_reduction_loop() -> None:
    """A pointwise value stored inside a reduction block's two loops (an embedding gathered row
    by row, its rows also summed): the row's index and its range check move with the outer
    reduction loop only, so they are read before the innermost one — inside it, the check's
    status store kept the loop scalar (embed_classifier's training forward: 1.4x eager's time)."""
    import re

    from torch.fx.experimental.proxy_tensor import make_fx

    from ember_inductor.compile_fx import generate_source, load_wrapper
    from ember_inductor.decompositions import decompositions

    def f(ids: torch.Tensor, w: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.nn.functional.embedding(ids, w) + p
        return h, (ids != 0).sum(1), h.sum(1)

    ids = torch.randint(0, 50, (4, 8))
    w, p = torch.randn(50, 32), torch.randn(8, 32)
    gm = make_fx(f, decomposition_table=decompositions())(ids, w, p)
    src, _ = generate_source(gm, key="gather-rows")
    loops = re.findall(r"for \(int64_t r1 = 0;.*?\n(.*?)\n\s*\}", src, flags=re.S)
    assert loops and any("buf" in loop for loop in loops), src
    for loop in loops:
        assert "__atomic_store_n" not in loop and "arg0[" not in loop, loop
    out = load_wrapper(src, gm, "gather-rows")(ids, w, p)
    for a, b in zip(out, f(ids, w, p)):
        torch.testing.assert_close(a, b)
