"""Inductor training on a sample of the Hugging Face corpus, in CI (issue 19): train mode, one
backward, the outputs and every parameter's gradient compared with eager by the accuracy rule
(float64 past the tolerance: tests/hf/harness.py), no fallback (every graph compiles), and the
NaN-fill debug mode on (runtime/debug_fill.py: no kernel leaves a buffer unwritten, no output or
saved activation holds the fill, every input has the strides its graph was compiled for).

One architecture or two per family (``CI_SAMPLE``), chosen to stay within CI's time: the full
corpus and the held-out architectures run as a script, with their table in docs/inductor.md::

    python -m tests.hf.test_inductor_train            # every corpus architecture, a table
    python -m tests.hf.test_inductor_train --eval     # the same in eval mode (inference)
    TRITON_INTERPRET=1 python -m tests.hf.test_inductor_train --triton   # the Triton target
    python -m tests.hf.test_inductor_train --dynamic  # every size symbolic (dynamic=True)
    EMBER_DEBUG_FILL=1 python -m tests.hf.sweep_heldout run --train inductor   # held-out ones
"""

from __future__ import annotations

import sys
import time

import pytest

from . import harness, models

pytest.importorskip("transformers")

#: decoders (GPT-2, RoPE + GQA, sliding window + soft-capping), encoders (BERT, disentangled
#: attention), encoder-decoders, vision (ViT, BEiT: convolution + relative position bias, ConvNeXt,
#: ResNet: BatchNorm, Swin: windows), audio (wav2vec2: convolutions, Whisper), CLIP (pooled
#: slices saved for the backward), MoE, SSM
CI_SAMPLE = ("gpt2", "llama", "gemma2", "bert", "deberta-v2", "t5", "bart", "vit", "beit",
             "convnext", "resnet", "swin", "wav2vec2", "whisper", "clip", "mixtral", "mamba")


def run(name: str, mode: str = "train", options: dict | None = None,
        dynamic: bool | None = None) -> harness.Result:
    import ember

    with ember.config.patch(debug_fill=True):
        return harness.run_ember(name, mode, "inductor", options, dynamic)


def _check(r: harness.Result) -> None:
    detail = f"\nfallbacks: {list(r.fallback_reasons)}"
    assert not r.error, f"{r.name}/train/inductor: {r.error}{detail}"
    assert r.fallbacks == 0, f"{r.name}/train/inductor: a graph ran eagerly{detail}"
    assert r.accuracy.startswith("pass"), f"{r.name}/train/inductor: {r.accuracy}"


def test_ci_sample_is_in_the_corpus() -> None:
    assert set(CI_SAMPLE) <= set(models.SPECS)
    assert {models.SPECS[n].family for n in CI_SAMPLE} == {s.family for s in models.SPECS.values()}


@pytest.mark.slow
@pytest.mark.parametrize("name", CI_SAMPLE)
def test_inductor_train(name: str) -> None:
    _check(run(name))


def main(names: list[str], mode: str = "train", options: dict | None = None,
         dynamic: bool | None = None) -> int:
    """Every corpus architecture (or ``names``) in ``mode``: one row each, and the count of
    failures. ``options``: of every compile (``--triton``: ``cpu_codegen="triton"``, the Triton
    target under TRITON_INTERPRET=1)."""
    bad = 0
    print("| model | family | graphs | fallbacks | result | seconds |")
    print("| --- | --- | ---: | ---: | --- | ---: |")
    for name in names or list(models.SPECS):
        t0 = time.perf_counter()
        try:
            r = run(name, mode, options, dynamic)
            verdict = r.error or ("fallback: " + "; ".join(r.fallback_reasons)[:120]
                                  if r.fallbacks else r.accuracy)
            ok = r.ok
        except Exception as e:  # noqa: BLE001 - a row, the sweep goes on
            verdict, ok, r = f"crash: {type(e).__name__}: {e}"[:160], False, None
        bad += not ok
        print(f"| {name} | {models.SPECS[name].family} | {r.graphs if r else '-'} | "
              f"{r.fallbacks if r else '-'} | {verdict} | {time.perf_counter() - t0:.1f} |",
              flush=True)
    return bad


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    args = sys.argv[1:]
    mode = "eval" if "--eval" in args else "train"
    opts = {"cpu_codegen": "triton"} if "--triton" in args else None
    dyn = True if "--dynamic" in args else None
    flags = ("--eval", "--triton", "--dynamic")
    sys.exit(1 if main([a for a in args if a not in flags], mode, opts, dyn) else 0)
