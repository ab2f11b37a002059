"""Smoke test of the benchmark runner: one tiny model, eager + ember-eager, report shape only."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.accuracy import compare  # noqa: E402
from benchmarks.report import CSV_COLUMNS, OVERHEAD_COLUMNS  # noqa: E402


def test_runner_writes_reports(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks", "run", "--device", "cpu", "--mode", "infer",
           "--backends", "eager,ember-eager,torch-nonexistent-backend", "--models", "tiny_mlp",
           "--iters", "3", "--warmup", "1", "--compile-probes", "cold", "--out", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "tiny_mlp" in p.stderr  # the progress display

    for name in ("cpu-infer.md", "cpu-infer.csv", "cpu-infer-overhead.csv", "cpu-infer.png"):
        assert (tmp_path / name).stat().st_size > 0, name

    with open(tmp_path / "cpu-infer.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == CSV_COLUMNS
        rows = {r["backend"]: r for r in reader}
    assert set(rows) == {"eager", "ember-eager", "torch-nonexistent-backend"}
    assert all(r["model"] == "tiny_mlp" for r in rows.values())
    eager, ember_row, missing = (rows["eager"], rows["ember-eager"],
                                 rows["torch-nonexistent-backend"])
    assert eager["status"] == "ok" and eager["accuracy"] == "pass"
    assert float(eager["speedup"]) == pytest.approx(1.0)
    assert float(eager["median_ms"]) > 0 and int(eager["iters"]) >= 3
    # Ember's row ran (compiled, or fell back to eager with the reason noted) and is accurate.
    assert ember_row["status"] in ("ok", "eager fallback"), ember_row
    assert ember_row["accuracy"] == "pass"
    assert float(ember_row["median_ms"]) > 0
    assert float(ember_row["cold_compile_s"]) >= 0  # the fresh-process probe answered
    assert ember_row["warm_compile_s"] == ""  # only "cold" was asked for
    assert ember_row["graphs"] != "" and ember_row["graph_breaks"] != ""
    # An unknown backend is a row with a reason, not a crash.
    assert missing["status"].startswith("not available"), missing
    assert missing["median_ms"] == ""

    with open(tmp_path / "cpu-infer-overhead.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == OVERHEAD_COLUMNS
        over = {r["backend"]: r for r in reader}
    assert float(over["eager"]["us_per_call"]) > 0 and float(over["ember-eager"]["us_per_call"]) > 0

    md = (tmp_path / "cpu-infer.md").read_text()
    assert "| model | backend | status | accuracy | median ms | speedup |" in md
    assert md.count("| tiny_mlp |") == 3
    assert "python -m benchmarks run --device cpu" in md


def test_accuracy_rule() -> None:
    import torch

    ref64 = [torch.linspace(-1, 1, 100, dtype=torch.float64)]
    fp32 = [ref64[0].float() + 1e-7]
    assert compare([fp32[0].clone()], fp32, ref64, 1e-3).ok
    # Far from eager and from fp64, but still pointing the same way: cosine fallback.
    assert compare([fp32[0] * 1.05], fp32, ref64, 1e-3).how == "pass (cosine)"
    bad = compare([-fp32[0]], fp32, ref64, 1e-3)
    assert not bad.ok and bad.how.startswith("FAIL")
    assert not compare([fp32[0][:50]], fp32, ref64, 1e-3).ok  # shape mismatch
    assert compare([torch.tensor([1, 2])], [torch.tensor([1, 2])], [torch.tensor([1, 2])], 1e-3).ok


def test_append_merges_by_model_and_backend() -> None:
    from benchmarks.report import merge_results
    from benchmarks.runner import Row

    def res(rows: list[Row], cmd: str) -> dict:
        return {"stem": "cpu-infer", "commands": [cmd], "overhead": {},
                "rows": [r.__dict__ | {} for r in rows]}

    old = res([Row("mlp", "eager", median_ms=1.0), Row("mlp", "ember-eager", median_ms=2.0)], "a")
    new = res([Row("mlp", "ember-eager", median_ms=3.0), Row("gpt2", "eager", median_ms=4.0)], "b")
    merged = merge_results(old, new)
    got = [(r["model"], r["backend"], r["median_ms"]) for r in merged["rows"]]
    assert got == [("mlp", "eager", 1.0), ("mlp", "ember-eager", 3.0), ("gpt2", "eager", 4.0)]
    assert merged["commands"] == ["a", "b"]

    old = res([Row("mlp", "eager"), Row("mlp", "torch-inductor"), Row("gpt2", "eager"),
               Row("gpt2", "torch-inductor")], "a")
    new = res([Row("mlp", "ember-inductor"), Row("gpt2", "ember-inductor")], "c")
    got = [(r["model"], r["backend"]) for r in merge_results(old, new)["rows"]]
    assert got == [("mlp", "eager"), ("mlp", "ember-inductor"), ("mlp", "torch-inductor"),
                   ("gpt2", "eager"), ("gpt2", "ember-inductor"), ("gpt2", "torch-inductor")]


def test_isa_suffix_builds_for_that_isa(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ember-inductor+x86-64-v3`` is Ember's inductor with ``options={"cpu_isa": ...}``."""
    import ember

    from benchmarks import backends

    seen: list[dict] = []
    monkeypatch.setattr(ember, "compile", lambda fn, **kw: seen.append(kw) or fn)
    assert backends._family("ember-inductor+x86-64-v3") == ("ember", "inductor")
    backends.make_compiled("ember-inductor+x86-64-v3", lambda x: x)
    backends.make_compiled("ember-inductor", lambda x: x)
    assert seen[0]["options"] == {"cpu_isa": "x86-64-v3"} and seen[0]["backend"] == "inductor"
    assert seen[1]["options"] is None
    with pytest.raises(SystemExit, match="cpu_isa"):
        backends.make_compiled("torch-inductor+x86-64-v3", lambda x: x)


def test_summary_pairs_each_ember_build_with_the_peer(tmp_path: Path) -> None:
    import json

    from benchmarks.summary import summarize

    def row(model: str, backend: str, ms: float, acc: str = "pass") -> dict:
        return {"model": model, "backend": backend, "status": "ok", "accuracy": acc,
                "median_ms": ms, "speedup": 10.0 / ms, "cold_compile_s": 1.0,
                "warm_compile_s": None}

    rows = [row("a", "eager", 10), row("a", "ember-inductor", 5), row("a", "torch-inductor", 8),
            row("a", "ember-inductor+x86-64-v3", 20),
            row("b", "eager", 10), row("b", "ember-inductor", 10, "FAIL"),
            row("b", "torch-inductor", 10), row("b", "ember-inductor+x86-64-v3", 10)]
    res = {"rows": rows, "commands": ["python -m benchmarks run"], "machine": {"cpu": "X"}}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(res))
    md = summarize(p, None)
    assert "**ember-inductor** against **torch-inductor**" in md
    assert "| a | 10.00 | 2.00× | 1.25× | 1.60 |" in md
    assert "| b | 10.00 | — (ok) | 1.00× | — |" in md  # a failed accuracy does not count
    assert "| **geomean** | | **2.00×** | **1.25×** | **1.60** |" in md
    assert "Below 0.95× eager: a inference 0.50×." in md  # the AVX2 build's slow model
