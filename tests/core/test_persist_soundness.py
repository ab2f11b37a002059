"""Persisted captures are sound: a capture stored by one process and found by a later one whose
model, code, arguments or global state differ is a miss (or is rebuilt with guards that hold),
never a stale graph. Every case compares the compiled result with eager's in a fresh process.

One process fills the cache with the baseline model's capture. A second process applies each
change in turn to a fresh model instance (undoing global ones after), with saving turned off so
that every case is checked against the baseline's stored capture, and ``ember.reset()`` between
cases; a control case at the start and the end must hit. Edits of the model's and of a helper
module's source files each run in a process of their own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, *, env: dict[str, str], pythonpath: list[Path],
               args: list[str] = ()) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (no EMBER_* settings of ours), ``pythonpath`` first."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join([str(p) for p in pythonpath] +
                                         ([full["PYTHONPATH"]] if full.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, "-c", code, *args], env=full, capture_output=True,
                          text=True, timeout=600, cwd=str(ROOT))

HELPER = '''
import torch

K = 2.0


def act(x, slope=0.5):
    return torch.nn.functional.leaky_relu(x, slope) * K


def make_scaler(k):
    def scaler(x):
        return x * k
    return scaler


def other_act(x, slope=0.5):
    return torch.tanh(x) * K
'''

MODEL = '''
import os
import torch
import pm_helper
from pm_helper import act

SCALE = 2.0
FLAG = True


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.alpha = 0.5
        self.use = True
        self.n = 2

    def forward(self, x):
        y = self.fc(x)
        if self.use:
            y = y * self.alpha
        if self.training:
            y = y + 1
        for _ in range(self.n):
            y = y + 0.25
        return act(y)


class Model(torch.nn.Module):
    def __init__(self, tie=False):
        super().__init__()
        self.blk = Block()
        self.out = torch.nn.Linear(8, 8)
        if tie:
            self.out.weight = self.blk.fc.weight
        self.act = torch.nn.ReLU()

    def forward(self, x, scale=1.5):
        y = self.out(self.blk(x))
        y = torch.relu(y) + self.act(-y)
        y = y * 3.0 * scale
        return y * SCALE if FLAG else y


def env_fn(x):
    return x * (2.0 if os.environ.get("PM_FLAG") == "1" else 3.0)
'''

# Each case: (name, setup) where setup is Python run before building the call; it may set
# `m` (the model), `x` (the input), `fn` (what is compiled, default m), `grad`, `undo` (code run
# after the case). Names starting with "control" must hit.
CASES = {
    "control": "",
    "attr_float": "m.blk.alpha = 0.25",
    "attr_float_to_int": "m.blk.alpha = 1",
    "attr_bool": "m.blk.use = False",
    "attr_int_loop": "m.blk.n = 3",
    "training_flag": "m.eval()",
    "submodule_training_only": "m.blk.training = False",
    "instance_method": "m.blk.forward = types.MethodType(lambda self, x: self.fc(x) * 7, m.blk)",
    "root_instance_method": "m.forward = types.MethodType(lambda self, x: x * 5, m)",
    "class_method": ("old = pm_model.Block.forward\n"
                     "pm_model.Block.forward = lambda self, x: self.fc(x) * 7\n"
                     "undo = 'pm_model.Block.forward = old'"),
    "root_class_method": ("old = pm_model.Model.forward\n"
                          "def fw(self, x, scale=1.5):\n"
                          "    return old(self, x, scale) + 1\n"
                          "pm_model.Model.forward = fw\n"
                          "undo = 'pm_model.Model.forward = old'"),
    "forward_hook": "m.blk.register_forward_hook(lambda mod, i, o: o * 3)",
    "forward_pre_hook_root": "m.register_forward_pre_hook(lambda mod, i: (i[0] * 3,))",
    "root_defaults": ("pm_model.Model.forward.__defaults__ = (4.0,)\n"
                      "undo = 'pm_model.Model.forward.__defaults__ = (1.5,)'"),
    "helper_defaults": ("pm_helper.act.__defaults__ = (0.1,)\n"
                        "undo = 'pm_helper.act.__defaults__ = (0.5,)'"),
    "submodule_type": "m.act = torch.nn.Tanh()",
    "submodule_same_name_other_class": (
        "m.act.__class__ = type('ReLU', (torch.nn.ReLU,), {'forward': lambda self, x: x * 2, "
        "'__module__': 'torch.nn.modules.activation', '__qualname__': 'ReLU'})"),
    "submodule_subclass_same_code": (
        "m.blk.__class__ = type('Block', (pm_model.Block,), {'__module__': 'pm_model', "
        "'__qualname__': 'Block', 'alpha': 9.0})\n"
        "del m.blk.__dict__['alpha']"),
    "arg_dtype": "m.double(); x = x.double()",
    "arg_shape": "x = torch.randn(5, 8)",
    "arg_strides": "x = torch.randn(8, 4).t()",
    "arg_requires_grad": "x.requires_grad_(True)",
    "grad_mode": "grad = False",
    "param_requires_grad": "m.out.weight.requires_grad_(False)",
    "global_float": "pm_model.SCALE = 3.0\nundo = 'pm_model.SCALE = 2.0'",
    "global_bool": "pm_model.FLAG = False\nundo = 'pm_model.FLAG = True'",
    "global_function_rebound": ("pm_model.act = pm_helper.other_act\n"
                                "undo = 'pm_model.act = pm_helper.act'"),
    "helper_module_global": "pm_helper.K = 5.0\nundo = 'pm_helper.K = 2.0'",
    "torch_function_rebound": ("old = torch.relu\ntorch.relu = torch.tanh\n"
                               "undo = 'torch.relu = old'"),
    "functional_rebound": ("old = torch.nn.functional.leaky_relu\n"
                           "torch.nn.functional.leaky_relu = "
                           "lambda x, s=0.01, inplace=False: torch.tanh(x)\n"
                           "undo = 'torch.nn.functional.leaky_relu = old'"),
    "torch_class_method": ("old = torch.nn.ReLU.forward\n"
                           "torch.nn.ReLU.forward = lambda self, x: torch.sigmoid(x)\n"
                           "undo = 'torch.nn.ReLU.forward = old'"),
    "default_dtype": ("torch.set_default_dtype(torch.float64)\n"
                      "undo = 'torch.set_default_dtype(torch.float32)'"),
    "ember_disable": ("ember.disable(pm_helper.act, recursive=False)\n"
                      "undo = 'ember.reset(); frame._disabled.clear()'"),
    "backend_options": "options = {'mode': 'max-autotune'}",
    "torch_version": ("old = torch.__version__\ntorch.__version__ = '0.0.1'\n"
                      "undo = 'torch.__version__ = old'"),
    "closure_value": "fn = pm_helper.make_scaler(5.0)",
    "closure_int_to_bool": "fn = pm_helper.make_scaler(True)",
    "env_dependent_code": "os.environ['PM_FLAG'] = '1'; fn = pm_model.env_fn\n"
                          "undo = 'del os.environ[\"PM_FLAG\"]'",
    "control_end": "",
}

# the baseline: the model, a closure made with k=1, a function reading os.environ
BASELINE = '''
import json, torch, ember
from ember.capture import persist
import pm_model, pm_helper
torch.manual_seed(0)
x = torch.randn(4, 8)
for f in (pm_model.Model(), pm_helper.make_scaler(1), pm_model.env_fn):
    ember.compile(f, backend="aot_eager")(x)
print(json.dumps(persist.counters))
'''

SCENARIOS = '''
import json, os, sys, types
import torch, ember
from ember.capture import frame, persist
import pm_model, pm_helper
persist.save = lambda *a, **k: None  # every case is checked against the baseline's capture
cases = json.loads(sys.argv[1])
report = {}
for name, setup in cases.items():
    ember.reset()
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    m = pm_model.Model()
    fn = None
    grad = True
    options = None
    undo = ""
    exec(setup)
    fn = m if fn is None else fn
    before = dict(persist.counters)
    with torch.set_grad_enabled(grad):
        ref = fn(x)
        out = ember.compile(fn, backend="aot_eager", options=options)(x)
    exec(undo)
    same = out.dtype == ref.dtype and torch.allclose(out.detach(), ref.detach(), atol=1e-6)
    report[name] = {"ok": bool(same),
                    "hits": persist.counters["hits"] - before["hits"],
                    "misses": persist.counters["misses"] - before["misses"]}
print(json.dumps(report))
'''


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("persist-soundness")
    src = root / "src"
    src.mkdir()
    (src / "pm_model.py").write_text(MODEL)
    (src / "pm_helper.py").write_text(HELPER)
    cache = root / "cache"
    r = run_python(BASELINE, env={"EMBER_CACHE_DIR": str(cache)}, pythonpath=[src])
    assert r.returncode == 0, r.stderr
    counters = json.loads(r.stdout.strip().splitlines()[-1])
    # the captures are persisted, except the one that reads os.environ (refused)
    assert counters["saved"] == 2 and counters["refused"] == 1, counters
    return {"root": root, "src": src, "cache": cache}


def _scenarios(baseline: dict[str, Path], cases: dict[str, str], tag: str,
               src: Path | None = None) -> dict[str, Any]:
    cache = baseline["root"] / f"cache-{tag}"
    shutil.copytree(baseline["cache"], cache)
    r = run_python(SCENARIOS, env={"EMBER_CACHE_DIR": str(cache)},
                   pythonpath=[src or baseline["src"]], args=[json.dumps(cases)])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_change_gives_eagers_result(baseline: dict[str, Path]) -> None:
    report = _scenarios(baseline, CASES, "all")
    assert set(report) == set(CASES)
    wrong = {k: v for k, v in report.items() if not v["ok"]}
    assert not wrong, wrong
    # the harness reaches the stored captures: the controls (and the closure made with the
    # same value) are rebuilt without tracing
    assert report["control"]["hits"] == 1 and report["control_end"]["hits"] == 1, report
    # changes that alter the result must not have been served by the stored capture
    stale = {k: v for k, v in report.items()
             if not k.startswith("control") and v["hits"]}
    assert not stale, stale


def test_closure_with_the_same_value_hits(baseline: dict[str, Path]) -> None:
    report = _scenarios(baseline, {"closure_same": "fn = pm_helper.make_scaler(1)"}, "closure")
    assert report["closure_same"] == {"ok": True, "hits": 1, "misses": 0}


def test_tied_and_untied_weights(baseline: dict[str, Path], tmp_path: Path) -> None:
    """A capture of a model with tied weights (one graph input for both uses) loaded for an
    untied one must miss; the other way round, each use reads its own path and may hit."""
    cache = tmp_path / "tied"
    code = BASELINE.replace("for f in (pm_model.Model(), pm_helper.make_scaler(1), "
                            "pm_model.env_fn):",
                            "for f in (pm_model.Model(tie=True),):")
    assert code != BASELINE
    r = run_python(code, env={"EMBER_CACHE_DIR": str(cache)}, pythonpath=[baseline["src"]])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["saved"] == 1
    report = _scenarios({"root": tmp_path, "cache": cache, "src": baseline["src"]},
                        {"control_tied": "m = pm_model.Model(tie=True)", "untied": ""}, "t")
    assert report["control_tied"] == {"ok": True, "hits": 1, "misses": 0}
    assert report["untied"] == {"ok": True, "hits": 0, "misses": 1}


@pytest.mark.parametrize("edit", ["model", "helper"])
def test_source_edits_are_misses(baseline: dict[str, Path], edit: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(baseline["src"], src)
    if edit == "model":  # the model's own file: a different residual
        (src / "pm_model.py").write_text(MODEL.replace("y * 3.0 * scale", "y * 2.0 * scale"))
    else:  # a function the forward inlines, from another user module
        (src / "pm_helper.py").write_text(HELPER.replace("leaky_relu(x, slope) * K",
                                                         "leaky_relu(x, slope) * K + 1"))
    report = _scenarios(baseline, {"edited": ""}, f"edit-{edit}", src=src)
    assert report["edited"] == {"ok": True, "hits": 0, "misses": 1}
