"""One torchrun job (NCCL, one GPU per rank): GPT-2 124M (from config, random weights) trained
under DDP or FSDP2, eager vs Ember (aot_eager, inductor) vs torch.compile: median step time,
peak memory, first-step (compile) seconds, losses of the first steps, Ember's graphs/fallbacks.
Run by scripts/gpu_dist.sh:

    torchrun --nproc-per-node 2 scripts/gpu_dist.py --mode ddp --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist


def model() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return GPT2LMHeadModel(cfg)  # 124M parameters


def wrap(mode: str, variant: str, m: torch.nn.Module, dev: torch.device) -> torch.nn.Module:
    import ember

    m = m.to(dev)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        d = DDP(m, device_ids=[dev.index])
        if variant.startswith("ember"):
            return ember.compile(d, backend=variant.split("-", 1)[1])
        if variant == "torch.compile":
            return torch.compile(d)
        return d
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i, blk in enumerate(m.transformer.h):
        if variant.startswith("ember"):
            blk = m.transformer.h[i] = ember.compile(blk, backend=variant.split("-", 1)[1])
        elif variant == "torch.compile":
            blk.compile()
        fully_shard(blk, mp_policy=mp)
    fully_shard(m, mp_policy=mp)
    return m


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "fsdp"], required=True)
    p.add_argument("--variants", default="eager,ember-aot_eager,ember-inductor,torch.compile")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    g = torch.Generator(device="cpu").manual_seed(rank)
    ids = torch.randint(0, 50257, (a.batch, a.seq), generator=g).to(dev)
    results = {}
    for variant in a.variants.split(","):
        import ember
        from ember import events

        ember.reset()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        row: dict = {}
        try:
            base = model()
            m = wrap(a.mode, variant, base, dev)
            opt = torch.optim.AdamW(base.parameters(), lr=1e-4, foreach=False)
            times, losses = [], []
            for step in range(a.steps + 3):
                torch.cuda.synchronize(dev)
                dist.barrier()
                t0 = time.perf_counter()
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.mode == "ddp"):
                    out = m(ids, labels=ids)
                out.loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                torch.cuda.synchronize(dev)
                dt = time.perf_counter() - t0
                if step == 0:
                    row["first_step_s"] = round(dt, 2)
                if step < 3:
                    losses.append(round(out.loss.item(), 4))
                else:
                    times.append(dt)
            row.update(median_step_ms=round(1e3 * statistics.median(times), 2),
                       peak_mem_gb=round(torch.cuda.max_memory_allocated(dev) / 2**30, 2),
                       losses=losses, ember=dict(events.counters["stats"]),
                       ddp_split=dict(events.counters["ddp"]))
            del m, base, opt
        except Exception as e:  # a failed variant is reported, the others still run
            row["error"] = f"{type(e).__name__}: {e}"
            row["traceback"] = traceback.format_exc()[-3000:]
        results[variant] = row
    if rank == 0:
        a.out.mkdir(parents=True, exist_ok=True)
        info = {"mode": a.mode, "world": dist.get_world_size(), "gpu": torch.cuda.get_device_name(dev),
                "torch": torch.__version__, "batch_per_rank": a.batch, "seq": a.seq,
                "results": results}
        (a.out / f"gpu_dist_{a.mode}.json").write_text(json.dumps(info, indent=1))
        eager = results.get("eager", {}).get("median_step_ms")
        lines = [f"{a.mode.upper()} GPT-2 124M, {info['world']} x {info['gpu']}, torch "
                 f"{info['torch']}, batch {a.batch}x{a.seq} per rank",
                 "", "| variant | step ms | vs eager | peak GB | first step s | losses | graphs |",
                 "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
        for v, r in results.items():
            if "error" in r:
                lines.append(f"| {v} | error: {r['error'][:120]} | | | | | |")
                continue
            sp = f"{eager / r['median_step_ms']:.2f}x" if eager else ""
            lines.append(f"| {v} | {r['median_step_ms']} | {sp} | {r['peak_mem_gb']} | "
                         f"{r['first_step_s']} | {r['losses']} | {r['ember']} {r['ddp_split']} |")
        text = "\n".join(lines)
        (a.out / f"gpu_dist_{a.mode}.md").write_text(text + "\n")
        print(text, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
