"""FSDP2 (fully_shard) under Ember on 2 gloo ranks: eager vs Ember, 3 steps; checkpoints.
(GPT-2 under FSDP2: test_ddp.py::test_ddp_and_fsdp_gpt2, one spawn for both.)"""

from __future__ import annotations

from . import workers
from ._spawn import run_ranks


def test_fsdp_mlp(tmp_path):
    run_ranks(workers.fsdp_mlp, str(tmp_path), timeout=240)
