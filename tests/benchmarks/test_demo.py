"""``python -m benchmarks demo`` (the README's first command, through scripts/demo.sh): the table
has eager, Ember and the peer with accuracy and speed. The peer is swapped for torch.compile's
cheap ``eager`` backend and the fresh-process probes are off, to keep the test short."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import demo as demo_mod  # noqa: E402


def test_demo_prints_the_three_way_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(demo_mod, "PEER", "torch-eager")
    assert demo_mod.demo(iters=2, max_seconds=1.0, probes=False) == 0
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines()
            if ln.split() and ln.split()[0] in ("eager", "ember-inductor", "torch-eager")}
    assert set(rows) == {"eager", "ember-inductor", "torch-eager"}, out
    assert rows["ember-inductor"][1] == "pass" and rows["torch-eager"][1] == "pass"
    assert rows["ember-inductor"][3].endswith("x")  # a speedup was measured
    assert "speed: ember-inductor" in out
