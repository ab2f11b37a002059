"""Run one corpus model through eager, Ember and (for the oracle file) torch.compile.

Eval: ``model.eval()`` under ``no_grad``, every floating output compared. Train: ``model.train()``
with every dropout probability, layer drop, router jitter and SpecAugment mask set to zero in the
config (so train mode is deterministic), ``loss_of(outputs).backward()``; the outputs and every
parameter's gradient compared. Comparisons follow benchmarks/accuracy.py (tolerance 1e-3 eval,
1e-2 train; past it, the float64 rule).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.accuracy import compare  # noqa: E402

from . import models  # noqa: E402


def _oracle_path() -> Path:
    """torch.compile's counts differ between torch versions (and the transformers that comes
    with them): ``oracle-<major.minor>.json`` holds another torch's, made on the machine that has
    it (scripts/device_validate.sh); ``oracle.json`` this machine's. EMBER_HF_ORACLE overrides
    (a regen on another torch version, a shard of one)."""
    if os.environ.get("EMBER_HF_ORACLE"):
        return Path(os.environ["EMBER_HF_ORACLE"])
    here = Path(__file__).parent
    versioned = here / f"oracle-{'.'.join(torch.__version__.split('.')[:2])}.json"
    return versioned if versioned.exists() else here / "oracle.json"


ORACLE = _oracle_path()


def _no_randomness(cfg: Any) -> None:
    for key, value in list(vars(cfg).items()):
        low = key.lower()
        if isinstance(value, float) and ("drop" in low or "jitter" in low or "mask_" in low):
            setattr(cfg, key, 0.0)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _no_randomness(value)


#: ``EMBER_HF_DEVICE=cuda`` runs the corpus on a GPU (scripts/gpu_hf_corpus.py); default CPU.
DEVICE = os.environ.get("EMBER_HF_DEVICE", "cpu")


def build(name: str, mode: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model, inputs = models.build(name)
    if DEVICE != "cpu":
        model = model.to(DEVICE)
        inputs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v
                  for k, v in inputs.items()}
    if mode == "train":
        _no_randomness(model.config)
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
            cfg = getattr(m, "config", None)
            if cfg is not None and cfg is not model.config:
                _no_randomness(cfg)
            for attr in ("dropout", "attention_dropout", "layerdrop", "activation_dropout",
                         "hidden_dropout", "jitter_noise", "router_jitter_noise"):
                if isinstance(getattr(m, attr, None), float):
                    setattr(m, attr, 0.0)
        model.train()
    return model, inputs


def _grads(model: torch.nn.Module) -> list[torch.Tensor | None]:
    return [p.grad for _, p in sorted(model.named_parameters())]


def run_once(model: torch.nn.Module, inputs: dict[str, torch.Tensor], mode: str,
             fn: Any = None) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Outputs (floating leaves, detached) and gradients of one call of ``fn or model``."""
    fn = model if fn is None else fn
    model.zero_grad(set_to_none=True)
    if mode == "eval":
        with torch.no_grad():
            out = fn(**inputs)
        return [t.detach().clone() for t in models.float_leaves(out)], []
    out = fn(**inputs)
    models.loss_of(out).backward()
    grads = [None if g is None else g.detach().clone() for g in _grads(model)]
    model.zero_grad(set_to_none=True)
    return [t.detach().clone() for t in models.float_leaves(out)], grads


def _fp64(model: torch.nn.Module, inputs: dict[str, torch.Tensor], mode: str) -> tuple:
    m64 = copy.deepcopy(model).double()
    in64 = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    return run_once(m64, in64, mode)


@dataclasses.dataclass
class Result:
    name: str
    mode: str
    backend: str
    graphs: int = 0
    breaks: int = 0
    fallbacks: int = 0
    accuracy: str = ""
    error: str = ""
    break_reasons: tuple[str, ...] = ()
    fallback_reasons: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.error and self.accuracy.startswith("pass") and self.fallbacks == 0


class _Collect(logging.Handler):
    def __init__(self, out: list[str]):
        super().__init__(logging.INFO)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.name == "ember.fallback" or "eagerly" in msg:
            self.out.append(msg[:400])


def run_ember(name: str, mode: str, backend: str, options: dict | None = None,
              dynamic: bool | None = None) -> Result:
    import ember
    import ember.events

    model, inputs = build(name, mode)
    ref_out, ref_grads = run_once(model, inputs, mode)
    res = Result(name, mode, backend)
    ember.reset()
    reasons: list[str] = []
    handler = _Collect(reasons)
    fallback_log = logging.getLogger("ember.fallback")
    capture_log = logging.getLogger("ember.capture")
    old_level = fallback_log.level
    fallback_log.addHandler(handler)
    capture_log.addHandler(handler)  # warnings that an entry ran eagerly
    fallback_log.setLevel(logging.INFO)
    try:
        compiled = ember.compile(model, backend=backend, options=options, dynamic=dynamic)
        out, grads = run_once(model, inputs, mode, compiled)
    except Exception as e:  # reported, not raised: the corpus lists every failure
        res.error = f"{type(e).__name__}: {str(e)[:300]}"
        return res
    finally:
        fallback_log.removeHandler(handler)
        capture_log.removeHandler(handler)
        fallback_log.setLevel(old_level)
        res.fallback_reasons = tuple(reasons)
        c = ember.events.counters
        res.graphs = c["stats"]["graphs"]
        res.fallbacks = max(c["stats"]["fallbacks"], len(reasons))
        res.breaks = sum(c["graph_breaks"].values())
        res.break_reasons = tuple(sorted(c["graph_breaks"]))
    tol = 1e-3 if mode == "eval" else 1e-2
    fp32, got = ref_out + ref_grads, out + grads
    if len(fp32) != len(got):
        res.accuracy = f"FAIL: {len(got)} outputs, eager has {len(fp32)}"
        return res
    close = all((a is None and b is None) or (a is not None and b is not None
                and a.shape == b.shape and torch.allclose(a, b, rtol=tol, atol=tol))
                for a, b in zip(got, fp32))
    if close:
        res.accuracy = "pass"
        return res
    o64, g64 = _fp64(model, inputs, mode)
    res.accuracy = compare(got, fp32, o64 + g64, tol).how
    return res


def run_torch(name: str, mode: str) -> dict[str, int]:
    """torch.compile(backend=eager)'s graph and break counts on the same call."""
    import torch._dynamo as dynamo

    model, inputs = build(name, mode)
    graphs = 0

    def counting(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        nonlocal graphs
        graphs += 1
        return gm.forward

    dynamo.reset()
    dynamo.utils.counters.clear()
    run_once(model, inputs, mode, torch.compile(model, backend=counting))
    breaks = sum(dynamo.utils.counters["graph_break"].values())
    dynamo.reset()
    return {"graphs": graphs, "breaks": breaks}


def load_oracle() -> dict[str, Any]:
    return json.loads(ORACLE.read_text()) if ORACLE.exists() else {}
