"""In-place writes of the Triton target (scheduler.plan_in_place): a kernel writes its result over
a dead buffer it reads, through one in/out parameter, when every element of that buffer is read
at the index where the result is stored, before it is stored. Numerics under the interpreter
(real kernels with EMBER_TRITON_DEVICE=cuda); the wrapper generated for CUDA (fake CUDA tensors)
and the memory its plan holds (BufferPlan)."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from triton_util import DEVICE

# the CPU target's rules (a wrapper that keeps its buffers returns none written in place)
cpu_only = pytest.mark.skipif(DEVICE != "cpu", reason="the rules of a CPU wrapper")

_IN_PLACE = re.compile(r"^    (\w+) = .*# in place: \w+ writes \1 over (\w+)$", re.M)


def _in_place(src: str) -> dict[str, str]:
    """``{N: O}`` of the wrapper's in-place lines."""
    return dict(_IN_PLACE.findall(src))


def _decompositions() -> Any:
    from ember_inductor.decompositions import decompositions

    return decompositions()


def _generate_gm(gm: Any, **options: Any) -> tuple[str, Any]:
    from ember_inductor.compile_fx import generate_source

    src, info = generate_source(gm, key="inplace", options={"cpu_codegen": "triton", **options})
    return src, (gm, info)


def _generate(fn: Callable[..., Any], inputs: tuple[Any, ...], **options: Any) -> tuple[str, Any]:
    # fake tensors, as in a compile: a view's metadata then carries its storage offset (a real
    # trace's values of x[1:] are copies, so lowering would read x[1:] at offset 0)
    inputs = tuple(t.to(DEVICE) for t in inputs)
    gm = make_fx(fn, decomposition_table=_decompositions(), tracing_mode="fake")(*inputs)
    return _generate_gm(gm, **options)


def _run(fn: Callable[..., Any], inputs: tuple[Any, ...], **options: Any) -> str:
    """The wrapper of ``fn`` (Triton target, interpreter), run twice and compared with eager."""
    from ember_inductor.compile_fx import load_wrapper

    inputs = tuple(t.to(DEVICE) for t in inputs)
    src, (gm, _) = _generate(fn, inputs, **options)
    call = load_wrapper(src, gm, "inplace")
    want = fn(*inputs)
    for _ in range(2):  # a second call: nothing kept from the first one is written over
        got = call(*inputs)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    return src


def _kernel(src: str, name: str) -> str:
    i = src.index(f"def {name}(")
    return src[i:src.index("\n\n\n", i)]


# -- numerics, and what goes in place ----------------------------------------------------------

def test_pointwise_after_mm() -> None:
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(64, 32), torch.randn(32, 128), torch.randn(128, 32)
    src = _run(lambda x, w1, w2: (F.gelu(x @ w1) @ w2,), (x, w1, w2))
    assert _in_place(src) == {"buf1": "buf0"}
    k = _kernel(src, "kernel0")
    # one parameter, read and written; the dead product is no parameter of its own
    assert k.startswith("def kernel0(buf1, XBLOCK")
    assert "tl.load(buf1 + x0" in k and "tl.store(buf1 + x0" in k
    assert "kernel0(8192, buf1)" in src and "'inout': ['buf1']" in src


def test_reduction_epilogue() -> None:
    """A softmax over a product: the product is read by three loop blocks at the index the
    result is stored at (the row's max, its sum, the division), all before the store."""
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(16, 32), torch.randn(32, 64), torch.randn(64, 8)
    src = _run(lambda x, w1, w2: (torch.softmax(x @ w1, -1) @ w2,), (x, w1, w2))
    assert list(_in_place(src).values()) == ["buf0"]
    # rows longer than a persistent reduction takes (4096 under the interpreter): each block
    # loops over the row, the division's loop reads a tile, then writes it
    x, w1, w2 = torch.randn(4, 8), torch.randn(8, 5000), torch.randn(5000, 4)
    src = _run(lambda x, w1, w2: (torch.softmax(x @ w1, -1) @ w2,), (x, w1, w2))
    assert list(_in_place(src).values()) == ["buf0"] and "looped" in src
    x, w1, w2 = torch.randn(16, 32), torch.randn(32, 64), torch.randn(64, 8)
    # a product centred on its rows' mean (the mean's block, then the subtraction's)
    src = _run(lambda x, w1, w2: ((lambda a: a - a.mean(-1, keepdim=True))(x @ w1) @ w2,),
               (x, w1, w2))
    assert list(_in_place(src).values()) == ["buf0"]


def test_product_read_as_activations() -> None:
    """A linear layer of 3-d activations is a 2-d product ([16, 64]) whose GELU is stored as
    [2, 8, 64]: another layout, the same storage order; attention's batched product [8, 8, 8]
    under its softmax, stored [2, 4, 8, 8]."""
    torch.manual_seed(0)
    x, w1, b1, w2 = torch.randn(2, 8, 16), torch.randn(64, 16), torch.randn(64), torch.randn(16, 64)
    src = _run(lambda x, w1, b1, w2: (F.linear(F.gelu(F.linear(x, w1, b1)), w2),),
               (x, w1, b1, w2))
    assert list(_in_place(src).values()) == ["buf0"]
    assert re.search(r"buf1 = _view\(buf0, \(2, 8, 64\), \(512, 64, 1\), 0\)", src)
    q, k, v = (torch.randn(2, 4, 8, 8) for _ in range(3))
    src = _run(lambda q, k, v: ((q @ k.transpose(-1, -2)).softmax(-1) @ v,), (q, k, v))
    assert list(_in_place(src).values()) == ["buf0"]


def test_multi_output_kernel() -> None:
    """One kernel writes two results from a dead product: the second takes its storage (the
    first's member reads the product before the second's store)."""
    torch.manual_seed(0)
    x, w = torch.randn(32, 16), torch.randn(16, 32)

    def fn(x, w):
        a = x @ w
        return a.relu() @ torch.sigmoid(a * 2.0),

    src = _run(fn, (x, w))
    assert _in_place(src) == {"buf2": "buf0"}
    k = _kernel(src, "kernel0")
    assert k.startswith("def kernel0(buf1, buf2, XBLOCK")
    assert re.findall(r"tl\.store\((\w+) \+", k) == ["buf1", "buf2"]


def test_symbolic_sizes_through_compile() -> None:
    """The whole path (capture, AOT, the Triton target) with every size symbolic: layouts
    compared as expressions; three batch sizes."""
    from triton_util import assert_same, compile_triton

    def fn(x, w1, w2):
        return torch.softmax(F.gelu(x @ w1) @ w2, -1) @ w2.t()

    f = compile_triton(fn, dynamic=True)
    torch.manual_seed(0)
    for n in (5, 9, 17):
        x, w1, w2 = (t.to(DEVICE) for t in (torch.randn(n, 32), torch.randn(32, 64),
                                             torch.randn(64, 48)))
        assert_same(f(x, w1, w2), fn(x, w1, w2))
    gm = make_fx(lambda *a: (fn(*a),), decomposition_table=_decompositions(),
                 tracing_mode="symbolic")(x, w1, w2)
    src, _ = _generate_gm(gm)
    assert _in_place(src) == {"buf1": "buf0", "buf5": "buf2"}
    assert "buf1 = _view(buf0, (s" in src  # sizes as symbols, layouts equal as expressions


# -- what must not go in place ---------------------------------------------------------------

def test_not_in_place_when_read_elsewhere() -> None:
    """A dead product read at another index than the result's (a transpose, a row read by the
    next row's element, a shifted slice): not written over. The same kernel's plain epilogue
    (the positive control) is."""
    torch.manual_seed(0)
    x, w, w2 = torch.randn(32, 32), torch.randn(32, 32), torch.randn(32, 32)

    def transposed(x, w, w2):
        a = x @ w
        b = F.gelu(a @ w2)  # in place over a @ w2
        return (a + a.t()) @ b,  # a read at (i, j) and (j, i), stored like a: not in place

    src = _run(transposed, (x, w, w2))
    assert _in_place(src) == {"buf3": "buf1"}
    assert "buf2 = _empty((32, 32), (32, 1)" in src  # a's layout: only the index differs

    def rolled(x, w, w2):
        a = x @ w
        b = F.gelu(a @ w2)
        return (a + a.roll(1, 0)) @ b,  # a read at row i and row i - 1

    src = _run(rolled, (x, w, w2))
    assert _in_place(src) == {"buf3": "buf1"}

    def shifted(x, w, w2):
        a = x @ w
        b = F.gelu(a @ w2)
        return (a[1:] + a[:-1]) @ b,

    src = _run(shifted, (x, w, w2))
    assert list(_in_place(src).values()) == ["buf1"]


@cpu_only
def test_not_in_place_when_read_after_the_store() -> None:
    """Two results of one kernel from a dead product, the second returned (so never written
    in place on the CPU): the second's member reads the product after the first's store, so
    the first does not take it either. The graph's other GELU is written in place."""
    torch.manual_seed(0)
    x, w = torch.randn(32, 16), torch.randn(16, 32)

    def fn(x, w, w2):
        a = x @ w
        s = torch.sigmoid(a * 2.0)
        return a.relu() @ s, s, F.gelu(x @ w2) @ w2.t()

    src = _run(fn, (x, w, w))
    got = _in_place(src)
    assert "buf0" not in got.values() and len(got) == 1, got
    assert "kernel0(1024, buf0, buf1, buf2)" in src


def test_not_in_place_over_inputs_or_a_live_view() -> None:
    """A graph input, and a product whose view is returned (its storage lives on), are never
    written over; the same graph's internal product is."""
    torch.manual_seed(0)
    x, w, w2 = torch.randn(16, 16), torch.randn(16, 16), torch.randn(16, 16)

    def fn(x, w, w2):
        a = x @ w
        c = x @ w2
        return F.gelu(x) @ a.relu(), a.t(), F.gelu(c) @ w

    src = _run(fn, (x, w, w2))
    got = _in_place(src)
    assert list(got.values()) == ["buf1"], got  # c; not x (an input), not a (viewed, returned)


@cpu_only
def test_result_computed_from_what_it_overwrites() -> None:
    """A result takes only a buffer its own statement reads: the sigmoid of b is not written
    over a (which only the ReLU, returned, reads: another thread of the program might store
    over an element of a before the ReLU's thread loads it), but over b."""
    torch.manual_seed(0)
    x, y, w = torch.randn(16, 16), torch.randn(16, 16), torch.randn(16, 16)

    def fn(x, y, w):
        a, b = x @ w, y @ w
        r = a.relu()
        return torch.mm(r, torch.sigmoid(b)), r

    src = _run(fn, (x, y, w))
    assert _in_place(src) == {"buf3": "buf1"}
    assert "kernel0(256, buf0, buf2, buf3)" in src


@cpu_only
def test_outputs_not_written_in_place_on_the_cpu() -> None:
    """A wrapper that keeps buffers between calls (the CPU's) never returns a buffer written in
    place; a CUDA one may (test_cuda_* below)."""
    torch.manual_seed(0)
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    src = _run(lambda x, w: (F.gelu(x @ w), F.gelu(x @ w) @ w), (x, w))
    assert _in_place(src) == {"buf2": "buf1"}
    assert "return (buf4, buf3)" in src and "buf4 = _empty(" in src


@cpu_only
def test_pooled_buffers_are_not_written_in_place() -> None:
    """8 MiB products on the CPU: the wrapper pools its large buffers (runtime/pool.py), but
    not one written in place, nor the one it is written over; two calls stay right."""
    torch.manual_seed(0)
    x, w, w2 = torch.randn(2048, 16), torch.randn(16, 1024), torch.randn(1024, 8)

    def fn(x, w, w2):
        a = x.sin()  # 8 KiB: not pooled
        b = F.gelu((a @ w).cos()) @ w2
        return (b,)

    src = _run(fn, (x, w, w2))
    got = _in_place(src)
    assert got, src
    for n, o in got.items():
        assert not re.search(rf"\b({n}|{o}) = pool\[", src)
        assert f"# {n}\n" not in src.split("def call")[0]


# -- kernels: identity, dedup, tuning ----------------------------------------------------------

def test_in_place_kernel_is_not_its_twin() -> None:
    """A GELU written in place and the same GELU into a fresh buffer are two kernels (the
    dedup of identical kernels, codegen/triton.py _canonical_kernel, keeps them apart), and so
    are their cache keys (runtime/triton.py _kernel_id)."""
    from ember_inductor.runtime.triton import _kernel_id

    torch.manual_seed(0)
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    src = _run(lambda x, w: (F.gelu(x @ w) @ w, F.gelu(x) @ w), (x, w))
    assert len(_in_place(src)) == 1
    ns: dict[str, Any] = {}
    exec(src.split("_k = load_kernels")[0].split("CONSTANTS", 1)[1].split("\n", 1)[1], ns)
    kernels = ns["KERNELS"]
    assert len(kernels) == 2, kernels
    (a, b) = kernels.values()
    assert bool(a.get("inout")) != bool(b.get("inout"))
    assert _kernel_id(ns["TRITON_SOURCE"], a) != _kernel_id(ns["TRITON_SOURCE"], b)
    # the key of a kernel without in/out parameters is what it was
    plain = a if not a.get("inout") else b
    assert "inout" not in _kernel_id(ns["TRITON_SOURCE"], plain)


def test_tuning_times_copies_of_in_out_parameters(monkeypatch: Any) -> None:
    """Each timed launch writes over its in/out parameter: tuning runs on copies, so the real
    launch after it reads the values as they were."""
    from ember_inductor.runtime import triton as rt

    spec = {"name": "k", "params": ["arg0", "buf1"], "signature": ["*fp32", "*fp32"],
            "grid": "1d", "config": {"XBLOCK": 8, "num_warps": 1},
            "candidates": [{"XBLOCK": 4, "num_warps": 1}], "checked": False,
            "numels": ["16"], "inout": ["buf1"]}
    ln = rt.Launcher("src", None, spec)

    class CK:  # a launch adds the input to the in/out buffer
        def __getitem__(self, grid: Any) -> Any:
            return lambda a, io, *consts: io.add_(a)

    class Event:
        def __init__(self, **kw: Any) -> None:
            pass

        def record(self) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, other: Any) -> float:
            return 1.0

    class Stream:
        def synchronize(self) -> None:
            pass

    monkeypatch.setattr(rt, "prebuild", lambda *a, **k: None)
    monkeypatch.setattr(ln, "_try_build", lambda cfg: CK())
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    a, io = torch.ones(16), torch.zeros(16)
    ln._tune([16], [a, io], spec["candidates"])
    assert torch.equal(io, torch.zeros(16)), io


def test_debug_fill_keeps_the_values_written_over() -> None:
    """debug_fill fills a buffer taken over before its kernel; one written in place holds the
    values the kernel reads: not filled, still checked after the kernel."""
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(32, 16), torch.randn(16, 64), torch.randn(64, 16)
    src = _run(lambda x, w1, w2: (F.gelu(x @ w1) @ w2,), (x, w1, w2), debug_fill=True)
    (n,) = _in_place(src)
    assert f"_dbg.fill({n})" not in src and f"_dbg.check(" in src
    assert re.search(rf"_dbg\.check\([^\n]*'{n}', {n}\)", src)


# -- CUDA wrappers (fake CUDA tensors): the in-place writes and the peak they lower ---------

def _cuda_plan(fn: Callable[..., Any], make: Callable[[], tuple[Any, ...]], in_place: bool,
               monkeypatch: Any) -> tuple[str, Any]:
    from ember_inductor import scheduler
    from ember_inductor.compile_fx import generate_source
    from ember_inductor.decompositions import decompositions

    with monkeypatch.context() as m:
        if not in_place:
            m.setattr(scheduler, "plan_in_place", lambda sched, outputs: {})
        with FakeTensorMode(allow_non_fake_inputs=True):
            gm = make_fx(fn, decomposition_table=decompositions())(*make())
        # layout_opt False: fake CUDA convolutions cannot be timed without a GPU
        src, info = generate_source(gm, key="inplace-cuda",
                                    options={"cpu_codegen": "triton", "layout_opt": False})
    return src, info["buffer_plan"]


MiB = 1 << 20


def test_cuda_mlp_peak(monkeypatch: Any) -> None:
    """x @ w1 -> gelu -> @ w2 -> + x at 8192 x 768 (3072 inner): the GELU is written over the
    product it reads, the residual add over the second product (a CUDA wrapper keeps no
    buffers, so an output may be written in place)."""
    def mlp(x, w1, w2):
        return (F.gelu(x @ w1) @ w2 + x,)

    def make():
        return (torch.empty(8192, 768, device="cuda"), torch.empty(768, 3072, device="cuda"),
                torch.empty(3072, 768, device="cuda"))

    src, after = _cuda_plan(mlp, make, True, monkeypatch)
    base_src, before = _cuda_plan(mlp, make, False, monkeypatch)
    assert _in_place(src) == {"buf1": "buf0", "buf3": "buf2"}, src
    assert not _in_place(base_src)
    assert "kernel1(6291456, arg0, buf3)" in src and "return (buf3,)" in src
    # 96 MiB products of 8192 x 3072: two live at the GELU before, one after
    assert before.peak_bytes() == 192 * MiB
    assert after.peak_bytes() == 120 * MiB  # the second product (24 MiB) beside the GELU's


def test_cuda_conv_block_peak(monkeypatch: Any) -> None:
    """conv -> batch norm + ReLU -> conv -> batch norm + residual add + ReLU (eval), a
    bottleneck's wide middle: each epilogue is written over the convolution it reads."""
    def block(x, w1, m1, v1, g1, b1, w2, m2, v2, g2, b2):
        y = F.relu(F.batch_norm(F.conv2d(x, w1, padding=1), m1, v1, g1, b1, False))
        z = F.batch_norm(F.conv2d(y, w2, padding=1), m2, v2, g2, b2, False)
        return (F.relu(z + x),)

    def make():
        d = "cuda"
        bn = [torch.empty(256, device=d) for _ in range(4)]
        bn2 = [torch.empty(64, device=d) for _ in range(4)]
        return (torch.empty(16, 64, 56, 56, device=d), torch.empty(256, 64, 3, 3, device=d),
                *bn, torch.empty(64, 256, 3, 3, device=d), *bn2)

    src, after = _cuda_plan(block, make, True, monkeypatch)
    _, before = _cuda_plan(block, make, False, monkeypatch)
    # each batch norm epilogue over its convolution's result
    convs = re.findall(r"(buf\d+) = (?:_as_declared\()?torch\.ops\.aten\.convolution", src)
    assert sorted(_in_place(src).values()) == sorted(convs) and len(convs) == 2, src
    if DEVICE == "cpu":
        # fake CUDA without cuDNN: the plan's layout copies and contiguous results; 49 MiB for
        # the 256-channel activations, 12.25 MiB for the 64-channel ones
        assert before.peak_bytes() == 98 * MiB
        assert after.peak_bytes() == 49 * MiB + 49 * MiB // 4
    else:  # cuDNN's own result strides: no copies, one wide activation fewer
        assert after.peak_bytes() <= before.peak_bytes() - 49 * MiB // 4


def test_cuda_gpt2_block_peak(monkeypatch: Any) -> None:
    """A GPT-2 block (float32, 8 x 1024 x 768, 12 heads): attention's softmax is written over
    its [96, 1024, 1024] product, the GELU over its linear layer's product, the residual add
    over the attention's projection; the layer norms are not (their shifted variance reads the
    row's first element)."""
    B, T, C, H = 8, 1024, 768, 12

    def block(mask, x, ln1w, ln1b, wqkv, bqkv, wo, bo, ln2w, ln2b, w1, b1, w2, b2):
        h = F.layer_norm(x, (C,), ln1w, ln1b)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2)
                   for t in F.linear(h, wqkv, bqkv).split(C, -1))
        att = ((q @ k.transpose(-1, -2)) * 0.125).masked_fill(mask, float("-inf")).softmax(-1)
        x = x + F.linear((att @ v).transpose(1, 2).reshape(B, T, C), wo, bo)
        h = F.layer_norm(x, (C,), ln2w, ln2b)
        return (x + F.linear(F.gelu(F.linear(h, w1, b1), approximate="tanh"), w2, b2),)

    def make():
        def e(*s: int) -> torch.Tensor:
            return torch.empty(*s, device="cuda")
        return (torch.empty(T, T, dtype=torch.bool, device="cuda"), e(B, T, C), e(C), e(C),
                e(3 * C, C), e(3 * C), e(C, C), e(C), e(C), e(C), e(4 * C, C), e(4 * C),
                e(C, 4 * C), e(C))

    src, after = _cuda_plan(block, make, True, monkeypatch)
    _, before = _cuda_plan(block, make, False, monkeypatch)
    notes = re.findall(r"# in place: (\w+) writes", src)
    assert len(notes) == 3, src
    assert "<- gelu" in src.split(f"# in place: {notes[1]} writes", 1)[1].split("\n")[1]
    # the softmax's [8, 12, 1024, 1024] (384 MiB) no longer beside its product's
    assert before.peak_bytes() == 888 * MiB
    assert after.peak_bytes() == 504 * MiB
