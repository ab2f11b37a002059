"""Pointwise work on both sides of a reshape is one loop: GPT-2's MLP computes its GELU over
[16, 512, 3072] and casts it for the next product over [8192, 3072]; the scheduler grouped
only loops of equal sizes, so the GELU's float32 result was written out and read back
(on an H100: two 52 us kernels per layer where one 37 us kernel does; scheduler
``_member_refined``). Results equal eager's; the intermediate is never stored."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from inductor_util import compile_strict


def _sched(fn, *args):
    from ember_inductor.decompositions import decompositions
    from ember_inductor.lowering import GraphLowering
    from ember_inductor.scheduler import CppRegion, Scheduler
    from ember_inductor.sizes import SizeEnv, size_env

    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    with size_env(SizeEnv()):
        graph = GraphLowering(gm)
        graph.run()
        sched = Scheduler(graph)
    groups = [g for s in sched.steps if isinstance(s, CppRegion) for g in s.groups]
    return sched, groups


def _gelu_cast(x):
    y = torch.nn.functional.gelu(x.float(), approximate="tanh")
    return y.view(-1, y.shape[-1]).to(torch.bfloat16) * 2


def test_reshape_between_pointwise_ops_is_one_group():
    x = torch.randn(4, 6, 10).to(torch.bfloat16)
    sched, groups = _sched(_gelu_cast, x)
    assert len(groups) == 1, [[m.node.name for m in g.members] for g in groups]
    assert len(groups[0].members) >= 2
    stored = [m.node.name for m in groups[0].members if m.node.name not in sched.local]
    assert len(stored) == 1, stored  # only the output


def test_sizes_that_do_not_line_up_stay_apart():
    def f(x):  # [6, 4] read as [4, 6]: the flattened orders agree, but no dim is a run of dims
        y = torch.exp(x)
        return y.reshape(4, 6) + 1
    sched, groups = _sched(f, torch.randn(6, 4))
    assert len(groups) == 2
    out = compile_strict(f)(torch.ones(6, 4))
    torch.testing.assert_close(out, f(torch.ones(6, 4)))


@pytest.mark.parametrize("shape", [(4, 6, 10), (2, 3, 5, 7), (5, 1, 9)])
def test_results_equal_eager(shape):
    torch.manual_seed(0)
    x = torch.randn(*shape).to(torch.bfloat16)
    torch.testing.assert_close(compile_strict(_gelu_cast)(x), _gelu_cast(x), atol=0, rtol=0)

    def g(x, b):  # a broadcast read on the coarse side, a transposed view on the fine side
        y = torch.sigmoid(x) * 3
        z = y.reshape(-1, y.shape[-1]) + b
        return z, (y.transpose(0, 1) * 2).sum()
    b = torch.randn(shape[-1])
    got, want = compile_strict(g)(x.float(), b), g(x.float(), b)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _norm_cast(x, w):
    y = torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w)
    return y.view(-1, y.shape[-1]).to(torch.bfloat16)


def test_reshape_after_a_row_reduction_joins_its_rows():
    """GPT-2's LayerNorm over rows [16, 512] writes float32, cast to bfloat16 over [8192, 768]
    for the next product: the cast joins the norm's group as a member of its last loop block
    (outer [4, 6] refined, 10 inner), and the float32 normalized value is never stored."""
    x, w = torch.randn(4, 6, 10).to(torch.bfloat16), torch.randn(10)
    sched, groups = _sched(_norm_cast, x, w)
    assert len(groups) == 1, [[m.node.name for m in g.members] for g in groups]
    stored = [m.node.name for m in groups[0].members if m.node.name not in sched.local]
    assert len(stored) == 1, stored
    for shape in [(4, 6, 10), (3, 1, 7, 33), (2, 5, 300)]:
        x, w = torch.randn(*shape).to(torch.bfloat16), torch.randn(shape[-1])
        torch.testing.assert_close(compile_strict(_norm_cast)(x, w), _norm_cast(x, w),
                                   atol=0, rtol=0)
