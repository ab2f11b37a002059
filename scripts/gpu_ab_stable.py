"""A/B of the state-version guard check on the GPU (one model, inductor reduce-overhead,
inference): CUDA-event median of a call, and how many calls re-evaluated covered guards in
Python. Run twice: as is, and with EMBER_TENSOR_CHECK=py (no extension: no split).
    python3 scripts/gpu_ab_stable.py gpt2"""
import os, sys, statistics
sys.path.insert(0, os.getcwd())
import torch, ember
from ember.capture import stable, tensor_check
from benchmarks.zoo import get_spec
name = sys.argv[1] if len(sys.argv) > 1 else "gpt2"
if os.environ.get("EMBER_TENSOR_CHECK") != "py":
    tensor_check.extension(wait=300)
calls = []
real = stable._Recheck.__call__
stable._Recheck.__call__ = lambda self, idx: calls.append(len(idx)) or real(self, idx)
m, inputs = get_spec(name).build("cuda", "small")
m.eval()
f = ember.compile(m, mode="reduce-overhead")
with torch.no_grad():
    for _ in range(20):
        f(*inputs)
    torch.cuda.synchronize()
    calls.clear()
    ts = []
    for _ in range(200):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(*inputs); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
e = f.__dict__["_ember_call"].cache.entries
print(f"{name} tensor_check={tensor_check.state()} split={any('___stable_ok' in x.__globals__ for x in e)} "
      f"median {statistics.median(ts):.3f} ms, rechecks in 200 calls: {len(calls)} "
      f"(sizes {sorted(set(calls))[:10]})", flush=True)
