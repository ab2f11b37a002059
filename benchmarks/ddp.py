"""DDP training step on N gloo ranks: eager vs Ember vs torch.compile, step time and overlap.

    python -m benchmarks ddp [--world 2] [--model mlp|gpt2] [--iters 30] [--out DIR]

Each rank builds one DDP model per variant (same weights, same ``bucket_cap_mb``), warms them
up, then times training steps (zero_grad, forward, backward with DDP's all-reduces, SGD step)
*interleaved*: step i of every variant runs before step i+1 of any, so the machine's load drifts
over all of them alike; the table gives medians. Then one profiled step per variant
(torch.profiler) shows the overlap: when each bucket's all-reduce was *started* (gloo's
``all_reduce`` op, enqueued by DDP's gradient hooks) relative to the end of the backward. A
compiled graph that is one autograd node starts every all-reduce at the very end of the
backward; a graph split at bucket boundaries (Ember, torch.compile's DDPOptimizer) starts them
while the backward of earlier layers still runs.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

VARIANTS = ("eager", "ember", "torch.compile")


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=2048, n_positions=128,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
        return GPT2LMHeadModel(cfg)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(1024, 16))


def _batch(name: str, rank: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(rank)
    if name == "gpt2":
        return (torch.randint(0, 2048, (4, 128), generator=g),)
    return (torch.randn(64, 1024, generator=g),)


def _loss(name: str, out: Any, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    if name == "gpt2":
        logits = out.logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                 batch[0][:, 1:].flatten())
    return out.pow(2).mean()


def _wrap(variant: str, model: torch.nn.Module, cap_mb: float) -> Any:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, bucket_cap_mb=cap_mb)
    if variant == "ember":
        import ember

        return ember.compile(ddp, backend="inductor")
    if variant == "torch.compile":
        return torch.compile(ddp, backend="inductor")
    return ddp


def _overlap(prof: Any) -> dict[str, Any]:
    """From one profiled step: backward span, all-reduce enqueue times (ms before the end of
    the backward; positive = started while the backward still ran)."""
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    bwd = [e for e in events if e.name.startswith("autograd::engine::evaluate_function")]
    # gloo's collective as recorded on the calling thread (one per bucket; the c10d dispatcher
    # op around it would count each twice)
    ar = [e for e in events if e.name.startswith("gloo:all_reduce")] or \
        [e for e in events if "allreduce" in e.name]
    if not bwd or not ar:
        return {"backward_ms": None, "allreduces": len(ar), "started_during_backward": 0,
                "first_start_before_end_ms": None}
    b0 = min(e.time_range.start for e in bwd)
    b1 = max(e.time_range.end for e in bwd)
    starts = sorted(e.time_range.start for e in ar)
    during = [s for s in starts if s < b1 - 1]  # µs; 1 µs slack
    return {"backward_ms": round((b1 - b0) / 1e3, 2), "allreduces": len(starts),
            "started_during_backward": len(during),
            "first_start_before_end_ms": round((b1 - starts[0]) / 1e3, 2)}


def _rank(rank: int, world: int, store: str, model_name: str, iters: int, cap_mb: float,
          out_path: str) -> None:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=900))
    runs: dict[str, Any] = {}
    for v in VARIANTS:
        model = _model(model_name)
        wrapped = _wrap(v, model, cap_mb)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        runs[v] = (wrapped, opt)
    batch = _batch(model_name, rank)

    def step(v: str) -> float:
        wrapped, opt = runs[v]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _loss(model_name, wrapped(*batch), batch).backward()
        opt.step()
        return time.perf_counter() - t0

    compile_s = {}
    for v in VARIANTS:  # first step: compile
        dist.barrier()
        compile_s[v] = step(v)
        for _ in range(2):
            step(v)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(iters):
        for v in VARIANTS:
            dist.barrier()
            times[v].append(step(v))
    overlap = {}
    for v in VARIANTS:
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(v)
        overlap[v] = _overlap(prof)
    if rank == 0:
        from ember import events

        res = {"model": model_name, "world": world, "bucket_cap_mb": cap_mb, "iters": iters,
               "median_step_ms": {v: round(1e3 * statistics.median(t), 2)
                                  for v, t in times.items()},
               "first_step_s": {v: round(s, 2) for v, s in compile_s.items()},
               "ember_pieces": dict(events.counters["ddp"]), "overlap": overlap}
        Path(out_path).write_text(json.dumps(res, indent=1))
    dist.barrier()
    dist.destroy_process_group()


def table(res: dict[str, Any]) -> str:
    lines = [f"DDP training step, {res['world']} gloo ranks, model {res['model']}, "
             f"bucket_cap_mb={res['bucket_cap_mb']}, median of {res['iters']} interleaved steps",
             "",
             "| variant | step ms | vs eager | first step s | all-reduces | started during "
             "backward | first start before backward end (ms) | backward ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    eager = res["median_step_ms"]["eager"]
    for v in VARIANTS:
        o = res["overlap"][v]
        ms = res["median_step_ms"][v]
        lines.append(f"| {v} | {ms} | {eager / ms:.2f}x | {res['first_step_s'][v]} | "
                     f"{o['allreduces']} | {o['started_during_backward']} | "
                     f"{o['first_start_before_end_ms']} | {o['backward_ms']} |")
    lines.append("")
    lines.append(f"Ember split: {res['ember_pieces']}")
    return "\n".join(lines)


def main(world: int = 2, model: str = "mlp", iters: int = 30, cap_mb: float = 4.0,
         out: Path | None = None) -> int:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="ember-ddp-bench-") as tmp:
        res_path = os.path.join(tmp, "res.json")
        mp.start_processes(_rank, args=(world, os.path.join(tmp, "store"), model, iters, cap_mb,
                                        res_path), nprocs=world, start_method="spawn")
        res = json.loads(Path(res_path).read_text())
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    res["machine"] = {"cpu": cpu, "cores": os.cpu_count(), "loadavg": load,
                      "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                         time.gmtime())}
    text = table(res) + f"\n\nMachine: {res['machine']}\n"
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"ddp-{model}.json").write_text(json.dumps(res, indent=1))
        (out / f"ddp-{model}.md").write_text(text)
    return 0
