"""The wide performance corpus (benchmarks/corpus.py, ``--corpus wide``): at least 15 distinct
graphs, selectable by the runner, each building at its CPU size and running an inference and a
training step eagerly (whose results the runner's accuracy rule then compares)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import zoo  # noqa: E402
from benchmarks.report import build_result  # noqa: E402
from benchmarks.runner import RunConfig, make_step  # noqa: E402


def test_selection_and_report_name() -> None:
    wide = zoo.default_models("cpu", "wide")
    assert len(wide) >= 15 and len(set(wide)) == len(wide)
    assert not set(wide) & set(zoo.default_models("cpu", "zoo"))
    assert zoo.default_models("cpu", "all") == zoo.default_models("cpu") + wide
    assert {"attn_causal", "trig_chain", "depthwise", "reductions"} <= set(wide)
    cfg = RunConfig(mode="train", corpus="wide", backends=["eager"]).resolve()
    assert cfg.models == wide
    assert build_result([], {}, cfg, [])["stem"] == "cpu-train-wide"


def test_every_model_runs_both_steps() -> None:
    for name in zoo.default_models("cpu", "wide"):
        model, inputs = zoo.get_spec(name).build("cpu", "small")
        for mode in ("infer", "train"):
            model.train(mode == "train")
            out = make_step(mode, model, inputs, "cpu", False)()
            res = zoo.step_result(mode, model, out)
            assert res and all(torch.isfinite(t).all() for t in res
                               if isinstance(t, torch.Tensor)), (name, mode)
            if mode == "train":  # a backward with gradients to compare
                assert len(res) > 1 and all(g is not None for g in res[1:]), name
            model.zero_grad(set_to_none=True)
