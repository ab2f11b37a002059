"""GPT-2 (small, fp32) on the GPU through inductor, with and without mode="reduce-overhead":
on 2026-12-06 (H100) both cudagraphs tests of GPT-2 failed in CUDA's memory-efficient attention
with "(*bias): last dimension must be contiguous". This prints, for a failing call, every frame
of the traceback and the shapes and strides of the tensors each frame's ``args`` holds; run with
EMBER_LOGS=output_code to keep the wrapper's source.

    EMBER_LOGS=output_code python3 scripts/gpu_sdpa_bias.py 2> wrapper.log
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.getcwd())


def _describe(v: object) -> str:
    if isinstance(v, torch.Tensor):
        return f"T{tuple(v.shape)}/{tuple(v.stride())}/{str(v.dtype)[6:]}"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_describe(x) for x in v[:12]) + ")"
    return repr(v)[:40]


def main() -> None:
    import ember
    from benchmarks.zoo import flatten_outputs, get_spec

    for mode in (None, "reduce-overhead"):
        model, inputs = get_spec("gpt2").build("cuda", "small")
        model.eval()
        fast = ember.compile(model, mode=mode) if mode else ember.compile(model)
        try:
            with torch.no_grad():
                want = flatten_outputs(model(*inputs))
                for _ in range(3):
                    got = flatten_outputs(fast(*inputs))
            err = max((a - b).abs().max().item() for a, b in zip(got, want))
            print(f"mode={mode}: ok, max abs diff {err:.2e}", flush=True)
        except Exception as e:  # noqa: BLE001 - the point is to describe it
            print(f"mode={mode}: {type(e).__name__}: {e}", flush=True)
            tb = e.__traceback__
            while tb is not None:
                fr = tb.tb_frame
                print(f"  {fr.f_code.co_filename}:{tb.tb_lineno} {fr.f_code.co_name}")
                if "args" in fr.f_locals:
                    print(f"    args {_describe(fr.f_locals['args'])}")
                tb = tb.tb_next


if __name__ == "__main__":
    main()
