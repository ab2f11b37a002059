"""Matrix multiplies padded to aligned sizes (ember_inductor/padding.py): the rewrite keeps
every value and the geometry downstream, and padded graphs train like eager through the Triton
target. Whether padding pays is timed on the GPU; ``pad_mm="always"`` forces it here."""

from __future__ import annotations

import copy

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from triton_util import DEVICE, assert_same

aten = torch.ops.aten


def _products(x, w, bias, y, z, c):
    # mm with an odd N, addmm with a bias, bmm with odd K and N, and a column-major operand
    # (a transposed view: its leading dimension is M)
    return (x @ w, torch.addmm(bias, x, w), torch.bmm(y, z), c.t() @ w)


def _args():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return (r(6, 10), r(10, 7), r(7), r(3, 5, 9), r(3, 9, 11), r(10, 6))


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_rewrite_keeps_values_and_geometry():
    from ember_inductor.padding import pad_matmuls

    args = _args()
    gm = make_fx(_products, tracing_mode="fake")(*args)
    new = pad_matmuls(gm, "always")
    assert new is not gm
    ts = _targets(new)
    assert ts.count(aten.constant_pad_nd.default) >= 4 and aten.slice.Tensor in ts
    for n in new.graph.nodes:  # every product now has aligned sizes (4 float32 elements)
        if n.op == "call_function" and n.target in (aten.mm.default, aten.bmm.default,
                                                     aten.addmm.default):
            v = n.meta["val"]
            assert v.shape[-1] % 4 == 0, (n, v.shape)
    expect, got = gm(*args), new(*args)
    for e, g in zip(expect, got):
        torch.testing.assert_close(g, e)
        assert g.stride() == e.stride()
    # nothing to pad: the graph is returned as it is
    aligned = make_fx(lambda a, b: a @ b, tracing_mode="fake")(torch.randn(8, 4), torch.randn(4, 8))
    assert pad_matmuls(aligned, "always") is aligned
    assert pad_matmuls(gm, False) is gm


def test_auto_leaves_cpu_graphs_alone():
    from ember_inductor.padding import pad_matmuls

    gm = make_fx(_products, tracing_mode="fake")(*_args())
    assert pad_matmuls(gm, "auto") is gm  # CPU tensors: the GPU's alignment does not apply


class Head(torch.nn.Module):
    """A projection to an odd width (a vocabulary), its output both returned and reused."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(12, 18)
        self.head = torch.nn.Linear(18, 13)

    def forward(self, x):
        h = torch.tanh(self.l1(x))
        logits = self.head(h)
        return logits, (logits.softmax(-1) @ self.head.weight).sum(-1)


def test_padded_model_trains_like_eager():
    torch.manual_seed(0)
    model = Head().to(DEVICE)
    ref = copy.deepcopy(model)
    x = torch.randn(2, 5, 12, device=DEVICE)
    opts = {"pad_mm": "always"}
    if DEVICE == "cpu":
        opts["cpu_codegen"] = "triton"
    seen = []

    def backend(gm, example_inputs, **options):
        from ember_inductor import compile_inductor
        from ember_inductor.compile_fx import generate_source

        seen.append(generate_source(gm, "", options)[0])
        return compile_inductor(gm, example_inputs, **options)

    from triton_util import _decompositions

    ember.register_backend("inductor_padded", backend, level="aten",
                           decompositions=_decompositions, override=True)
    fast = ember.compile(model, backend="inductor_padded", options=opts)
    with ember.config.patch(suppress_errors=False):
        out = fast(x)
    exp = ref(x)
    assert_same(out, exp, atol=1e-5, rtol=1e-5)
    sum(o.sum() for o in out).backward()
    sum(o.sum() for o in exp).backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=n)
    # forward and backward both multiplied padded operands (13 -> 16 columns)
    assert len(seen) == 2 and all("<- constant_pad_nd" in s for s in seen)


def test_timed_padding_counts_the_copy_of_a_returned_product(monkeypatch):
    """A product the graph returns is copied back to eager's strides after padding: the timed
    padded candidate includes that copy (it once timed the padded product alone); a product
    read by a kernel is timed without it. The candidates run here on CPU tensors."""
    from ember_inductor import autotune, padding

    seen = {}

    def fake_choose(kind, sig, candidates, default=None, device="cpu", machine_id=None):
        seen[sig[-1]] = candidates["padded"]()
        return "direct"

    monkeypatch.setattr(autotune, "choose", fake_choose)

    def returned(x, w):
        return (x @ w,)

    def consumed(x, w):
        return ((x @ w).relu(),)

    for fn in (returned, consumed):
        gm = make_fx(fn, tracing_mode="fake")(torch.randn(6, 10), torch.randn(10, 7))
        (mm,) = [n for n in gm.graph.nodes if n.target is aten.mm.default]
        assert padding._time_choice(mm, padding._plan(mm, forced=True)) is False
    assert seen[True].shape == (6, 7) and seen[True].is_contiguous()  # the copy, timed
    assert seen[False].shape == (6, 8)  # the padded product alone (N padded to 8)
