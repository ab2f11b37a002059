"""Snapshot ("process replay") tests of generated code: the wrapper (which embeds the C++) for a
few small graphs must match the golden files in ``snapshots/``. After an intended codegen change,
regenerate them with ``EMBER_UPDATE_SNAPSHOTS=1 pytest tests/inductor/test_snapshots.py`` and
review the diff."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.compile_fx import generate_source, load_wrapper
from ember_inductor.decompositions import decompositions

SNAPSHOTS = Path(__file__).parent / "snapshots"


def _graph(fn: Callable[..., Any], *args: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(fn, decomposition_table=decompositions())(*args)


CASES: dict[str, tuple[Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "pointwise_chain": (lambda x, s: (torch.tanh(torch.sigmoid(x * s + 0.5) * x) * 0.25,),
                        lambda: (torch.randn(16, 32), torch.randn(32))),
    "softmax": (lambda x: (torch.softmax(x, -1),), lambda: (torch.randn(8, 64),)),
    "linear_relu_layernorm": (
        lambda x, w, b: (torch.nn.functional.layer_norm(torch.relu(x @ w.t() + b), (24,)),),
        lambda: (torch.randn(8, 16), torch.randn(24, 16), torch.randn(24))),
    # an index from a tensor: the kernel returns a status, the wrapper raises on a bad index
    "embedding_scale": (lambda w, i: (torch.nn.functional.embedding(i, w) * 0.5,),
                        lambda: (torch.randn(12, 8), torch.tensor([[0, 3], [11, 5]]))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_snapshot(name: str) -> None:
    fn, make_inputs = CASES[name]
    torch.manual_seed(0)
    inputs = make_inputs()
    gm = _graph(fn, *inputs)
    src, _ = generate_source(gm, key="snapshot")
    path = SNAPSHOTS / f"{name}.py.txt"
    if os.environ.get("EMBER_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        path.write_text(src)
    assert src == path.read_text(), f"generated code for {name} changed; see {path}"
    # the snapshot is also a working program
    out = load_wrapper(src, gm, "snapshot")(*inputs)
    torch.testing.assert_close(out[0], fn(*inputs)[0], atol=1e-5, rtol=1e-5)
