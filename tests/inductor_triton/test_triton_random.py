"""Random numbers in the Triton target's kernels (lowering/random.py): Philox draws fused into
the kernels, one seed per call from torch's generator. Checked: eager's distributions (mean,
variance, a Kolmogorov-Smirnov bound), fresh numbers every call and for every op of a call,
reproducible under torch.manual_seed, dropout's backward using its forward's mask; the C++
target keeps them as ATen calls."""

from __future__ import annotations

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from triton_util import DEVICE, compile_triton

N = 8192


def _ks(sample: torch.Tensor, cdf) -> float:
    s, _ = sample.double().flatten().sort()
    n = s.numel()
    f = cdf(s)
    i = torch.arange(1, n + 1, dtype=torch.float64, device=s.device)
    return float(torch.maximum(i / n - f, f - (i - 1) / n).max())


def _normal_cdf(v: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1 + torch.erf(v / math.sqrt(2)))


def test_rand_randn_distributions_fresh_and_seeded():
    def f(x):
        return (torch.rand_like(x), torch.randn_like(x), torch.rand_like(x),
                torch.randn(N, device=x.device), x * 2)

    cf = compile_triton(f)
    x = torch.zeros(N, device=DEVICE)
    torch.manual_seed(123)
    u, z, u2, z2, _ = cf(x)
    assert u.dtype == z.dtype == torch.float32 and u.shape == z.shape == (N,)
    bound = 2.0 / math.sqrt(N)  # KS: above the 0.1% critical value (1.95/sqrt(n))
    for a in (u, u2):
        assert 0 <= float(a.min()) and float(a.max()) < 1
        assert abs(float(a.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / N)
        assert abs(float(a.var()) - 1 / 12) < 0.01
        assert _ks(a, lambda v: v.clamp(0, 1)) < bound
    for a in (z, z2):
        assert abs(float(a.mean())) < 5 / math.sqrt(N) and abs(float(a.var()) - 1) < 0.06
        assert _ks(a, _normal_cdf) < bound
    # the ops of one call draw different numbers (two rand_like(x) are not one); so does the
    # next call
    assert not torch.equal(u, u2) and not torch.equal(z, z2) and abs(float(torch.corrcoef(torch.stack([u, u2]))[0, 1])) < 0.05
    u_next = cf(x)[0]
    assert not torch.equal(u, u_next)
    # reproducible under torch.manual_seed (the compiled program's own stream)
    torch.manual_seed(123)
    again = cf(x)
    assert torch.equal(again[0], u) and torch.equal(again[1], z)


def test_bernoulli_and_dropout_mask_shared_with_backward():
    p = 0.3
    x = (torch.rand(64, 128) + 0.5).to(DEVICE).requires_grad_()
    c = torch.randn(64, 128).to(DEVICE)

    def f(x, c):
        return torch.nn.functional.dropout(x * 1.0, p, training=True) * c, torch.bernoulli(
            torch.full_like(c, 0.25))

    cf = compile_triton(f)
    y, b = cf(x, c)
    keep = y.detach() != 0
    assert abs(float(keep.float().mean()) - (1 - p)) < 5 * math.sqrt(p * (1 - p) / keep.numel())
    assert abs(float(b.mean()) - 0.25) < 5 * math.sqrt(0.25 * 0.75 / b.numel())
    torch.testing.assert_close(y.detach(), torch.where(keep, x.detach() * c / (1 - p), 0.0))
    (g,) = torch.autograd.grad(y.sum(), x)
    # the backward applies the forward's mask (saved, not drawn again)
    torch.testing.assert_close(g, torch.where(keep, c / (1 - p), 0.0))
    y2, _ = cf(x, c)
    assert not torch.equal(y2.detach() != 0, keep)


def test_dynamic_sizes():
    def f(x):
        return torch.rand_like(x), torch.randn_like(x) * 0 + x

    cf = compile_triton(f, dynamic=True)
    for n in (1000, 3000):
        u, z = cf(torch.zeros(n, device=DEVICE))
        assert u.shape == (n,) and 0 <= float(u.min()) and float(u.max()) < 1
        assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / n)
        assert u.unique().numel() > 0.99 * n  # no offsets reused within a call


def test_zero_dim_draws():
    def f(x):
        return torch.rand_like(x), torch.randn((), device=x.device) + x

    u, z = compile_triton(f)(torch.tensor(1.0, device=DEVICE))
    assert u.shape == z.shape == () and 0 <= float(u) < 1 and math.isfinite(float(z))


@pytest.mark.skipif(DEVICE != "cpu", reason="the C++ target is the CPU's")
def test_cpp_target_keeps_aten_random_calls():
    from ember_inductor.compile_fx import generate_source
    from ember_inductor.decompositions import decompositions

    gm = make_fx(lambda x: torch.rand_like(x) + x, decomposition_table=decompositions())(
        torch.zeros(4))
    cpp, _ = generate_source(gm, key="rand-cpp", options={})
    tri, _ = generate_source(gm, key="rand-triton", options={"cpu_codegen": "triton"})
    assert "aten.rand_like" in cpp and "tl.rand(" not in cpp
    assert "aten.rand_like" not in tri and "tl.rand(" in tri and "aten.randint" in tri
    # dropout (bernoulli.p on a fresh tensor): the mask drawn in the kernel, one seed per call
    gm = make_fx(torch.func.functionalize(  # as AOT hands it over: bernoulli.p, no mutation
        lambda x: torch.nn.functional.dropout(x, 0.5, training=True) * 3,
        remove="mutations_and_views"), decomposition_table=decompositions())(torch.zeros(4))
    tri, _ = generate_source(gm, key="dropout-triton", options={"cpu_codegen": "triton"})
    assert "aten.bernoulli" not in tri and tri.count("tl.rand(") == 1 and tri.count("randint") == 1
