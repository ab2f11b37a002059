"""Random programs of views, in-place writes (into intermediates and into the input, in the
graph or through a view passed to a function that runs outside it) and graph breaks, through AOT autograd and inductor, against eager: the results (values, shapes, strides
of dimensions longer than 1), the input after the call, and whether eager raises. The corpus
that follows up the view-output bug of test_adv_views_across_breaks.py (a view returned as a
buffer of its own lost writes made after a break)."""

from __future__ import annotations

import random

import pytest
import torch

import ember


@ember.disable
def brk(*args):
    pass


@ember.disable
def bump(t):  # a write made outside the graph, into a view made inside it (a graph break)
    t.add_(10)


VIEWS = ["{v}[1:]", "{v}[:, ::2]", "{v}.t()", "{v}.view(-1)", "{v}.unsqueeze(0)",
         "{v}.diagonal()", "{v}.split(2)[1]", "{v}.narrow(0, 1, 2)", "{v}[0]", "{v}.T",
         "{v}.reshape(-1)", "{v}[..., 1]", "{v}.expand(2, *{v}.shape)[0]"]
WRITES = ["{v}.add_(1)", "{v}.mul_(2)", "{v}.zero_()", "{v}.fill_(3)", "{v}.sub_(0.5)",
          "{v}.clamp_(max=5)", "{v}[...] = 7"]
PURE = ["{v} * 2", "{v} + 1", "torch.relu({v})", "{v}.clone()"]


def program(rng: random.Random) -> str:
    lines, names, n = ["y = x * 1"], ["y", "x"], 0
    for _ in range(rng.randint(3, 9)):
        r, v = rng.random(), rng.choice(names)
        if r < 0.4 or r >= 0.85:
            n += 1
            table = VIEWS if r < 0.4 else PURE
            lines.append(f"v{n} = {rng.choice(table).format(v=v)}")
            names.append(f"v{n}")
        elif r < 0.6:
            lines.append(rng.choice(WRITES).format(v=v))
        elif r < 0.7:
            lines.append(f"bump({rng.choice(VIEWS).format(v=v)})")
        else:
            lines.append("brk()")
    outs = rng.sample(names, k=min(len(names), rng.randint(1, 3)))
    lines.append(f"return ({', '.join(outs)},)")
    return "def f(x):\n" + "".join(f"    {line}\n" for line in lines)


def _strides(t: torch.Tensor) -> list[int]:
    return [s for s, n in zip(t.stride(), t.shape) if n > 1]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("seed", range(8))
def test_random_view_and_write_programs_match_eager(backend, seed):
    rng = random.Random(1000 + seed)
    for _ in range(25):
        src = program(rng)
        ns = {"torch": torch, "brk": brk, "bump": bump}
        exec(src, ns)
        f = ns["f"]
        x = torch.arange(16.).reshape(4, 4)
        x_eager, x_ember = x.clone(), x.clone()
        try:
            want, want_error = f(x_eager), None
        except Exception as e:  # noqa: BLE001 - a program may index a dimension it lacks
            want, want_error = None, f"{type(e).__name__}: {e}"
        ember.reset()
        try:
            got, got_error = ember.compile(f, backend=backend)(x_ember), None
        except Exception as e:  # noqa: BLE001
            got, got_error = None, f"{type(e).__name__}: {e}"
        assert got_error == want_error, src
        if want_error is None:
            for a, b in zip(got, want):
                assert a.shape == b.shape and _strides(a) == _strides(b), src
                assert torch.equal(a, b), src
            assert torch.equal(x_ember, x_eager), src
