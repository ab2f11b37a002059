"""The wrapper's buffer pool (runtime/pool.py): internal buffers of a compiled graph stay allocated
between calls; outputs and buffers that share storage with an output are fresh each call; a call
that finds the pool taken (another thread, a re-entrant call) allocates its own; an exception
gives the pool back; symbolic sizes remake the buffers when they change. By default only buffers
of at least 4 MiB are pooled; most tests here pool every buffer (``buffer_pool_min_bytes=0``)
to keep their graphs small."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember_inductor.compile_fx import compile_inductor, generate_source, load_wrapper
from ember_inductor.decompositions import decompositions

from inductor_util import assert_same


ALL = {"buffer_pool_min_bytes": 0}


def _load(fn: Callable[..., Any], inputs: tuple[Any, ...], mode: str = "real",
          **options: Any) -> tuple[Callable[..., Any], str]:
    options = {**ALL, **options}
    gm = make_fx(fn, tracing_mode=mode, decomposition_table=decompositions())(*inputs)
    key = f"pool-test-{fn.__name__}-{mode}-{sorted(options.items())}"
    src, _ = generate_source(gm, key=key, options=options)
    return load_wrapper(src, gm, key), src


def _f(x, w):
    """softmax -> mm -> two outputs: the softmax result is internal (pooled)."""
    y = torch.softmax(x * 2, -1)
    z = y @ w
    return (torch.relu(z).sum(0), torch.tanh(z)[:, :3])


def _inputs(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 64, generator=g), torch.randn(64, 64, generator=g)


def _pool_of(call: Callable[..., Any]) -> Any:
    return call.__globals__["_pool"]


def test_pooled_lines_and_repeated_calls() -> None:
    call, src = _load(_f, _inputs())
    body = src.split("\ndef call(", 1)[1]
    pooled = re.findall(r"^        (buf\d+) = pool\[(\d+)\]$", body, re.M)
    assert pooled, src
    assert "_pool.take()" in body and "_pool.release(pool)" in body
    ret = re.search(r"return \((.*)\)", body).group(1)
    for name, _ in pooled:
        assert not re.search(rf"\b{name}\b", ret), (name, ret)  # never an output
    ptrs = None
    for seed in range(4):  # other inputs each call: nothing of an earlier call shows
        args = _inputs(seed=seed)
        assert_same(call(*args), _f(*args))
        now = [b.data_ptr() for b in _pool_of(call)._buffers]
        assert ptrs is None or now == ptrs  # the same buffers every call
        ptrs = now
    assert not _pool_of(call)._lock.locked()


def test_snapshot_pooled_call() -> None:
    """The wrapper's call() with a pool, pinned (regenerate with EMBER_UPDATE_SNAPSHOTS=1)."""
    _, src = _load(_f, _inputs())
    body = "def call(" + src.split("\ndef call(", 1)[1]
    pool = src[src.index("_pool = BufferPool("):src.index("\n])\n") + 3]
    text = pool + "\n\n" + body
    path = Path(__file__).parent / "snapshots" / "buffer_pool.call.txt"
    if os.environ.get("EMBER_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        path.write_text(text)
    assert text == path.read_text(), f"the pooled wrapper changed; see {path}"


def test_option_off() -> None:
    call, src = _load(_f, _inputs(), buffer_pool=False)
    assert "BufferPool" not in src and "pool[" not in src
    assert_same(call(*_inputs()), _f(*_inputs()))
    # through the compiler entry, as ember.compile(..., options=...) passes it
    gm = make_fx(_f, decomposition_table=decompositions())(*_inputs())
    assert "_pool" not in compile_inductor(gm, list(_inputs()), buffer_pool=False,
                                           **ALL).__globals__
    assert "_pool" in compile_inductor(gm, list(_inputs()), **ALL).__globals__


def test_default_pools_large_buffers_only() -> None:
    """Default threshold 4 MiB: the [64, 64] softmax is allocated per call; a [1024, 1024] one
    (4 MiB) is pooled."""
    gm = make_fx(_f, decomposition_table=decompositions())(*_inputs())
    assert "BufferPool" not in generate_source(gm, key="pool-default-small")[0]
    big = (torch.randn(1024, 1024), torch.randn(1024, 64))
    gm = make_fx(_f, decomposition_table=decompositions())(*big)
    src, _ = generate_source(gm, key="pool-default-big")
    assert re.search(r"^        buf\d+ = pool\[0\]$", src, re.M), src
    assert_same(load_wrapper(src, gm, "pool-default-big")(*big), _f(*big), atol=1e-4, rtol=1e-4)


def test_precompiled_artifact_with_pool(tmp_path: Any) -> None:
    """A precompiled artifact embeds the pooled wrapper; saved, loaded and run, it equals eager
    over calls with other inputs."""
    art = ember.precompile(_f, *_inputs(), backend="inductor", options=ALL)
    assert "_pool = BufferPool(" in art.source and "= pool[0]" in art.source
    art.save(str(tmp_path / "art"))
    from ember.precompile import load

    fn = load(str(tmp_path / "art"))
    for seed in range(3):
        args = _inputs(seed=seed)
        assert_same(list(fn(*args)), list(_f(*args)))


def test_outputs_are_never_pooled() -> None:
    call, _ = _load(_f, _inputs())
    a = _inputs(seed=1)
    first = call(*a)
    kept = [t.clone() for t in first]
    second = call(*_inputs(seed=2))
    assert_same(list(first), kept)  # the first call's outputs are untouched by the second
    for t, u in zip(first, second):
        assert t.untyped_storage().data_ptr() != u.untyped_storage().data_ptr()


def _views_out(x, w):
    """Outputs that are views of buffers a C++ region writes: those buffers are not pooled."""
    y = torch.softmax(x * 2, -1)
    z = torch.exp(x) + 1
    return (y.t(), y @ w, z[2:, 1:5], (z * 3).sum(1))


def test_views_of_intermediates_returned_are_not_pooled() -> None:
    call, src = _load(_views_out, _inputs())
    first = call(*_inputs(seed=1))
    kept = [t.clone() for t in first]
    for seed in (2, 3):
        args = _inputs(seed=seed)
        assert_same(list(call(*args)), list(_views_out(*args)))
    assert_same(list(first), kept)
    pool = call.__globals__.get("_pool")
    held = {b.untyped_storage().data_ptr() for b in (pool._buffers or [])} if pool else set()
    out = call(*_inputs(seed=4))
    assert not held & {t.untyped_storage().data_ptr() for t in out}


def _alias_out(x):
    """ATen fallbacks whose results alias their input (unfold, diagonal), returned: the buffers
    they view are not pooled; the one an ATen copy (_to_copy to complex) reads is."""
    y = torch.exp(x)
    return (y.unfold(0, 2, 1), torch.sigmoid(x).diagonal(),
            torch.view_as_real(torch.tanh(x).to(torch.complex64)))


def test_aten_views_of_intermediates_returned_are_not_pooled() -> None:
    x = torch.randn(8, 8)
    call, src = _load(_alias_out, (x,))
    body = src.split("\ndef call(", 1)[1]
    assert "aten.unfold.default(" in body and "aten.diagonal.default(" in body, body
    assert body.count("pool[") == 1, body  # the tanh result only
    first = call(x)
    kept = [t.clone() for t in first]
    y = torch.randn(8, 8)
    assert_same(list(call(y)), list(_alias_out(y)))
    assert_same(list(first), kept)


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x)))) * torch.sigmoid(x)


def test_training_twice_with_retained_outputs() -> None:
    torch.manual_seed(0)
    eager = _MLP()
    model = _MLP()
    model.load_state_dict(eager.state_dict())
    compiled = ember.compile(model, backend="inductor", options=ALL)
    xs = [torch.randn(16, 32) for _ in range(2)]
    outs, eouts = [], []
    with ember.config.patch(suppress_errors=False):
        for x in xs:
            out = compiled(x)
            out.square().mean().backward()
            outs.append(out)
            e = eager(x)
            e.square().mean().backward()
            eouts.append(e)
    for o, e in zip(outs, eouts):  # the first step's output survives the second step
        assert_same(o.detach(), e.detach(), atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p.grad, q.grad, atol=1e-4, rtol=1e-4)


def test_two_threads_at_once() -> None:
    call, _ = _load(_f, _inputs())
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(30):
                args = _inputs(seed=seed * 100 + i)
                assert_same(call(*args), _f(*args))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not _pool_of(call)._lock.locked()


def test_taken_pool_is_left_alone() -> None:
    """A call that finds the pool taken allocates its own buffers: the taken ones are not
    written (what a concurrent call in another thread relies on)."""
    call, _ = _load(_f, _inputs())
    call(*_inputs())
    pool = _pool_of(call)
    held = pool.take()
    try:
        for b in held:
            b.fill_(7.0)
        args = _inputs(seed=5)
        assert_same(call(*args), _f(*args))
        assert all(bool((b == 7.0).all()) for b in held)
    finally:
        pool.release(held)
    assert not pool._lock.locked()


def test_reentrant_call() -> None:
    """A kernel that calls the graph again (as a Python callback inside a call would): the
    inner call runs with its own buffers and both results are right."""
    call, _ = _load(_f, _inputs())
    ns = call.__globals__
    real = ns["kernel1"]
    inner_args = _inputs(seed=9)
    inner: list[Any] = []
    depth = [0]

    def kernel1(*ptrs: Any) -> Any:
        depth[0] += 1
        if depth[0] == 1:  # the outer call only
            inner.append(call(*inner_args))
        return real(*ptrs)

    ns["kernel1"] = kernel1
    try:
        args = _inputs(seed=8)
        assert_same(call(*args), _f(*args))
        assert_same(inner[0], _f(*inner_args))
    finally:
        ns["kernel1"] = real
    assert not _pool_of(call)._lock.locked()


def test_exception_releases_pool() -> None:
    call, _ = _load(_f, _inputs())
    call(*_inputs())
    pool = _pool_of(call)
    ptrs = [b.data_ptr() for b in pool._buffers]
    ns = call.__globals__
    real = ns["kernel1"]

    def failing(*_: Any) -> None:
        raise RuntimeError("kernel failed")

    ns["kernel1"] = failing
    try:
        try:
            call(*_inputs(seed=1))
            raise AssertionError("the call did not raise")
        except RuntimeError as e:
            assert "kernel failed" in str(e)
    finally:
        ns["kernel1"] = real
    assert not pool._lock.locked()
    args = _inputs(seed=2)
    assert_same(call(*args), _f(*args))
    assert [b.data_ptr() for b in pool._buffers] == ptrs  # taken again, not fresh ones


def test_dynamic_sizes() -> None:
    def g(x, w):
        y = torch.softmax(x * 2, -1)
        z = y @ w
        return (torch.relu(z).sum(0), torch.tanh(z) + 1)

    call, src = _load(g, _inputs(n=8), mode="symbolic")
    assert re.search(r"_pool = BufferPool\(lambda s\d+(, s\d+)*: \[", src), src
    pool = _pool_of(call)
    sizes = []
    for n in (8, 3, 3, 20, 8):
        args = _inputs(n=n, seed=n)
        assert_same(list(call(*args)), list(g(*args)), check_stride=True)
        sizes.append(pool.nbytes)
    assert sizes[0] == sizes[4] != sizes[1] == sizes[2] != sizes[3]
