"""Snapshots of the Triton target's generated code (wrapper and kernels, as generated for the
interpreter: block sizes differ on a GPU). Regenerate with ``EMBER_UPDATE_SNAPSHOTS=1`` after an
intended change and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from triton_util import DEVICE

SNAPSHOTS = Path(__file__).parent / "snapshots"

CASES = {
    # a persistent row reduction (softmax) after a broadcast multiply
    "scaled_softmax": (lambda x, s: (torch.softmax(x * s, -1),),
                       lambda: (torch.randn(8, 64), torch.randn(64))),
    # a transpose: 2-D tiles; and an embedding: checked indirect load, the wrapper raises
    "transpose_embedding": (
        lambda x, w, i: (x.t().contiguous() + 1.0, torch.nn.functional.embedding(i, w) * 0.5),
        lambda: (torch.randn(32, 48), torch.randn(12, 8), torch.tensor([[0, 3], [11, 5]]))),
}


@pytest.mark.skipif(DEVICE != "cpu", reason="snapshots are of the interpreter's configuration")
@pytest.mark.parametrize("name", sorted(CASES))
def test_snapshot(name: str) -> None:
    from ember_inductor.compile_fx import generate_source, load_wrapper
    from ember_inductor.decompositions import decompositions

    fn, make_inputs = CASES[name]
    torch.manual_seed(0)
    inputs = make_inputs()
    gm = make_fx(fn, decomposition_table=decompositions())(*inputs)
    src, _ = generate_source(gm, key="snapshot", options={"cpu_codegen": "triton"})
    path = SNAPSHOTS / f"{name}.py.txt"
    if os.environ.get("EMBER_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        path.write_text(src)
    assert src == path.read_text(), f"generated code for {name} changed; see {path}"
    out = load_wrapper(src, gm, "snapshot")(*inputs)
    for a, b in zip(out, fn(*inputs)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
