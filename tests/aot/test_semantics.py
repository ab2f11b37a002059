"""aot_compile on small programs: outputs, input/parameter gradients and mutated inputs match
eager, for the semantics AOT autograd has to preserve."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import pytest
from torch.utils import _pytree as pytree

from aot_util import assert_close, compile_fn


def _leafs(*shapes, rg=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_(rg) for s in shapes]


def _clone_args(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            c = a.detach().clone().requires_grad_(a.requires_grad)
            out.append(c)
        else:
            out.append(a)
    return out


def _loss(out):
    flat = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    total = 0
    for i, o in enumerate(flat):
        w = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape)
        total = total + (o * (w + i)).sum()
    return total


def check(fn, args, prep=None, atol=1e-5):
    """Run fn eagerly and through aot_compile on copies of args; compare outputs, gradients of
    leaf inputs, and input values afterwards (mutations). ``prep`` maps leaf args to the
    arguments actually passed (e.g. to make non-leaf inputs)."""
    ea, ca = args, _clone_args(args)
    prep = prep or (lambda xs: xs)
    e_in, c_in = prep(ea), prep(ca)
    compiled = compile_fn(fn, c_in)
    e_out = fn(*e_in)
    c_out = compiled(*c_in)
    assert_close(c_out, e_out, atol=atol, rtol=1e-5)
    for a, b in zip(e_in, c_in):  # mutated inputs
        if isinstance(a, torch.Tensor):
            assert_close(b.detach(), a.detach(), atol=atol, rtol=1e-5)
    le, lc = _loss(e_out), _loss(c_out)
    if isinstance(le, torch.Tensor):
        le.backward()
        lc.backward()
        for a, b in zip(ea, ca):
            if isinstance(a, torch.Tensor) and a.requires_grad and a.is_leaf:
                assert (a.grad is None) == (b.grad is None)
                if a.grad is not None:
                    assert_close(b.grad, a.grad, atol=atol, rtol=1e-5)
    return e_out, c_out


# -- plain functions -----------------------------------------------------------------------

CASES = {
    "pointwise": (lambda x, y: (torch.sin(x) * y + x.exp(),), [(4, 5), (4, 5)]),
    "matmul_chain": (lambda x, w1, w2: (torch.relu(x @ w1) @ w2,), [(3, 4), (4, 6), (6, 2)]),
    "broadcast": (lambda x, b: (x + b, (x * b).sum(0)), [(5, 3), (3,)]),
    "reductions": (lambda x: (x.sum(), x.mean(1), x.amax(0), x.var(0)), [(4, 6)]),
    "softmax_logsoftmax": (lambda x: (F.softmax(x, -1), F.log_softmax(x, 0)), [(3, 7)]),
    "layer_norm": (lambda x, w, b: (F.layer_norm(x, (6,), w, b),), [(4, 6), (6,), (6,)]),
    "gelu_tanh_sigmoid": (lambda x: (F.gelu(x), torch.tanh(x), torch.sigmoid(x)), [(8,)]),
    "views_in_graph": (lambda x: ((x.t() @ x).reshape(-1)[:5] * 2,), [(3, 4)]),
    "cat_stack": (lambda x, y: (torch.cat([x, y], 0), torch.stack([x, y]).sum(0)), [(2, 3), (2, 3)]),
    "index_gather": (lambda x: (x[:, [0, 2]] * 3, x[1:, ::2]), [(4, 5)]),
    "where_clamp": (lambda x: (torch.where(x > 0, x, x * 0.1).clamp(-0.5, 0.5),), [(10,)]),
    "conv2d": (lambda x, w, b: (F.conv2d(x, w, b, padding=1),), [(2, 3, 6, 6), (4, 3, 3, 3), (4,)]),
    "pool_relu": (lambda x: (F.max_pool2d(F.relu(x), 2), F.avg_pool2d(x, 2)), [(1, 2, 4, 4)]),
    "bmm_attention": (lambda q, k, v: (F.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v,),
                      [(2, 3, 4), (2, 3, 4), (2, 3, 4)]),
    "sdpa": (lambda q, k, v: (F.scaled_dot_product_attention(q, k, v, is_causal=True),),
             [(1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4)]),
    "embedding": (lambda w: (F.embedding(torch.tensor([[0, 2], [3, 1]]), w).sum(-1),), [(4, 3)]),
    "cross_entropy": (lambda x: (F.cross_entropy(x, torch.tensor([1, 0, 3])),), [(3, 4)]),
    "mse": (lambda x, y: (F.mse_loss(x, y),), [(5,), (5,)]),
    "repeated_use": (lambda x: (x * x * x + x,), [(6,)]),
    "pow_div_sqrt": (lambda x: ((x.abs() + 1).sqrt() / (x.pow(2) + 1),), [(7,)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_function(name):
    fn, shapes = CASES[name]
    check(fn, _leafs(*shapes))


def test_some_inputs_do_not_require_grad():
    x, w = _leafs((3, 4), (4, 2))
    x.requires_grad_(False)
    check(lambda x, w: (torch.tanh(x @ w),), [x, w])


def test_multiple_outputs_some_unused_in_loss():
    x, = _leafs((4, 4))
    e_out, c_out = check(lambda x: (x.sin(), x.cos() * 2, x.exp()), [x])
    xe = x.detach().clone().requires_grad_()
    xc = x.detach().clone().requires_grad_()
    fn = lambda x: (x.sin(), x.cos() * 2, x.exp())  # noqa: E731
    c = compile_fn(fn, [xc])
    fn(xe)[1].sum().backward()
    c(xc)[1].sum().backward()
    assert_close(xc.grad, xe.grad)


def test_outputs_that_do_not_require_grad():
    x, = _leafs((5, 3))
    fn = lambda x: (x * 2, x.argmax(1), x.detach() + 1, (x > 0).float())  # noqa: E731
    e, c = check(fn, [x])
    assert [o.requires_grad for o in c] == [o.requires_grad for o in e] == [True, False, False, False]


def test_output_is_input_view():
    x, = _leafs((4, 6))
    x2 = x.detach().clone().requires_grad_()
    fn = lambda x: (x.view(2, 12), x.t(), x[1], x * 2)  # noqa: E731
    e, c = check(fn, [x])
    c2 = compile_fn(fn, [x2])(x2)
    for o in c2[:3]:
        assert o._base is x2 or o.untyped_storage().data_ptr() == x2.untyped_storage().data_ptr()


def test_output_is_the_input_itself():
    x, = _leafs((3,), rg=False)
    fn = lambda x, y: (x, x + y)  # noqa: E731
    y, = _leafs((3,))
    c = compile_fn(fn, [x, y])
    out = c(x, y)
    assert out[0] is x
    assert_close(out[1], x + y)


def test_outputs_alias_each_other():
    x, = _leafs((4, 4))
    fn = lambda x: ((y := x * 3), y.view(16), y[0])  # noqa: E731
    xc = x.detach().clone().requires_grad_()
    out = compile_fn(fn, [xc])(xc)
    assert out[1].untyped_storage().data_ptr() == out[0].untyped_storage().data_ptr()
    assert out[2].untyped_storage().data_ptr() == out[0].untyped_storage().data_ptr()
    check(fn, [x])


def test_inplace_on_input_without_grad():
    x, = _leafs((5,), rg=False)
    w, = _leafs((5,), seed=1)
    def fn(x, w):
        x.mul_(2)
        x.add_(1)
        return (x * w,)
    check(fn, [x, w])


def test_inplace_on_input_view():
    x, = _leafs((4, 4), rg=False)
    def fn(x):
        x[1].zero_()
        x[:, 0].add_(5)
        return (x.sum(),)
    check(fn, [x])


def test_inplace_on_nonleaf_input_requiring_grad():
    x, = _leafs((6,))
    def fn(y):
        y.mul_(3)
        return (y.sin(),)
    e, c = check(fn, [x], prep=lambda xs: [xs[0] * 1])


def test_inplace_returned_input():
    x, = _leafs((3, 3), rg=False)
    w, = _leafs((3, 3), seed=2)
    def fn(x, w):
        x.add_(w)
        return (x, w * 2)
    xc, wc = x.clone(), w.detach().clone().requires_grad_()
    c = compile_fn(fn, [xc, wc])
    out = c(xc, wc)
    assert out[0] is xc
    check(fn, [x, w])


def test_inplace_on_intermediate():
    x, = _leafs((4, 5))
    def fn(x):
        y = x * 2
        y.add_(1)
        y[0].mul_(4)
        return (y + 1,)
    check(fn, [x])


def test_frozen_parameter():
    x, w, b = _leafs((3, 4), (5, 4), (5,))
    w.requires_grad_(False)
    e, c = check(lambda x, w, b: (F.linear(x, w, b),), [x, w, b])


def test_no_input_requires_grad_is_inference():
    x, w = _leafs((3, 4), (4, 4), rg=False)
    c = compile_fn(lambda x, w: (x @ w,), [x, w])
    out = c(x, w)
    assert not out[0].requires_grad
    assert list(c._variants) == ["inference"]
    assert_close(out[0], x @ w)


def test_no_grad_mode_is_inference():
    x, w = _leafs((3, 4), (4, 4))
    with torch.no_grad():
        c = compile_fn(lambda x, w: (x @ w,), [x, w])
        out = c(x, w)
    assert not out[0].requires_grad
    assert list(c._variants) == ["inference"]


def test_inference_mode():
    x, w = _leafs((3, 4), (4, 4), rg=False)
    with torch.inference_mode():
        c = compile_fn(lambda x, w: (torch.relu(x @ w),), [x, w])
        out = c(x, w)
    assert_close(out[0], torch.relu(x @ w))


def test_switching_between_training_and_inference():
    x, w = _leafs((3, 4), (4, 2))
    fn = lambda x, w: ((x @ w).tanh(),)  # noqa: E731
    c = compile_fn(fn, [x, w])
    with torch.no_grad():
        assert not c(x, w)[0].requires_grad
    out = c(x, w)
    out[0].sum().backward()
    w2 = w.detach().clone().requires_grad_()
    fn(x.detach(), w2)[0].sum().backward()
    assert_close(w.grad, w2.grad)
    assert x.grad is not None
    assert set(c._variants) == {"inference", (True, True)}


def test_retain_graph():
    x, = _leafs((4,))
    xe = x.detach().clone().requires_grad_()
    fn = lambda x: ((x * x).sin(),)  # noqa: E731
    c = compile_fn(fn, [x])
    out = c(x)[0].sum()
    out.backward(retain_graph=True)
    out.backward()
    oe = fn(xe)[0].sum()
    oe.backward(retain_graph=True)
    oe.backward()
    assert_close(x.grad, xe.grad)


def test_backward_twice_without_retain_graph_errors():
    x, = _leafs((4,))
    c = compile_fn(lambda x: ((x * x).sin(),), [x])
    out = c(x)[0].sum()
    out.backward()
    with pytest.raises(RuntimeError):
        out.backward()


def test_double_backward_is_a_clear_error():
    from ember.aot import DoubleBackwardError

    x, = _leafs((4,))
    c = compile_fn(lambda x: ((x * x).sin(),), [x])
    out = c(x)[0].sum()
    with pytest.raises(DoubleBackwardError, match="double backward"):
        torch.autograd.grad(out, x, create_graph=True)


def test_non_contiguous_input_and_grad():
    x, = _leafs((4, 6))
    xt = x.detach().t().clone().t().requires_grad_()  # column-major leaf
    check(lambda x: (x * 2 + 1, x.sum(1)), [xt])
    # a gradient arriving with broadcast (stride-0) layout
    c = compile_fn(lambda x: (x.exp(),), [x])
    c(x)[0].sum().backward()
    assert_close(x.grad, x.detach().exp())


def test_non_tensor_constant_output():
    x, = _leafs((3,))
    c = compile_fn(lambda x: (x * 2, 3, None), [x])
    out = c(x)
    assert out[1] == 3 and out[2] is None
    assert_close(out[0], x * 2)


def test_integer_and_bool_tensors():
    x, = _leafs((6,))
    idx = torch.tensor([0, 2, 5])
    check(lambda x, i: (x[i] * 2, (x > 0).sum()), [x, idx])


def test_new_example_inputs_same_shapes():
    x, w = _leafs((3, 4), (4, 2))
    fn = lambda x, w: ((x @ w).relu(),)  # noqa: E731
    c = compile_fn(fn, [x, w])
    for seed in range(3):
        a, b = _leafs((3, 4), (4, 2), seed=seed + 10)
        a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        c(a, b)[0].sum().backward()
        fn(a2, b2)[0].sum().backward()
        assert_close(a.grad, a2.grad)
        assert_close(b.grad, b2.grad)


def test_parameter_reaching_only_unused_output_gets_no_grad():
    x, w1, w2 = _leafs((3, 4), (4, 4), (4, 4))
    fn = lambda x, w1, w2: (x @ w1, (x @ w2).relu())  # noqa: E731
    c = compile_fn(fn, [x, w1, w2])
    c(x, w1, w2)[0].sum().backward()
    assert w2.grad is None and w1.grad is not None and x.grad is not None
    xe, w1e = x.detach().clone().requires_grad_(), w1.detach().clone().requires_grad_()
    fn(xe, w1e, w2.detach())[0].sum().backward()
    assert_close(w1.grad, w1e.grad)
    assert_close(x.grad, xe.grad)


def test_non_tensor_input_is_baked_in():
    import torch.fx as fx
    from ember.aot import aot_compile
    from aot_util import aot_eager_backend

    gm = fx.symbolic_trace(lambda x, n: (x * n + 1,))
    x, = _leafs((4,))
    c = aot_compile(gm, [x, 3], backend=aot_eager_backend(), options={})
    out = c(x, 3)[0]
    assert_close(out, x * 3 + 1)
    out.sum().backward()
    assert_close(x.grad, torch.full((4,), 3.0))


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("op", ["native_batch_norm", "cudnn_batch_norm"])
def test_legacy_batch_norm_kernels_become_one_legit_call(op: str, training: bool) -> None:
    """Ember's own decomposition of batch norm's legacy kernels (aot/trace.py) agrees with
    ``native_batch_norm`` in values and running statistics; cuDNN's (GPU-only in eager, called
    here on CPU tensors) also returns its empty reserve, and empty statistics in evaluation."""
    from ember.aot.trace import base_decompositions

    aten = torch.ops.aten
    decomp = base_decompositions()[getattr(aten, op).default]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, 5, generator=g)
    w, b = torch.randn(3, generator=g), torch.randn(3, generator=g)
    rm, rv = torch.randn(3, generator=g), torch.rand(3, generator=g) + 0.5
    rm2, rv2 = rm.clone(), rv.clone()
    got = decomp(x, w, b, rm, rv, training, 0.1, 1e-5)
    want = aten.native_batch_norm(x, w, b, rm2, rv2, training, 0.1, 1e-5)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close((rm, rv), (rm2, rv2))  # running statistics updated alike
    if training:
        torch.testing.assert_close(got[1:3], want[1:3])
    else:
        assert got[1].numel() == 0 and got[2].numel() == 0
    if op == "cudnn_batch_norm":
        assert len(got) == 4 and got[3].dtype == torch.uint8 and got[3].numel() == 0
    else:
        assert len(got) == 3


@pytest.mark.parametrize("training", [False, True])
def test_a_batch_norm_reaches_a_backend_without_decompositions_as_one_op(training: bool) -> None:
    """aot_eager and cudagraphs run the ATen graph op by op: a batch norm must arrive as one
    ``_native_batch_norm_legit*`` call, not as torch's ~8-12 elementwise ops."""
    import ember

    seen: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example: Any, **kw: Any) -> Any:
        seen.append(gm)
        return gm

    ember.register_backend("bn_recording", record, level="aten")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU()).train(training)
    ref = __import__("copy").deepcopy(model)
    x = torch.randn(2, 3, 8, 8)
    out = ember.compile(model, backend="bn_recording")(x)
    torch.testing.assert_close(out, ref(x))
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)
    ops = [str(n.target) for n in seen[0].graph.nodes if n.op == "call_function"]
    want = ("aten._native_batch_norm_legit_functional.default" if training
            else "aten._native_batch_norm_legit_no_training.default")
    assert ops.count(want) == 1, ops
    assert not any(o.startswith(("aten.rsqrt", "aten.var_mean", "aten.sqrt")) for o in ops), ops
