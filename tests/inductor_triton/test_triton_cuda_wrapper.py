"""The wrapper generated for a CUDA graph, without a GPU: graphs traced with fake CUDA tensors go
through the same lowering, scheduling and code generation as on the GPU machine (no kernel is
built or run), so what the wrapper does on a GPU is pinned here, in CI."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx


def _source(fn: Callable[..., Any], make_args: Callable[[str], tuple[Any, ...]], device: str) -> str:
    from ember_inductor.compile_fx import generate_source
    from ember_inductor.decompositions import decompositions

    with FakeTensorMode():
        gm = make_fx(fn, decomposition_table=decompositions())(*make_args(device))
    src, _ = generate_source(gm, key=f"wrapper-{device}", options={"cpu_codegen": "triton"})
    return src


def _mm_between(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
    # sin(x) is an internal buffer (the matrix multiply reads it): 8 MiB, kept between calls on
    # the CPU (runtime/pool.py)
    return ((x.sin() @ w).relu(),)


def _mm_args(device: str) -> tuple[torch.Tensor, ...]:
    return torch.empty(2048, 1024, device=device), torch.empty(1024, 64, device=device)


def test_cpu_wrapper_keeps_its_buffers() -> None:
    assert "BufferPool" in _source(_mm_between, _mm_args, "cpu")


def test_cuda_wrapper_keeps_no_buffers() -> None:
    """On a GPU the caching allocator reuses blocks; a kept buffer would be memory a CUDA graph
    writes after the pool let it go (codegen/target.py keeps_buffers)."""
    src = _source(_mm_between, _mm_args, "cuda")
    assert "device='cuda'" in src and "BufferPool" not in src
