"""An exception the traced code raises and does not catch (found on Hugging Face's longt5: its
encoder builds a default mask only ``if attention_mask is None and not
is_torchdynamo_compiling()``, then reads ``attention_mask.shape``). Breaking the graph at the
raising instruction raised the AttributeError for real, an error eager never gives; as
torch.compile does, the frame now runs as Python, with the modules it calls compiled."""

from __future__ import annotations

import pytest
import torch

import ember


def _rows(m: torch.Tensor) -> int:
    return m.shape[0]


def _default_mask_only_eagerly(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    if mask is None and not torch.compiler.is_compiling():
        mask = torch.ones(3)
    return x * _rows(mask)


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = _Layer()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None and not torch.compiler.is_compiling():
            mask = torch.ones(x.shape[0], 1)
        return self.layer(x) * _rows(mask)


@pytest.fixture(autouse=True)
def _raise_errors():
    with ember.config.patch(suppress_errors=False):  # a fallback would hide the failure
        ember.reset()
        yield
    ember.reset()


def test_function_runs_as_python() -> None:
    x = torch.randn(3)
    out = ember.compile(_default_mask_only_eagerly, backend="eager")(x)
    torch.testing.assert_close(out, _default_mask_only_eagerly(x))
    assert ember.events.counters["stats"]["skipped_frames"] == 1


def test_module_called_from_the_skipped_frame_is_compiled() -> None:
    model = _Model()
    x = torch.randn(2, 4)
    out = ember.compile(model, backend="eager")(x)
    torch.testing.assert_close(out, model(x))
    assert ember.events.counters["stats"]["skipped_frames"] == 1
    assert ember.events.counters["stats"]["graphs"] == 1  # _Layer


def test_caught_raise_is_still_traced() -> None:
    def f(x: torch.Tensor, m: object = None) -> torch.Tensor:
        try:
            n = m.shape[0]
        except AttributeError:
            n = 5
        return x * n

    x = torch.randn(3)
    torch.testing.assert_close(ember.compile(f, backend="eager")(x), x * 5)
    assert ember.events.counters["stats"]["graphs"] == 1
    assert ember.events.counters["stats"].get("skipped_frames", 0) == 0


def test_a_real_error_is_still_the_users() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if y.shape[0] == 3:
            raise ValueError("three")
        return y

    with pytest.raises(ValueError, match="three"):
        ember.compile(f, backend="eager")(torch.randn(3))
