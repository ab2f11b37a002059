"""Every rank compiles the same graphs (else ember.RankDivergence, not a hang), and a shared
cache directory makes one rank compile for all."""

from __future__ import annotations

from . import workers
from ._spawn import run_ranks


def test_divergence_is_an_error():
    run_ranks(workers.divergence, timeout=120)


def test_shared_cache_compiles_once(tmp_path):
    run_ranks(workers.compile_once, timeout=180, daemon=True,
              env={"EMBER_CACHE_DIR": str(tmp_path / "cache")})
