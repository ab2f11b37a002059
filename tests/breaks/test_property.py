"""Random programs with graph breaks (prints, .item(), data-dependent branches, breaks inside
no_grad blocks and helpers, Python-side effects) compiled with Ember and compared with eager:
results, gradients, printed output and every side effect."""

from __future__ import annotations

import contextlib
import io
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ember

STATEMENTS = [
    "x = x * {c}",
    "x = x + {c}",
    "print('p', {c})",
    "acc.append(x.sum().item())",
    "if x.sum() > {c}:\n    x = x - 1\nelse:\n    x = x + 2",
    "with torch.no_grad():\n    z = x * 2\n    print('ng')\n    x = z + x",
    "x = helper(x, {c})",
    "lst.append({c})",
    "for i in range(2):\n    x = x + i",
    "k = int(x.max().item())\nx = x * k",
    "d['k{c}'] = x.mean()",
    "x = x.relu() if {c} > 1 else x.tanh()",
]
HELPER = ("def helper(v, c):\n    if v.mean() > 0:\n        print('h', c)\n"
          "    return v * c\n")


def make_program(seed: int) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(rng.randint(2, 7)):
        lines += rng.choice(STATEMENTS).format(c=rng.randint(0, 3)).split("\n")
    body = "\n".join("    " + line for line in lines)
    return (HELPER + "def f(x, acc, lst, d):\n" + body +
            "\n    return x, len(acc), list(lst), sorted(d)\n")


def run(fn, x: torch.Tensor, grad: bool):  # noqa: ANN001, ANN201
    acc: list = []
    lst: list = [0]
    d: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        xi = x.clone().requires_grad_(grad)
        r = fn(xi, acc, lst, d)
        g = None
        if grad and r[0].requires_grad:
            g = torch.autograd.grad(r[0].sum(), xi, allow_unused=True)[0]
    return r, acc, lst, d, out.getvalue(), g


@pytest.mark.parametrize("backend,grad", [("eager", False), ("aot_eager", True)])
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10**6))
def test_random_programs_with_breaks_match_eager(backend: str, grad: bool, seed: int) -> None:
    src = make_program(seed)
    ns: dict = {"torch": torch}
    exec(src, ns)  # noqa: S102 - the program under test
    f = ns["f"]
    ember.reset()
    cf = ember.compile(f, backend=backend)
    for x in (torch.randn(4, generator=torch.Generator().manual_seed(seed)),
              torch.full((4,), -2.0), torch.full((4,), 0.75)):
        want = run(f, x, grad)
        got = run(cf, x, grad)
        torch.testing.assert_close(got[0][0], want[0][0], msg=src)
        assert got[0][1:] == want[0][1:], src
        assert got[1] == want[1] and got[2] == want[2], src
        assert got[4] == want[4], f"printed output differs\n{src}"
        assert got[3].keys() == want[3].keys(), src
        for k in want[3]:
            torch.testing.assert_close(got[3][k], want[3][k], msg=src)
        assert (got[5] is None) == (want[5] is None), src
        if want[5] is not None:
            torch.testing.assert_close(got[5], want[5], msg=src)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_grad_mode_restored_after_a_break_inside_no_grad(backend: str) -> None:
    # AOT backends trace grad switches away: the entry itself must restore the mode.
    def f(x):
        x = x + 0
        with torch.no_grad():
            z = x * 2
            print("inside")
            x = z + x
        return x * 3

    ember.reset()
    cf = ember.compile(f, backend=backend)
    for _ in range(3):
        x = torch.randn(4, requires_grad=True)
        with contextlib.redirect_stdout(io.StringIO()):
            got = cf(x)
        assert torch.is_grad_enabled()
        torch.testing.assert_close(got, f(x))
        assert got.requires_grad == f(x).requires_grad
