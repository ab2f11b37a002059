"""The Hugging Face corpus: every architecture in tests/hf/models.py, in eval (through
``ember.compile(model, backend="eager")``; a family sample also through ``"aot_eager"``) and in
train (``backend="aot_eager"``), compared with eager (outputs and, in train, every parameter's
gradient; benchmarks/accuracy.py's rule) and with torch.compile's graph count.

torch.compile's counts come from tests/hf/oracle.json (regenerate with
``python -m tests.hf.regen_oracle`` after changing a model or upgrading torch/transformers), so
the suite does not run torch.compile. A model passes when Ember does not fall back to eager, its
results match, and it captures no more graphs than torch.compile (break counts are reported, not
compared: see _check).

Known gaps are listed in ``KNOWN_GAPS`` with their reason (the same table is in docs/capture.md)
and marked ``xfail(strict=True)``: a fix makes the test pass and the strict xfail fail, so the
entry is removed when the gap closes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from . import harness, models

pytest.importorskip("transformers")

#: (name, mode) -> why Ember does not yet run it as torch.compile does. Keep in sync with the
#: table in docs/capture.md (test_known_gaps_are_documented checks).
KNOWN_GAPS: dict[tuple[str, str], str] = {}


def _transformers_version() -> tuple[int, ...]:
    try:
        import transformers
    except Exception:
        return (0,)
    return tuple(int(p) for p in re.findall(r"\d+", transformers.__version__)[:2])


#: Gaps only with some transformers versions: (name, mode) -> (applies?, why). Documented in the
#: same docs/capture.md table. (mixtral, qwen2_moe and olmoe training with transformers 5.17,
#: whose grouped-matmul fallback has an untraceable Python backward, are no longer gaps: that
#: backward runs as one opaque op, ember/aot/opaque.py.)
VERSION_GAPS: dict[tuple[str, str], tuple[bool, str]] = {}
for _key, (_applies, _why) in VERSION_GAPS.items():
    if _applies:
        KNOWN_GAPS[_key] = _why

ORACLE = harness.load_oracle()
CASES = [(n, m) for n in models.SPECS for m in ("eval", "train")]
#: eval runs on the eager backend (capture alone decides graphs, breaks and fallbacks); train
#: on aot_eager (AOT autograd's forward and backward graphs, gradients compared). These also run
#: eval through aot_eager, one architecture per family, to keep the suite to a few minutes.
AOT_EVAL = ("gpt2", "bert", "t5", "vit", "wav2vec2", "clip", "mixtral", "mamba")

_REPORT: list[tuple[str, ...]] = []


def _check(name: str, mode: str, backend: str) -> None:
    oracle = ORACLE.get(name, {}).get(mode)
    assert oracle and "graphs" in oracle, (
        f"no torch.compile count for {name}/{mode} in oracle.json: run "
        "python -m tests.hf.regen_oracle " + name)
    r = harness.run_ember(name, mode, backend)
    _REPORT.append((name, mode, backend, str(r.graphs), str(oracle["graphs"]), str(r.breaks),
                    str(oracle["breaks"]), "fallback" if r.fallbacks else (r.error or r.accuracy)))
    detail = (f"\nbreaks: {list(r.break_reasons)}\nfallbacks: {list(r.fallback_reasons)}")
    assert not r.error, f"{name}/{mode}: {r.error}{detail}"
    assert r.fallbacks == 0, f"{name}/{mode}: Ember ran a frame eagerly{detail}"
    assert r.accuracy.startswith("pass"), f"{name}/{mode}: {r.accuracy}"
    # Graphs are compared; break counts are reported only: Ember counts a break once per
    # frame it splits (each decorator wrapper around a forward is a frame), torch.compile
    # counts differently, so the numbers are not on one scale.
    assert r.graphs <= oracle["graphs"], (
        f"{name}/{mode}: Ember {r.graphs} graphs / {r.breaks} breaks, torch.compile "
        f"{oracle['graphs']} / {oracle['breaks']}{detail}")


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_hf(name: str, mode: str, request: pytest.FixtureRequest) -> None:
    gap = KNOWN_GAPS.get((name, mode))
    if gap:
        request.applymarker(pytest.mark.xfail(strict=True, reason=gap))
    _check(name, mode, "eager" if mode == "eval" else "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("name", AOT_EVAL)
def test_hf_eval_aot_eager(name: str) -> None:
    _check(name, "eval", "aot_eager")


def test_corpus_size_and_families() -> None:
    assert len(models.SPECS) >= 50
    families = {s.family for s in models.SPECS.values()}
    assert families >= {"decoder", "encoder", "encdec", "vision", "audio", "multimodal", "moe",
                        "ssm"}


def test_known_gaps_are_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "capture.md").read_text()
    rows = set(re.findall(r"^\| `([\w-]+)` \| (eval|train) \|", doc, re.M))
    documented = set(KNOWN_GAPS) | set(VERSION_GAPS)
    assert rows == documented, (
        "docs/capture.md's table of Hugging Face corpus gaps and KNOWN_GAPS differ: "
        f"only in docs {sorted(rows - documented)}, "
        f"only in tests {sorted(documented - rows)}")


def test_oracle_covers_the_corpus() -> None:
    missing = [n for n in models.SPECS if set(ORACLE.get(n, {})) < {"eval", "train"}]
    assert not missing, f"regenerate oracle.json for {missing}"
