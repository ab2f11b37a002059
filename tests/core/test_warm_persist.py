"""Persisted captures (ember/capture/persist.py, on by default; ``EMBER_PERSIST_CAPTURE=0``): a fresh process whose cache holds the
capture of a model's forward rebuilds it without tracing (no FakeTensorMode, so torch._dynamo is
never imported), and misses (then captures as usual, with correct results) when the model's
code, a global it reads, a helper module, or its submodules changed between processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

MODEL = '''
import os
import torch
import warm_helper

SCALE = float(os.environ.get("WARM_SCALE", "2.0"))


class Block(torch.nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)
        self.norm = torch.nn.LayerNorm(d)

    @warm_helper.decorated  # a wrapper whose closure holds the function it wraps
    def forward(self, x, scale=1.0):
        return x + self.fc2(warm_helper.act(self.fc1(self.norm(x)))) * scale


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        d, h = 16, int(os.environ.get("WARM_H", "32"))
        n = int(os.environ.get("WARM_N", "2"))
        self.blocks = torch.nn.Sequential(*[Block(d, h) for _ in range(n)])
        self.register_buffer("offset", torch.full((d,), 0.5))

    def forward(self, x):
        return self.blocks(x) * SCALE + self.offset
'''

HELPER = '''
import functools
import torch


def act(x):
    return torch.nn.functional.gelu(x)


def decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper
'''

RUN = '''
import json, os, sys
import torch, ember
from ember.aot import cache
from ember.capture import persist
import warm_model
torch.manual_seed(0)
m = warm_model.Model().eval()
x = torch.randn(4, 16)
with torch.no_grad():
    ref = m(x)
    out = ember.compile(m, backend="aot_eager")(x)
print(json.dumps({"persist": persist.counters, "aot": cache.counters,
                  "dynamo": "torch._dynamo" in sys.modules,
                  "ok": bool(torch.allclose(out, ref, atol=1e-5))}))
'''


@pytest.fixture
def warm(tmp_path: Path, py: Any) -> Any:
    src = tmp_path / "src"
    src.mkdir()
    (src / "warm_model.py").write_text(MODEL)
    (src / "warm_helper.py").write_text(HELPER)

    def run(**env: str | None) -> dict[str, Any]:
        full = {"EMBER_CACHE_DIR": str(tmp_path / "cache"), "EMBER_PERSIST_CAPTURE": "1", **env}
        full = {k: v for k, v in full.items() if v is not None}  # None: leave it unset
        r = py(RUN, env=full, pythonpath=[src])
        assert r.returncode == 0, r.stderr
        ans = json.loads(r.stdout.strip().splitlines()[-1])
        assert ans["ok"], ans  # whatever happened, the result is eager's
        return ans

    run.src = src  # type: ignore[attr-defined]
    return run


def test_a_fresh_process_reuses_the_capture_without_tracing(warm: Any) -> None:
    first = warm()
    assert first["persist"]["saved"] == 1 and first["persist"]["hits"] == 0
    second = warm()
    assert second["persist"]["hits"] == 1 and second["persist"]["misses"] == 0
    assert second["aot"]["hits"] == 1
    assert second["dynamo"] is False  # no FakeTensorMode was created


def test_changes_between_processes_are_misses(warm: Any) -> None:
    warm()
    assert warm()["persist"]["hits"] == 1
    src = warm.src
    # a global's value (the file is unchanged: the entry's own value guard fails)
    assert warm(WARM_SCALE="3.0")["persist"]["hits"] == 0
    # submodules: another hidden width (parameter metadata), another depth
    assert warm(WARM_H="8")["persist"]["hits"] == 0
    assert warm(WARM_N="3")["persist"]["hits"] == 0
    # the model's code
    (src / "warm_model.py").write_text(MODEL.replace("* SCALE + self.offset",
                                                     "* SCALE - self.offset"))
    changed = warm()
    assert changed["persist"]["hits"] == 0 and changed["persist"]["saved"] == 1
    assert warm()["persist"]["hits"] == 1  # the new capture is stored and reused
    # a helper in another module that the forward inlines
    (src / "warm_helper.py").write_text(HELPER.replace("gelu(x)", "relu(x)"))
    assert warm()["persist"]["hits"] == 0


def test_on_by_default_and_off_with_the_environment_variable(warm: Any) -> None:
    off = warm(EMBER_PERSIST_CAPTURE="0")
    assert off["persist"] == {"hits": 0, "saved": 0, "misses": 0, "refused": 0}
    off = warm(EMBER_PERSIST_CAPTURE="0")
    assert off["persist"] == {"hits": 0, "saved": 0, "misses": 0, "refused": 0}
    assert off["dynamo"] is True
    default = warm(EMBER_PERSIST_CAPTURE=None)  # not set: on
    assert default["persist"]["saved"] == 1
    default = warm(EMBER_PERSIST_CAPTURE=None)
    assert default["persist"]["hits"] == 1 and default["dynamo"] is False



REGISTRY_HELPER = '''
import functools

# a module-level registry read by a decorator's wrapper (Hugging Face transformers 5.17's
# ``_CAN_RECORD_REGISTRY``: ``str(model class)`` -> ``_can_record_outputs``, output names mapped
# to layer classes)
_REGISTRY = {}


def record(fn):
    @functools.wraps(fn)
    def wrapper(self, x, **kwargs):
        flags = _REGISTRY.get(str(self.__class__)) or {}
        wanted = {k: [] for k in flags if kwargs.get(f"output_{k}", False)}
        out = fn(self, x)
        return out + len(wanted)
    return wrapper
'''

REGISTRY_MODEL = '''
import os
import torch
import reg_helper


class Gate(torch.nn.Module):
    def forward(self, x):
        return torch.sigmoid(x) * x


class Model(torch.nn.Module):
    _record = {"hidden": torch.nn.Linear,
               "gate": Gate if os.environ.get("WARM_GATE", "gate") == "gate" else torch.nn.ReLU}

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.act = Gate()
        reg_helper._REGISTRY[str(self.__class__)] = self._record

    @reg_helper.record
    def forward(self, x, **kwargs):
        y = self.fc(x)
        for name, cls in reg_helper._REGISTRY[str(self.__class__)].items():
            if name == "gate" and isinstance(self.act, cls):
                y = self.act(y)
        return y + 1
'''


def test_a_registry_global_of_a_helper_module_is_persisted_and_checked(tmp_path: Path, py: Any
                                                                        ) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "warm_model.py").write_text(REGISTRY_MODEL)
    (src / "reg_helper.py").write_text(REGISTRY_HELPER)

    def run(**env: str) -> dict[str, Any]:
        r = py(RUN, env={"EMBER_CACHE_DIR": str(tmp_path / "cache"), "EMBER_PERSIST_CAPTURE": "1",
                         **env}, pythonpath=[src])
        assert r.returncode == 0, r.stderr
        ans = json.loads(r.stdout.strip().splitlines()[-1])
        assert ans["ok"], ans
        return ans

    first = run()
    assert first["persist"]["saved"] == 1 and first["persist"]["refused"] == 0
    second = run()
    assert second["persist"]["hits"] == 1 and second["dynamo"] is False
    # the registry maps "gate" to another class: the stored capture does not apply
    other = run(WARM_GATE="relu")
    assert other["persist"]["hits"] == 0


def test_a_dict_of_classes_bound_to_a_helper_modules_global_is_resolved_live(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What transformers 5.17's BERT needs (its captures were refused: "namespace dict"): a
    dict that is not plain data (layer classes as values), bound to a global of the module whose
    wrapper the capture ran, is named by that global and resolved to the live object on load."""
    import importlib
    import sys

    from ember.capture import persist

    (tmp_path / "reg_mod.py").write_text(REGISTRY_HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("reg_mod")
    try:
        mod._REGISTRY["M"] = {"hidden": torch.nn.Linear}
        wrapper = mod.record(lambda self, x: x)
        finder = persist._Finder(wrapper, {})
        recipe = finder.recipe("___dict_13", mod._REGISTRY)
        assert recipe[:3] == ["modglobal", "reg_mod", "_REGISTRY"]
        assert persist._resolve(recipe, wrapper, {}, finder.files) is mod._REGISTRY
        with pytest.raises(persist._Refuse):  # not plain data: never snapshotted
            persist._enc_plain(mod._REGISTRY)
    finally:
        sys.modules.pop("reg_mod", None)
