"""Channels-last convolution graphs on the GPU's rules (layout.py, codegen/target.py
``ConvLayoutRules``), without a GPU.

On a GPU the plan takes float16/bfloat16/float32 convolutions, asks ATen (through fake tensors)
which strides each convolution returns instead of assuming channels-last, and uses none of the
CPU's oneDNN entry points or float64 statistics. Two ways to check that here: graphs traced with
fake CUDA tensors go through the real lowering and code generation (no kernel runs), and the same
rules applied to CPU tensors run for real (Triton's interpreter and the C++ target) against
eager, forward and backward.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from triton_util import DEVICE


def _block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, mean: torch.Tensor,
           var: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
    h = F.relu(F.batch_norm(F.conv2d(x, w1, padding=1), mean, var, g, b, False))
    h = F.batch_norm(F.conv2d(h, w2, padding=1), mean, var, g, b, False)
    return (F.relu(h + x),)


def _block_args(device: str, dtype: torch.dtype, c: int = 16) -> tuple[torch.Tensor, ...]:
    return (torch.empty(2, c, 12, 12, device=device, dtype=dtype),
            torch.empty(c, c, 3, 3, device=device, dtype=dtype),
            torch.empty(c, c, 3, 3, device=device, dtype=dtype),
            *(torch.empty(c, device=device, dtype=dtype) for _ in range(4)))


def _cuda_source(dtype: torch.dtype) -> str:
    from ember_inductor.compile_fx import generate_source
    from ember_inductor.decompositions import decompositions

    with FakeTensorMode(allow_non_fake_inputs=True):
        gm = make_fx(_block, decomposition_table=decompositions())(*_block_args("cuda", dtype))
    src, _ = generate_source(gm, key=f"cl-{dtype}", options={"layout_opt": True})
    compile(src, "<cl>", "exec")
    return src


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_convolutions_read_channels_last_operands(dtype: torch.dtype) -> None:
    """Every convolution's input is a channels-last buffer; no oneDNN call, no float64."""
    src = _cuda_source(dtype)
    convs = re.findall(r"aten\.convolution\.default\((\w+),", src)
    assert len(convs) == 2, src
    c, h, w = 16, 12, 12
    for name in convs:
        while True:
            # declared by an allocation, or by a view of a buffer a kernel writes in place (on
            # a GPU, cuDNN's channels-last result taken over by the epilogue kernel)
            alloc = re.search(rf"{name} = (?:_empty\(|_view\(\w+, )\(2, {c}, {h}, {w}\), "
                              r"\(([^)]*)\)", src)
            if alloc is not None:
                break
            old = re.search(rf"{name} = (\w+); del", src)  # a reused buffer: follow it
            assert old is not None, src
            name = old.group(1)
        assert alloc.group(1) == f"{c * h * w}, 1, {w * c}, {c}", src
    assert "mkldnn" not in src and "float64" not in src


def test_cuda_weight_cast_stored_channels_last() -> None:
    """autocast's per-call cast of a float32 weight to bfloat16 writes channels-last order
    (cuDNN would copy a contiguous weight to channels-last inside every call)."""
    from ember_inductor.compile_fx import generate_source
    from ember_inductor.decompositions import decompositions

    def conv(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.conv2d(x, w.to(torch.bfloat16), padding=1).relu(),)

    with FakeTensorMode(allow_non_fake_inputs=True):
        gm = make_fx(conv, decomposition_table=decompositions())(
            torch.empty(2, 16, 12, 12, device="cuda", dtype=torch.bfloat16),
            torch.empty(32, 16, 3, 3, device="cuda"))
    src, _ = generate_source(gm, key="wcast", options={"layout_opt": True})
    (wname,) = re.findall(r"aten\.convolution\.default\(\w+, (\w+),", src)
    assert re.search(rf"{wname} = _empty\(\(32, 16, 3, 3\), \(144, 1, 48, 16\), "
                     r"dtype=torch\.bfloat16", src), src


def test_cuda_rules_keep_float64_contiguous() -> None:
    """cuDNN keeps float64 convolutions contiguous: no plan, no copies."""
    src = _cuda_source(torch.float64)
    assert "layout_copy" not in src


def test_convolution_result_strides_are_atens() -> None:
    """On the GPU's rules a convolution's result is declared with the strides ATen returns for
    the plan's operands (fake tensors run ATen's choice of library), not assumed channels-last:
    on this CPU-only build a fake CUDA convolution takes a non-cuDNN kernel and returns
    contiguous strides; a CPU convolution asked the same way returns channels-last."""
    from ember_inductor.ir import InputBuffer, Layout
    from ember_inductor.layout import _result_strides, channels_last_stride

    aten = torch.ops.aten
    size, wsize = (2, 8, 10, 10), (8, 8, 3, 3)
    for device in ("cuda", "cpu"):
        mode = FakeTensorMode()
        with mode:
            x = torch.empty_strided(size, channels_last_stride(size), device=device)
            want = aten.convolution.default(x, torch.empty(wsize, device=device), None, [1, 1],
                                            [1, 1], [1, 1], False, [0, 0], 1)
        xb = InputBuffer("x", Layout(size, channels_last_stride(size), torch.float32,
                                     torch.device(device)), 0)
        wb = InputBuffer("w", Layout(wsize, (72, 9, 3, 1), torch.float32, torch.device(device)),
                         1)
        got = _result_strides(aten.convolution.default,
                              [xb, wb, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1], [want])
        if device == "cuda":
            assert got == [tuple(want.stride())]
        else:  # the CPU's rule: channels-last (checked against ATen by tests/inductor/test_layout.py)
            assert got == [channels_last_stride(tuple(want.shape))] == [tuple(want.stride())]


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.b2 = torch.nn.BatchNorm2d(8)
        self.c3 = torch.nn.Conv2d(8, 16, 1, stride=2)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.b1(self.c1(x)))
        h = F.relu(self.b2(self.c2(h)) + h)
        h = F.max_pool2d(h, 2)
        h = self.c3(h)
        return self.head(h.mean((2, 3)))


@pytest.fixture
def gpu_rules_on_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    """The GPU's rules given to CPU tensors (float32/64 kept: the CPU's dtypes), with a cache of
    their own (the rules are the device's, not in the cache key)."""
    from ember_inductor.codegen import target

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    cuda = target._CONV_RULES["cuda"]
    monkeypatch.setitem(target._CONV_RULES, "cpu",
                        dataclasses.replace(cuda, dtypes=(torch.float32, torch.float64)))
    return target._CONV_RULES["cpu"]


@pytest.mark.parametrize("codegen", ["triton", "cpp"])
def test_gpu_rules_run_right_on_cpu_tensors(gpu_rules_on_cpu: Any, codegen: str) -> None:
    """The whole plan on the GPU's rules (result strides from ATen, no oneDNN epilogues, no
    float64 statistics), run for real: inference and a training step equal eager's."""
    if codegen == "triton" and DEVICE != "cpu":
        pytest.skip("Triton's interpreter is off (EMBER_TRITON_DEVICE=cuda): "
                    "test_cuda_rules_run_right_on_the_gpu runs these rules on the GPU")
    _check_plan(torch.device("cpu"), {"cpu_codegen": codegen, "layout_opt": True},
                rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs EMBER_TRITON_DEVICE=cuda and a GPU")
def test_cuda_rules_run_right_on_the_gpu() -> None:
    """The plan on the GPU's own rules (cuDNN's result strides, timed choice forced on), float32
    with TF32 off: inference and a training step equal eager's."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            _check_plan(torch.device("cuda"), {"layout_opt": True}, rtol=1e-3, atol=1e-4)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _check_plan(device: torch.device, opts: dict[str, Any], rtol: float, atol: float) -> None:
    import ember
    from ember_inductor.layout import counters

    torch.manual_seed(0)
    model = _Net().to(device)
    x = torch.randn(2, 3, 12, 12, device=device)

    def onednn() -> int:
        return sum(counters[k] for k in ("conv_relu", "conv_add_relu", "conv_onednn",
                                         "var_mean", "mean"))

    fused = onednn()
    model.eval()
    with torch.no_grad():
        want = model(x)
        before = counters["conv"]
        got = ember.compile(model, options=opts)(x)
    assert counters["conv"] > before  # the plan lowered the convolutions
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)

    model.train()
    ref = _Net().to(device)
    ref.load_state_dict(model.state_dict())
    xr = x.clone().requires_grad_()
    xc = x.clone().requires_grad_()
    ember.compile(model, options=opts)(xc).square().sum().backward()
    ref(xr).square().sum().backward()
    assert onednn() == fused  # no oneDNN entry point, no float64 statistics
    torch.testing.assert_close(xc.grad, xr.grad, rtol=rtol, atol=atol)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=n)
