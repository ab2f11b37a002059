"""``as_declared``: an ATen result in the strides a generated wrapper's kernels read it at.

ATen chooses a result's strides from its inputs' layouts (which lowering may store otherwise than
eager did: mamba2's padded scan with symbolic sizes), and an op's fake kernel, from which the
metadata comes, may predict other strides than its real kernel, while the kernels were generated
for the strides of the graph's metadata. The wrapper passes every such
result through here (codegen/wrapper.py): a comparison per call, and a copy where the strides
differ, counted in ``counters["restrided"]`` and logged once per layout (a copy costs a pass
over the result: a layout the lowering should have predicted)."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["as_declared", "counters"]

log = logging.getLogger("ember.inductor")
counters: dict[str, int] = {"restrided": 0}
_seen: set[tuple[Any, ...]] = set()


def as_declared(t: Any, size: tuple[Any, ...], stride: tuple[Any, ...]) -> Any:
    have = t.stride()
    if have == stride or all(a == b or n == 1 for n, a, b in zip(size, have, stride)):
        return t
    counters["restrided"] += 1
    key = (tuple(size), tuple(have), tuple(stride))
    if key not in _seen:
        _seen.add(key)
        log.debug("an ATen result of size %s came with strides %s, not the declared %s: copied",
                  list(size), list(have), list(stride))
    import torch

    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)
