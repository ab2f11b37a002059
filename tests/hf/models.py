"""The Hugging Face corpus: small architectures built from config classes with random weights.

Nothing is downloaded: every model is ``AutoModel*.from_config`` of a config with tiny sizes
(hidden 16-32, 1-2 layers, vocabulary 64), and the inputs are a handful of tokens, a 32x32 image
or a few hundred audio samples. ``SPECS`` maps a name to a ``Spec``; ``build(name)`` returns
``(model, inputs)`` with the model in eval mode and seeded weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

VOCAB = 64
SEQ = 8

# Common tiny sizes, by the names the config classes use.
_LLAMA = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)
_BERT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
_BART = dict(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
             decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
_VIT = dict(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=1,
            num_attention_heads=4, intermediate_size=64)
_W2V = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
            intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4),
            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, num_feat_extract_layers=2,
            do_stable_layer_norm=False, mask_time_prob=0.0, mask_feature_prob=0.0)


@dataclasses.dataclass(frozen=True)
class Spec:
    model_type: str
    family: str  # decoder, encoder, encdec, vision, audio, multimodal, moe, ssm
    config: dict[str, Any]
    inputs: str  # "ids", "ids_dec", "pixels", "audio", "whisper", "clip"
    auto: str = "AutoModel"


def _s(model_type: str, family: str, inputs: str, base: dict | None = None,
       auto: str = "AutoModel", **extra: Any) -> Spec:
    return Spec(model_type, family, {**(base or {}), **extra}, inputs, auto)


SPECS: dict[str, Spec] = {
    # decoders
    "gpt2": _s("gpt2", "decoder", "ids", dict(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4,
                                              n_positions=64, bos_token_id=1, eos_token_id=2),
               auto="AutoModelForCausalLM"),
    "gpt_neo": _s("gpt_neo", "decoder", "ids", dict(vocab_size=VOCAB, hidden_size=32,
                                                    num_layers=2, num_heads=4,
                                                    attention_types=[[["global", "local"], 1]],
                                                    max_position_embeddings=64, window_size=4),
                  auto="AutoModelForCausalLM"),
    "gptj": _s("gptj", "decoder", "ids", dict(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4,
                                              rotary_dim=4, n_positions=64),
               auto="AutoModelForCausalLM"),
    "gpt_neox": _s("gpt_neox", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM"),
    "llama": _s("llama", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM"),
    "mistral": _s("mistral", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM",
                  sliding_window=4),
    "qwen2": _s("qwen2", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM"),
    "qwen3": _s("qwen3", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM", head_dim=8),
    "phi": _s("phi", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM"),
    "phi3": _s("phi3", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM"),
    "opt": _s("opt", "decoder", "ids", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=4, ffn_dim=64,
                                            word_embed_proj_dim=32,
                                            max_position_embeddings=64, pad_token_id=0),
              auto="AutoModelForCausalLM"),
    "bloom": _s("bloom", "decoder", "ids", dict(vocab_size=VOCAB, hidden_size=32, n_layer=1,
                                                n_head=4), auto="AutoModelForCausalLM"),
    "falcon": _s("falcon", "decoder", "ids", dict(vocab_size=VOCAB, hidden_size=32,
                                                  num_hidden_layers=1, num_attention_heads=4),
                 auto="AutoModelForCausalLM"),
    "gemma": _s("gemma", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM", head_dim=8),
    "gemma2": _s("gemma2", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM", head_dim=8,
                 sliding_window=4, num_hidden_layers=2),
    "stablelm": _s("stablelm", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM"),
    "codegen": _s("codegen", "decoder", "ids", dict(vocab_size=VOCAB, n_embd=32, n_layer=1,
                                                    n_head=4, rotary_dim=4, n_positions=64,
                                                    n_ctx=64), auto="AutoModelForCausalLM"),
    "olmo": _s("olmo", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM"),
    "starcoder2": _s("starcoder2", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM"),
    "granite": _s("granite", "decoder", "ids", _LLAMA, auto="AutoModelForCausalLM"),
    "xglm": _s("xglm", "decoder", "ids", dict(vocab_size=VOCAB, d_model=32, num_layers=1,
                                              attention_heads=4, ffn_dim=64,
                                              max_position_embeddings=64),
               auto="AutoModelForCausalLM"),
    "biogpt": _s("biogpt", "decoder", "ids", _BERT, auto="AutoModelForCausalLM"),
    # encoders
    "bert": _s("bert", "encoder", "ids", _BERT),
    "roberta": _s("roberta", "encoder", "ids", _BERT, pad_token_id=1),
    "distilbert": _s("distilbert", "encoder", "ids", dict(vocab_size=VOCAB, dim=32, n_layers=1,
                                                          n_heads=4, hidden_dim=64,
                                                          max_position_embeddings=64)),
    "albert": _s("albert", "encoder", "ids", _BERT, embedding_size=16),
    "electra": _s("electra", "encoder", "ids", _BERT, embedding_size=16),
    "deberta": _s("deberta", "encoder", "ids", _BERT),
    "deberta-v2": _s("deberta-v2", "encoder", "ids", _BERT),
    "xlm-roberta": _s("xlm-roberta", "encoder", "ids", _BERT, pad_token_id=1),
    "mpnet": _s("mpnet", "encoder", "ids", _BERT, pad_token_id=1),
    "convbert": _s("convbert", "encoder", "ids", _BERT, embedding_size=32),
    "squeezebert": _s("squeezebert", "encoder", "ids", _BERT, embedding_size=32),
    "megatron-bert": _s("megatron-bert", "encoder", "ids", _BERT),
    "mobilebert": _s("mobilebert", "encoder", "ids", _BERT, embedding_size=16,
                     intra_bottleneck_size=16, num_feedforward_networks=1),
    "ernie": _s("ernie", "encoder", "ids", _BERT),
    "layoutlm": _s("layoutlm", "encoder", "ids", _BERT),
    # encoder-decoders
    "t5": _s("t5", "encdec", "ids_dec", dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                                             num_layers=1, num_decoder_layers=1, num_heads=4,
                                             decoder_start_token_id=0)),
    "bart": _s("bart", "encdec", "ids_dec", _BART),
    "marian": _s("marian", "encdec", "ids_dec", _BART),
    "pegasus": _s("pegasus", "encdec", "ids_dec", _BART),
    "mbart": _s("mbart", "encdec", "ids_dec", _BART),
    "blenderbot": _s("blenderbot", "encdec", "ids_dec", _BART),
    "m2m_100": _s("m2m_100", "encdec", "ids_dec", _BART),
    # outputs y[:, :n], y[:, n:] of one tensor (AOT: sibling views of an intermediate)
    "prophetnet": _s("prophetnet", "encdec", "ids_dec", dict(
        vocab_size=VOCAB, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
        num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=4,
        num_decoder_attention_heads=4, max_position_embeddings=64, ngram=2, num_buckets=16,
        relative_max_distance=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=2)),
    # numpy of constants in its positional embedding (capture: numpy folding)
    "pegasus_x": _s("pegasus_x", "encdec", "ids_dec", _BART, block_size=4, num_global_tokens=4),
    # vision
    "vit": _s("vit", "vision", "pixels", _VIT),
    "deit": _s("deit", "vision", "pixels", _VIT),
    "beit": _s("beit", "vision", "pixels", _VIT),
    "dinov2": _s("dinov2", "vision", "pixels", _VIT),
    "convnext": _s("convnext", "vision", "pixels", dict(num_channels=3, hidden_sizes=[8, 16],
                                                        depths=[1, 1], num_stages=2)),
    "resnet": _s("resnet", "vision", "pixels", dict(num_channels=3, embedding_size=8,
                                                    hidden_sizes=[8, 16], depths=[1, 1],
                                                    layer_type="basic")),
    "regnet": _s("regnet", "vision", "pixels", dict(num_channels=3, embedding_size=8,
                                                    hidden_sizes=[8, 16], depths=[1, 1],
                                                    groups_width=8)),
    "swin": _s("swin", "vision", "pixels", dict(image_size=32, patch_size=4, embed_dim=16,
                                                depths=[1, 1], num_heads=[2, 2], window_size=4)),
    "bit": _s("bit", "vision", "pixels", dict(num_channels=3, embedding_size=8,
                                              hidden_sizes=[8, 16], depths=[1, 1], num_groups=4)),
    "poolformer": _s("poolformer", "vision", "pixels", dict(num_channels=3, hidden_sizes=[8, 16],
                                                            depths=[1, 1], num_encoder_blocks=2,
                                                            patch_sizes=[7, 3], strides=[4, 2],
                                                            padding=[2, 1])),
    "segformer": _s("segformer", "vision", "pixels", dict(num_channels=3, num_encoder_blocks=2,
                                                          depths=[1, 1], sr_ratios=[2, 1],
                                                          hidden_sizes=[8, 16],
                                                          patch_sizes=[7, 3], strides=[4, 2],
                                                          num_attention_heads=[1, 2],
                                                          mlp_ratios=[2, 2])),
    # audio
    "wav2vec2": _s("wav2vec2", "audio", "audio", _W2V),
    "hubert": _s("hubert", "audio", "audio", _W2V),
    "wavlm": _s("wavlm", "audio", "audio", _W2V, num_buckets=16, max_bucket_distance=32),
    "unispeech": _s("unispeech", "audio", "audio", _W2V),
    "data2vec-audio": _s("data2vec-audio", "audio", "audio", _W2V),
    "whisper": _s("whisper", "audio", "whisper", dict(vocab_size=VOCAB, d_model=32,
                                                      encoder_layers=1, decoder_layers=1,
                                                      encoder_attention_heads=4,
                                                      decoder_attention_heads=4,
                                                      encoder_ffn_dim=64, decoder_ffn_dim=64,
                                                      num_mel_bins=8, max_source_positions=8,
                                                      max_target_positions=16, pad_token_id=0,
                                                      bos_token_id=1, eos_token_id=2,
                                                      decoder_start_token_id=1)),
    # multimodal
    "clip": _s("clip", "multimodal", "clip", dict(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=16),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=4),
        projection_dim=16, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "siglip": _s("siglip", "multimodal", "clip", dict(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=16),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=4))),
    # mixture of experts
    "mixtral": _s("mixtral", "moe", "ids", _LLAMA, auto="AutoModelForCausalLM",
                  num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": _s("qwen2_moe", "moe", "ids", _LLAMA, auto="AutoModelForCausalLM",
                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=32),
    "olmoe": _s("olmoe", "moe", "ids", _LLAMA, auto="AutoModelForCausalLM", num_experts=4,
                num_experts_per_tok=2),
    "switch_transformers": _s("switch_transformers", "moe", "ids_dec_mask", dict(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, num_experts=4, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
        decoder_start_token_id=0)),
    # state-space models
    "mamba": _s("mamba", "ssm", "ids", dict(vocab_size=VOCAB, hidden_size=32, state_size=8,
                                            num_hidden_layers=1, expand=2, conv_kernel=4),
                auto="AutoModelForCausalLM"),
    "mamba2": _s("mamba2", "ssm", "ids", dict(vocab_size=VOCAB, hidden_size=32, state_size=8,
                                              num_hidden_layers=1, expand=2, conv_kernel=4,
                                              head_dim=8, num_heads=8, n_groups=1,
                                              chunk_size=4), auto="AutoModelForCausalLM"),
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_inputs(spec: Spec, config: Any, seed: int = 0) -> dict[str, torch.Tensor]:
    g = _gen(seed)
    ids = torch.randint(3, VOCAB, (2, SEQ), generator=g)
    if spec.inputs == "ids":
        return {"input_ids": ids}
    if spec.inputs == "ids_dec":
        return {"input_ids": ids, "decoder_input_ids": torch.randint(3, VOCAB, (2, 4), generator=g)}
    if spec.inputs == "ids_dec_mask":  # its encoder has no default mask under a compiler
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "decoder_input_ids": torch.randint(3, VOCAB, (2, 4), generator=g)}
    if spec.inputs == "pixels":
        size = getattr(config, "image_size", 32)
        size = size if isinstance(size, int) else 32
        return {"pixel_values": torch.randn(2, 3, size, size, generator=g)}
    if spec.inputs == "audio":
        return {"input_values": torch.randn(2, 400, generator=g)}
    if spec.inputs == "whisper":
        return {"input_features": torch.randn(2, 8, 16, generator=g),
                "decoder_input_ids": torch.randint(3, VOCAB, (2, 4), generator=g)}
    if spec.inputs == "clip":
        return {"input_ids": ids, "pixel_values": torch.randn(2, 3, 32, 32, generator=g)}
    raise ValueError(spec.inputs)


def build(name: str, seed: int = 0) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    import transformers

    spec = SPECS[name]
    config = transformers.AutoConfig.for_model(spec.model_type, **spec.config)
    if hasattr(config, "_attn_implementation"):
        config._attn_implementation = "eager"
    torch.manual_seed(seed)
    auto: Callable = getattr(transformers, spec.auto)
    model = auto.from_config(config).eval()
    return model, make_inputs(spec, model.config, seed)


def float_leaves(out: Any) -> list[torch.Tensor]:
    """The floating-point tensors of a model output, in a fixed order (DynamicCache included)."""
    leaves: list[torch.Tensor] = []

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            if x.is_floating_point():
                leaves.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif hasattr(x, "layers"):  # a transformers Cache
            for layer in x.layers:
                walk(getattr(layer, "keys", None))
                walk(getattr(layer, "values", None))
        elif hasattr(x, "to_tuple"):
            walk(x.to_tuple())

    walk(out)
    return leaves


def loss_of(out: Any) -> torch.Tensor:
    """A scalar that depends on every floating output (train mode's ``loss.backward()``)."""
    leaves = [t for t in float_leaves(out) if t.requires_grad]
    return sum(t.float().square().mean() for t in leaves)
