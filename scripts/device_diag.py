"""Diagnostics for what fails only on the GPU machine's torch (run there by device_validate.sh):
the full traceback of an HF corpus model's AOT failure, and the 0x0 det gradient."""

from __future__ import annotations

import sys
import traceback

import torch

sys.path.insert(0, ".")


def moe(name: str) -> None:
    import ember
    from tests.hf import harness

    model, inputs = harness.build(name, "train")
    ember.reset()
    with ember.config.patch(suppress_errors=False):
        try:
            out = ember.compile(model, backend="aot_eager")(**inputs)
            harness.models.loss_of(out).backward()
            print(name, "train: OK")
        except Exception:
            print(name, "train: FAILED")
            traceback.print_exc(limit=60)


def det() -> None:
    import ember

    xe = torch.randn(0, 0, requires_grad=True)
    torch.linalg.det(xe).backward()
    xc = torch.randn(0, 0, requires_grad=True)
    ember.compile(lambda x: torch.linalg.det(x), backend="aot_eager")(xc).backward()
    print("det 0x0 grad eager:", xe.grad, "ember:", xc.grad)


if __name__ == "__main__":
    det()
    for n in sys.argv[1:] or ["mixtral"]:
        moe(n)
