"""The wrapper's buffer reuse: a dead buffer a C++ region wrote, of the same geometry as the new
one, is taken as it is (no ``as_strided``); one an ATen call returned is always re-viewed in the
declared layout. ATen calls with an ``out=`` overload (mm, addmm, bmm, baddbmm) write into dead
buffers instead of allocating. Results match eager, in inference and in a traced training step."""

from __future__ import annotations

import re

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.compile_fx import generate_source, load_wrapper
from ember_inductor.decompositions import decompositions

from inductor_util import assert_same

# the lines checked here are call()'s own; with the buffer pool (test_buffer_pool.py) they sit
# one level deeper, inside a try
NO_POOL = {"buffer_pool": False}


def _mlp(x, w1, b1, w2, b2, g, b):
    """Two residual MLP blocks (the zoo's mlp in small): LayerNorm, Linear, GELU, Linear."""
    F = torch.nn.functional
    for _ in range(2):
        x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (x.shape[-1],), g, b), w1, b1)), w2, b2)
    return (F.layer_norm(x, (x.shape[-1],), g, b),)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    d, h = 16, 64

    def r(*s):
        return torch.randn(*s, generator=gen)

    return (r(8, d), r(h, d) / 4, r(h), r(d, h) / 8, r(d), r(d), r(d))


def test_reuse_lines_and_result() -> None:
    args = _inputs()
    gm = make_fx(_mlp, decomposition_table=decompositions(), tracing_mode="fake")(*args)
    src, _ = generate_source(gm, key="reuse-test", options=NO_POOL)
    body = src.split("\ndef call(", 1)[1]
    aliases = re.findall(r"^    (buf\d+) = (buf\d+); del \2  # reuse$", body, re.M)
    views = re.findall(r"^    (buf\d+) = _view\((buf\d+), .*; del \2  # reuse$", body, re.M)
    assert aliases, body  # LayerNorm outputs of the same [8, 16] geometry
    region_writes = set(re.findall(r"^    (buf\d+) = _empty\(", body, re.M))
    extern_results = set(re.findall(r"^    (buf\d+) = torch\.ops\.\S+\.default\(", body, re.M))
    region_writes |= set(re.findall(r"^    (buf\d+) = torch\.ops\.\S+\.out\(", body, re.M))
    for new, old in aliases:
        assert old not in extern_results, (new, old)  # an ATen result is never aliased as is
        region_writes.add(new)
    for new, old in views:
        assert old in extern_results or old in region_writes
    out = load_wrapper(src, gm, "reuse-test")(*args)
    assert_same(out, _mlp(*args))
    # a second call (buffers come from the allocator again) gives the same
    assert_same(load_wrapper(src, gm, "reuse-test")(*args), out)


def _out_calls(body: str) -> list[tuple[str, str, str, str]]:
    """(result, op, args, target) of every extern line that writes through ``out=``."""
    # addmm(bias, x, W.t()) of a linear layer is written as linear(x, W, bias, out=...)
    return [(r, "addmm" if op == "linear" else op, a, t) for r, op, a, t in re.findall(
        r"^    (buf\d+) = torch\.(?:ops\.aten|_C\._nn)\.(\w+?)(?:\.out)?\((.*), "
        r"out=(?:_view\()?(buf\d+)\b.*; del \4  # extern .* reuse\b.*$", body, re.M)]


def _check_out_calls(src: str, n_args: int, n_outs: int) -> list[tuple[str, str, str, str]]:
    body = src.split("\ndef call(", 1)[1]
    calls = _out_calls(body)
    assert len(calls) == body.count("out="), body  # every out= line has the expected form
    lines = body.splitlines()
    ret = lines[-1]
    assert ret.startswith("    return ("), ret
    for res, op, args, target in calls:
        assert op in ("mm", "addmm", "bmm", "baddbmm"), op
        assert not re.search(rf"\b{target}\b", args), (res, target)  # never its own input
        assert not re.search(rf"\b{target}\b", ret), target  # never a graph output
        assert not target.startswith("arg"), target  # never an input
        # the target is dead: its name appears on no later line
        at = next(i for i, ln in enumerate(lines) if ln.startswith(f"    {res} = "))
        assert not any(re.search(rf"\b{target}\b", ln) for ln in lines[at + 1:]), target
    return calls


def test_extern_out_inference() -> None:
    args = _inputs()
    gm = make_fx(_mlp, decomposition_table=decompositions(), tracing_mode="fake")(*args)
    src, _ = generate_source(gm, key="reuse-out-test", options=NO_POOL)
    calls = _check_out_calls(src, len(args), 1)
    # four addmm calls: all but the first write into a dead buffer (LayerNorm's [8, 16] output
    # or an earlier addmm's [8, 64] one)
    assert [op for _, op, _, _ in calls] == ["addmm"] * 3, src
    call = load_wrapper(src, gm, "reuse-out-test")
    out = call(*args)
    assert_same(out, _mlp(*args))
    assert_same(call(*args), out)


def _attn_step(x, wq, wk, wv, wo):
    """One training step of a small attention block (bmm, mm), gradients by autograd."""
    q, k, v = x @ wq, x @ wk, x @ wv
    a = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.25, -1)
    y = torch.bmm(a, v) @ wo
    loss = (y * y).mean()
    return (loss, *torch.autograd.grad(loss, (x, wq, wk, wv, wo)))


def test_extern_out_training() -> None:
    gen = torch.Generator().manual_seed(1)
    b, t, d = 2, 8, 16
    args = [torch.randn(b, t, d, generator=gen)] + [
        torch.randn(d, d, generator=gen) / 4 for _ in range(4)]
    traced = [a.clone().requires_grad_() for a in args]
    gm = make_fx(_attn_step, decomposition_table=decompositions(), tracing_mode="fake")(*traced)
    src, _ = generate_source(gm, key="reuse-out-train", options=NO_POOL)
    calls = _check_out_calls(src, len(args), 6)
    ops = {op for _, op, _, _ in calls}
    assert "bmm" in ops and "mm" in ops, src  # backward bmm/mm write into dead buffers
    expected = _attn_step(*[a.clone().requires_grad_() for a in args])
    call = load_wrapper(src, gm, "reuse-out-train")
    for _ in range(2):  # a second call gets fresh buffers from the allocator
        assert_same(call(*args), tuple(e.detach() for e in expected))
