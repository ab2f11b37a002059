"""Shared by the precompile tests and the load-time measurement: the functions precompiled for
zoo models, and a child-process entry point that loads artifacts in a fresh interpreter and
compares them with eager (run as ``python tests/precompile/pc_cases.py SPEC.json``)."""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def infer(model: Any, x: Any) -> Any:
    """Inference step: the model's output (Hugging Face models return a plain tuple)."""
    out = model(x)
    if hasattr(model, "config"):  # a transformers ModelOutput: its tensor fields, as a tuple
        return tuple(getattr(out, k) for k in _HF_FIELDS if getattr(out, k, None) is not None)
    return out


def train_loss(model: Any, x: Any) -> Any:
    """Training step as a precompiled artifact: the loss is returned, backward() is the
    caller's (a backward() call inside the function is a graph break)."""
    out = infer(model, x)
    outs = out if isinstance(out, tuple) else (out,)
    return sum(t.float().mean() for t in outs if t.is_floating_point())


def train_step(model: Any, x: Any) -> Any:
    """Training step with backward() inside: the artifact replays it, grads land in .grad."""
    loss = train_loss(model, x)
    loss.backward()
    return loss


_HF_FIELDS = ("logits", "last_hidden_state", "pooler_output")
FUNCS = {"infer": infer, "train": train_loss, "step": train_step}
#: modes whose function needs gradients (precompiled and called with grad mode on)
GRAD_MODES = ("train", "step")


def build(model: str) -> tuple[Any, tuple]:
    """A zoo model and its inputs: CPU "small" sizes, or ``PC_DEVICE=cuda`` ("full" sizes)."""
    sys.path.insert(0, ROOT)
    from benchmarks.zoo import get_spec

    device = os.environ.get("PC_DEVICE", "cpu")
    return get_spec(model).build(device, "small" if device == "cpu" else "full")


def perturb(model: Any, seed: int) -> None:
    """New weights, same architecture: results must follow the model passed at run time."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=g).to(p.device, p.dtype) * 0.05)


def _flat(x: Any) -> list:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _flat(v)]
    return []


def max_diff(a: Any, b: Any) -> float:
    fa, fb = _flat(a), _flat(b)
    assert len(fa) == len(fb), (len(fa), len(fb))
    return max([(x.double() - y.double()).abs().max().item() if x.numel() else 0.0
                for x, y in zip(fa, fb)] + [0.0])


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """Load one artifact and compare with eager on the same (perturbed) weights."""
    import torch

    import ember.precompile

    t0 = time.perf_counter()
    model, inputs = build(case["model"])
    if case.get("seed") is not None:
        perturb(model, case["seed"])
    ref_model = copy.deepcopy(model)
    fn = FUNCS[case["mode"]]
    res: dict[str, Any] = {"build_s": time.perf_counter() - t0}
    if case.get("build_dir"):  # inductor's on-disk build cache for this case (starts empty)
        os.environ["EMBER_CACHE_DIR"] = case["build_dir"]
    t1 = time.perf_counter()
    if case.get("no_cache"):  # the source alone: the backend builds everything from it
        with open(os.path.join(case["dir"], "artifact.py")) as f:
            loaded = ember.precompile.load(source=f.read())
    else:
        loaded = ember.precompile.load(case["dir"])
    if case["mode"] == "infer":
        with torch.no_grad():
            out = loaded(model, *inputs)
            res["first_result_s"] = time.perf_counter() - t1
            ref = fn(ref_model, *inputs)
        res["max_diff"] = max_diff(out, ref)
    else:
        out = loaded(model, *inputs)
        if case["mode"] == "train":  # the caller runs backward (for "step" the artifact does)
            out.backward()
        res["first_result_s"] = time.perf_counter() - t1
        ref = fn(ref_model, *inputs)
        if case["mode"] == "train":
            ref.backward()
        res["max_diff"] = max_diff(out, ref)
        grads = [(n, p.grad, q.grad) for (n, p), q in zip(model.named_parameters(),
                                                          ref_model.parameters())]
        missing = [n for n, a, b in grads if (a is None) != (b is None)]
        res["grad_missing"] = missing
        res["grad_max_diff"] = max([max_diff(a, b) for _, a, b in grads
                                    if a is not None and b is not None] + [0.0])
        res["grad_max_abs"] = max([b.abs().max().item() for _, _, b in grads
                                   if b is not None] + [0.0])
    res["used_cache"] = loaded.used_cache
    if case.get("build_dir"):
        res["built_files"] = sum(len(f) for _, _, f in os.walk(case["build_dir"]))
    res["imported_capture"] = any(m in sys.modules for m in (
        "ember.capture.interpreter", "ember.capture.convert", "ember.aot.trace"))
    return res


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    results = [run_case(c) for c in spec["cases"]]
    print("RESULTS " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
