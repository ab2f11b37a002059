"""The wide performance corpus (``python -m benchmarks run --corpus wide``): graphs of shapes the
zoo does not have, so that a choice tuned on the zoo is seen where it does not hold.

Each entry is a :class:`~benchmarks.zoo.ModelSpec` like the zoo's (same runner, same accuracy
rule, same inference and training steps): attention written by hand (causal ``masked_fill``,
an additive padding mask, SDPA's pattern without a mask, batch 1), LayerNorm and RMSNorm,
embeddings, convolutions of kernel sizes 1/3/5/7 and strides 1/2, depthwise-separable blocks,
pooling, pointwise chains of transcendental functions (including issue 21's
``(sin(x) * cos(y) + sigmoid(x) * 0.5).relu().sum(-1)`` on 256x4096), reductions along every
axis, and batch sizes from 1 to 1024. Each model has a few parameters on its path, so a
training step has a backward worth compiling. Sizes: ``small`` for the 2-core CPU machine (an
eager step of a few to ~30 ms), ``full`` a few times larger for bigger machines.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["WIDE"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, device: str, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(device)


def _seeded(fn: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return fn()


# ---- attention written by hand ---------------------------------------------------------------

class HandAttentionBlock(nn.Module):
    """Pre-norm transformer block whose attention is written out: ``q @ k^T * scale``, an
    optional causal ``masked_fill(-inf)`` or additive mask, ``softmax``, ``@ v`` (issue 21's
    block with ``causal=True``: d=256, 4 heads, T=128, batch 8)."""

    def __init__(self, d: int, heads: int, causal: bool, t_max: int):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("tril", torch.tril(torch.ones(t_max, t_max, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        if self.causal:
            s = s.masked_fill(~self.tril[:t, :t], float("-inf"))
        if mask is not None:
            s = s + mask
        a = torch.softmax(s, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _attn(causal: bool, masked: bool, small: tuple[int, int, int, int],
          full: tuple[int, int, int, int]) -> Callable[[str, str], Any]:
    def build(device: str, size: str):
        b, t, d, h = small if size == "small" else full
        m = _seeded(lambda: HandAttentionBlock(d, h, causal, t)).to(device)
        x = _randn(b, t, d, device=device)
        if not masked:
            return m, (x,)
        # padding: the last quarter of every other sequence is masked out (additive -1e4)
        pad = torch.zeros(b, 1, 1, t)
        pad[::2, ..., 3 * t // 4:] = -1e4
        return m, (x, pad.to(device))
    return build


# ---- norms, embeddings -----------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Norms(nn.Module):
    """LayerNorm, RMSNorm (written out), a residual, and a LayerNorm without affine."""

    def __init__(self, d: int):
        super().__init__()
        self.ln, self.rms = nn.LayerNorm(d), RMSNorm(d)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.rms(self.ln(x) * self.scale + x)
        return F.layer_norm(y * 2.0 - x, y.shape[-1:])


class SwiGLU(nn.Module):
    """RMSNorm + SwiGLU MLP (Llama's), batch of few tokens: small-``m`` linear layers."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.norm = RMSNorm(d)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class EmbedClassifier(nn.Module):
    """Token + position embeddings, LayerNorm, masked mean pooling, a linear classifier."""

    def __init__(self, vocab: int, d: int, t_max: int, classes: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(t_max, d)
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.ln(self.tok(ids) + self.pos(torch.arange(t, device=ids.device)))
        keep = (ids != 0).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        return self.head(pooled)


class LogSoftmaxHead(nn.Module):
    """A language-model head: linear to a large vocabulary, log_softmax, then the
    log-probabilities' entropy-like reduction per row."""

    def __init__(self, d: int, vocab: int):
        super().__init__()
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp = torch.log_softmax(self.head(self.ln(x)), dim=-1)
        return lp, -(lp.exp() * lp).sum(-1)


# ---- convolutions, pooling -------------------------------------------------------------------

class ConvKernels(nn.Module):
    """Convolutions of kernel sizes 7 (stride 2), 5, 3 (stride 2), 1 and 3 with dilation 2, each
    with BatchNorm and ReLU."""

    def __init__(self, c: int = 16):
        super().__init__()

        def cbr(cin: int, cout: int, k: int, s: int, dil: int = 1) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, k, s, dil * (k // 2), dilation=dil,
                                           bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        self.body = nn.Sequential(cbr(3, c, 7, 2), cbr(c, c, 5, 1), cbr(c, 2 * c, 3, 2),
                                  cbr(2 * c, 4 * c, 1, 1), cbr(4 * c, 4 * c, 3, 1, dil=2))
        self.fc = nn.Linear(4 * c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).mean((2, 3)))


class DepthwiseSeparable(nn.Module):
    """MobileNet-style blocks: depthwise 3x3 (groups=C) + BN + ReLU6, pointwise 1x1 + BN, and a
    residual where the shape allows."""

    def __init__(self, c: int = 32, blocks: int = 3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c),
                                  nn.ReLU6())
        self.blocks = nn.ModuleList(nn.Sequential(
            nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), nn.BatchNorm2d(c), nn.ReLU6(),
            nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)) for _ in range(blocks))
        self.fc = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        for b in self.blocks:
            y = y + b(y)
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class Pooling(nn.Module):
    """Max pooling, average pooling (3x3 stride 2 with padding), adaptive average pooling to 4x4,
    with convolutions between."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, c, 3, padding=1), nn.Conv2d(c, 2 * c, 3, padding=1)
        self.fc = nn.Linear(2 * c * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(torch.relu(self.c1(x)), 2)
        y = F.avg_pool2d(torch.relu(self.c2(y)), 3, 2, 1)
        return self.fc(F.adaptive_avg_pool2d(y, 4).flatten(1))


def _small_resnet_b1(device: str, size: str):
    from .zoo import SmallResNet

    b = 1 if size == "small" else 4
    return _seeded(lambda: SmallResNet(32)).to(device), (_randn(b, 3, 64, 64, device=device),)


# ---- pointwise and reductions ----------------------------------------------------------------

class TrigChain(nn.Module):
    """Issue 21's pointwise chain, ``(sin(x) * cos(y) + sigmoid(x) * 0.5).relu().sum(-1)``, with x
    scaled by a per-column parameter first (so that a training step has a gradient to
    compute: the fused backward of sin, cos and sigmoid)."""

    def __init__(self, width: int):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x * self.scale
        return (torch.sin(x) * torch.cos(y) + torch.sigmoid(x) * 0.5).relu().sum(-1)


class TranscendentalChain(nn.Module):
    """exp, log1p, erf, tanh, pow, rsqrt, atan: softplus-like and GELU-like pieces chained."""

    def __init__(self, width: int):
        super().__init__()
        self.a = nn.Parameter(torch.linspace(0.8, 1.2, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.a
        sp = torch.log1p(torch.exp(-x.abs())) + x.clamp_min(0)     # softplus
        g = 0.5 * x * (1 + torch.erf(x * 0.7071067811865476))      # erf GELU
        t = torch.tanh(sp) * torch.rsqrt(1 + x * x) + torch.atan(g) * 0.1
        return t * torch.pow(sp + 1.0, 0.5)


class Reductions(nn.Module):
    """Reductions along every axis of a 3-d tensor: sum over the batch, mean over rows, max over
    columns, variance, logsumexp, a softmax along dim 0 and a full mean."""

    def __init__(self, cols: int):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, cols))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = x * self.w
        return (x.sum(0), x.mean(1), x.amax(2), x.var(1), torch.logsumexp(x, -1),
                torch.softmax(x, 0).sum((1, 2)), x.abs().mean())


class ViewsCat(nn.Module):
    """Data movement: permutes, cat, pad, slicing, a transpose-and-reshape and a residual."""

    def __init__(self, c: int):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.w                                  # [B, T, C]
        z = torch.cat([y, y.flip(1) * 0.5, F.pad(y[:, 1:], (0, 0, 0, 1))], dim=-1)
        z = z.permute(0, 2, 1).contiguous()             # [B, 3C, T]
        z = z.reshape(z.shape[0], 3, -1, z.shape[-1]).transpose(1, 2)
        return torch.relu(z.sum(2)).transpose(1, 2) + y


class MLPWide(nn.Module):
    def __init__(self, d: int, hidden: int, blocks: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, hidden),
                                                  nn.GELU(), nn.Linear(hidden, d))
                                    for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return x


# ---- the corpus ------------------------------------------------------------------------------

def _spec(name: str, description: str, build: Callable[[str, str], Any], batch: tuple[int, int]):
    from .zoo import ModelSpec

    return ModelSpec(name, description, build, {"small": batch[0], "full": batch[1]},
                     default=False, corpus="wide")


def _simple(make: Callable[[str], nn.Module], shapes: Callable[[str], list[tuple[int, ...]]]
            ) -> Callable[[str, str], Any]:
    def build(device: str, size: str):
        m = _seeded(lambda: make(size)).to(device)
        return m, tuple(_randn(*s, device=device, seed=1 + i) for i, s in enumerate(shapes(size)))
    return build


def _ids(vocab: int, b: int, t: int, device: str) -> torch.Tensor:
    ids = torch.randint(1, vocab, (b, t), generator=_gen(2))
    ids[::3, 3 * t // 4:] = 0  # padding in every third sequence
    return ids.to(device)


def _embed(device: str, size: str):
    vocab, d, b, t = (32000, 256, 16, 64) if size == "small" else (50000, 768, 64, 256)
    m = _seeded(lambda: EmbedClassifier(vocab, d, t, 16)).to(device)
    return m, (_ids(vocab, b, t, device),)


def _s(small: Any, full: Any) -> Callable[[str], Any]:
    return lambda size: small if size == "small" else full


WIDE_SPECS = [
    _spec("attn_causal", "hand-written causal attention block (masked_fill + softmax), d=256, "
          "4 heads, T=128, batch 8 (issue 21)",
          _attn(True, False, (8, 128, 256, 4), (32, 512, 1024, 16)), (8, 32)),
    _spec("attn_padmask", "hand-written attention with an additive padding mask, d=128, 4 heads, "
          "T=64, batch 4", _attn(False, True, (4, 64, 128, 4), (16, 256, 512, 8)), (4, 16)),
    _spec("attn_sdpa_pattern", "hand-written softmax(q k^T * s) v, no mask (SDPA's pattern), "
          "d=256, 8 heads, T=96, batch 4", _attn(False, False, (4, 96, 256, 8),
                                                 (16, 512, 1024, 16)), (4, 16)),
    _spec("attn_causal_b1", "hand-written causal attention block, batch 1, T=32, d=512, 8 heads",
          _attn(True, False, (1, 32, 512, 8), (1, 128, 2048, 16)), (1, 1)),
    _spec("norms", "LayerNorm + RMSNorm (written out) + residual, 16x128x512",
          _simple(lambda s: Norms(_s(512, 1024)(s)),
                  lambda s: [_s((16, 128, 512), (64, 512, 1024))(s)]), (16, 64)),
    _spec("swiglu_b2", "RMSNorm + SwiGLU MLP d=1024, hidden 2816, 2x4 tokens (small batch)",
          _simple(lambda s: SwiGLU(*_s((1024, 2816), (2048, 5632))(s)),
                  lambda s: [_s((2, 4, 1024), (4, 4, 2048))(s)]), (2, 4)),
    _spec("embed_classifier", "token + position embeddings (32000x256), LayerNorm, masked mean "
          "pooling, classifier; 16x64 ids", _embed, (16, 64)),
    _spec("logsoftmax_head", "LayerNorm + linear 256->8192 + log_softmax + row entropy, 256 rows",
          _simple(lambda s: LogSoftmaxHead(*_s((256, 8192), (1024, 32000))(s)),
                  lambda s: [_s((256, 256), (2048, 1024))(s)]), (256, 2048)),
    _spec("conv_kernels", "convolutions 7x7/2, 5x5, 3x3/2, 1x1, 3x3 dilated (BN, ReLU), "
          "8x3x64x64", _simple(lambda s: ConvKernels(_s(16, 32)(s)),
                               lambda s: [_s((8, 3, 64, 64), (64, 3, 128, 128))(s)]), (8, 64)),
    _spec("depthwise", "depthwise-separable blocks (3x3 groups=C, 1x1, BN, ReLU6), 4x3x64x64, "
          "C=32", _simple(lambda s: DepthwiseSeparable(_s(32, 64)(s)),
                          lambda s: [_s((4, 3, 64, 64), (64, 3, 160, 160))(s)]), (4, 64)),
    _spec("pooling", "max/avg/adaptive pooling between convolutions, 8x3x64x64",
          _simple(lambda s: Pooling(16), lambda s: [_s((8, 3, 64, 64), (128, 3, 128, 128))(s)]),
          (8, 128)),
    _spec("resnet_b1", "the zoo's small ResNet at batch 1 (small-batch convolutions)",
          _small_resnet_b1, (1, 4)),
    _spec("trig_chain", "(sin(x) * cos(y) + sigmoid(x) * 0.5).relu().sum(-1) on 256x4096 "
          "(issue 21)", _simple(lambda s: TrigChain(4096),
                                lambda s: [_s((256, 4096), (4096, 4096))(s)] * 2), (256, 4096)),
    _spec("transcendental", "exp/log1p/erf/tanh/rsqrt/atan/pow chain, 512x2048",
          _simple(lambda s: TranscendentalChain(2048),
                  lambda s: [_s((512, 2048), (8192, 2048))(s)]), (512, 8192)),
    _spec("reductions", "sum/mean/amax/var/logsumexp/softmax along every axis of 16x256x512",
          _simple(lambda s: Reductions(512), lambda s: [_s((16, 256, 512), (128, 512, 512))(s)]),
          (16, 128)),
    _spec("views_cat", "cat, flip, pad, permute, reshape-transpose, 16x256x256",
          _simple(lambda s: ViewsCat(256), lambda s: [_s((16, 256, 256), (64, 512, 512))(s)]),
          (16, 64)),
    _spec("mlp_b1", "2-block MLP d=1024, hidden 4096, batch 1 (small-batch linear layers)",
          _simple(lambda s: MLPWide(1024, 4096, 2), lambda s: [(1, 1024)]), (1, 1)),
    _spec("mlp_b1024", "2-block MLP d=256, hidden 1024, batch 1024 (large batch)",
          _simple(lambda s: MLPWide(256, 1024, 2), lambda s: [_s((1024, 256), (16384, 256))(s)]),
          (1024, 16384)),
]

WIDE = {s.name: s for s in WIDE_SPECS}
