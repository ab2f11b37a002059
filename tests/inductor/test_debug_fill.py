"""The NaN-fill debug mode (option ``debug_fill``, ``EMBER_DEBUG_FILL=1``; runtime/debug_fill.py):
buffers filled with a pattern before kernels write them, kernel writes, outputs and input
strides checked; correct graphs pass, a kernel that skips its writes is named."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember_inductor import compile_fx
from ember_inductor.runtime import debug_fill
from ember_inductor.runtime.debug_fill import UnwrittenMemory


def _train_step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> Any:
    h = F.gelu(x @ w + b)
    h = F.layer_norm(h, (h.shape[-1],), g)
    return (h.softmax(-1) * h).sum(), h[:, :3]


def _args() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(6, 8, generator=gen), torch.randn(8, 8, generator=gen, requires_grad=True),
            torch.randn(8, generator=gen, requires_grad=True),
            torch.randn(8, generator=gen, requires_grad=True)]


@pytest.fixture
def fresh_cache(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    ember.reset()


def test_correct_training_graphs_pass(fresh_cache: None) -> None:
    args = _args()
    loss, sl = _train_step(*args)
    expected = torch.autograd.grad(loss + sl.sum(), args[1:])
    fn = ember.compile(_train_step, backend="inductor", options={"debug_fill": True})
    with ember.config.patch(suppress_errors=False):
        loss2, sl2 = fn(*args)
        got = torch.autograd.grad(loss2 + sl2.sum(), args[1:])
    torch.testing.assert_close(loss2, loss)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_wrapper_fills_and_checks() -> None:
    x = torch.randn(6, 8)
    gm = make_fx(lambda x: (torch.sin(x) + 1).sum(0) * torch.cos(x))(x)
    src, _ = compile_fx.generate_source(gm, "k" * 16, {"debug_fill": True})
    assert "_empty = _dbg.empty" in src and "_dbg.check(" in src and "_dbg.check_outputs(" in src
    plain, _ = compile_fx.generate_source(gm, "k" * 16, {})
    assert "_dbg" not in plain


def test_a_kernel_that_skips_its_writes_is_named(fresh_cache: None, monkeypatch: Any) -> None:
    load = compile_fx.load_wrapper

    def broken(src: str, gm: Any, key: str) -> Any:
        call = load(src, gm, key)
        call.__globals__["kernel0"] = lambda *a: None  # writes nothing
        return call
    monkeypatch.setattr(compile_fx, "load_wrapper", broken)
    x = torch.randn(6, 8)
    gm = make_fx(lambda x: (torch.sin(x) * 2, x + 1))(x)
    fn = compile_fx.compile_inductor(gm, [x], debug_fill=True)
    with pytest.raises(UnwrittenMemory, match=r"buffer buf\d+ .*after kernel0"):
        fn(x)
    ok = compile_fx.compile_inductor(gm, [x], debug_fill=False)  # unchecked: no error, garbage
    ok(x)


def test_outputs_that_hold_the_pattern_are_named() -> None:
    t = debug_fill.fill(torch.empty(3, 4))
    t[0] = 1.0
    with pytest.raises(UnwrittenMemory, match=r"graph g1: buffer buf7 \(output 1\).* 8 of 12"):
        debug_fill.check_outputs("g1", [torch.ones(2), t], [("buf1", "k"), ("buf7", "kernel3")])
    for dtype in debug_fill.PATTERNS:
        filled = debug_fill.fill(torch.empty(5, dtype=dtype))
        if dtype in debug_fill.UNCHECKED:  # 0xE5 is a uint8/int8 value: filled, not checked
            assert (filled.view(torch.uint8) == 0xE5).all()
            debug_fill.check("g", "k", "b", filled)
            continue
        with pytest.raises(UnwrittenMemory):
            debug_fill.check("g", "k", "b", filled)
        debug_fill.check("g", "k", "b", torch.zeros(5, dtype=dtype))


def test_inputs_in_another_layout_are_refused(fresh_cache: None) -> None:
    # a graph compiled for a strided slice (a saved activation) called with a dense copy: its
    # kernels would read past the end (the Funnel Transformer bug, issue 19)
    base = torch.randn(8, 16)
    gm = make_fx(lambda s: s * 2)(base[:, :8])
    fn = compile_fx.compile_inductor(gm, [base[:, :8]], debug_fill=True)
    torch.testing.assert_close(fn(base[:, :8])[0], base[:, :8] * 2)
    with pytest.raises(UnwrittenMemory, match=r"input arg0 .*strides \[8, 1\].*\[16, 1\]"):
        fn(base[:, :8].contiguous())


def test_environment_variable(py: Any) -> None:
    r = py("import ember; print(ember.config.debug_fill)", env={"EMBER_DEBUG_FILL": "1"})
    assert r.stdout.strip() == "True", r.stderr


def test_empty_and_sparse_tensors_are_not_flagged() -> None:
    # the strides of a tensor without elements mean nothing (OpInfo's svd#0); sparse tensors
    # have no strided storage to fill or check (to_sparse#0)
    debug_fill.check_strides("g", "arg0", torch.empty(0, 0), [0, 0], [1, 1])
    sparse = torch.eye(3).to_sparse()
    debug_fill.check_strides("g", "arg0", sparse, [3, 3], [3, 1])
    debug_fill.check_outputs("g", [sparse], [("buf0", "kernel0")])
