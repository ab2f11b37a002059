"""Global module hooks (``torch.nn.modules.module.register_module_forward_hook`` and the pre-hook
variant) run on every module call in eager, the compiled root module included, exactly once;
registered or removed after compiling, the next call follows. Hooks on the OptimizedModule
wrapper itself run once too."""

from __future__ import annotations

import pytest
import torch
from torch.nn.modules import module as mm

import ember


class B(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) + 1


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.b = B()
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.act(self.b(x)) * 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_global_hooks_added_and_removed_after_compiling(backend):
    torch.manual_seed(0)
    m = M()
    x = torch.rand(2, 4) + 1
    c = ember.compile(m, backend=backend)
    torch.testing.assert_close(c(x), m(x))
    for register, hook in [(mm.register_module_forward_hook, lambda mod, i, o: o * 1.5),
                           (mm.register_module_forward_pre_hook, lambda mod, i: (i[0] - 0.25,))]:
        h = register(hook)
        try:
            torch.testing.assert_close(c(x), m(x))
            torch.testing.assert_close(c(x), m(x))
        finally:
            h.remove()
        torch.testing.assert_close(c(x), m(x))


def test_hook_on_the_wrapper_runs_once():
    m = M()
    x = torch.rand(2, 4)
    c = ember.compile(m, backend="eager")
    calls = []
    h = c.register_forward_hook(lambda mod, i, o: calls.append(1) or o + 3)
    try:
        torch.testing.assert_close(c(x), m(x) + 3)
        assert len(calls) == 1
    finally:
        h.remove()
