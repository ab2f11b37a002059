"""Hand-written attention (``softmax(q @ k^T * s) @ v``) becomes ATen's fused attention kernel
in the wrapper (ember_inductor/patterns.py), where nothing else reads the intermediates; the
results match eager."""

from __future__ import annotations

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.compile_fx import generate_source, load_wrapper
from ember_inductor.decompositions import decompositions
from ember_inductor.patterns import FLASH, flash_meta, fuse_attention

from inductor_util import assert_same, compile_strict

B, T, H, D = 2, 16, 4, 8


def _attention(x: torch.Tensor, w: torch.Tensor, scale_by: str = "mul") -> torch.Tensor:
    """The DemoModel's block: qkv projection, heads split, attention, heads merged."""
    b, t, d = x.shape
    q, k, v = (x @ w.t()).split(d, dim=-1)
    q, k, v = (z.view(b, t, H, d // H).transpose(1, 2) for z in (q, k, v))
    s = q @ k.transpose(-2, -1)
    s = s * (1.0 / math.sqrt(d // H)) if scale_by == "mul" else s / math.sqrt(d // H)
    y = torch.softmax(s, dim=-1) @ v
    return y.transpose(1, 2).reshape(b, t, d)


def _inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    d = H * D
    return (torch.randn(B, T, d, generator=g, dtype=dtype),
            torch.randn(3 * d, d, generator=g, dtype=dtype) / math.sqrt(d))


def _source(fn, *args) -> str:
    # fake tracing: make_fx's real mode records storage offset 0 for every split piece
    gm = make_fx(fn, decomposition_table=decompositions(), tracing_mode="fake")(*args)
    src, _ = generate_source(gm, key="attention-test")
    return src, gm


@pytest.mark.parametrize("scale_by", ["mul", "div"])
def test_fused_in_wrapper_and_correct(scale_by: str) -> None:
    x, w = _inputs()
    fn = lambda x, w: (_attention(x, w, scale_by),)  # noqa: E731
    src, gm = _source(fn, x, w)
    body = src.split("\ndef call(", 1)[1]
    assert "_scaled_dot_product_flash_attention_for_cpu.default(" in body
    assert "aten.bmm" not in body          # both batched matmuls are gone
    assert f"scale={1.0 / math.sqrt(D)!r}" in body
    # the heads are merged by a view of the fused kernel's output: no copy kernel at all
    assert "kernel" not in body, body
    out = load_wrapper(src, gm, "attention-test")(x, w)
    assert_same(out[0], fn(x, w)[0])


def test_probabilities_also_returned_are_not_fused() -> None:
    """The softmax output is read elsewhere: the rewrite would compute it twice; left alone."""
    x, w = _inputs()

    def fn(x, w):
        b, t, d = x.shape
        q, k, v = (x @ w.t()).split(d, dim=-1)
        q, k, v = (z.view(b, t, H, D).transpose(1, 2) for z in (q, k, v))
        p = torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1)
        return (p @ v, p)

    src, gm = _source(fn, x, w)
    assert "flash_attention" not in src
    out = load_wrapper(src, gm, "attention-test")(x, w)
    assert_same(out, fn(x, w))


def test_consumer_of_other_strides_gets_contiguous_copy() -> None:
    """The attention output feeds a pointwise op directly (no head merge): the op was traced on
    a contiguous tensor, and it still sees one."""
    x, w = _inputs()

    def fn(x, w):
        b, t, d = x.shape
        q, k, v = (x @ w.t()).split(d, dim=-1)
        q, k, v = (z.view(b, t, H, D).transpose(1, 2) for z in (q, k, v))
        y = torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1) @ v
        return (y * 2.0 + 1.0, y.sum(-1))

    src, gm = _source(fn, x, w)
    assert "flash_attention" in src
    out = load_wrapper(src, gm, "attention-test")(x, w)
    assert_same(out, fn(x, w), check_stride=True)


def test_broadcast_heads_not_fused() -> None:
    """k and v shared by all heads (an expand that really broadcasts): not this pattern."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, T, D, generator=g)
    k = torch.randn(B, 1, T, D, generator=g)
    v = torch.randn(B, 1, T, D, generator=g)

    def fn(q, k, v):
        return (torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v,)

    src, gm = _source(fn, q, k, v)
    assert "flash_attention" not in src
    assert_same(load_wrapper(src, gm, "attention-test")(q, k, v), fn(q, k, v))


def test_non_unit_inner_stride_not_fused() -> None:
    """The fused kernel assumes unit stride along the head dim: a q without it stays as it was
    (it gave silently wrong results when called with such a q)."""
    g = torch.Generator().manual_seed(2)
    qt = torch.randn(B, H, D, T, generator=g)
    k = torch.randn(B, H, T, D, generator=g)
    v = torch.randn(B, H, T, D, generator=g)

    def fn(qt, k, v):
        q = qt.transpose(-2, -1)
        return (torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v,)

    gm = make_fx(fn, decomposition_table=decompositions(), tracing_mode="fake")(qt, k, v)
    assert fuse_attention(gm) == 0
    src, gm = _source(fn, qt, k, v)
    assert_same(load_wrapper(src, gm, "attention-test")(qt, k, v), fn(qt, k, v))


@pytest.mark.parametrize("layout", ["contiguous", "heads_inner", "from_qkv"])
def test_fused_output_geometry_matches_kernel(layout: str) -> None:
    """The rewrite writes the fused kernel's output geometry itself (flash_meta): it must be the
    one the kernel returns, for each layout of q."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if layout == "contiguous":
        q = torch.randn(B, H, T, D)
    elif layout == "heads_inner":
        q = torch.randn(B, T, H, D).transpose(1, 2)
    else:
        q = torch.randn(B, T, 3, H, D)[:, :, 1].transpose(1, 2)
    real = FLASH(q, q, q, scale=0.5)
    with FakeTensorMode() as mode:
        fq = mode.from_tensor(q)
    for meta in (flash_meta(q), flash_meta(fq)):
        for m, t in zip(meta, real):
            assert (tuple(m.shape), m.stride(), m.dtype) == (tuple(t.shape), t.stride(), t.dtype)


def test_demo_model_compiled_fused_and_correct() -> None:
    from ember.examples import DemoModel

    torch.manual_seed(0)
    m = DemoModel(d=32, heads=4, hidden=64, layers=2).eval()
    x = torch.randn(2, 16, 32)
    f = compile_strict(m)
    with torch.no_grad():
        assert_same(f(x), m(x))


def test_training_graph_still_correct() -> None:
    """Training: the forward saves the probabilities for the backward, so nothing is fused;
    gradients match eager."""
    from ember.examples import DemoModel

    torch.manual_seed(0)
    m = DemoModel(d=32, heads=4, hidden=64, layers=1)
    x = torch.randn(2, 8, 32)
    f = compile_strict(m)
    f(x).sum().backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for g, p in zip(got, m.parameters()):
        assert_same(g, p.grad, atol=1e-4, rtol=1e-4)


def test_wrapper_snapshot() -> None:
    """The wrapper's ``call`` (Python only; the C++ is covered by test_snapshots) for the
    DemoModel's attention block must match ``snapshots/attention_block.call.txt``. After an
    intended change: ``EMBER_UPDATE_SNAPSHOTS=1 pytest tests/inductor/test_wrapper_attention.py``."""
    import os
    from pathlib import Path

    x, w = _inputs()
    fn = lambda x, w: (_attention(x, w),)  # noqa: E731
    src, gm = _source(fn, x, w)
    body = "def call(" + src.split("\ndef call(", 1)[1]
    path = Path(__file__).parent / "snapshots" / "attention_block.call.txt"
    if os.environ.get("EMBER_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        path.write_text(body)
    assert body == path.read_text(), f"the wrapper's call changed; see {path}"
