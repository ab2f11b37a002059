"""Sweep Hugging Face architectures that are *not* in the corpus (tests/hf/models.py) through
Ember, the way tests/hf/test_corpus.py runs the corpus: eval on the eager backend, train on
aot_eager (outputs and gradients compared with eager), graphs/breaks/fallbacks counted, and
torch.compile's graph count as the yardstick. A script, not a test (pytest collects test_*.py).

    .venv/bin/python -m tests.hf.sweep_heldout list                  # the candidate model types
    .venv/bin/python -m tests.hf.sweep_heldout run [TYPE ...] [--limit N] [--backend inductor]
    .venv/bin/python -m tests.hf.sweep_heldout run --train inductor   # train mode only, inductor
    .venv/bin/python -m tests.hf.sweep_heldout table [FILE]          # the cached results
    .venv/bin/python -m tests.hf.sweep_heldout one TYPE MODE BACKEND # one run, in this process

Configs are shrunk generically: every key of the default config that the corpus's tiny configs
use (hidden 32, one layer, 4 heads, vocabulary 64, 32x32 images, ...) is overridden when the
config has it, nested sub-configs likewise; a model still over ``MAX_PARAMS`` or that fails to
build or to run eagerly is skipped with the reason. Each model runs in its own subprocess, one
at a time (the machine is shared), with a timeout; results are cached in ``CACHE`` (JSON), so a
rerun only runs what is missing (``--force`` reruns). torch.compile runs only where Ember
captured more than one graph or took a break (one graph and no break cannot be beaten).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("EMBER_HF_SWEEP_CACHE", "/tmp/ember-hf-heldout.json"))
MAX_PARAMS = 3_000_000
TIMEOUT = 240

#: Overridden when the default config has the key. Sizes follow tests/hf/models.py.
SMALL: dict[str, Any] = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    n_embd=32, n_layer=1, n_head=4, n_positions=64, n_ctx=64, n_inner=64,
    d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_layers=1,
    num_decoder_layers=1, num_heads=4, d_ff=64, d_kv=8, ffn_dim=64, head_dim=8,
    embedding_size=32, embed_dim=32, dim=32, hidden_dim=64, n_layers=1, n_heads=4,
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=32, expert_intermediate_size=32,
    first_k_dense_replace=0, n_shared_experts=1, n_group=1, topk_group=1,
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
    image_size=32, patch_size=8, num_channels=3, state_size=8, conv_kernel=4, expand=2,
    num_mel_bins=8, max_source_positions=8, max_target_positions=16,
    sliding_window=4, window_size=4, attention_window=4, num_buckets=16,
    max_relative_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    decoder_start_token_id=2, linear_num_key_heads=2, linear_num_value_heads=2,
    linear_key_head_dim=8, linear_value_head_dim=8, mamba_d_state=8, mamba_n_heads=8,
    mamba_d_head=8, mamba_n_groups=1, mamba_expand=2, mamba_d_conv=4, mamba_chunk_size=4,
    ssm_state_size=8, time_step_rank=4, chunk_size=4, n_groups=1, global_attn_every_n_layers=1,
    intermediate_size_mlp=64, attention_head_dim=8, rotary_dim=4, encoder_hidden_size=32,
    num_key_value_groups=2,
)
#: List-valued keys: each element shrunk (depth 1, widths 8, 16, ...), the length kept.
LISTS = {"depths": lambda n, i: 1, "hidden_sizes": lambda n, i: 8 * 2 ** i,
         "num_heads": lambda n, i: 2, "embed_dims": lambda n, i: 8 * 2 ** i,
         "num_attention_heads": lambda n, i: 2, "layers": lambda n, i: 1,
         "mlp_ratios": lambda n, i: 2, "sr_ratios": lambda n, i: 1}
INPUT_OF = {"input_ids": "ids", "pixel_values": "pixels", "input_values": "audio",
            "input_features": "features"}


def candidates() -> list[tuple[str, str, str]]:
    """(model_type, auto class, input kind) of the architectures not in the corpus, in the order
    run: causal LMs, encoders, seq2seq, vision, audio."""
    from transformers.models.auto import modeling_auto as m

    from . import models

    corpus = {s.model_type for s in models.SPECS.values()}
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for mapping, auto, kind in (
            (m.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "AutoModelForCausalLM", "ids"),
            (m.MODEL_FOR_MASKED_LM_MAPPING_NAMES, "AutoModel", "ids"),
            (m.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, "AutoModelForSeq2SeqLM", "ids_dec"),
            (m.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES, "AutoModelForImageClassification",
             "pixels"),
            (m.MODEL_FOR_CTC_MAPPING_NAMES, "AutoModelForCTC", "audio"),
            (m.MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES, "AutoModelForAudioClassification",
             "audio"),
            (m.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES, "AutoModelForSpeechSeq2Seq", "whisper")):
        for t in mapping:
            if t not in corpus and t not in seen:
                seen.add(t)
                out.append((t, auto, kind))
    return out


def _shrink(cfg: Any, depth: int = 0) -> None:
    for key, value in list(vars(cfg).items()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type") and depth < 3:
            _shrink(value, depth + 1)
        elif key in SMALL and (isinstance(value, (int, float)) and not isinstance(value, bool)
                               or value is None and key.endswith("token_id")):
            if isinstance(value, float) and not float(SMALL[key]).is_integer():
                continue
            setattr(cfg, key, SMALL[key])
        elif key in LISTS and isinstance(value, (list, tuple)) and value \
                and all(isinstance(v, int) for v in value):
            setattr(cfg, key, [LISTS[key](len(value), i) for i in range(len(value))])
        elif key == "layer_types" and isinstance(value, list):
            pass  # fixed up below, once num_hidden_layers is known
    n = getattr(cfg, "num_hidden_layers", None)
    lt = getattr(cfg, "layer_types", None)
    if isinstance(n, int) and isinstance(lt, list) and len(lt) != n:
        kinds = list(dict.fromkeys(lt))  # one layer of each kind, so each kind is exercised
        cfg.num_hidden_layers = len(kinds)
        cfg.layer_types = kinds


def _small_kwargs(cfg: Any, depth: int = 0) -> dict[str, Any]:
    """The keyword arguments that make ``cfg``'s class small (sub-configs as dicts), so that
    what its ``__init__`` derives from them (``qk_head_dim``, ``layer_types``) follows."""
    probe = type(cfg).from_dict(cfg.to_dict()) if hasattr(cfg, "to_dict") else cfg
    _shrink(probe, depth)
    out: dict[str, Any] = {}
    for key, value in vars(probe).items():
        old = getattr(cfg, key, None)
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            out[key] = _small_kwargs(old, depth + 1) if depth < 3 else value.to_dict()
            out[key] = {**value.to_dict(), **out[key]} if depth else out[key]
        elif value != old or key in ("layer_types", "num_hidden_layers"):
            out[key] = value
    return out


_FOR_MODEL: list[Any] = []  # transformers' own AutoConfig.for_model (_register patches it)


def _small_config(model_type: str) -> Any:
    import transformers

    if not _FOR_MODEL:
        _FOR_MODEL.append(transformers.AutoConfig.for_model)
    for_model = _FOR_MODEL[0]
    cfg = for_model(model_type)
    try:  # through __init__, so that derived sizes follow
        kw = _small_kwargs(cfg)
        subs = {k: v for k, v in kw.items() if isinstance(v, dict)}
        flat = {k: v for k, v in kw.items() if not isinstance(v, dict)}
        for k, v in subs.items():
            flat[k] = {**getattr(cfg, k).to_dict(), **v}
        if "kv_lora_rank" in flat and "num_key_value_heads" in flat:  # MLA: as many kv heads
            flat["num_key_value_heads"] = flat.get("num_attention_heads", 4)
        return for_model(model_type, **flat)
    except Exception:  # noqa: BLE001 - some configs refuse keywords: shrink in place
        _shrink(cfg)
        return cfg


def _register(model_type: str, auto: str, kind: str) -> str:
    """Put ``model_type`` into models.SPECS so that the harness builds it; returns its name."""
    import transformers

    from . import models

    cfg = _small_config(model_type)
    models.SPECS[model_type] = models.Spec(model_type, "heldout", {}, kind, auto)
    orig = _FOR_MODEL[0]

    def for_model(mt: str, *a: Any, **kw: Any) -> Any:  # the harness asks by model type
        import copy

        if mt == model_type and not a and not kw:
            return copy.deepcopy(cfg)
        return orig(mt, *a, **kw)

    transformers.AutoConfig.for_model = for_model
    return model_type


def _inputs_kind(model: Any, kind: str) -> str:
    name = getattr(model, "main_input_name", "input_ids")
    k = INPUT_OF.get(name, kind)
    if k == "ids" and kind == "ids_dec":
        return "ids_dec"
    if k == "features":
        return "whisper" if kind == "whisper" else "features"
    return k


def one(model_type: str, auto: str, kind: str, mode: str, backend: str) -> dict[str, Any]:
    """Build and check one model in this process; the dict that goes into the cache."""
    from . import harness, models

    warnings.filterwarnings("ignore")
    _register(model_type, auto, kind)
    try:
        model, _ = models.build(model_type)
    except Exception as e:
        return {"skip": f"build: {type(e).__name__}: {str(e)[:200]}"}
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        return {"skip": f"{n} parameters after shrinking"}
    real_kind = _inputs_kind(model, kind)
    if real_kind not in ("ids", "ids_dec", "pixels", "audio", "whisper"):
        return {"skip": f"input kind {real_kind}"}
    models.SPECS[model_type] = models.Spec(model_type, "heldout", {}, real_kind, auto)
    try:  # the model must run eagerly as built, or the comparison means nothing
        m2, inputs = harness.build(model_type, mode)
        harness.run_once(m2, inputs, mode)
    except Exception as e:
        return {"skip": f"eager: {type(e).__name__}: {str(e)[:200]}"}
    t0 = time.perf_counter()
    r = harness.run_ember(model_type, mode, backend)
    import ember.events

    skips = ember.events.counters["events"].get("skip", 0)  # frames run eagerly, callees compiled
    out = {"params": n, "graphs": r.graphs, "breaks": r.breaks, "fallbacks": r.fallbacks, "skips": skips,
           "accuracy": r.accuracy, "error": r.error, "break_reasons": list(r.break_reasons),
           "fallback_reasons": list(r.fallback_reasons), "ok": r.ok,
           "seconds": round(time.perf_counter() - t0, 1)}
    if (r.graphs > 1 or r.breaks or not r.ok) and backend != "inductor":
        try:
            out["torch"] = harness.run_torch(model_type, mode)
        except Exception as e:
            out["torch"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return out


def _load() -> dict[str, Any]:
    return json.loads(CACHE.read_text()) if CACHE.exists() else {}


def _save(data: dict[str, Any]) -> None:
    tmp = CACHE.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(CACHE)


class _Timeout(Exception):
    pass


def work(keys: list[str]) -> None:
    """Run ``keys`` (``type|mode|backend|auto|kind``) in this process, one after the other,
    each under an alarm; the result of each goes into the cache as soon as it is known."""
    import signal

    def alarm(*_: Any) -> None:
        raise _Timeout(f"timeout after {TIMEOUT}s")

    signal.signal(signal.SIGALRM, alarm)
    for key in keys:
        t, mode, backend, auto, kind = key.split("|")
        CACHE.with_suffix(".current").write_text(key)
        t0 = time.perf_counter()
        signal.alarm(TIMEOUT)
        try:
            res = one(t, auto, kind, mode, backend)
        except BaseException as e:  # noqa: BLE001 - recorded, the sweep goes on
            res = {"error": f"sweep: {type(e).__name__}: {str(e)[:300]}"}
        finally:
            signal.alarm(0)
        res["wall"] = round(time.perf_counter() - t0, 1)
        data = _load()
        data["|".join(key.split("|")[:3])] = res
        _save(data)
        print("|".join(key.split("|")[:3]), _row(res), flush=True)


def run(types: list[str], backends: dict[str, str], force: bool, limit: int | None,
        retry_skips: bool = False) -> None:
    """Run what the cache lacks in worker processes (a new one after a crash)."""
    cands = {t: (a, k) for t, a, k in candidates()}
    todo = (types or list(cands))[:limit]
    data = _load()
    keys = []
    for t in todo:
        auto, kind = cands.get(t, ("AutoModel", "ids"))
        for mode, backend in backends.items():
            prev = data.get(f"{t}|{mode}|{backend}")
            if force or prev is None or (retry_skips and "skip" in prev):
                keys.append(f"{t}|{mode}|{backend}|{auto}|{kind}")
    while keys:
        CACHE.with_suffix(".current").unlink(missing_ok=True)
        p = subprocess.run([sys.executable, "-m", "tests.hf.sweep_heldout", "work", *keys],
                           cwd=Path(__file__).resolve().parents[2])
        data = _load()
        keys = [k for k in keys if "|".join(k.split("|")[:3]) not in data]
        if p.returncode and keys:  # the worker died on keys[0]: record it, go on
            cur = CACHE.with_suffix(".current")
            dead = cur.read_text() if cur.exists() else keys[0]
            data["|".join(dead.split("|")[:3])] = {"error": f"worker died rc={p.returncode}"}
            _save(data)
            keys = [k for k in keys if k != dead]
        elif not p.returncode:
            break


def _row(r: dict[str, Any]) -> str:
    if "skip" in r:
        return "SKIP " + r["skip"][:120]
    tc = r.get("torch", {})
    tg = tc.get("graphs", "1" if "graphs" in r and r["graphs"] <= 1 else "?")
    verdict = ("ERROR " + r["error"][:150] if r.get("error") else
               f"FALLBACK x{r['fallbacks']}" if r.get("fallbacks") else r.get("accuracy", "?"))
    skips = f" skips {r['skips']}" if r.get("skips") else ""
    return f"graphs {r.get('graphs')} (torch {tg}) breaks {r.get('breaks')}{skips} {verdict}"


def table(path: str | None = None) -> None:
    data = json.loads(Path(path).read_text()) if path else _load()
    for key in sorted(data):
        print(f"{key:45s} {_row(data[key])}")


def main(argv: list[str]) -> None:
    cmd = argv[0] if argv else "table"
    if cmd == "list":
        for t, a, k in candidates():
            print(t, a, k)
    elif cmd == "one":
        t, mode, backend = argv[1:4]
        auto, kind = (argv[4], argv[5]) if len(argv) > 5 else ("AutoModel", "ids")
        print("RESULT " + json.dumps(one(t, auto, kind, mode, backend)), flush=True)
    elif cmd == "work":
        work(argv[1:])
    elif cmd == "run":
        args = argv[1:]
        force = "--force" in args
        limit = None
        backends = {"eval": "eager", "train": "aot_eager"}
        if "--limit" in args:
            i = args.index("--limit")
            limit = int(args[i + 1])
            del args[i:i + 2]
        if "--backend" in args:
            i = args.index("--backend")
            backends = {"eval": args[i + 1]}
            del args[i:i + 2]
        if "--train" in args:  # train mode only, through this backend (inductor's training sweep)
            i = args.index("--train")
            backends = {"train": args[i + 1]}
            del args[i:i + 2]
        run([a for a in args if not a.startswith("--")], backends, force, limit,
            "--retry-skips" in args)
    else:
        table(argv[1] if len(argv) > 1 else None)


if __name__ == "__main__":
    os.environ.setdefault("EMBER_CACHE_DIR", "/tmp/ember-cache-hfx")
    main(sys.argv[1:])
