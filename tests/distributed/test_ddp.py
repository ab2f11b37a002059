"""DDP under Ember on 2 gloo ranks: eager vs Ember, loss and every gradient, 3 steps."""

from __future__ import annotations

from . import workers
from ._spawn import run_ranks


def test_ddp_mlp():
    run_ranks(workers.ddp_mlp, timeout=240)


def test_ddp_and_fsdp_gpt2():
    run_ranks(workers.gpt2_all, timeout=300)
