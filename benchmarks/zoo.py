"""The model zoo: every model the runner knows, with its inputs, batch size and two steps.

A :class:`ModelSpec` builds a fresh model and example inputs for a device and a size
(``"small"`` for the 2-core CPU machine, ``"full"`` for the GPU machine). The runner deep-copies the
model once per backend, so every backend starts from identical weights.

* inference step: ``model(*inputs)`` under ``torch.no_grad()``;
* training step: forward, a scalar loss (the mean of every floating output, summed, as PyTorch's
  harness reduces outputs), and ``loss.backward()``. No optimizer: the step's result is the loss
  and every parameter's gradient, which is what the accuracy check compares.

Nothing is downloaded: Hugging Face models are built from configs with random weights, and the
GPU-only models (torchvision resnet50, timm ViT-B/16) are imported lazily and skipped with a note
where the library is missing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["ModelSpec", "ZOO", "get_spec", "default_models", "flatten_outputs", "reduce_to_loss"]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One zoo entry.

    ``build(device, size)`` returns ``(model, inputs)`` with ``inputs`` a tuple of positional
    arguments already on ``device``; ``batch[size]`` is the batch size used (for the report);
    ``sizes`` lists where the model runs (``cpu`` runs "small", ``cuda`` runs "full");
    ``requires`` names the importable modules it needs.
    """

    name: str
    description: str
    build: Callable[[str, str], tuple[nn.Module, tuple[Any, ...]]]
    batch: dict[str, int]
    devices: tuple[str, ...] = ("cpu", "cuda")
    requires: tuple[str, ...] = ()
    default: bool = True
    corpus: str = "zoo"  # "zoo", or "wide" (benchmarks/corpus.py: run with --corpus wide)

    def missing(self) -> list[str]:
        """Modules this model needs that are not importable here."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, device: str) -> torch.Tensor:
    # Never all-zero inputs: a random normal tensor, made on the CPU so every device sees the same.
    return torch.randn(*shape, generator=_gen(1)).to(device)


def _randint(high: int, *shape: int, device: str) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=_gen(2)).to(device)


# ---- hand-written models ---------------------------------------------------------------------

class PointwiseChain(nn.Module):
    """A chain of elementwise ops on a 256x4096 tensor: what fusion wins the most on."""

    def __init__(self, width: int):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale + 0.5
        y = torch.sigmoid(y) * x
        y = torch.tanh(y) + y * 0.25
        y = torch.relu(y - 0.1) + torch.exp(-y.abs())
        y = y * torch.cos(x) - torch.sin(y) * 0.5
        return y / (1.0 + y.abs())


class MLPBlock(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class MLP(nn.Module):
    """Residual MLP: ``blocks`` x (LayerNorm, Linear d->4d, GELU, Linear 4d->d)."""

    def __init__(self, d: int = 512, blocks: int = 4):
        super().__init__()
        self.blocks = nn.Sequential(*[MLPBlock(d, 4 * d) for _ in range(blocks)])
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.blocks(x))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: causal self-attention (SDPA) and a GELU MLP."""

    def __init__(self, d: int = 256, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idt = x if self.down is None else self.down(x)
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + idt)


class SmallResNet(nn.Module):
    """ResNet-style conv net for 64x64 images: stem, three stages of basic blocks, pool, fc."""

    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2),
                                    BasicBlock(2 * width, 4 * width, 2))
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers(self.stem(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, 1), 1))


# ---- builders --------------------------------------------------------------------------------

def _seeded(fn: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return fn()


def _build_tiny_mlp(device: str, size: str):
    return _seeded(lambda: MLP(d=16, blocks=1)).to(device), (_randn(4, 16, device=device),)


def _build_pointwise(device: str, size: str):
    rows = 256 if size == "small" else 4096
    return _seeded(lambda: PointwiseChain(4096)).to(device), (_randn(rows, 4096, device=device),)


def _build_mlp(device: str, size: str):
    b = 128 if size == "small" else 4096
    return _seeded(lambda: MLP(512, 4)).to(device), (_randn(b, 512, device=device),)


def _build_transformer_block(device: str, size: str):
    b, t, d = (8, 128, 256) if size == "small" else (32, 512, 1024)
    return (_seeded(lambda: TransformerBlock(d, 4 if d == 256 else 16)).to(device),
            (_randn(b, t, d, device=device),))


def _build_demo(device: str, size: str):
    # Ember's bundled model (``python -m ember demo``), at the size the product demo uses.
    from ember.examples import example_input, make_model

    return make_model().to(device), (example_input().to(device),)


def _build_convnet(device: str, size: str):
    b = 16 if size == "small" else 128
    return _seeded(lambda: SmallResNet(32)).to(device), (_randn(b, 3, 64, 64, device=device),)


def _hf_common(cfg: Any) -> Any:
    # Deterministic training steps (dropout off) and plain tensor outputs (no KV cache objects).
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop",
                 "attn_pdrop", "attention_dropout", "classifier_dropout"):
        if hasattr(cfg, name):
            setattr(cfg, name, 0.0)
    cfg.use_cache = False
    return cfg


def _build_gpt2(device: str, size: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    if size == "small":
        cfg = GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=256, vocab_size=8192,
                         bos_token_id=8191, eos_token_id=8191)
        b, t = 4, 128
    else:  # GPT-2 small, 124M
        cfg = GPT2Config()
        b, t = 16, 512
    cfg = _hf_common(cfg)
    model = _seeded(lambda: GPT2LMHeadModel(cfg))
    return model.to(device), (_randint(cfg.vocab_size, b, t, device=device),)


def _build_bert(device: str, size: str):
    from transformers import BertConfig, BertModel

    if size == "small":
        cfg = BertConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=1024, vocab_size=8192, max_position_embeddings=256)
        b, t = 4, 128
    else:  # bert-base
        cfg = BertConfig()
        b, t = 16, 512
    cfg = _hf_common(cfg)
    model = _seeded(lambda: BertModel(cfg))
    return model.to(device), (_randint(cfg.vocab_size, b, t, device=device),)


def _build_llama(device: str, size: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    if size == "small":
        cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=8192,
                          max_position_embeddings=256)
        b, t = 4, 128
    else:  # an 8-layer Llama-style model (~0.5B parameters)
        cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                          num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                          max_position_embeddings=1024)
        b, t = 8, 512
    cfg = _hf_common(cfg)
    model = _seeded(lambda: LlamaForCausalLM(cfg))
    return model.to(device), (_randint(cfg.vocab_size, b, t, device=device),)


def _build_resnet50(device: str, size: str):
    import torchvision

    model = _seeded(lambda: torchvision.models.resnet50(weights=None))
    b = 64 if size == "full" else 2
    return model.to(device), (_randn(b, 3, 224, 224, device=device),)


def _build_vit(device: str, size: str):
    import timm

    model = _seeded(lambda: timm.create_model("vit_base_patch16_224", pretrained=False))
    b = 64 if size == "full" else 2
    return model.to(device), (_randn(b, 3, 224, 224, device=device),)


ZOO: dict[str, ModelSpec] = {s.name: s for s in [
    ModelSpec("pointwise", "pointwise chain, 256x4096 (12 elementwise ops)", _build_pointwise,
              {"small": 256, "full": 4096}),
    ModelSpec("mlp", "4-block residual MLP d=512 (LayerNorm, GELU)", _build_mlp,
              {"small": 128, "full": 4096}),
    ModelSpec("transformer_block", "pre-norm transformer block d=256, T=128 (SDPA)",
              _build_transformer_block, {"small": 8, "full": 32}),
    ModelSpec("convnet", "small ResNet-style conv net, 64x64 (BatchNorm, ReLU)", _build_convnet,
              {"small": 16, "full": 128}),
    ModelSpec("gpt2", "HF GPT-2 from config (small: 2 layers d=256; full: 124M, 16x512)",
              _build_gpt2, {"small": 4, "full": 16}, requires=("transformers",)),
    ModelSpec("bert", "HF BERT from config (small: 2 layers d=256; full: bert-base 16x512)",
              _build_bert, {"small": 4, "full": 16}, requires=("transformers",)),
    ModelSpec("llama", "HF Llama-style from LlamaConfig (small: 2 layers d=256; full: 8 layers "
              "d=2048)", _build_llama, {"small": 4, "full": 8}, requires=("transformers",)),
    ModelSpec("resnet50", "torchvision resnet50, 224x224 (GPU only)", _build_resnet50,
              {"small": 2, "full": 64}, devices=("cuda",), requires=("torchvision",)),
    ModelSpec("vit_b16", "timm vit_base_patch16_224 (GPU only)", _build_vit,
              {"small": 2, "full": 64}, devices=("cuda",), requires=("timm",)),
    ModelSpec("tiny_mlp", "1-block MLP d=16 (for the smoke test)", _build_tiny_mlp,
              {"small": 4, "full": 4}, default=False),
    ModelSpec("demo", "Ember's bundled model: 2 pre-norm transformer blocks d=128, 8x64 "
              "(python -m benchmarks demo)", _build_demo, {"small": 8, "full": 8},
              requires=("ember",), default=False),
]}


def _add_wide() -> None:
    from .corpus import WIDE

    ZOO.update(WIDE)


_add_wide()

#: ``--corpus`` selections: the zoo, the wide corpus (benchmarks/corpus.py), or both
CORPORA = ("zoo", "wide", "all")


def get_spec(name: str) -> ModelSpec:
    try:
        return ZOO[name]
    except KeyError:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(ZOO)}") from None


def default_models(device: str, corpus: str = "zoo") -> list[str]:
    """The models a run without ``--models`` benchmarks: the zoo's default set, the whole wide
    corpus, or both (``corpus="all"``)."""
    if corpus not in CORPORA:
        raise SystemExit(f"unknown corpus {corpus!r}; known: {', '.join(CORPORA)}")
    zoo = [s.name for s in ZOO.values() if s.corpus == "zoo" and s.default and device in s.devices]
    wide = [s.name for s in ZOO.values() if s.corpus == "wide" and device in s.devices]
    return {"zoo": zoo, "wide": wide, "all": zoo + wide}[corpus]


# ---- steps -----------------------------------------------------------------------------------

def flatten_outputs(out: Any) -> list[Any]:
    """Every leaf of a model's output (tensors, tuples, dicts, Hugging Face ModelOutputs)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):  # ModelOutput is an OrderedDict holding only the non-None fields
        return [x for v in out.values() for x in flatten_outputs(v)]
    if isinstance(out, (list, tuple)):
        return [x for v in out for x in flatten_outputs(v)]
    return [out]


def reduce_to_loss(out: Any) -> torch.Tensor:
    tensors = [t for t in flatten_outputs(out)
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum(t.float().mean() for t in tensors)  # type: ignore[return-value]


def step_result(mode: str, module: nn.Module, out: Any) -> list[Any]:
    """What the accuracy check compares: the outputs (infer) or the loss and every gradient."""
    if mode == "infer":
        return flatten_outputs(out)
    return [out.detach()] + [p.grad for _, p in module.named_parameters() if p.requires_grad]
