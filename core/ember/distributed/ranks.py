"""Every rank compiles the same graphs, and a shared cache makes them compile once.

Under data parallelism every rank runs the same program, so every rank captures the same
graphs in the same order. When they do not (a guard failed on one rank only: a Python value
that differs between ranks, a shape only one rank sees), one rank runs a graph whose collectives
the others never join, and the job hangs until the collective times out. Ember checks instead,
through the process group's key-value store (never a collective, which would itself hang):

* each top-level compile gets a sequence number; the rank posts ``(graph hash, graph id,
  function, last recompile reason, host, cache dir)`` under it and waits up to
  ``ember.config.dist_timeout`` seconds for every other rank's post;
* different hashes, or a rank that never posts, raise :class:`ember.RankDivergence` naming the
  graph, the function, the ranks and (when a guard failed) the guard.

Compile once (``ember.config.dist_compile_once``, off by default): the ranks whose host and
cache directory are rank 0's wait until rank 0 has compiled the graph, then compile it
themselves, which reads what rank 0 wrote to the on-disk caches (AOT autograd's graphs,
inductor's kernels) instead of building it again: one rank builds, not N competing ones.

Only graphs compiled with gradients on (training) are checked: code that runs on one rank only
(evaluation or logging on rank 0) usually runs under ``torch.no_grad()``, and is left alone.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Sequence

import torch

from .. import config, events
from ..exc import RankDivergence
from ..hookspecs import hookimpl

__all__ = ["active", "agreed", "graph_hash"]

log = logging.getLogger("ember.distributed")

_tls = threading.local()
_lock = threading.Lock()
_state: dict[str, Any] = {"store": None, "seq": 0}
_observer_registered = False


def _dist() -> Any:
    d = sys.modules.get("torch.distributed")
    if d is None or not d.is_available() or not d.is_initialized():
        return None
    return d


def active() -> bool:
    """Is a rank check due for a compile now? (torch.distributed initialized with more than one
    rank, the check or compile-once on, grad mode on, and not inside a check already.)"""
    if getattr(_tls, "inside", False) or not (config.dist_check or config.dist_compile_once):
        return False
    if not torch.is_grad_enabled():
        return False
    d = _dist()
    if d is None:
        return False
    try:
        return d.get_world_size() > 1
    except Exception:
        return False


def graph_hash(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """A digest of the graph's code (without its comments: source locations may differ between
    hosts) and its inputs' shapes, strides, dtypes and requires_grad."""
    code = "\n".join(line for line in gm.code.splitlines() if not line.lstrip().startswith("#"))
    h = hashlib.sha256(code.encode())
    for v in example_inputs:
        if isinstance(v, torch.Tensor):
            h.update(repr((tuple(v.shape), tuple(v.stride()), str(v.dtype),
                           bool(v.requires_grad))).encode())
        else:
            h.update(repr(type(v).__name__).encode())
    return h.hexdigest()[:16]


class _RecompileObserver:
    """Remembers the last recompile reason of each thread, to name the guard in an error."""

    @hookimpl
    def ember_compile_event(self, event: Any) -> None:
        if event.kind == "recompile":
            _tls.last_recompile = f"{event.data.get('function')}: {event.data.get('reason')}"


def _observe() -> None:
    global _observer_registered
    if _observer_registered:
        return
    from ..plugins import plugin_manager

    try:
        plugin_manager().register(_RecompileObserver(), name="ember.distributed.ranks")
    except ValueError:
        pass
    _observer_registered = True


def _store_and_seq() -> tuple[Any, int]:
    from torch.distributed import distributed_c10d as c10d

    store = c10d._get_default_store()
    with _lock:
        if _state["store"] is not store:  # a new process group: numbering starts again
            _state["store"], _state["seq"] = store, 0
        _state["seq"] += 1
        return store, _state["seq"]


def _wait(store: Any, keys: list[str], timeout: float) -> list[str]:
    """The keys among ``keys`` still missing after ``timeout`` seconds (empty: all there)."""
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout))
        return []
    except Exception:
        return [k for k in keys if not store.check([k])]


def agreed(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], graph_id: str,
           compile_fn: Callable[[], Any]) -> Any:
    """Run ``compile_fn`` (the local compile of ``gm``) after checking that every rank compiles
    the same graph at this point; rank 0 first when the ranks share the cache."""
    d = _dist()
    _observe()
    rank, world = d.get_rank(), d.get_world_size()
    store, seq = _store_and_seq()
    digest = graph_hash(gm, example_inputs)
    me = {"hash": digest, "graph": graph_id, "reason": getattr(_tls, "last_recompile", None),
          "host": socket.gethostname(), "cache": _cache_dir()}
    _tls.last_recompile = None
    prefix = f"ember/compile/{seq}"
    store.set(f"{prefix}/rank{rank}", json.dumps(me))
    timeout = float(config.dist_timeout)
    others = [r for r in range(world) if r != rank]
    t0 = time.perf_counter()
    missing = _wait(store, [f"{prefix}/rank{r}" for r in others], timeout)
    if missing:
        ranks = [int(k.rsplit("rank", 1)[1]) for k in missing]
        why = (f" This rank recompiled because a guard failed: {me['reason']}; that guard held "
               "on the other ranks." if me["reason"] else "")
        raise RankDivergence(
            f"ember: rank {rank} compiled graph #{seq} ({graph_id}, hash {digest}) but rank(s) "
            f"{ranks} did not compile a graph #{seq} within {timeout:g} s: the ranks took "
            f"different paths through the program.{why} Make the values the compiled code "
            "depends on equal on every rank (shapes, Python values, flags), or turn the check "
            "off with ember.config.dist_check = False (then a collective may hang instead).")
    posts = {r: json.loads(store.get(f"{prefix}/rank{r}").decode()) for r in others}
    posts[rank] = me
    if config.dist_check:
        differ = {r: p for r, p in posts.items() if p["hash"] != digest}
        if differ:
            lines = "; ".join(f"rank {r}: {p['graph']} (hash {p['hash']})"
                              + (f", recompiled because {p['reason']}" if p["reason"] else "")
                              for r, p in sorted(posts.items()))
            raise RankDivergence(
                f"ember: the ranks compiled different graphs at compile #{seq}: {lines}. A "
                "collective in them would not match across ranks. Make the inputs' shapes and "
                "the Python values the compiled code depends on equal on every rank.")
    waited = time.perf_counter() - t0
    events.counters["distributed"]["checked_graphs"] += 1
    share = (config.dist_compile_once and rank != 0
             and (posts[0]["host"], posts[0]["cache"]) == (me["host"], me["cache"]))
    done = f"{prefix}/done"
    _tls.inside = True
    try:
        if share:
            if _wait(store, [done], timeout):
                # every rank agreed on the graph: a slow compile on rank 0 is no divergence,
                # so this rank compiles it itself rather than fail
                log.warning("ember: rank %d waited %g s for rank 0 to compile graph #%d (%s) "
                            "into the shared cache; compiling it here", rank, timeout, seq,
                            graph_id)
            else:
                events.counters["distributed"]["waited_for_rank0"] += 1
        try:
            out = compile_fn()
        finally:
            if rank == 0:
                store.set(done, "1")
    finally:
        _tls.inside = False
    log.debug("ember: rank %d graph #%d %s hash %s agreed (%.3f s waiting for the ranks)",
              rank, seq, graph_id, digest, waited)
    return out


def _cache_dir() -> str:
    try:
        from .._store import cache_dir

        return os.path.realpath(str(cache_dir()))
    except Exception:
        return ""
