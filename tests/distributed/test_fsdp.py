"""FSDP2 (fully_shard) under Ember on 2 gloo ranks: eager vs Ember, 3 steps; checkpoints."""

from __future__ import annotations

from . import workers
from ._spawn import run_ranks


def test_fsdp_mlp(tmp_path):
    run_ranks(workers.fsdp_mlp, str(tmp_path), timeout=240)


def test_fsdp_gpt2():
    run_ranks(workers.fsdp_gpt2, timeout=240)
