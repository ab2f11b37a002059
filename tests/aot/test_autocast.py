"""Autocast around and inside compiled regions: graphs are only reused under the autocast state
they were traced in, and AOT graphs (which hold autocast's casts) are not cast a second time."""

from __future__ import annotations

import torch

import ember


class Rotary(torch.nn.Module):
    """Like HF Llama's rotary embedding: a region that runs with autocast disabled."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("freq", torch.linspace(0.1, 3.0, 8))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            ang = pos.float()[:, None] @ self.freq[None, :]  # stays fp32 in eager
        h = self.lin(x)
        return h * torch.cat([ang.cos(), ang.sin()], dim=-1).to(h.dtype)


def _run(fn, x, pos, amp: bool):  # noqa: ANN001, ANN202
    if amp:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(x, pos)
    return fn(x, pos)


def test_autocast_state_is_guarded_and_matches_eager() -> None:
    torch.manual_seed(0)
    m = Rotary().eval()
    x, pos = torch.randn(64, 16), torch.arange(64) * 37.0
    for backend in ("eager", "aot_eager"):
        ember.reset()
        cm = ember.compile(m, backend=backend)
        with torch.no_grad():
            for amp in (False, True, False, True):
                got, want = _run(cm, x, pos, amp), _run(m, x, pos, amp)
                assert got.dtype == want.dtype, (backend, amp)
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        # one entry per autocast state, no more
        assert ember.events.counters["stats"]["recompiles"] == 1, backend


def test_aot_graph_is_not_autocast_twice_in_training() -> None:
    torch.manual_seed(0)
    m = Rotary()
    x, pos = torch.randn(64, 16, requires_grad=True), torch.arange(64) * 37.0
    ember.reset()
    cm = ember.compile(m, backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = cm(x, pos)
        want = m(x, pos)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (g1,) = torch.autograd.grad(got.float().sum(), x)
    (g2,) = torch.autograd.grad(want.float().sum(), x)
    torch.testing.assert_close(g1, g2)


def _nesting() -> int:
    n = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return n - 1


def test_break_inside_autocast_leaves_state_and_nesting_balanced() -> None:
    import contextlib
    import io

    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = a @ b
            print("inside autocast", c.dtype)
            d = c @ b.t()
        return c, d, a @ b

    a, b = torch.randn(2, 3), torch.randn(3, 3)
    for backend in ("eager", "aot_eager"):
        ember.reset()
        cf = ember.compile(f, backend=backend)
        for _ in range(3):
            with contextlib.redirect_stdout(io.StringIO()):
                got = cf(a, b)
            want = f(a, b)
            assert not torch.is_autocast_enabled("cpu"), backend
            assert _nesting() == 0, backend
            for g, w in zip(got, want):
                assert g.dtype == w.dtype
                torch.testing.assert_close(g, w, rtol=0, atol=0)
