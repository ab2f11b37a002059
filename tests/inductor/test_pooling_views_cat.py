"""Data movement of the wide corpus's ``views_cat`` graph lowered to generated code: ``flip`` is a
reversed index (it was an ATen copy of a stored value), and a sum over a dim of at most 3
elements (``reshape(B, 3, C, T).transpose(1, 2).sum(2)``) is an unrolled pointwise body instead
of a 3-iteration reduction loop, so the whole inference graph is one loop nest."""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.compile_fx import generate_source
from ember_inductor.decompositions import decompositions
from inductor_util import assert_same, compile_strict


def _views_cat(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = x * w
    z = torch.cat([y, y.flip(1) * 0.5, F.pad(y[:, 1:], (0, 0, 0, 1))], dim=-1)
    z = z.permute(0, 2, 1).contiguous()
    z = z.reshape(z.shape[0], 3, -1, z.shape[-1]).transpose(1, 2)
    return torch.relu(z.sum(2)).transpose(1, 2) + y


def test_views_cat_one_kernel_forward_and_grad() -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 6, 5, generator=g), torch.randn(5, generator=g)
    gm = make_fx(lambda a, b: (_views_cat(a, b),), decomposition_table=decompositions())(x, w)
    src, _ = generate_source(gm, key="test_views_cat")
    assert not re.findall(r"torch\.ops\.aten\.\w+", src), "an ATen call left in the graph"
    assert len(re.findall(r"^    kernel\d+\(", src, re.M)) == 1, src[-1500:]
    assert "reduction(" not in src  # the 3-element sum is unrolled
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    ye, yc = _views_cat(xe, we), compile_strict(_views_cat)(xc, wc)
    assert_same(yc, ye, check_stride=True)
    gr = torch.randn(ye.shape, generator=g)
    ye.backward(gr)
    yc.backward(gr)
    assert_same(xc.grad, xe.grad)
    assert_same(wc.grad, we.grad)


def test_flip_dims() -> None:
    def fn(x: torch.Tensor, n: torch.Tensor) -> Any:
        return (x.flip(0) * 2, x.flip(-1, 1) + 1, x.transpose(0, 2).flip(0).exp(), n.flip(2),
                x[:, 1:].flip(1).sum(1))

    x = torch.randn(3, 4, 5)
    x[0, 1, 2] = float("nan")
    n = torch.randint(-9, 9, (3, 4, 5))
    src = make_fx(fn, decomposition_table=decompositions())(x, n)
    assert "flip" in str(src.graph)
    out, _ = generate_source(src, key="test_flip")
    assert "aten.flip" not in out
    assert_same(compile_strict(fn)(x, n), fn(x, n))


def test_negative_padding_crops() -> None:
    # constant_pad_nd with negative pads (the backward of F.pad(y[:, 1:], ...)) was an ATen fallback
    def fn(x: torch.Tensor) -> Any:
        return tuple(F.pad(x, pad, value=1.5) * 2 for pad in
                     [(0, 0, 0, -1), (-1, 2, 1, -2), (-2, -1), (1, -3, 0, 0, -1, 1)])

    x = torch.randn(3, 5, 6)
    gm = make_fx(fn, decomposition_table=decompositions())(x)
    src, _ = generate_source(gm, key="test_negative_pad")
    assert "aten.constant_pad_nd" not in src
    assert_same(compile_strict(fn)(x), fn(x))


def test_transposed_output_computed_along_its_loads() -> None:
    # eager's output strides put T innermost while every load runs along C: the value is
    # computed contiguously (vector code) and copied into eager's strides
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(4, 64, 64, generator=g), torch.randn(64, generator=g)
    gm = make_fx(lambda a, b: (_views_cat(a, b),), decomposition_table=decompositions())(x, w)
    src, _ = generate_source(gm, key="test_views_cat_transposed")
    assert "<- output_strides" in src, src[-1500:]
    assert_same(compile_strict(_views_cat)(x, w), _views_cat(x, w), check_stride=True)
