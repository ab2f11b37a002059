"""A module-level global of the user's code bound to one of torch's objects (a function, a
dtype, a device, torch's modules, a class) and rebound later makes the compiled function
recompile, in this process and in a later one (persisted captures check the same guards):
found by the OpInfo sweep with int64 samples (``zeros(..., dtype=c1)`` replayed a float32
graph). Globals of torch's own modules (``F`` in torch.nn.modules.linear) stay unguarded."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import ember


def _module(src: str) -> types.ModuleType:
    """A fresh user module holding ``src`` (its own globals dict)."""
    mod = types.ModuleType(f"user_globals_{abs(hash(src))}")
    exec(compile(src, mod.__name__, "exec"), mod.__dict__)  # noqa: S102
    sys.modules[mod.__name__] = mod
    return mod


CASES = {
    "function": ("ACT = torch.relu\ndef f(x):\n    return ACT(x) * 2\n",
                 "ACT", torch.tanh),
    "dtype_of_a_factory": ("DT = torch.float32\ndef f(x):\n"
                           "    return x + torch.zeros(x.shape, dtype=DT)\n",
                           "DT", torch.float64),
    "dtype_of_a_cast": ("DT = torch.float32\ndef f(x):\n    return x.to(DT) + 1\n",
                        "DT", torch.int64),
    "torch_module_alias": ("import torch.nn.functional as F\nNS = F\ndef f(x):\n"
                           "    return NS.softplus(x)\n", "NS", torch.special),
    "class": ("import torch\nNORM = torch.nn.LayerNorm\ndef f(x):\n"
              "    return NORM(3, elementwise_affine=False)(x)\n", "NORM", torch.nn.Identity),
}


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rebinding_a_global_recompiles(case, backend):
    src, name, new = CASES[case]
    mod = _module("import torch\n" + src)
    ember.reset()
    cf = ember.compile(mod.f, backend=backend)
    x = torch.tensor([[-1.5, 0.25, 2.0]])
    if case == "torch_module_alias":
        x = torch.tensor([[-1.5, 0.25, 2.0]])
        new = types.SimpleNamespace(softplus=torch.sigmoid)  # same name, another function
    torch.testing.assert_close(cf(x), mod.f(x))
    setattr(mod, name, new)
    want = mod.f(x)
    got = cf(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


def test_torch_internal_globals_are_not_guarded():
    """nn.Linear's forward reads ``F`` from torch.nn.modules.linear: no guard on it."""
    ember.reset()
    lin = torch.nn.Linear(3, 2)
    cf = ember.compile(lin, backend="aot_eager")
    with torch.no_grad():
        cf(torch.randn(4, 3))
    guards = "\n".join(str(g) for g in ember.last_capture().guards)
    assert "['F']" not in guards, guards


def test_persisted_capture_sees_the_rebound_global(tmp_path, py):
    """A later process with another value of the global gets its own graph, not the stored one."""
    code = r"""
import os, torch, ember
DT = getattr(torch, os.environ["DT"])
def f():
    return torch.zeros((4,), dtype=DT)
print("DTYPE", ember.compile(f, backend="inductor")().dtype)
"""
    for dt in ("float32", "int64", "float32"):
        r = py(code, env={"EMBER_CACHE_DIR": str(tmp_path), "DT": dt})
        assert f"DTYPE torch.{dt}" in r.stdout, r.stdout + r.stderr[-2000:]
