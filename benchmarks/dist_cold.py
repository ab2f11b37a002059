"""Cold compile of a 2-rank job, with and without ``ember.config.dist_compile_once``.

    python -m benchmarks.dist_cold [--once 0|1]

Each run: an empty cache directory shared by the ranks, a GPT-2 (2 layers, d=32) from config
compiled with Ember's inductor, one training step; prints each rank's first-step seconds and
its kernel cache counters (builds: kernels it compiled; disk_hits: kernels it loaded).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.multiprocessing as mp


def _rank(rank: int, world: int, store: str, once: bool, q: "mp.Queue") -> None:
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    import ember
    from ember_inductor.runtime import cache

    ember.config.dist_compile_once = once
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=32,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   use_cache=False))
    c = ember.compile(m, backend="inductor")
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(rank))
    dist.barrier()
    t0 = time.perf_counter()
    c(ids, labels=ids).loss.backward()
    q.put((rank, round(time.perf_counter() - t0, 1), dict(cache.counters)))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--once", type=int, choices=[0, 1], default=None,
                   help="only this setting (default: both, off first)")
    a = p.parse_args()
    for once in ([bool(a.once)] if a.once is not None else [False, True]):
        with tempfile.TemporaryDirectory(prefix="ember-cold-") as tmp:
            os.environ["EMBER_CACHE_DIR"] = os.path.join(tmp, "cache")
            q = mp.get_context("spawn").Queue()
            t0 = time.perf_counter()
            mp.start_processes(_rank, args=(2, os.path.join(tmp, "store"), once, q), nprocs=2,
                               start_method="spawn")
            rows = sorted([q.get(), q.get()])
            print(f"dist_compile_once={once}: job {time.perf_counter() - t0:.1f} s; "
                  + "; ".join(f"rank {r}: first step {s} s, {c}" for r, s, c in rows), flush=True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
