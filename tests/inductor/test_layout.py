"""Channels-last layouts in graphs with convolutions (ember_inductor/layout.py): results, gradients,
running statistics and every output's strides exactly as eager's, in inference and training; the
ATen behaviour the lowering relies on (channels-last results for channels-last inputs); the
forward/backward pairing that hands saved activations over channels-last."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch import nn

import ember
from ember_inductor import layout


@pytest.fixture(autouse=True)
def _channels_last_pays(monkeypatch):
    """These tests check the channels-last plan itself; whether it pays for an inference graph
    is timed on the machine (layout.channels_last_chosen): here it always does."""
    from ember_inductor import layout as _layout

    monkeypatch.setattr(_layout, "channels_last_chosen", lambda gm: True)
    # and convolutions stay aten.convolution (the timed oneDNN entry: test_choices.py)
    monkeypatch.setattr(_layout, "_onednn_conv_chosen", lambda plan, node, args: False)


CL = torch.channels_last


@pytest.fixture(autouse=True)
def _strict():
    """A graph that fails to compile raises (never a silent eager fallback)."""
    with ember.config.patch(suppress_errors=False):
        yield


@pytest.fixture(autouse=True, scope="module")
def _fresh_cache(tmp_path_factory: pytest.TempPathFactory):
    """This module's graphs are lowered here (a wrapper from an earlier run's cache would skip
    the lowering the counters below observe)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_CACHE_DIR", str(tmp_path_factory.mktemp("layout_cache")))
        yield


class Block(nn.Module):
    """conv-bn-relu, a strided 1x1 shortcut, a residual add, pooling; returns a 4-d activation
    (whose strides must be eager's) and a flattened head."""

    def __init__(self, cin: int = 3, c: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, bias=True)
        self.bn2 = nn.BatchNorm2d(2 * c)
        self.down = nn.Conv2d(c, 2 * c, 1, stride=2, bias=False)
        self.fc = nn.Linear(2 * c, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn1(self.conv1(x)))
        z = torch.relu(self.bn2(self.conv2(y)) + self.down(y))
        return z, self.fc(torch.nn.functional.adaptive_avg_pool2d(z, 1).flatten(1))


def _pair(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    m = Block()
    with torch.no_grad():
        for bn in (m.bn1, m.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    return m, copy.deepcopy(m)


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, what
    assert a.stride() == b.stride(), f"{what}: strides {a.stride()} != eager's {b.stride()}"
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=what)


def test_inference_matches_eager_with_eager_strides() -> None:
    ref, m = _pair()
    ref.eval()
    m.eval()
    f = ember.compile(m, backend="inductor")
    x = torch.randn(2, 3, 12, 10)
    before = layout.counters["conv"]
    with torch.no_grad():
        got, want = f(x), ref(x)
    assert layout.counters["conv"] > before  # the channels-last lowering ran
    for g, w, name in zip(got, want, ("activation", "head")):
        _close(g, w, name)


def test_channels_last_input_keeps_eager_strides() -> None:
    ref, m = _pair(1)
    ref.eval()
    m.eval()
    f = ember.compile(m, backend="inductor")
    x = torch.randn(2, 3, 9, 9).to(memory_format=CL)
    with torch.no_grad():
        got, want = f(x), ref(x)
    _close(got[0], want[0], "activation")
    _close(got[1], want[1], "head")


@pytest.mark.parametrize("offset", [0.0, 50.0])
def test_training_matches_eager(offset: float) -> None:
    """Outputs, input and parameter gradients (values and strides) and running statistics over
    two steps; ``offset`` shifts the input so batch statistics see a large mean."""
    ref, m = _pair(2)
    f = ember.compile(m, backend="inductor")
    paired, stats = layout.counters["paired"], layout.counters["var_mean"]
    for step in range(2):
        # a batch size per case: each case's graphs are lowered (no wrapper cache hit)
        x1 = (torch.randn(4 if offset == 0 else 3, 3, 10, 8) + offset).requires_grad_()
        x2 = x1.detach().clone().requires_grad_()
        got, want = f(x1), ref(x2)
        for g, w, name in zip(got, want, ("activation", "head")):
            _close(g.detach(), w.detach(), f"step {step} {name}")
        ((got[0] * got[0].detach().sin()).sum() + got[1].square().sum()).backward()
        ((want[0] * want[0].detach().sin()).sum() + want[1].square().sum()).backward()
        _close(x1.grad, x2.grad, f"step {step} input grad")
        for (name, p1), p2 in zip(ref.named_parameters(), m.parameters()):
            _close(p2.grad, p1.grad, f"step {step} grad {name}")
            p1.grad = p2.grad = None
        for (name, b1), b2 in zip(ref.named_buffers(), m.buffers()):
            torch.testing.assert_close(b2, b1, rtol=1e-4, atol=1e-4, msg=f"buffer {name}")
    # the forward was generated knowing its backward: saved activations went channels-last
    assert layout.counters["paired"] > paired
    # batch statistics took the one-pass channels-last form (offset 50: mean^2/var ~ 2500)
    assert layout.counters["var_mean"] > stats


def test_layout_opt_off_is_the_same_program_without_channels_last() -> None:
    ref, m = _pair(3)
    ref.eval()
    m.eval()
    f = ember.compile(m, backend="inductor", options={"layout_opt": False})
    before = layout.counters["conv"]
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        got, want = f(x), ref(x)
    assert layout.counters["conv"] == before
    _close(got[0], want[0], "activation")


def test_forward_called_before_any_backward_compiles_with_eager_strides() -> None:
    """A deferred training forward with no backward compiled generates on its first call, every
    output (saved ones included) with eager's strides."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ember_inductor.compile_fx import compile_inductor

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False,
                                               [0, 0], 1)
        return torch.relu(y), y

    x, w = torch.randn(2, 4, 6, 6), torch.randn(5, 4, 3, 3)
    gm = make_fx(fn)(x, w)

    class Ctx:
        kind = "forward"
        graph_id = "test_layout_lonely.forward"
        inputs = ()
        mode = None

    d = compile_inductor(gm, [x, w], context=Ctx())
    assert isinstance(d, layout.DeferredForward)
    got = d(x, w)
    want = fn(x, w)
    for g, e in zip(got, want):
        _close(g, e, "output")


_CONFIGS = list(itertools.product([torch.float32, torch.float64], [1, 3], [1, 2], [1, 2],
                                  [1, 2], [1, 5]))


@pytest.mark.parametrize("dtype,k,stride,groups,dilation,batch", _CONFIGS)
def test_aten_convolution_is_channels_last_for_channels_last_input(
        dtype: torch.dtype, k: int, stride: int, groups: int, dilation: int, batch: int) -> None:
    """What lower_conv declares: for a channels-last input (weight in any layout), ATen's
    convolution result, and convolution_backward's input and weight gradients, are channels-last."""
    torch.manual_seed(0)
    x = torch.randn(batch, 4, 7, 6, dtype=dtype).to(memory_format=CL)
    w = torch.randn(6, 4 // groups, k, k, dtype=dtype)
    conv = (None, [stride, stride], [k // 2, k // 2], [dilation, dilation], False, [0, 0], groups)
    y = torch.ops.aten.convolution.default(x, w, *conv)
    assert y.stride() == layout.channels_last_stride(y.shape) or y.is_contiguous(
        memory_format=CL)
    if k == 1 and stride > 1:
        return  # the lowering keeps this backward on contiguous layouts (an ATen heap bug)
    for go in (torch.randn(y.shape, dtype=dtype).to(memory_format=CL),
               torch.randn(y.shape, dtype=dtype)):
        gi, gw, _ = torch.ops.aten.convolution_backward.default(
            go.to(memory_format=CL), x, w, [6], [stride, stride], [k // 2, k // 2],
            [dilation, dilation], False, [0, 0], groups, [True, True, True])
        assert gi.is_contiguous(memory_format=CL)
        assert gw.is_contiguous(memory_format=CL)


def test_sink_pure_nodes_moves_recomputation_next_to_its_use() -> None:
    """Values computed up front (as a training backward recomputes its forward's activations)
    move down to their first use; random ops stay; the graph computes the same values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r1 = torch.relu(a) * 2       # used late
        noise = torch.rand_like(a)   # random: must not move
        x = torch.mm(b, b)
        y = torch.mm(x, b)
        return y + r1, noise

    a, b = torch.randn(4, 4), torch.randn(4, 4)
    gm = make_fx(fn)(a, b)
    before = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    moved = layout.sink_pure_nodes(gm)
    gm.graph.lint()
    gm.recompile()
    after = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert moved >= 2
    names = [str(n.target) for n in after]
    # relu and its *2 now come after the second mm, right before the add
    assert names.index("aten.relu.default") > max(i for i, t in enumerate(names)
                                                  if t == "aten.mm.default")
    assert [t for t in before if "rand" in str(t)] == [n.target for n in after
                                                        if "rand" in str(n.target)]
    # the random op kept its place among the ops that did not move (the mms)
    assert names.index("aten.rand_like.default") < names.index("aten.mm.default")
    torch.manual_seed(0)
    got = gm(a, b)
    torch.manual_seed(0)
    want = fn(a, b)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_inference_fuses_relu_and_residual_add_into_the_convolution() -> None:
    """Frozen inference of conv-bn-relu and of relu(conv + shortcut): oneDNN calls with the
    epilogue fused, values and strides as eager's, also where the shortcut is stored in
    another layout (the block's input)."""

    class Res(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(6, 6, 3, padding=1)
            self.b1 = nn.BatchNorm2d(6)
            self.c2 = nn.Conv2d(6, 6, 3, padding=1, bias=False)
            self.b2 = nn.BatchNorm2d(6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + x)

    torch.manual_seed(0)
    m = Res().eval()
    with torch.no_grad():
        for bn in (m.b1, m.b2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    ref = copy.deepcopy(m)
    f = ember.compile(m, backend="inductor")
    before = dict(layout.counters)
    for x in (torch.randn(2, 6, 7, 5), torch.randn(2, 6, 7, 5).to(memory_format=CL)):
        with torch.no_grad():
            got, want = f(x), ref(x)
        _close(got, want, "output")
    if layout._mkldnn_pointwise() is not None:
        assert layout.counters["conv_relu"] > before.get("conv_relu", 0)
        assert layout.counters["conv_add_relu"] > before.get("conv_add_relu", 0)


@pytest.mark.parametrize("k,stride,groups,batch", list(itertools.product([1, 3], [1, 2], [1, 2],
                                                                          [1, 3])))
def test_mkldnn_pointwise_convolution_is_channels_last_and_matches(k: int, stride: int,
                                                                 groups: int, batch: int) -> None:
    """What the fused epilogue relies on: oneDNN's fused convolution returns a channels-last
    result for a channels-last input, equal to relu(conv(x) [+ other]) computed apart."""
    op = layout._mkldnn_pointwise()
    if op is None:
        pytest.skip("this torch has no oneDNN")  # the lowering then never emits the op
    torch.manual_seed(0)
    x = torch.randn(batch, 4, 7, 6).to(memory_format=CL)
    w, b = torch.randn(6, 4 // groups, k, k), torch.randn(6)
    y = torch.ops.aten.convolution.default(x, w, b, [stride] * 2, [k // 2] * 2, [1, 1], False,
                                           [0, 0], groups)
    other = torch.randn(y.shape).to(memory_format=CL)
    common = ([k // 2] * 2, [stride] * 2, [1, 1], groups)
    u = op.default(x, w, b, *common, "relu", [], None)
    v = op.binary(x, other, w, b, *common, "add", None, "relu", [], None)
    assert u.is_contiguous(memory_format=CL) and v.is_contiguous(memory_format=CL)
    torch.testing.assert_close(u, torch.relu(y), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, torch.relu(y + other), rtol=1e-5, atol=1e-5)


class PoolNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(torch.relu(self.b1(self.c1(x))), 3, 2, 1, ceil_mode=True)
        y = nn.functional.avg_pool2d(self.c2(y), 2)
        return nn.functional.interpolate(self.c3(y), scale_factor=2)


def test_pooling_between_convolutions_train_and_eval() -> None:
    """max/avg pooling (forward and backward, indices saved for the backward) on channels-last
    values, an upsample fallback after them: values, gradients and strides as eager's."""
    torch.manual_seed(0)
    m = PoolNet()
    ref = copy.deepcopy(m)
    f = ember.compile(m, backend="inductor")
    before = layout.counters["pool"]
    x1 = torch.randn(2, 3, 15, 13, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    y1, y2 = f(x1), ref(x2)
    _close(y1.detach(), y2.detach(), "output")
    g = torch.randn(y1.shape)
    y1.backward(g)
    y2.backward(g)
    _close(x1.grad, x2.grad, "input grad")
    for (name, p1), p2 in zip(ref.named_parameters(), m.parameters()):
        _close(p2.grad, p1.grad, f"grad {name}")
    assert layout.counters["pool"] > before
    m.eval()
    ref.eval()
    with torch.no_grad():
        _close(ember.compile(m, backend="inductor")(x2), ref(x2), "eval output")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_aten_pooling_is_channels_last_for_channels_last_input(dtype: torch.dtype) -> None:
    """What lower_pool declares, over kernels, strides, paddings, ceil_mode and batch sizes."""
    a = torch.ops.aten
    for k, s, p, ceil, n, hw in itertools.product([2, 3], [1, 2], [0, 1], [False, True], [1, 3],
                                                  [5, 8]):
        if p > k // 2:
            continue
        x = torch.randn(n, 6, hw, hw, dtype=dtype).to(memory_format=CL)
        y, idx = a.max_pool2d_with_indices.default(x, [k, k], [s, s], [p, p], [1, 1], ceil)
        g = torch.randn(y.shape, dtype=dtype).to(memory_format=CL)
        gx = a.max_pool2d_with_indices_backward.default(g, x, [k, k], [s, s], [p, p], [1, 1],
                                                         ceil, idx)
        av = a.avg_pool2d.default(x, [k, k], [s, s], [p, p], ceil, True, None)
        ga = a.avg_pool2d_backward.default(g, x, [k, k], [s, s], [p, p], ceil, True, None)
        for t in (y, idx, gx, av, ga):
            assert t.is_contiguous(memory_format=CL), (k, s, p, ceil, n, hw, t.stride())


def test_sink_pure_nodes_leaves_graphs_with_writes_alone() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        r = a * 2          # read of a before the write below: must stay before it
        a.add_(1)
        return torch.mm(b, b) + r

    gm = make_fx(fn)(torch.randn(3, 3), torch.randn(3, 3))
    before = [n.name for n in gm.graph.nodes]
    assert layout.sink_pure_nodes(gm) == 0
    assert [n.name for n in gm.graph.nodes] == before


def test_strided_1x1_convolution_backward_runs_on_contiguous_layouts() -> None:
    """ATen's channels-last backward of a strided 1x1 convolution corrupts the heap at some
    sizes (batch 3, 10x8 input, stride 2); the lowering keeps it on eager's layouts, so this
    training step (it crashed the process) matches eager."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 16, 1, stride=2, bias=False))
    ref = copy.deepcopy(m)
    f = ember.compile(m, backend="inductor")
    before = layout.counters["conv_1x1_strided_backward"]
    for shape in ((3, 3, 10, 8), (3, 3, 9, 7), (2, 3, 6, 5)):  # odd sizes: a partial last row
        x1 = torch.randn(*shape, requires_grad=True)
        x2 = x1.detach().clone().requires_grad_()
        y1, y2 = f(x1), ref(x2)
        _close(y1.detach(), y2.detach(), "output")
        y1.square().sum().backward()
        y2.square().sum().backward()
        _close(x1.grad, x2.grad, "input grad")
        for (name, p1), p2 in zip(ref.named_parameters(), m.parameters()):
            _close(p2.grad, p1.grad, f"grad {name}")
            p1.grad = p2.grad = None
    assert layout.counters["conv_1x1_strided_backward"] > before


class Shortcuts(nn.Module):
    """Residual adds whose shortcut is dead after the add (a strided 1x1 projection; a value an
    earlier convolution read), is the graph input, is read again after the add, or is the
    convolution's own input."""

    def __init__(self, reuse: bool) -> None:
        super().__init__()
        self.reuse = reuse
        self.c1 = nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(6)
        self.c2 = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(6)
        self.down = nn.Conv2d(4, 6, 1, stride=2, bias=False)
        self.bd = nn.BatchNorm2d(6)
        self.c3 = nn.Conv2d(6, 6, 3, padding=1)
        self.c4 = nn.Conv2d(6, 6, 1)
        self.c5 = nn.Conv2d(6, 6, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = self.bd(self.down(x))
        y = torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + s)
        z = torch.relu(self.c4(self.c3(y)) + y)  # y: read by c3 before, dead after the add
        w = torch.relu(self.c5(z) + z)  # z: the convolution's own input
        if self.reuse:
            return w, s * 2.0  # s read after its add: no write into it
        return (w,)


@pytest.mark.parametrize("reuse,cl", [(False, False), (True, True)])
def test_fused_residual_add_writes_into_a_dead_shortcut_only(reuse: bool, cl: bool) -> None:
    """Frozen inference: ``relu(conv + shortcut)`` accumulates into the shortcut's buffer
    (oneDNN's in-place variant) when nothing reads the shortcut after the add; values and
    strides as eager's, the input untouched, a shortcut read later left alone."""
    torch.manual_seed(4)
    m = Shortcuts(reuse).eval()
    with torch.no_grad():
        for bn in (m.b1, m.b2, m.bd):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    ref = copy.deepcopy(m)
    f = ember.compile(m, backend="inductor")
    before = layout.counters["conv_add_relu_inplace"]
    x = torch.randn(2, 4, 9, 7)
    if cl:
        x = x.to(memory_format=CL)
    x0 = x.clone()
    for _ in range(2):
        with torch.no_grad():
            got, want = f(x), ref(x)
        assert torch.equal(x, x0) and x.stride() == x0.stride()
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"output {i}")
    if layout._mkldnn_pointwise() is not None:
        # reuse=False: the projection shortcut (y's buffer is then that in-place result, left
        # alone); reuse=True: y only (the shortcut is read after its add); never z
        assert layout.counters["conv_add_relu_inplace"] - before == 1


def test_inplace_fused_residual_add_matches_the_out_of_place_one() -> None:
    """What the in-place epilogue relies on: ``_convolution_pointwise_.binary`` writes
    relu(conv(x) + other) into ``other``, bit-equal to the out-of-place call, channels-last
    (ungrouped: the lowering uses it for groups=1 only; grouped, it differs by an ulp)."""
    if layout._mkldnn_pointwise() is None:
        pytest.skip("this torch has no oneDNN")  # the lowering then never emits the op
    torch.manual_seed(0)
    for stride, k, batch in itertools.product([1, 2], [1, 3], [1, 3]):
        x = torch.randn(batch, 4, 7, 6).to(memory_format=CL)
        w, b = torch.randn(6, 4, k, k), torch.randn(6)
        common = ([k // 2] * 2, [stride] * 2, [1, 1], 1)
        y = torch.ops.aten.convolution.default(x, w, b, [stride] * 2, [k // 2] * 2, [1, 1], False,
                                               [0, 0], 1)
        other = torch.randn(y.shape).to(memory_format=CL)
        want = torch.ops.mkldnn._convolution_pointwise.binary(
            x, other, w, b, *common, "add", None, "relu", [], None)
        buf = other.clone()
        got = torch.ops.mkldnn._convolution_pointwise_.binary(
            buf, x, w, b, *common, "add", None, "relu", [], None)
        assert got.data_ptr() == buf.data_ptr() and got.is_contiguous(memory_format=CL)
        assert torch.equal(got, want)
        torch.testing.assert_close(got, torch.relu(y + other), rtol=1e-5, atol=1e-5)


class Pooled(nn.Module):
    def __init__(self, keepdim: bool) -> None:
        super().__init__()
        self.keepdim = keepdim
        self.c = nn.Conv2d(3, 10, 3, padding=1)
        self.bn = nn.BatchNorm2d(10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.c(x)))
        # spatial means (the lowered form), and a mean over channels (left to the default)
        return y.mean((-1, -2), keepdim=self.keepdim), y.mean(1)


@pytest.mark.parametrize("train,keepdim,cl", [(False, True, False), (False, False, True),
                                              (True, True, True), (True, False, False)])
def test_spatial_mean_of_a_channels_last_value(train: bool, keepdim: bool, cl: bool) -> None:
    """Global average pooling lowered as one reduction, channels innermost, scaled in float64:
    values, strides and gradients as eager's (spatial size 5x7: 1/35 is not exact in binary)."""
    torch.manual_seed(5)
    m = Pooled(keepdim).train(train)
    ref = copy.deepcopy(m)
    f = ember.compile(m, backend="inductor")
    before = layout.counters["mean"]
    x = torch.randn(3 + train, 3, 5, 7) * 3 + 1
    if cl:
        x = x.to(memory_format=CL)
    x1, x2 = x.clone().requires_grad_(train), x.clone().requires_grad_(train)
    with torch.set_grad_enabled(train):
        got, want = f(x1), ref(x2)
    for i, (g, w) in enumerate(zip(got, want)):
        _close(g.detach(), w.detach(), f"output {i}")
    if train:
        (got[0].square().sum() + got[1].sum()).backward()
        (want[0].square().sum() + want[1].sum()).backward()
        _close(x1.grad, x2.grad, "input grad")
        for (name, p1), p2 in zip(ref.named_parameters(), m.parameters()):
            _close(p2.grad, p1.grad, f"grad {name}")
    assert layout.counters["mean"] > before
