"""The gradient of an embedding table (a scatter-add of the rows a batch used): kept whole, ATen's
kernel, instead of the decomposition's zero-filled table plus an out-of-place index_put that copies
the whole table again (bert's 8192x256 word table: a 4 ms copy per training step)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.compile_fx import generate_source, load_wrapper
from ember_inductor.decompositions import decompositions

from inductor_util import compile_strict

aten = torch.ops.aten


def _emb_bwd(g: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor]:
    return (aten.embedding_dense_backward(g * 2.0, idx, 50, 3, False),)


def test_embedding_backward_is_one_aten_call() -> None:
    torch.manual_seed(0)
    idx = torch.tensor([[3, 7, 7, 0], [49, 3, 1, 7]])
    g = torch.randn(2, 4, 16)
    gm = make_fx(_emb_bwd, decomposition_table=decompositions())(g, idx)
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.embedding_dense_backward.default in ops
    assert aten.index_put.default not in ops
    src, _ = generate_source(gm, key="test_emb")
    assert "index_put" not in src and "embedding_dense_backward" in src
    out = load_wrapper(src, gm, "test_emb")(g, idx)
    expected = _emb_bwd(g, idx)[0]
    assert torch.equal(out[0], expected)
    assert torch.equal(out[0][3], torch.zeros(16))  # padding_idx gets no gradient


def test_embedding_training_gradients_match_eager() -> None:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(64, 8, padding_idx=0)
    lin = torch.nn.Linear(8, 8)

    def fn(i: torch.Tensor) -> torch.Tensor:
        return torch.tanh(lin(emb(i))).sum()

    idx = torch.tensor([[0, 5, 5, 63], [2, 0, 9, 5]])
    fn(idx).backward()
    expected = [p.grad.clone() for p in (emb.weight, lin.weight, lin.bias)]
    for p in (emb.weight, lin.weight, lin.bias):
        p.grad = None
    compile_strict(fn)(idx).backward()
    for p, e in zip((emb.weight, lin.weight, lin.bias), expected):
        torch.testing.assert_close(p.grad, e, atol=1e-5, rtol=1e-5)
    assert torch.equal(emb.weight.grad[0], torch.zeros(8))
