"""The GPU path without a GPU: kernels generated for CUDA (GPU block sizes, Triton's libdevice)
compile with Triton's real compiler for sm_90 and sm_80 (``triton.compile`` with Ember's
signature, constexprs and alignment attributes: what the interpreter cannot check), and a
compiled kernel goes through Ember's binary cache and back (``CompiledKernel`` rebuilt from the
stored files, no compilation)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from triton_util import DEVICE

_PAYLOAD_NAN = __import__("struct").unpack("<d", bytes.fromhex("2301000010f8ff7f"))[0]

GRAPHS = {
    "rows": (lambda x, s: (torch.softmax(x * s, -1), torch.nn.functional.layer_norm(x, (64,)),
                           x.argmax(-1), (x > 0).any(1), x.amax(-1)),
             lambda: (torch.randn(32, 64), torch.randn(64))),
    "looped_and_scalar": (lambda x: (torch.log_softmax(x, -1), x.sum(), *torch.var_mean(x, -1)),
                          lambda: (torch.randn(4, 3000),)),
    "pointwise": (lambda x, y, i, w: (x.t().contiguous() * 2, torch.tanh(x) + torch.erf(y.t()),
                                      x // 3, torch.remainder(x, 0.7), torch.where(x > y.t(), x, 1.0),
                                      torch.nn.functional.embedding(i, w) * 0.5,
                                      (i * 7) // (i + 1)),
                  lambda: (torch.randn(48, 40), torch.randn(40, 48), torch.tensor([[1, 3], [0, 2]]),
                           torch.randn(5, 8))),
    # few long rows: split across programs (a workspace and a finishing kernel)
    "split": (lambda x, m: (x.sum(), x.amax(0), (x * 2).sum(0), m.any()),
              lambda: (torch.randn(40000, 3), torch.rand(40000, 3) > 0.5)),
    # Philox draws (lowering/random.py): an int64 seed loaded as a scalar
    "random": (lambda x: (torch.rand_like(x) + torch.randn_like(x) * x,
                          torch.bernoulli(torch.sigmoid(x)), torch.rand_like(x[0, 0])),
               lambda: (torch.randn(16, 24),)),
    # eager's sign, relu and maximum on signed zeros; NaN constants with their sign and payload
    # (bit casts of integer constants)
    "special": (lambda x: (torch.sign(x), torch.relu(x), torch.maximum(x, -x),
                           torch.full_like(x, _PAYLOAD_NAN) + x,
                           torch.full_like(x, -float("nan"), dtype=torch.float64)),
                lambda: (torch.randn(6, 5),)),
    "dtypes": (lambda a, b, c: (a.double() * 2 + 1, (b & (b > 0)) | ~b, c.to(torch.int8) * 3),
               lambda: (torch.randn(10, 7), torch.rand(10, 7) > 0.5,
                        torch.randint(-5, 5, (10, 7)))),
}


def ptx_param_sizes(ck):
    """The byte sizes of a compiled kernel's parameters, from its PTX entry."""
    import re

    ptx = ck.asm["ptx"]
    head = ptx[ptx.index(".entry"):]
    head = head[:head.index(")")]
    sizes = {"8": 1, "16": 2, "32": 4, "64": 8}
    return [sizes[b] for b in re.findall(r"\.param\s+\.[a-z]+?(8|16|32|64)\b", head)]


def _nvidia():
    try:
        import triton  # noqa: F401
        from triton.backends import backends
        return "nvidia" in backends
    except Exception:  # noqa: BLE001
        return False


pytestmark = [
    pytest.mark.skipif(DEVICE != "cpu", reason="the GPU run builds kernels for real"),
    pytest.mark.skipif(not _nvidia(), reason="this Triton has no NVIDIA backend"),
]


_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, os.environ["EMBER_TEST_DIR"])
import torch, triton
from torch.fx.experimental.proxy_tensor import make_fx
from triton.backends.compiler import GPUTarget
from ember_inductor.compile_fx import generate_source
from ember_inductor.decompositions import decompositions
from ember_inductor.runtime import cuda_launch, triton as rt
from test_triton_gpu_build import GRAPHS, ptx_param_sizes

out = {"compiled": [], "errors": []}
for name, (fn, make) in sorted(GRAPHS.items()):
    gm = make_fx(fn, decomposition_table=decompositions())(*make())
    src, _ = generate_source(gm, key=f"gpu-{name}", options={"cpu_codegen": "triton"})
    ns = {}
    exec(src.split("_k = load_kernels")[0].split("CONSTANTS", 1)[1].split("\n", 1)[1], ns)
    source, kernels = ns["TRITON_SOURCE"], ns["KERNELS"]
    mod = rt._module(source)
    for arch in ((90, 80) if name == "rows" else (90,)):
        for kname, spec in kernels.items():
            for cfg in [spec["config"]] + spec["candidates"][:1 if arch == 90 else 0]:
                try:
                    ck = triton.compile(rt._ast_source(getattr(mod, kname), spec, cfg),
                                        target=GPUTarget("cuda", arch, 32),
                                        options=rt._options(cfg))
                    assert ck.asm.get("cubin")
                    out["compiled"].append(f"{name}/{kname}/sm{arch}")
                    # Ember's C launcher accepts what Triton compiled: the kernel's parameters,
                    # then at most two scratch pointers, which this kernel does not use
                    layout = cuda_launch.param_layout(spec["signature"], ptx_param_sizes(ck))
                    md = ck.metadata
                    if isinstance(layout, str) or getattr(md, "global_scratch_size", 0) or \
                            getattr(md, "profile_scratch_size", 0):
                        out["errors"].append(f"{name}/{kname}: Ember's launcher refuses: {layout}")
                    else:
                        out.setdefault("scratch", []).append(layout[1])
                except Exception as e:
                    out["errors"].append(f"{name}/{kname}/sm{arch} {cfg}: {type(e).__name__}: {str(e)[:800]}")
    if name == "rows":  # Ember's binary cache: store, load back (no compile), corrupt -> miss
        rt.machine_key = lambda: "test-machine"
        kname, spec = next(iter(kernels.items()))
        cfg = spec["config"]
        f = getattr(mod, kname)
        ck = triton.compile(rt._ast_source(f, spec, cfg), target=GPUTarget("cuda", 90, 32),
                            options=rt._options(cfg))
        key = rt._entry_key(source, spec, cfg)
        rt._store_binary(ck, key)
        before = dict(rt.counters)
        back = rt._load_binary(f, spec, cfg, key)
        out["roundtrip"] = (back is not None and back.asm["cubin"] == ck.asm["cubin"]
                            and rt.counters["disk_hits"] == before["disk_hits"] + 1
                            and rt.counters["compiles"] == before["compiles"])
        d = rt._entry_dir(key)
        next(p for p in d.iterdir() if p.suffix == ".cubin").write_bytes(b"garbage")
        out["corrupt_is_miss"] = rt._load_binary(f, spec, cfg, key) is None
# worker processes: every kernel of one graph compiled there, then loaded here from the cache
fn, make = GRAPHS["pointwise"]
gm = make_fx(fn, decomposition_table=decompositions())(*make())
src, _ = generate_source(gm, key="gpu-pool", options={"cpu_codegen": "triton"})
ns = {}
exec(src.split("_k = load_kernels")[0].split("CONSTANTS", 1)[1].split("\n", 1)[1], ns)
source, kernels = ns["TRITON_SOURCE"], ns["KERNELS"]
mod = rt._module(source)
rt.POOL_MIN_KERNELS = 1
os.environ["EMBER_TRITON_COMPILE_WORKERS"] = "2"
items = [(spec, spec["config"]) for spec in kernels.values()]
before = dict(rt.counters)
out["pool_built"] = rt.prebuild(source, items, target=("cuda", 90, 32))
out["pool_loaded"] = all(rt._load_binary(getattr(mod, s["name"]), s, c,
                                         rt._entry_key(source, s, c)) is not None
                         for s, c in items)
out["pool_no_compile_here"] = rt.counters["compiles"] == before["compiles"]
out["pool_kernels"] = len(items)
# the workers run Triton without torch (start-up in tens of ms, not seconds)
w = rt._procs[0]
w.stdin.write(json.dumps({"path": str(rt._module_path(source)), "name": items[0][0]["name"],
                          "spec": items[0][0], "config": items[0][1], "target": ["cuda", 90, 32],
                          "entry": str(rt._entry_dir(rt._entry_key(source, *items[0])))}) + "\n")
w.stdin.flush()
out["worker_reply"] = json.loads(w.stdout.readline())
# kernels identical but for names (one per layer) share one binary: built once (both tanh
# internal, so both written in place over the product they read)
gm = make_fx(lambda x, w: torch.tanh(torch.tanh(x @ w) @ w) @ w,
             decomposition_table=decompositions())(torch.randn(8, 8), torch.randn(8, 8))
src, _ = generate_source(gm, key="gpu-twins", options={"cpu_codegen": "triton"})
ns = {}
exec(src.split("_k = load_kernels")[0].split("CONSTANTS", 1)[1].split("\n", 1)[1], ns)
source, kernels = ns["TRITON_SOURCE"], ns["KERNELS"]
name = next(iter(kernels))
out["twins"] = [len(kernels), src.count(f"    {name}(")]
# load_kernels' GPU path (sm_90 stands for the GPU; the launcher is faked): on a cold cache every
# binary the first call needs (defaults, and all tuning candidates of untuned kernels) is built
# by the pool at once, nothing in this process; the ahead builds then load them from the cache
fn, make = GRAPHS["rows"]
gm = make_fx(fn, decomposition_table=decompositions())(*make())
src, _ = generate_source(gm, key="gpu-load", options={"cpu_codegen": "triton"})
ns = {}
exec(src.split("_k = load_kernels")[0].split("CONSTANTS", 1)[1].split("\n", 1)[1], ns)
source, kernels = ns["TRITON_SOURCE"], ns["KERNELS"]
saved = (rt._current_target, rt._fast_path, rt.Launcher._specialize, os.environ["EMBER_CACHE_DIR"])
rt._current_target = lambda: ("cuda", 90, 32)
rt._fast_path = lambda ck: (lambda *a: None)
rt.Launcher._specialize = lambda self: None
os.environ["EMBER_CACHE_DIR"] = os.path.join(saved[3], "load")
rt.machine_key = lambda: "test-machine-load"
rt._loaded.clear()
before = dict(rt.counters)
import logging
class _Logs(logging.Handler):
    def emit(self, r):
        out.setdefault("load_logs", []).append(r.getMessage()[:300])
logging.getLogger("ember.inductor.triton").addHandler(_Logs())
lns = rt.load_kernels(source, kernels)
want = {rt._entry_key(source, sp, c) for sp in kernels.values()
        for c in ([sp["config"]] + sp["candidates"])}
out["load"] = {"binaries": len(want), "pool": rt.counters["pool_builds"] - before["pool_builds"],
               "compiles_here": rt.counters["compiles"] - before["compiles"],
               "ahead": sum(ln.ck is not None for ln in lns.values()),
               "untuned": sum(bool(sp["candidates"]) for sp in kernels.values()),
               "kernels": len(kernels)}
rt._current_target, rt._fast_path, rt.Launcher._specialize = saved[:3]
os.environ["EMBER_CACHE_DIR"] = saved[3]
rt.machine_key = lambda: "test-machine"
# ember.precompile's Triton part: the binaries (default, candidates) and tuning choices of a
# graph travel as raw files; installed in a fresh cache they load without compiling
from ember_inductor.runtime.cache import get_text, put_text
fn, make = GRAPHS["looped_and_scalar"]
gm = make_fx(fn, decomposition_table=decompositions())(*make())
src, _ = generate_source(gm, key="gpu-art", options={"cpu_codegen": "triton"})
ns = {}
exec(src.split("_k = load_kernels")[0].split("CONSTANTS", 1)[1].split("\n", 1)[1], ns)
source, kernels = ns["TRITON_SOURCE"], ns["KERNELS"]
mod = rt._module(source)
items = [(spec, c) for spec in kernels.values() for c in [spec["config"]] + spec["candidates"]]
rt.prebuild(source, items, target=("cuda", 90, 32))
tuned = next(sp for sp in kernels.values() if sp["candidates"])
tkey = rt._tune_key(source, tuned, [int(n) for n in tuned["numels"]])
put_text("triton-tune", tkey, json.dumps(tuned["candidates"][0], sort_keys=True))
entries = rt.artifact_entries(source, kernels)
os.environ["EMBER_CACHE_DIR"] = os.path.join(os.environ["EMBER_CACHE_DIR"], "fresh")
rt._loaded.clear()
before = dict(rt.counters)
out["art_installed"] = [rt.install_artifact(entries), len({rt._entry_key(source, *it) for it in items})]
out["art_loaded"] = all(rt._load_binary(getattr(mod, s_["name"]), s_, c,
                                        rt._entry_key(source, s_, c)) is not None for s_, c in items)
out["art_no_compile"] = rt.counters["compiles"] == before["compiles"]
out["art_choice"] = get_text("triton-tune", tkey) == json.dumps(tuned["candidates"][0], sort_keys=True)
bad = dict(entries)
k = next(k for k in bad if k.endswith(".cubin"))
bad[k] = b"garbage"
os.environ["EMBER_CACHE_DIR"] += "2"
out["art_corrupt_skipped"] = rt.install_artifact(bad) == out["art_installed"][0] - 1
print("RESULT " + json.dumps(out))
"""


def test_kernels_compile_for_gpu_and_cache_roundtrip(tmp_path, py):
    """In a fresh process without TRITON_INTERPRET (Triton decides interpreter or compiler when
    it is imported): every kernel of GRAPHS, default configuration and a tuning candidate,
    compiles for sm_90 (one graph's also for sm_80); the binary cache round-trips."""
    import json
    from pathlib import Path

    env = {"EMBER_CACHE_DIR": str(tmp_path), "EMBER_TEST_DIR": str(Path(__file__).parent),
           "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    r = py(_SCRIPT, env=env, pythonpath=[str(Path(__file__).parent)], timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, f"the build script failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    out = json.loads(line[-1][7:])
    assert not out["errors"], "\n".join(out["errors"])
    assert len(out["compiled"]) >= 12, out["compiled"]
    # every kernel's compiled parameters are ones Ember's launcher passes (one scratch count)
    assert len(out["scratch"]) == len(out["compiled"]) and len(set(out["scratch"])) == 1, out
    assert any("_fin/" in c for c in out["compiled"]), "no split reduction was built"
    assert out["roundtrip"] and out["corrupt_is_miss"], out
    # built by worker processes, loaded here without compiling
    assert out["pool_built"] == out["pool_kernels"] >= 2, out
    assert out["pool_loaded"] and out["pool_no_compile_here"], out
    assert out["worker_reply"] == {"ok": "hit", "torch": False}, out
    # two tanh kernels identical but for names: one definition, called twice
    assert out["twins"] == [1, 2], out
    ld = out["load"]
    assert ld["binaries"] == ld["pool"] >= 3 and ld["compiles_here"] == 0, json.dumps(out["load"]) + json.dumps(out.get("load_logs"))
    assert ld["untuned"] >= 1 and ld["ahead"] == ld["kernels"] - ld["untuned"], ld
    # precompile: every binary of the graph installed from the artifact's entries, loaded
    # without compiling; the tuning choice travels; a corrupt binary is not installed
    assert out["art_installed"][0] == out["art_installed"][1] >= 3, out
    assert out["art_loaded"] and out["art_no_compile"] and out["art_choice"], out
    assert out["art_corrupt_skipped"], out


_TWINS = """import triton
import triton.language as tl

@triton.jit
def _sum(a, b):
    return a + b

@triton.jit
def kernel0(buf1, arg0, XBLOCK: tl.constexpr):
    # buf1: from tanh
    x0 = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(buf1 + x0, tl.load(arg0 + x0) * 2.0)

@triton.jit
def kernel1(buf7, buf3, XBLOCK: tl.constexpr):
    # buf7: another comment
    x0 = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(buf7 + x0, tl.load(buf3 + x0) * 2.0)

@triton.jit
def kernel2(buf7, buf3, XBLOCK: tl.constexpr):
    x0 = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(buf7 + x0, tl.load(buf3 + x0) * 3.0)
"""


def test_binary_keys_are_canonical(monkeypatch):
    """Across graphs (a forward and a backward module), kernels identical but for names and
    comments share one binary key; another constant, other parameter types or another
    configuration do not."""
    from ember_inductor.runtime import triton as rt

    monkeypatch.setattr(rt, "machine_key", lambda: "test-machine")

    def spec(name, sig=("*fp32", "*fp32")):
        return {"name": name, "signature": list(sig), "grid": "1d"}
    cfg = {"XBLOCK": 64, "num_warps": 2}
    k0, k1, k2 = (rt._entry_key(_TWINS, spec(n), cfg) for n in ("kernel0", "kernel1", "kernel2"))
    assert k0 == k1 != k2
    assert rt._entry_key(_TWINS, spec("kernel1", ("*fp32", "*bf16")), cfg) != k1
    assert rt._entry_key(_TWINS, spec("kernel1"), {"XBLOCK": 128, "num_warps": 2}) != k1
    other_helpers = _TWINS.replace("return a + b", "return a - b")
    assert rt._entry_key(other_helpers, spec("kernel1"), cfg) != k1
    assert rt._tune_key(_TWINS, spec("kernel0"), [64]) == rt._tune_key(_TWINS, spec("kernel1"), [64])
