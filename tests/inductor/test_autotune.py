"""ember_inductor/autotune.py: frozen linear layers are timed once in their alternatives (in every
mode), the choice is cached on disk and reused without timing, and results equal eager;
mode="reduce-overhead" is accepted on the CPU."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import ember
from ember_inductor import autotune
from ember_inductor.runtime import cache


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    ember.reset()
    yield
    ember.reset()


def _model() -> MLP:
    torch.manual_seed(0)
    return MLP().eval()


def _run(mode: str, x: torch.Tensor):
    eager = _model()
    compiled = ember.compile(copy.deepcopy(eager), backend="inductor", mode=mode)
    with torch.no_grad():
        return compiled(x), eager(x)


def test_choice_timed_once_then_cached(tmp_path):
    x = torch.randn(8, 32)
    before = dict(autotune.counters)
    out, ref = _run("max-autotune", x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert autotune.counters["timed"] == before.get("timed", 0) + 2  # fc1 (addmm), fc2 (mm)
    entries = list((tmp_path / "cache").rglob("*.json"))
    choices = []
    for p in entries:
        try:
            rec = json.loads(json.loads(p.read_text())["text"])
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(rec, dict) and rec.get("kind") == "linear":
            choices.append(rec["choice"])
    assert len(choices) == 2 and set(choices) <= {"addmm", "transposed", "mkl_packed", "onednn"}
    # a fresh compile of the same layers (a new process would do the same) reads the cache
    ember.reset()
    timed = autotune.counters["timed"]
    cached = autotune.counters["cached"]
    out2, ref2 = _run("max-autotune", x)
    torch.testing.assert_close(out2, ref2, rtol=1e-5, atol=1e-5)
    assert autotune.counters["timed"] == timed
    assert autotune.counters["cached"] == cached + 2


@pytest.mark.parametrize("choice", ["addmm", "transposed", "mkl_packed", "onednn"])
def test_every_choice_is_correct(choice, monkeypatch):
    if choice == "mkl_packed" and not torch.backends.mkl.is_available():
        pytest.skip("torch built without MKL: the packed variant is never a candidate")
    monkeypatch.setattr(autotune, "_time_all", lambda cands: {
        n: (1.0 if n == choice else 2.0) for n in cands})
    x = torch.randn(8, 32)
    out, ref = _run("max-autotune", x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # and a changed weight is still noticed through the frozen (pre-transposed/packed) copy
    eager = _model()
    cm = copy.deepcopy(eager)
    compiled = ember.compile(cm, backend="inductor", mode="max-autotune")
    with torch.no_grad():
        compiled(x)
        for m in (eager, cm):
            m.fc1.weight.data.mul_(-2.0)
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_default_modes_time_frozen_linears_too(mode):
    # every mode decides frozen linear layers by timing (max-autotune's choice is no longer
    # kept for it); reduce-overhead is the GPU's and accepted on the CPU
    x = torch.randn(8, 32)
    before = autotune.counters["timed"]
    out, ref = _run(mode, x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert autotune.counters["timed"] == before + 2


def test_corrupt_choice_is_timed_again(monkeypatch):
    calls = []
    cands = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    sig = ("test", 1)
    first = autotune.choose("unit", sig, cands)
    assert first in cands and calls
    # overwrite the stored choice with a name that is no candidate: timed again, not trusted
    key = autotune._key("unit", sig, list(cands))
    cache.put_text("autotune", key, json.dumps({"choice": "nope"}))
    timed = autotune.counters["timed"]
    assert autotune.choose("unit", sig, cands) in cands
    assert autotune.counters["timed"] == timed + 1
