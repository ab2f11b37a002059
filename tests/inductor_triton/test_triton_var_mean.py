"""var/var_mean on the Triton target with a large mean and a small spread (catastrophic
cancellation for a plain sum-then-subtract): the lowering computes the mean as the row's first
element plus the deviations' mean and never subtracts a rounded large mean (lowering/
reductions.py, ``shifted_var_mean``), for persistent, looped and split reductions. Compared
with float64; eager (Welford) is within ~1e-7 here, the plain two-pass form was off by up to
5e3x on the looped rows."""

from __future__ import annotations

import pytest
import torch

from triton_util import DEVICE, compile_triton


def _rel_err(got, x, fn):
    want = fn(x.double())
    if isinstance(want, tuple):
        return max(float(((g.double() - w).abs() / w.abs().clamp_min(1e-30)).max())
                   for g, w in zip(got, want))
    return float(((got.double() - want).abs() / want.abs()).max())


@pytest.mark.parametrize("case", ["persistent", "looped", "split", "columns"])
def test_var_mean_large_mean_small_spread(case):
    gen = torch.Generator().manual_seed(0)
    dynamic = None
    if case == "persistent":
        x = torch.randn(4, 512, generator=gen) * 0.01 + 1e4

        def fn(x):
            return torch.var_mean(x, -1, correction=1)
    elif case == "looped":  # symbolic row length: a looped reduction
        x = torch.randn(2, 30000, generator=gen) * 0.01 + 1e5
        dynamic = True

        def fn(x):
            return torch.var_mean(x, -1, keepdim=True)
    elif case == "split":  # one long row: split across programs
        x = torch.randn(40000, generator=gen) + 3e4

        def fn(x):
            return torch.var_mean(x)
    else:
        x = torch.randn(40000, 2, generator=gen) * 0.01 + 1e5

        def fn(x):
            return torch.var(x, 0), x.std(0)
    x = x.to(DEVICE)
    got = compile_triton(fn, dynamic=dynamic)(x)
    assert _rel_err(got, x, fn) < 1e-4, (case, _rel_err(got, x, fn), _rel_err(fn(x), x, fn))
