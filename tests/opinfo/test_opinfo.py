"""The OpInfo sweep in CI: every float32 OpInfo's first sample(s), through each backend in
``EMBER_OPINFO_BACKENDS`` (default ``eager,aot_eager``; ``EMBER_OPINFO_BACKENDS=aot_eager,inductor``
runs the same sweep on inductor), compared with eager (outputs and input gradients).

A sample must come out right, or fall back to eager with a reason (counted, not a failure), or be
a random op whose draws differ from eager's. A wrong result or an error fails the test, except
for the differences listed with their reason in ``known.json`` (regenerated with
``sweep.py --write-known``; docs/opinfo.md lists them): those are strict xfails, so a fix makes
the test fail until the list is updated. ``EMBER_OPINFO_SAMPLES`` (default 1) samples per op;
``tests/opinfo/sweep.py`` runs the full sweep and the torch.compile oracle.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sweep  # noqa: E402

BACKENDS = [b for b in os.environ.get("EMBER_OPINFO_BACKENDS", "eager,aot_eager").split(",") if b]
SAMPLES = int(os.environ.get("EMBER_OPINFO_SAMPLES", "1"))
KNOWN = json.loads((HERE / "known.json").read_text()) if (HERE / "known.json").exists() else {}
OK = {"right", "fallback", "random", "skip"}


def _ops():
    return {sweep.op_key(op): op for op in sweep.selected_ops()}


OPS = _ops()


def _params():
    out = []
    for b in BACKENDS:
        known = KNOWN.get(b, {})
        for key in OPS:
            listed = {k: v for k, v in known.items() if k.rsplit("#", 1)[0] == key
                      and int(k.rsplit("#", 1)[1]) < SAMPLES}
            marks = []
            if listed:
                why = "; ".join(f"{k}: {v[0]}: {v[1]}" for k, v in sorted(listed.items()))
                marks.append(pytest.mark.xfail(strict=True, reason=why[:500]))
            out.append(pytest.param(b, key, marks=marks, id=f"{b}-{key}"))
    return out


@pytest.mark.parametrize("backend,key", _params())
def test_opinfo(backend, key):
    bad = []
    for case in sweep.cases_for(OPS[key], SAMPLES):
        r = sweep.run_ember(case, backend, time_limit=60)
        if r.status not in OK:
            bad.append(f"{case.key}: {r.status}: {r.reason}")
    assert not bad, "\n".join(bad)


def test_oracle_covers_the_ci_samples():
    oracle = sweep.load_oracle()["results"]
    missing = [k for k in OPS if f"{k}#0" not in oracle]
    assert len(missing) <= len(OPS) // 50, f"oracle.json lacks {len(missing)} ops: {missing[:20]}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_opinfo_inplace_variants(backend, monkeypatch):
    """The ops' in-place variants (``x.add_(y)``, ``x.t_()``), without grad: outputs, the mutated
    inputs and whether the result is the input itself match eager (AOT's input mutations,
    metadata mutations and aliased outputs)."""
    monkeypatch.setattr(sweep, "INPLACE", True)
    bad, n = [], 0
    for key, op in OPS.items():
        if op.inplace_variant is None:
            continue
        for case in sweep.cases_for(op, SAMPLES):
            n += 1
            r = sweep.run_ember(case, backend, time_limit=60)
            if r.status not in OK:
                bad.append(f"{case.key}: {r.status}: {r.reason}")
    assert n > 100  # the in-place variants were found
    assert not bad, "\n".join(bad)


def test_fp32_error_rule_tells_reordering_from_wrong():
    """A result that differs from eager float32 only as a reordered float32 computation does is
    right (PyTorch's float64-reference rule); one that is off by more stays wrong."""
    kron = OPS["kron"]
    case = next(sweep.cases_for(kron, 1))
    ref = sweep._eager_reference(case)

    def reordered(*xs):  # the same op computed in float64 and rounded: closer to the truth
        out = case.make_fn()(*(x.double() for x in xs))
        return out.float()

    def off(*xs):
        out = case.make_fn()(*xs)
        return out * (1 + 1e-4)

    assert sweep.judge(case, reordered, *ref)[0] == "right"
    status, reason = sweep.judge(case, off, *ref)
    assert status == "wrong", reason
    # inductor's kron gradient sums 200 products in another order than eager: right by the rule
    assert sweep.run_ember(case, "inductor").status == "right"
