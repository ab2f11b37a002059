"""A symbolic guard printed as ``a or b`` joined into the entry's ``g1 and g2 and ...`` without
parentheses split the chain: ``g1 and ... and a or b and ...`` passes whenever ``b`` and the
guards after it hold, so every guard before it became optional. A graph compiled for a stride-1
convolution then served a stride-2 one (Hugging Face BiT under graph breaks: a size error
downstream; elsewhere a silently wrong shape)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.capture.output import conjunct


def _standardized_conv(conv, x, wv):
    w = F.batch_norm(wv, None, None, training=True, momentum=0.0, eps=1e-8).reshape_as(conv.weight)
    return F.conv2d(x, w, None, conv.stride, conv.padding, conv.dilation, conv.groups)


def test_a_stride_2_conv_is_not_served_by_the_stride_1_graph():
    # the shapes of BiT's weight-standardized convolutions: after the first recompile the
    # sizes are symbolic, and the conv's output-size check is a guard with `or`
    cg = ember.compile(_standardized_conv, backend="eager")
    convs = [nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False), nn.Conv2d(8, 8, 1, bias=False),
             nn.Conv2d(8, 8, 3, padding=1, bias=False),
             nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False)]
    xs = [torch.randn(2, 3, 32, 32)] + [torch.randn(2, 8, 8, 8)] * 3
    with torch.no_grad():
        for conv, x in zip(convs, xs):
            wv = conv.weight.reshape(1, conv.out_channels, -1)
            got, want = cg(conv, x, wv), _standardized_conv(conv, x, wv)
            assert got.shape == want.shape, (conv, got.shape, want.shape)
            torch.testing.assert_close(got, want)


def test_guards_that_bind_looser_than_and_are_parenthesized():
    assert conjunct("a > 0 or b > 0") == "(a > 0 or b > 0)"
    assert conjunct("x if c else y") == "(x if c else y)"
    assert conjunct("(lambda: 1)() == 1") == "(lambda: 1)() == 1"
    assert conjunct("(a or b) and c") == "(a or b) and c"
    assert conjunct("type(x) is int and x == 1") == "type(x) is int and x == 1"
    assert conjunct("'or' in s") == "'or' in s"
    # the joined chain evaluates as the conjunction of every guard
    guards = ["s == 1", "h > 0 or w > 0", "k == 3"]
    chain = " and ".join(map(conjunct, guards))
    assert eval(chain, {"s": 2, "h": 1, "w": 1, "k": 3}) is False
    assert eval(chain, {"s": 1, "h": 0, "w": 1, "k": 3}) is True
