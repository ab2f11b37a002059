"""Run a function on N gloo ranks (torch.multiprocessing spawn), bounded by a timeout.

Each rank joins a process group through a file store in a fresh temporary folder (no TCP port to
collide with other jobs on the machine), runs ``fn(rank, world, *args)`` with one torch thread,
and leaves. A rank that raises fails the test with its traceback; ranks still running when the
timeout expires are killed and the test fails naming the hang, instead of stalling CI.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import time
from typing import Any, Callable

import pytest
import torch.multiprocessing as mp


def _entry(rank: int, fn: Callable[..., Any], world: int, store: str, args: tuple,
           env: dict[str, str]) -> None:
    os.environ.update(env)
    import faulthandler

    faulthandler.enable()  # a rank killed by a signal prints every thread's Python stack
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    open(f"{store}.done{rank}", "w").close()
    # The rank's work is done and checked. Leave without the interpreter's finalization: torch's
    # gloo process group (still referenced by FSDP2's device mesh and DTensors) can abort the
    # process while it is torn down there ("terminate called without an active exception",
    # SIGABRT; seen once in CI, 1 in ~120 runs here; pytorch/pytorch#179291 describes the race).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _join(ctx: Any, store: str, world: int, deadline: float) -> bool:
    try:
        return ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
    except mp.ProcessExitedException as e:
        done = [r for r in range(world) if os.path.exists(f"{store}.done{r}")]
        raise AssertionError(f"{e} (ranks whose work had finished and passed its checks: "
                             f"{done}; each rank's Python stacks are printed above when a signal "
                             "killed it)") from e


def run_ranks(fn: Callable[..., Any], *args: Any, world: int = 2, timeout: float = 150,
              env: dict[str, str] | None = None, daemon: bool = False) -> None:
    """``fn(rank, world, *args)`` on ``world`` spawned gloo ranks (daemonic processes with
    ``daemon=True``, as some launchers make them); fails on error or hang."""
    with tempfile.TemporaryDirectory(prefix="ember-dist-") as tmp:
        store = os.path.join(tmp, "store")
        ctx = mp.start_processes(_entry, args=(fn, world, store, args, dict(env or {})),
                                 nprocs=world, join=False, daemon=daemon,
                                 start_method="spawn")
        deadline = time.monotonic() + timeout
        while not _join(ctx, store, world, deadline):
            if time.monotonic() > deadline:
                alive = [i for i, p in enumerate(ctx.processes) if p.is_alive()]
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                for p in ctx.processes:
                    p.join(5)
                pytest.fail(f"{fn.__name__}: rank(s) {alive} still running after {timeout:g} s "
                            "(a hang); killed")
