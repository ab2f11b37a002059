"""The on-disk cache of AOT autograd results (ember/aot/cache.py): a hit rebuilds exactly the graphs
tracing gives (same code, same metadata, same results), traces nothing, and anything in the key
that changes makes a miss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.fx as fx

import ember
from ember.aot import aot_compile
from ember.aot import cache

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _cache_dir(fresh_aot_cache: Path) -> Path:
    return fresh_aot_cache


def _backend(name: str = "warmtest", decompositions: Any = None) -> ember.Backend:
    def compile(gm: fx.GraphModule, example: list[Any], **options: Any) -> Callable[..., Any]:
        return gm

    return ember.Backend(name, compile, level="aten", decompositions=decompositions)


def _graph(fn: Callable[..., Any]) -> fx.GraphModule:
    """A torch-level graph returning a flat tuple (the form capture hands AOT)."""
    gm = fx.symbolic_trace(fn)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    if not isinstance(out.args[0], (tuple, list)):
        out.args = ((out.args[0],),)
    gm.recompile()
    return gm


def _block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, running: torch.Tensor) -> Any:
    h = torch.nn.functional.layer_norm(x, (8,), w, b)
    h = torch.nn.functional.gelu(h @ w.unsqueeze(1).expand(8, 8))
    running.mul_(0.9).add_(h.detach().mean(0), alpha=0.1)  # an input mutation
    m, i = h.max(dim=1)  # a multi-output op
    return h.sum(), h.t(), x[1:], m, i  # x[1:]: an output aliasing an input


def _inputs(requires_grad: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g)
    w = torch.randn(8, generator=g).requires_grad_(requires_grad)
    b = torch.randn(8, generator=g).requires_grad_(requires_grad)
    return [x, w, b, torch.zeros(8)]


def _variant(c: Any) -> Any:
    (v,) = c._variants.values()
    return v


def _graphs(v: Any) -> list[fx.GraphModule]:
    return [v.graph] if getattr(v, "partition", None) is None else [v.partition.fw,
                                                                       v.partition.bw]


def _metas(gm: fx.GraphModule) -> list[Any]:
    return [cache._enc_val(n.meta.get("val")) for n in gm.graph.nodes]


def _run(c: Any, args: list[torch.Tensor], train: bool) -> Any:
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = c(*args)
    grads = None
    if train:
        out[0].backward()
        grads = [a.grad for a in args]
    return out, args[3], grads


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_hit_rebuilds_exactly_what_tracing_gives(train: bool) -> None:
    gm, args, be = _graph(_block), _inputs(train), _backend()
    with torch.enable_grad():
        traced = aot_compile(gm, args, backend=be)
        assert cache.counters["misses"] == 1 and cache.counters["hits"] == 0
        rebuilt = aot_compile(gm, args, backend=be)
        assert cache.counters["hits"] == 1
        a, b = _variant(traced), _variant(rebuilt)
        assert type(a) is type(b)
        for ga, gb in zip(_graphs(a), _graphs(b), strict=True):
            assert ga.code == gb.code
            assert _metas(ga) == _metas(gb)
        assert a.info.outputs == b.info.outputs and a.info.mutated == b.info.mutated == [3]
        if train:
            pa, pb = a.partition, b.partition
            assert (pa.n_saved, pa.saved_names, pa.grad_tangent_deps, pa.primal_reaches) == \
                   (pb.n_saved, pb.saved_names, pb.grad_tangent_deps, pb.primal_reaches)
        (out_a, run_a, g_a), (out_b, run_b, g_b) = _run(traced, args, train), _run(rebuilt, args,
                                                                                   train)
    torch.testing.assert_close(out_a, out_b, rtol=0, atol=0)
    torch.testing.assert_close(run_a, run_b, rtol=0, atol=0)
    assert run_b.abs().sum() > 0  # the mutation was copied back
    torch.testing.assert_close(g_a, g_b, rtol=0, atol=0)
    # eager semantics kept: the aliasing output is a view of the input
    x = args[0].clone()
    out = rebuilt(x, *[a.detach().clone().requires_grad_(a.requires_grad) for a in args[1:]])
    assert out[2].data_ptr() == x[1:].data_ptr()


def test_a_hit_traces_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    gm, args, be = _graph(_block), _inputs(True), _backend()
    with torch.enable_grad():
        aot_compile(gm, args, backend=be)
        from torch._subclasses import fake_tensor

        made = []
        real_init = fake_tensor.FakeTensorMode.__init__

        def counting_init(self: Any, *a: Any, **k: Any) -> None:
            made.append(1)
            real_init(self, *a, **k)

        monkeypatch.setattr(fake_tensor.FakeTensorMode, "__init__", counting_init)
        aot_compile(gm, args, backend=be)
    assert cache.counters["hits"] == 1
    assert made == []  # no FakeTensorMode: nothing traced


def _changes() -> dict[str, Callable[[list[torch.Tensor]], Any]]:
    def shape(a):
        a[0] = torch.randn(5, 8)

    def stride(a):
        a[0] = torch.randn(8, 4).t()

    def dtype(a):
        a[3] = torch.zeros(8, dtype=torch.float64)

    def requires_grad(a):
        a[1] = a[1].detach().requires_grad_(False)

    def aliasing(a):  # two inputs sharing one storage
        a[2] = a[1]

    def offset(a):
        a[3] = torch.zeros(9)[1:]

    return {"shape": shape, "stride": stride, "dtype": dtype, "requires_grad": requires_grad,
            "aliasing": aliasing, "offset": offset}


@pytest.mark.parametrize("change", list(_changes()))
def test_a_changed_input_is_a_miss(change: str) -> None:
    gm, be = _graph(_block), _backend()
    with torch.enable_grad():
        aot_compile(gm, _inputs(True), backend=be)
        args = _inputs(True)
        _changes()[change](args)
        aot_compile(gm, args, backend=be)
    assert cache.counters["hits"] == 0 and cache.counters["misses"] == 2


def test_grad_mode_graph_backend_options_and_decompositions_are_in_the_key() -> None:
    def other(x, w, b, running):  # same signature, one op differs
        h = torch.nn.functional.layer_norm(x, (8,), w, b)
        h = torch.nn.functional.relu(h @ w.unsqueeze(1).expand(8, 8))
        running.mul_(0.9).add_(h.detach().mean(0), alpha=0.1)
        m, i = h.max(dim=1)
        return h.sum(), h.t(), x[1:], m, i

    gm, args = _graph(_block), _inputs(True)
    gelu = {aten.gelu.default: torch._decomp.decomposition_table[aten.gelu.default]}
    with torch.enable_grad():
        aot_compile(gm, args, backend=_backend())
        n = 1
        for gm2, be, opts in [(gm, _backend("warmtest2"), {}),  # backend name
                              (gm, _backend(), {"mode": "max-autotune"}),  # options
                              (gm, _backend(decompositions=gelu), {}),  # decompositions
                              (_graph(other), _backend(), {})]:  # graph code
            aot_compile(gm2, args, backend=be, options=opts)
            n += 1
            assert cache.counters["misses"] == n and cache.counters["hits"] == 0
    with torch.no_grad():  # grad mode: the inference variant
        aot_compile(gm, args, backend=_backend())
    assert cache.counters["misses"] == n + 1 and cache.counters["hits"] == 0
    # and each of those is now a hit
    with torch.no_grad():
        aot_compile(gm, args, backend=_backend())
    with torch.enable_grad():
        aot_compile(gm, args, backend=_backend(decompositions=gelu))
    assert cache.counters["hits"] == 2


def test_a_constant_input_is_in_the_key() -> None:
    gm = _graph(lambda x, k: (x * k,))
    be = _backend()
    aot_compile(gm, [torch.randn(3), 2], backend=be)
    c = aot_compile(gm, [torch.randn(3), 3], backend=be)
    assert cache.counters["hits"] == 0 and cache.counters["misses"] == 2
    torch.testing.assert_close(c(torch.ones(3), 3)[0], torch.full((3,), 3.0))


def test_a_corrupt_entry_is_a_miss_and_is_rewritten(_cache_dir: Path) -> None:
    gm, args, be = _graph(_block), _inputs(False), _backend()
    aot_compile(gm, args, backend=be)
    (entry,) = (_cache_dir / "text" / "aot").glob("*.json")
    record = json.loads(entry.read_text())
    for bad in [entry.read_bytes()[:100],  # truncated
                json.dumps(dict(record, text=record["text"].replace("gelu", "relu"))).encode()]:
        entry.write_bytes(bad)
        c = aot_compile(gm, args, backend=be)
        assert cache.counters["hits"] == 0
        out = c(*[a.clone() for a in args])
        torch.testing.assert_close(out[0], _block(*[a.clone() for a in args])[0])
    assert cache.counters["corrupt"] == 2 and cache.counters["misses"] == 3
    aot_compile(gm, args, backend=be)
    assert cache.counters["hits"] == 1


def test_a_checksummed_entry_that_does_not_rebuild_is_a_miss(_cache_dir: Path) -> None:
    gm, args, be = _graph(_block), _inputs(False), _backend()
    aot_compile(gm, args, backend=be)
    (entry,) = (_cache_dir / "text" / "aot").glob("*.json")
    record = json.loads(entry.read_text())
    text = record["text"].replace('"op:aten::gelu', '"op:aten::no_such_op')
    cache.put_text(cache.NAMESPACE, record["key"], text)  # a valid record of a bad graph
    aot_compile(gm, args, backend=be)
    assert cache.counters["hits"] == 0 and cache.counters["corrupt"] == 1


def test_switched_off(monkeypatch: pytest.MonkeyPatch, _cache_dir: Path) -> None:
    monkeypatch.setattr(ember.config, "aot_cache", False)
    gm, args, be = _graph(_block), _inputs(False), _backend()
    aot_compile(gm, args, backend=be)
    aot_compile(gm, args, backend=be)
    assert cache.counters == {"hits": 0, "misses": 0, "uncacheable": 0, "corrupt": 0}
    assert not (_cache_dir / "text" / "aot").exists()


def test_uncacheable_graph_is_traced_as_before() -> None:
    def helper(x, k):
        return x * (k + 1)

    gm = fx.symbolic_trace(lambda x: (x + 1,))
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.target = helper  # a local function: no importable name
    gm.recompile()
    c = aot_compile(gm, [torch.ones(2)], backend=_backend())
    assert cache.counters["uncacheable"] == 1 and cache.counters["misses"] == 0
    torch.testing.assert_close(c(torch.ones(2))[0], torch.full((2,), 2.0))


_WARM = """
import sys, torch, ember
from ember.aot import cache
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                        torch.nn.Linear(16, 4))
x = torch.randn(5, 8)
c = ember.compile(m, backend="aot_eager")
loss = c(x).square().sum()
loss.backward()
ref = m(x).square().sum()
g = [p.grad.clone() for p in m.parameters()]
m.zero_grad(); ref.backward()
ok = torch.allclose(loss, ref) and all(torch.allclose(a, p.grad) for a, p in zip(g, m.parameters()))
print(cache.counters["hits"], cache.counters["misses"], ok)
"""


def test_a_fresh_process_hits_what_another_stored(py: Any, _cache_dir: Path) -> None:
    env = {"EMBER_CACHE_DIR": str(_cache_dir)}
    first = py(_WARM, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["0", "1", "True"]
    second = py(_WARM, env=env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["1", "0", "True"]


def test_cache_cli_without_the_inductor_plugin(py: Any, _cache_dir: Path) -> None:
    gm, args = _graph(_block), _inputs(False)
    aot_compile(gm, args, backend=_backend())
    code = """
import sys
sys.modules["ember_inductor.runtime"] = None  # as if the plugin were not installed
from ember.__main__ import main
main(["cache", "info"]); main(["cache", "clear"]); main(["cache", "info"])
"""
    r = py(code, env={"EMBER_CACHE_DIR": str(_cache_dir)})
    assert r.returncode == 0, r.stderr
    assert "'aot': 1 entries" in r.stdout and "removed 1 file(s)" in r.stdout
    assert "'aot': 0 entries" in r.stdout
    assert not list((_cache_dir / "text" / "aot").glob("*.json"))


def test_rebuilt_tensor_meta_is_shape_props() -> None:
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    for t in [torch.empty(2, 3), torch.empty(2, 3).t(), torch.empty(4, 1)[::2], torch.empty(()),
              torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last),
              torch.empty(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d),
              torch.empty(0, 3, dtype=torch.int64)]:
        assert cache._tensor_metadata(t) == _extract_tensor_metadata(t)


def test_graph_info_fields_this_format_does_not_know_are_uncacheable() -> None:
    from torch.utils import _pytree as pytree

    from ember.aot.analysis import GraphInfo

    info = GraphInfo(pytree.tree_flatten((1,))[1], [], [], [])
    cache._dumps_info(info)  # every field at its default: fine
    info.geometry = lambda inputs: {}  # dynamic shapes' per-call geometry
    with pytest.raises(cache.Uncacheable):
        cache._dumps_info(info)
