"""Every rank compiles the same graphs (else ember.RankDivergence, not a hang), and a shared
cache directory makes one rank compile for all, inside daemonic processes."""

from __future__ import annotations

from . import workers
from ._spawn import run_ranks


def test_compile_once_and_divergence_errors(tmp_path):
    run_ranks(workers.ranks_all, timeout=200, daemon=True,
              env={"EMBER_CACHE_DIR": str(tmp_path / "cache")})
