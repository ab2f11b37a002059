"""Small-batch linear layers (batch-1 / few-row inference): which matrix multiply kernel the
fixed rule (patterns.onednn_preferred) picks, and that the chosen one gives eager's results."""

from __future__ import annotations

import pytest
import torch

from ember_inductor import patterns

from inductor_util import assert_same
from test_pattern_linear import LINEAR, _compile

pytestmark = pytest.mark.skipif(patterns.linear_op() is None, reason="torch built without oneDNN")


def test_rule_small_m() -> None:
    # large weights (>= 1M elements): oneDNN from 4 rows on
    assert patterns.onednn_preferred(4, 1024, 4096)
    assert patterns.onednn_preferred(16, 4096, 1024)
    assert patterns.onednn_preferred(8, 4096, 256)
    # one or two rows: addmm (eager's kernel), whatever the weight
    assert not patterns.onednn_preferred(1, 1024, 4096)
    assert not patterns.onednn_preferred(2, 4096, 1024)
    # 512K-element weights: from 16 rows on
    assert not patterns.onednn_preferred(8, 768, 768)
    assert patterns.onednn_preferred(16, 768, 768)
    # small weights: only from 64 rows on, and never with a narrow side
    assert not patterns.onednn_preferred(32, 512, 512)
    assert patterns.onednn_preferred(64, 512, 512)
    assert not patterns.onednn_preferred(16, 128, 8192)
    assert not patterns.onednn_preferred(16, 8192, 128)


@pytest.mark.parametrize("m", [1, 4])
def test_small_m_follows_the_rule(m) -> None:
    g = torch.Generator().manual_seed(2)
    k, n = 1024, 1024
    x, w, b = (torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / k ** 0.5,
               torch.randn(n, generator=g))

    def fn(x, w, b):
        return (torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)),)

    src, call = _compile(fn, (x, w, b))
    assert (LINEAR in src) == (m == 4), src
    assert_same(call(x, w, b), fn(x, w, b))
