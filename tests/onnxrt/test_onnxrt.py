"""The ``onnxrt`` backend (plugins/onnxrt): ops and small models against eager, partitioning,
dynamic shapes, the on-disk cache, frozen weights, precompile and errors."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

import ember
from ember import config

pytest.importorskip("onnxruntime", reason="ember-onnxrt needs onnxruntime (pip install "
                    "./plugins/onnxrt)")
pytest.importorskip("onnxscript", reason="ember-onnxrt needs onnxscript")

from ember_onnxrt import backend as B  # noqa: E402
from ember_onnxrt import session as S  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(config, "suppress_errors", False)
    ember.reset()
    B.last_compiled.clear()
    yield
    ember.reset()


def _run(fn, *args, options=None, **kw):
    c = ember.compile(fn, backend="onnxrt", options=options, **kw)
    with torch.no_grad():
        got = c(*args)
        want = fn(*args)
    return got, want, B.last_compiled[-1]


def _close(got, want, tol=1e-4):
    got = got if isinstance(got, (tuple, list)) else [got]
    want = want if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)
        else:
            assert torch.equal(g, w)


# -- listing -----------------------------------------------------------------------------------

def test_listed_inference_only_with_runtime_and_providers(capsys):
    from ember.__main__ import main
    from ember.plugins import backend_table

    row = next(r for r in backend_table() if r["name"] == "onnxrt")
    assert row["training"] == "inference-only" and row["level"] == "aten"
    assert row["distribution"] == "ember-onnxrt"
    import onnxruntime

    assert onnxruntime.__version__ in row["runtime"] and "CPUExecutionProvider" in row["runtime"]
    assert main(["backends"]) == 0
    assert f"runtime of onnxrt: onnxruntime {onnxruntime.__version__}, providers: " in \
        capsys.readouterr().out


# -- ops ---------------------------------------------------------------------------------------

x = torch.randn(3, 5)
ints = torch.randint(-4, 5, (3, 5))
OPS = {
    "pointwise": (lambda a: torch.sigmoid(a) * a.exp() - a.abs().sqrt() + a.tanh(), (x,)),
    "gelu_silu": (lambda a: torch.nn.functional.gelu(a) + torch.nn.functional.silu(a), (x,)),
    "int_times_float": (lambda a, i: a * i + i * 0.5, (x, ints)),
    "int_div": (lambda i: i / 3 + torch.div(i, 2, rounding_mode="floor"), (ints,)),
    "compare_mixed": (lambda a, i: (a > i) & (i >= 1) | (a == 0.0), (x, ints)),
    "where_scalar": (lambda a: torch.where(a > 0, a, 0.0), (x,)),
    "sum_bool": (lambda a: (a > 0).sum(-1), (x,)),
    "cumsum_int": (lambda i: i.cumsum(1), (ints,)),
    "reductions": (lambda a: (a.mean(0), a.amax(1), a.sum(1), a.softmax(-1),
                              a.log_softmax(0)), (x,)),
    "matmul": (lambda a, b: a @ b.t() + torch.bmm(a[None], b.t()[None])[0], (x, x)),
    "shapes": (lambda a: torch.cat([a, a.flip(0)], 1).reshape(5, 6).transpose(0, 1)
               .unsqueeze(0).expand(2, 6, 5).contiguous()[:, 1:4, ::2], (x,)),
    "split_stack": (lambda a: torch.stack(a.split(2, dim=1), 0).sum(0), (torch.randn(3, 6),)),
    "gather_index": (lambda a, i: (a.gather(1, i.abs() % 5), a[i.abs()[0] % 3]), (x, ints)),
    "full_arange": (lambda a: a + torch.arange(5) + torch.full((3, 5), 2.0) + torch.ones(5),
                    (x,)),
    "pow_clamp": (lambda a: a.pow(2).clamp(0.1, 2.0) + a.clamp_min(0) ** 0.5, (x,)),
    "float64": (lambda a: (a.double() * 3).sin(), (x,)),
    "transposed_output": (lambda a, b: (a @ b.t()).t(), (x, x)),
}


@pytest.mark.parametrize("name", list(OPS))
def test_op_matches_eager(name):
    fn, args = OPS[name]
    got, want, comp = _run(fn, *args)
    _close(got, want)
    assert comp.ort_ops == comp.total_ops, comp.aten_ops


def test_var_mean_stays_aten_and_is_right():
    got, want, comp = _run(lambda a: torch.var_mean(a * 2, dim=1, keepdim=True)[0].exp() + 1,
                           torch.randn(4, 6))
    _close(got, want)
    assert "aten::var_mean.correction" in comp.aten_ops


def test_conv_batchnorm_pool_model():
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                            torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 4, 1),
                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                            torch.nn.Linear(4, 3)).eval()
    got, want, comp = _run(m, torch.randn(2, 3, 8, 8))
    _close(got, want)
    assert comp.share == 1.0 and comp.subgraphs == 1


class Block(torch.nn.Module):
    """A pre-norm transformer block with SDPA (causal)."""

    def __init__(self, d=16, h=2):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, d // self.h).permute(
            2, 0, 3, 1, 4).unbind(0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def test_transformer_block():
    m = Block().eval()
    got, want, comp = _run(m, torch.randn(2, 5, 16))
    _close(got, want)
    assert comp.share == 1.0, comp.aten_ops


def test_torch_fast_path_op_runs_in_aten():
    # nn.TransformerEncoderLayer in eval runs one fused ATen op torch_lib does not have
    m = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    got, want, comp = _run(m, torch.randn(2, 5, 16))
    _close(got, want)
    assert "aten::_transformer_encoder_layer_fwd" in comp.aten_ops


# -- partitioning ----------------------------------------------------------------------------

def _with_gap(a):
    h = torch.relu(a @ a.t()) * 2 + 1
    v = torch.special.i0(h)  # aten::i0: torch_lib has no function for it
    return torch.softmax(h * v - 1, -1).exp() + 1


def test_partition_runs_unsupported_op_in_aten_between_subgraphs(caplog):
    caplog.set_level(logging.INFO, logger="ember.onnxrt")
    got, want, comp = _run(_with_gap, torch.randn(4, 4))
    _close(got, want)
    assert comp.subgraphs == 2
    assert "aten::i0" in comp.aten_ops
    assert "torch_lib has no function" in comp.aten_ops["aten::i0"]
    assert 0 < comp.share < 1 and comp.ort_ops == comp.total_ops - 1
    assert any("aten::i0" in r.getMessage() and "ATen" in r.getMessage()
               for r in caplog.records)


def test_min_subgraph_size_keeps_tiny_groups_in_aten():
    got, want, comp = _run(_with_gap, torch.randn(4, 4))
    assert comp.subgraphs == 2
    ember.reset()
    # 5 supported ops on either side of i0: with a minimum of 6 neither is worth a session
    got, want, comp = _run(_with_gap, torch.randn(4, 4), options={"min_subgraph_ops": 6})
    _close(got, want)
    assert comp.subgraphs == 0 and comp.ort_ops == 0
    assert "fewer than min_subgraph_ops=6" in comp.aten_ops["aten::mm"]


def test_nothing_for_ort_runs_as_is_with_one_info_line(caplog):
    caplog.set_level(logging.INFO, logger="ember.onnxrt")
    got, want, comp = _run(lambda a: torch.special.i0(a), torch.randn(4, 3))
    _close(got, want)
    assert comp.ort_ops == 0 and comp.subgraphs == 0
    lines = [r for r in caplog.records if "nothing for ONNX Runtime" in r.getMessage()]
    assert len(lines) == 1 and "aten::i0" in lines[0].getMessage()


# -- dynamic shapes ----------------------------------------------------------------------------

def test_sequence_length_sweep_uses_one_session():
    m = Block().eval()
    c = ember.compile(m, backend="onnxrt", dynamic=True)
    with torch.no_grad():
        for n in (3, 5, 8, 11):
            t = torch.randn(2, n, 16)
            _close(c(t), m(t))
    assert len(B.last_compiled) == 1
    comp = B.last_compiled[0]
    (call,) = comp.calls
    assert call.frozen_call.calls == 4
    dims = [i.shape for i in call.frozen_call.sess.get_inputs()]
    assert any(isinstance(d, str) for shape in dims for d in shape), dims  # a named dim


# -- frozen weights ----------------------------------------------------------------------------

def test_weights_are_initializers_and_a_change_is_seen(caplog):
    caplog.set_level(logging.INFO, logger="ember.onnxrt")
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
    t = torch.randn(3, 4)
    c = ember.compile(m, backend="onnxrt")
    with torch.no_grad():
        _close(c(t), m(t))
        (call,) = B.last_compiled[-1].calls
        assert len(call.init) == 4 and len(call.frozen_call.sess.get_inputs()) == 1
        m[0].weight.add_(1.0)            # a torch in-place op: version counter
        _close(c(t), m(t))
        assert call.thawed
        m[2].bias.data.mul_(3.0)          # through .data: only the content check sees it
        _close(c(t), m(t))
    assert any("now takes them as inputs" in r.getMessage() for r in caplog.records)


def test_data_write_seen_by_content_check_before_thawing():
    m = torch.nn.Linear(4, 4).eval()
    t = torch.randn(2, 4)
    c = ember.compile(m, backend="onnxrt")
    with torch.no_grad():
        _close(c(t), m(t))
        m.weight.data.mul_(-1.0)
        _close(c(t), m(t))


# -- cache and precompile ----------------------------------------------------------------------

def test_warm_start_builds_no_session_from_scratch(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).eval()
    t = torch.randn(3, 4)
    before = dict(S.counters)
    got, want, _ = _run(m, t)
    assert S.counters["built"] == before["built"] + 1
    files = sorted(p.name for p in (tmp_path / "cache" / "onnxrt").iterdir())
    assert any(f.endswith(".opt.onnx") for f in files) and any(
        f.endswith(".onnx") and not f.endswith(".opt.onnx") for f in files)
    ember.reset()
    hits = B.counters["partition_cache_hits"]
    got2, want2, _ = _run(m, t)
    assert S.counters["built"] == before["built"] + 1
    assert S.counters["warm"] == before["warm"] + 1
    assert B.counters["partition_cache_hits"] == hits + 1  # no node asked torch_lib again
    _close(got2, want2)
    # a corrupt entry is a miss, rebuilt
    for p in (tmp_path / "cache" / "onnxrt").iterdir():
        if p.name.endswith(".opt.onnx"):
            p.write_bytes(b"garbage")
    ember.reset()
    got3, want3, _ = _run(m, t)
    _close(got3, want3)
    assert S.counters["built"] == before["built"] + 2


def test_precompile_artifact_round_trip(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).eval()
    t = torch.randn(3, 4)
    with torch.no_grad():
        art = ember.precompile(m, t, backend="onnxrt")
        assert any(k.endswith(".onnx") for k in _entries(art))
        art.save(str(tmp_path / "art"))
        fn = ember.precompile.load(str(tmp_path / "art"))
        _close(fn(m, t), m(t))
        m[0].weight.mul_(2.0)  # the artifact reads the weights of the model it is given
        _close(fn(m, t), m(t))


def test_precompile_partitioned_graph(tmp_path):
    t = torch.randn(4, 4)
    with torch.no_grad():
        art = ember.precompile(_with_gap, t, backend="onnxrt")
        assert sum(k.endswith(".onnx") for k in _entries(art)) == 2  # two ORT subgraphs
        assert "torch.ops.aten.i0" in art.source  # the ATen op between them, as source
        fn = ember.precompile.load(source=art.source, cache=art.cache)
        _close(fn(t), _with_gap(t))
        fn = ember.precompile.load(source=art.source)  # no cache: models from the source
        _close(fn(t), _with_gap(t))


def _entries(art):
    from ember.precompile.container import read_manifest

    manifest, _ = read_manifest(art.cache)
    return [e["name"] for e in manifest["entries"]]


# -- errors ------------------------------------------------------------------------------------

def test_training_call_raises_inference_only():
    m = torch.nn.Linear(4, 2)
    c = ember.compile(m, backend="onnxrt")
    with pytest.raises(ember.InferenceOnlyBackend, match=r"torch\.no_grad\(\)") as e:
        c(torch.randn(2, 4))
    assert "inference_mode" in str(e.value) and "aot_eager" in str(e.value)


def test_missing_onnxruntime_is_a_clear_compile_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ember.BackendCompilerFailed, match="pip install onnxruntime"):
        with torch.no_grad():
            ember.compile(lambda a: a + 1, backend="onnxrt")(torch.randn(2))


def test_unknown_option_is_refused():
    with pytest.raises(ValueError, match="min_subgraph_ops"):
        ember.compile(lambda a: a + 1, backend="onnxrt",
                      options={"min_subgraph_op": 2})(torch.randn(2))


def test_listing_does_not_import_onnxruntime():
    code = ("import sys, ember\nfrom ember.plugins import list_backends\nlist_backends()\n"
            "print('onnxruntime' in sys.modules, 'onnxscript' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), check=True).stdout
    assert out.split() == ["False", "False"]


def _cuda_ep() -> bool:
    import onnxruntime

    return torch.cuda.is_available() and \
        "CUDAExecutionProvider" in onnxruntime.get_available_providers()


@pytest.mark.skipif(not _cuda_ep(), reason="needs a CUDA GPU and onnxruntime-gpu "
                    "(CUDAExecutionProvider)")
def test_cuda_tensors_use_the_cuda_execution_provider():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval().cuda()
    got, want, comp = _run(m, torch.randn(4, 8, device="cuda"))
    _close(got, want, tol=1e-3)
    (call,) = comp.calls
    assert call.frozen_call.sess.get_providers()[0] == "CUDAExecutionProvider"
    assert got.device.type == "cuda"
