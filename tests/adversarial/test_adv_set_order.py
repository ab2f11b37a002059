"""A set made inside the compiled region iterates in the order the program's own set does: a set
literal (compiled by Python as a frozenset constant copied into a new set), ``set(S)``,
``frozenset(S)``, a comprehension, ``update``/``add``/``discard``. Capture mirrors each such set
with a real one that goes through the same insertions and copies; rebuilding it from its items
could lay out colliding hashes differently (the order then depends on the hash seed, so the
checks run in processes with several). Found by the adversarial guard probe."""

from __future__ import annotations

import pytest

_SCRIPT = r"""
import torch, ember
S = {"alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota"}
def literal(x):
    return x, "".join({"a", "b", "c", "d", "e", "f", "g", "h", "i"})
def copied(x):
    return x, "".join(set(S))
def frozen(x):
    return x, "".join(frozenset(S))
def comprehension(x):
    return x, "".join({k for k in ["q", "k", "v", "o", "u", "w", "z", "y", "x"]})
def cat_in_set_order(x):
    d = {k: x * i for i, k in enumerate(["q", "k", "v", "o", "u"])}
    return torch.cat([d[k] for k in {"q", "k", "v", "o", "u"}]), ""
def updated(x):
    s = set()
    s.update(S)
    s.add("zz")
    s.discard("alpha")
    return x, "".join(s) + "".join(frozenset(s))
wrong = []
for fn in (literal, copied, frozen, comprehension, cat_in_set_order, updated):
    for backend in ("eager", "aot_eager"):
        x = torch.arange(3.0)
        got, want = ember.compile(fn, backend=backend)(x), fn(x)
        if got[1] != want[1] or not torch.equal(got[0], want[0]):
            wrong.append(f"{fn.__name__}/{backend}")
print("WRONG", wrong)
"""


@pytest.mark.parametrize("seed", [3, 7, 11, 20, 24, 28, 29, 31])
def test_sets_made_inside_iterate_as_in_eager(seed, tmp_path, py):
    r = py(_SCRIPT, env={"PYTHONHASHSEED": str(seed), "EMBER_CACHE_DIR": str(tmp_path)})
    assert "WRONG []" in r.stdout, r.stdout + r.stderr[-3000:]
