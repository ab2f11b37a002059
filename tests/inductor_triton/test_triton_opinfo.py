"""An OpInfo subset through the Triton target (first float32 sample of each op, outputs and input
gradients vs eager; tests/opinfo/sweep.py's rules). Compilation errors raise here instead of
falling back to eager, so a Triton codegen failure is an error, not a silent fallback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ember

from triton_util import DEVICE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "opinfo"))

import sweep  # noqa: E402

SUBSET = ["abs", "add", "addcmul", "clamp", "div.no_rounding_mode", "div.floor_rounding",
          "exp", "remainder", "fmod", "lerp", "logsumexp", "amax", "argmax", "argmin", "sum",
          "mean", "var_mean", "softmax", "log_softmax", "nn.functional.layer_norm",
          "nn.functional.gelu", "where", "cat", "gather", "index_select",
          "nn.functional.embedding", "nn.functional.pad.constant", "sigmoid", "tanh", "std",
          "prod", "rsqrt", "maximum", "logical_and", "nn.functional.silu",
          "nn.functional.logsigmoid", "nn.functional.multilabel_soft_margin_loss"]
OK = {"right", "random", "skip"}


def _backend(gm, example_inputs, **options):
    from ember_inductor import compile_inductor

    return compile_inductor(gm, example_inputs, cpu_codegen="triton", **options)


def _decompositions():
    from ember_inductor.decompositions import decompositions

    return decompositions()


ember.register_backend("inductor_triton_interp", _backend, level="aten",
                       decompositions=_decompositions, override=True)

sweep.DEVICE = DEVICE  # the samples are made where the Triton target runs
OPS = {sweep.op_key(op): op for op in sweep.selected_ops()}


@pytest.mark.parametrize("key", SUBSET)
def test_opinfo_subset(key):
    if key not in OPS:
        pytest.fail(f"{key} is not an OpInfo of this torch (known: {sorted(OPS)[:5]}...)")
    bad = []
    with ember.config.patch(suppress_errors=False):
        for case in sweep.cases_for(OPS[key], 1):
            r = sweep.run_ember(case, "inductor_triton_interp", time_limit=120)
            if r.status not in OK:
                bad.append(f"{case.key}: {r.status}: {r.reason}")
    assert not bad, "\n".join(bad)
