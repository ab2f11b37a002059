"""The wrapper generated for a CUDA graph, without a GPU: graphs traced with fake CUDA tensors go
through the same lowering, scheduling and code generation as on the GPU machine (no kernel is
built or run), so what the wrapper does on a GPU is pinned here, in CI."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from triton_util import DEVICE


def _source(fn: Callable[..., Any], make_args: Callable[[str], tuple[Any, ...]], device: str) -> str:
    from ember_inductor.compile_fx import generate_source
    from ember_inductor.decompositions import decompositions

    with FakeTensorMode(allow_non_fake_inputs=True):  # (the program's own CPU constants)
        gm = make_fx(fn, decomposition_table=decompositions())(*make_args(device))
    src, _ = generate_source(gm, key=f"wrapper-{device}", options={"cpu_codegen": "triton"})
    compile(src, f"<wrapper-{device}>", "exec")  # valid Python (a GPU-only branch once was not)
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


def _scaled(x: torch.Tensor) -> tuple[torch.Tensor]:
    return ((x * _SCALE).sin(),)


_SCALE = torch.tensor(2.5)  # a 0-d CPU constant in a CUDA graph (eager accepts it)


def test_cuda_wrapper_is_safe_to_record() -> None:
    """What a CUDA graph recording of the wrapper needs: a CPU constant copied to the device
    once (not per call: a host-to-device copy per call cannot be recorded), and the index
    check's status read (a sync) skipped while the stream records."""
    src = _source(_scaled, lambda d: (torch.empty(4, 3, device=d),), "cuda")
    assert "_on_device(const0, 'cuda')" in src and ".to('cuda')" not in src

    def gather(w: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.nn.functional.embedding(i, w) * 2.0,)

    src = _source(gather, lambda d: (torch.empty(10, 8, device=d),
                                     torch.zeros(2, 3, dtype=torch.long, device=d)), "cuda")
    assert ("    if not _capturing() and status.item():\n"
            "        _kernel_failed(status.item(), ") in src
    assert "capturing as _capturing" in src


def test_on_device_copies_a_constant_once() -> None:
    from ember_inductor.runtime.triton import on_device

    c = torch.tensor(2.5)
    a = on_device(c, "meta")
    assert a.device.type == "meta" and on_device(c, "meta") is a
    c.add_(1.0)  # changed in place: copied again
    assert on_device(c, "meta") is not a


def test_precompile_probe_reads_a_cuda_wrapper() -> None:
    """ember.precompile runs a wrapper's module level with recorders for its runtime imports;
    the CUDA wrapper imports more names than the CPU one (``capturing as _capturing``, ...): the
    probe must bind them all and record the kernels (it once failed with a SyntaxError on the
    GPU machine)."""
    from ember_inductor.precompile import _cpp_sources

    def gather(w: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.nn.functional.embedding(i, w) * 2.0,)

    src = _source(gather, lambda d: (torch.empty(10, 8, device=d),
                                     torch.zeros(2, 3, dtype=torch.long, device=d)), "cuda")
    triton: list = []
    assert _cpp_sources(src, triton) == []
    assert len(triton) == 1 and triton[0][1]  # (kernel module, specs): one module, its kernels


def test_cuda_products_padded_only_where_decided() -> None:
    """A half-precision product with an odd width: padded to 8 columns when the option forces
    it; without a GPU to time on, "auto" leaves the graph alone (padding.py)."""
    def head(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return (x @ w.t(),)

    def args(d: str) -> tuple[torch.Tensor, ...]:
        return (torch.empty(64, 48, device=d, dtype=torch.float16),
                torch.empty(77, 48, device=d, dtype=torch.float16))

    from ember_inductor.compile_fx import generate_source
    from ember_inductor.decompositions import decompositions

    with FakeTensorMode(allow_non_fake_inputs=True):
        gm = make_fx(head, decomposition_table=decompositions())(*args("cuda"))
    forced, _ = generate_source(gm, key="pad", options={"pad_mm": "always"})
    compile(forced, "<pad>", "exec")
    assert "<- constant_pad_nd" in forced and "# extern [64, 80]" in forced
    auto, _ = generate_source(gm, key="auto", options={})
    assert "constant_pad_nd" not in auto and "# extern [64, 77]" in auto


def test_host_values_of_a_cuda_graph_run_as_aten() -> None:
    """A value eager computes on the CPU in a CUDA graph (position ids made with arange on the
    host, then copied: HF Mistral's graphs) runs as ATen's CPU ops and its host-to-device copy;
    the device kernels read the copy. (The whole graph once ran eagerly: "computed on the CPU in
    a cuda graph".)"""
    def f(x: torch.Tensor) -> tuple[torch.Tensor]:
        t = (torch.arange(16) * 2.0).sin()
        return (x + t.to(x.device),)

    src = _source(f, lambda d: (torch.empty(8, 16, device=d),), "cuda")
    body = src[src.index("def call"):]
    for op in ("arange", "mul.Tensor", "sin.default", "_to_copy.default"):
        assert f"torch.ops.aten.{op}" in body, body
    copy = re.search(r"(buf\d+) = (?:_as_declared\()?torch\.ops\.aten\._to_copy\.default\(",
                     body)
    assert copy is not None and re.search(rf"kernel0\(128, arg0, {copy.group(1)}, ", body), body


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU tensors through the Triton target")
def test_cpu_tensors_through_triton_need_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without TRITON_INTERPRET, kernels compiled for a GPU would be handed CPU pointers (on a
    machine with a GPU: an illegal memory access that poisons the CUDA context). The compile is
    refused with the way out instead."""
    from ember_inductor import compile_inductor

    gm = make_fx(lambda x: (x.sin() + 1,), tracing_mode="fake")(torch.randn(4))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        compile_inductor(gm, [torch.randn(4)], cpu_codegen="triton")
