"""The wrapper's buffer reuse: a dead buffer a C++ region wrote, of the same geometry as the new
one, is taken as it is (no ``as_strided``); one an ATen call returned is always re-viewed in the
declared layout. Results match eager."""

from __future__ import annotations

import re

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.compile_fx import generate_source, load_wrapper
from ember_inductor.decompositions import decompositions

from inductor_util import assert_same


def _mlp(x, w1, b1, w2, b2, g, b):
    """Two residual MLP blocks (the zoo's mlp in small): LayerNorm, Linear, GELU, Linear."""
    F = torch.nn.functional
    for _ in range(2):
        x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (x.shape[-1],), g, b), w1, b1)), w2, b2)
    return (F.layer_norm(x, (x.shape[-1],), g, b),)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    d, h = 16, 64

    def r(*s):
        return torch.randn(*s, generator=gen)

    return (r(8, d), r(h, d) / 4, r(h), r(d, h) / 8, r(d), r(d), r(d))


def test_reuse_lines_and_result() -> None:
    args = _inputs()
    gm = make_fx(_mlp, decomposition_table=decompositions(), tracing_mode="fake")(*args)
    src, _ = generate_source(gm, key="reuse-test")
    body = src.split("\ndef call(", 1)[1]
    aliases = re.findall(r"^    (buf\d+) = (buf\d+); del \2  # reuse$", body, re.M)
    views = re.findall(r"^    (buf\d+) = _view\((buf\d+), .*; del \2  # reuse$", body, re.M)
    assert aliases, body  # LayerNorm outputs of the same [8, 16] geometry
    region_writes = set(re.findall(r"^    (buf\d+) = _empty\(", body, re.M))
    extern_results = set(re.findall(r"^    (buf\d+) = torch\.ops\.", body, re.M))
    for new, old in aliases:
        assert old not in extern_results, (new, old)  # an ATen result is never aliased as is
        region_writes.add(new)
    for new, old in views:
        assert old in extern_results or old in region_writes
    out = load_wrapper(src, gm, "reuse-test")(*args)
    assert_same(out, _mlp(*args))
    # a second call (buffers come from the allocator again) gives the same
    assert_same(load_wrapper(src, gm, "reuse-test")(*args), out)
