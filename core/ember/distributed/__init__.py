"""Ember under ``torch.distributed``: DDP and FSDP2 modules, rank agreement, compile once.

Ember runs under torch.distributed; it does not replace it. What lives here:

* :mod:`.ddp`: ``ember.compile(DDP(model))`` (DDP's bookkeeping runs as Python around the
  compiled inner module) and the bucket split of a graph compiled inside a DDP forward, so each
  gradient bucket's all-reduce starts while the backward of earlier layers still runs (what
  torch calls DDPOptimizer).
* :mod:`.ranks`: every rank must compile the same graphs; a compile that one rank makes and
  another does not, or a graph that differs between ranks, is an error naming it instead of a
  hang. With a cache directory shared by the ranks, rank 0 compiles each graph first and the
  others load it from the caches.

See docs/distributed.md.
"""

from __future__ import annotations

from .ddp import is_ddp
from ..exc import RankDivergence

__all__ = ["is_ddp", "RankDivergence"]
