"""Accuracy by PyTorch's rule, restated.

PyTorch's benchmark harness does not compare a compiled result with eager fp32 alone: fp32 eager
is itself an approximation. It also runs the model in float64 and asks a relative question: is the
compiled result's error against the fp64 answer no larger than a small multiple of eager fp32's
own error against it, plus a tolerance? A compiler that reorders a reduction is then judged
against the error that reordering naturally costs, not against bit-exactness.

The check here, per output tensor (errors are root-mean-square over the elements):

1. close to eager fp32 within ``tol`` (``allclose(res, fp32, rtol=tol, atol=tol)``): pass;
2. else ``rmse(res, fp64) <= multiplier * rmse(fp32, fp64) + tol``: pass
   (multiplier 2.0, 3.0 for bf16/fp16 results);
3. else cosine similarity of ``res`` and ``fp64`` (flattened) ``>= 0.99``: pass, marked "cosine";
4. else fail, with the numbers.

Integer and boolean outputs must match exactly; ``None`` gradients must be ``None`` on both sides.
Tolerance: 1e-3 for inference and 1e-2 for training in fp32 (bf16 autocast: 1e-2 and 4e-2).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["AccuracyResult", "compare", "default_tolerance"]


@dataclasses.dataclass
class AccuracyResult:
    ok: bool
    how: str  # "pass", "pass (cosine)", "FAIL: ...", "n/a"

    def __str__(self) -> str:
        return self.how


def default_tolerance(mode: str, amp: bool) -> float:
    if amp:
        return 1e-2 if mode == "infer" else 4e-2
    return 1e-3 if mode == "infer" else 1e-2


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.sqrt(torch.mean(torch.square(a.double() - b.double()))).item()


def _one(res: Any, fp32: Any, fp64: Any, tol: float) -> tuple[bool, bool, str]:
    """(passed, via_cosine, message) for one leaf."""
    if res is None or fp32 is None:
        return (res is None and fp32 is None), False, "None mismatch"
    if not isinstance(res, torch.Tensor):
        return res == fp32, False, f"value {res!r} != {fp32!r}"
    if res.shape != fp32.shape:
        return False, False, f"shape {tuple(res.shape)} != {tuple(fp32.shape)}"
    if not res.is_floating_point():
        return bool(torch.equal(res.cpu(), fp32.cpu())), False, "integer output differs"
    r, e, f = res.detach().double().cpu(), fp32.detach().double().cpu(), fp64.detach().double().cpu()
    if not torch.isfinite(r).all() and not torch.equal(torch.isfinite(r), torch.isfinite(e)):
        return False, False, "non-finite values where eager has none"
    if torch.allclose(r, e, rtol=tol, atol=tol, equal_nan=True):
        return True, False, ""
    multiplier = 3.0 if res.dtype in (torch.float16, torch.bfloat16) else 2.0
    res_err, ref_err = _rmse(r, f), _rmse(e, f)
    if res_err <= multiplier * ref_err + tol:
        return True, False, ""
    cos = torch.nn.functional.cosine_similarity(r.flatten(), f.flatten(), dim=0, eps=1e-12).item()
    if cos >= 0.99:
        return True, True, ""
    return False, False, (f"rmse vs fp64 {res_err:.2e} > {multiplier}*{ref_err:.2e}+{tol:g}, "
                          f"cosine {cos:.4f}")


def compare(res: list[Any], fp32: list[Any], fp64: list[Any], tol: float) -> AccuracyResult:
    """Compare flattened results of a backend with eager fp32 and the fp64 reference."""
    if not (len(res) == len(fp32) == len(fp64)):
        return AccuracyResult(False, f"FAIL: {len(res)} outputs, eager has {len(fp32)}")
    cosine = False
    for i, (a, b, c) in enumerate(zip(res, fp32, fp64)):
        ok, via_cos, msg = _one(a, b, c, tol)
        if not ok:
            return AccuracyResult(False, f"FAIL: output {i}: {msg}")
        cosine |= via_cos
    return AccuracyResult(True, "pass (cosine)" if cosine else "pass")
