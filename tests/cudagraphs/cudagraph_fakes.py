"""A CPU stand-in for the CUDA calls of ember_cudagraphs.runtime, to test its bookkeeping
(shape keys, address checks, generations, what is invalidated) without a GPU.

A fake "graph" records the callable and its static inputs; a replay runs the callable again on
them and copies the results into the static outputs, which is what a CUDA graph replay does to
memory. Invalidation cannot be simulated on the CPU (torch's storage-poisoning call is CUDA-only):
``killed`` collects the storages the runtime invalidated, by their weak cdata."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ember_cudagraphs.runtime import CudaOps


class FakeGraph:
    def __init__(self, fn: Any, args: list[Any], outs: Any):
        self.fn, self.args, self.outs = fn, list(args), outs
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        new = self.fn(*self.args)
        # a replay writes memory, whatever autograd thinks of the tensors (inference ones too)
        with torch.inference_mode():
            for s, n in zip(self.outs, new):
                if isinstance(s, torch.Tensor) and all(
                        s.data_ptr() != a.data_ptr() for a in self.args
                        if isinstance(a, torch.Tensor)):
                    s.copy_(n)


class FakeOps(CudaOps):
    """CudaOps with the CUDA calls replaced (``tensor`` is inherited: its CPU path)."""

    def __init__(self) -> None:
        super().__init__()
        self.killed: set[int] = set()
        self.graphs: list[FakeGraph] = []
        self.capturing = False

    def new_pool(self, device: Any) -> Any:
        return object()

    @contextlib.contextmanager
    def warmup(self, device: Any) -> Any:
        yield

    def record(self, fn: Any, args: Any, pool: Any, device: Any, gens: Any) -> Any:
        outs = fn(*args)
        # a CUDA graph reads its inputs by address and keeps no reference to them
        by_address = [_by_address(a) if isinstance(a, torch.Tensor) else a for a in args]
        g = FakeGraph(fn, by_address, outs)
        self.graphs.append(g)
        return g, outs

    def replay(self, graph: Any) -> None:
        graph.replay()

    def is_capturing(self) -> bool:
        return self.capturing

    def alias_storage(self, static: Any, device: Any) -> Any:
        return torch._C._construct_storage_from_data_pointer(static.data_ptr(), device,
                                                             static.nbytes())

    def kill(self, cdata: int, message: str) -> None:
        assert "clone" in message and "cudagraph_mark_step_begin" in message
        self.killed.add(cdata)

    def available(self) -> str | None:
        return None


def _by_address(t: torch.Tensor) -> torch.Tensor:
    st = t.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(st.data_ptr(), t.device, st.nbytes())
    return torch.empty(0, dtype=t.dtype).set_(alias, t.storage_offset(), t.shape, t.stride())


def was_killed(ops: FakeOps, t: torch.Tensor) -> bool:
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(t.untyped_storage()).cdata in ops.killed
