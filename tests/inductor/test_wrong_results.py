"""Wrong results found outside the corpus (issue 19), one test per cause: each failed before its
fix. Compiled through inductor with internal errors raised (inductor_util.compile_strict)."""

from __future__ import annotations

import torch

from inductor_util import compile_strict


def test_saved_slice_keeps_its_strides_for_the_backward() -> None:
    # The forward saves a slice of a computed value (stride 16, 8 columns); it used to return it
    # as a dense copy (stride 8) while its backward, compiled from the same metadata, read it at
    # stride 16: past the end of the buffer (Funnel Transformer's attention masks, gradients
    # ~1e20).
    def f(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.sin(a @ b)[:, :8]
        return (y * w).sum()

    a, b = torch.randn(8, 16), torch.randn(16, 16)
    w = torch.randn(8, 8, requires_grad=True)
    (expected,) = torch.autograd.grad(f(a, b, w), [w])
    (got,) = torch.autograd.grad(compile_strict(f)(a, b, w), [w])
    torch.testing.assert_close(got, expected)


def test_output_has_the_strides_of_its_metadata() -> None:
    # the user-visible side of the same cause: an output that is a slice of a computed value
    # comes back with eager's strides
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.cos(x)[:, 1:5]

    x = torch.randn(6, 8)
    got = compile_strict(f)(x)
    torch.testing.assert_close(got, f(x))
    assert got.stride() == f(x).stride()


def test_sinking_many_nodes_before_one_user_keeps_the_graph_ordered() -> None:
    # layout.sink_pure_nodes moves each pure node to just before its first user, numbering moved
    # nodes by midpoints: as floats, ~50 moves before one node made ties, a node was moved past
    # one of its users and lowering failed (BEiT's training graph: "KeyError: where_4")
    from torch.fx.experimental.proxy_tensor import make_fx

    from ember_inductor.layout import sink_pure_nodes

    def f(x: torch.Tensor) -> torch.Tensor:
        v = x * 3
        w = x * 2
        return torch.stack([w + v, w - v] + [w + i for i in range(2, 80)])

    gm = make_fx(f)(torch.randn(4))
    assert sink_pure_nodes(gm) > 50
    gm.graph.lint()  # every node after its inputs
    gm.recompile()
    x = torch.randn(4)
    torch.testing.assert_close(gm(x), f(x))
