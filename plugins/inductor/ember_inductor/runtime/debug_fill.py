"""The NaN-fill debug mode of generated wrappers (option ``debug_fill``, ``EMBER_DEBUG_FILL=1``).

Every buffer a wrapper allocates, takes from its pool or takes over from a dead buffer is filled
with a fill pattern before a kernel writes it: floats with a quiet NaN of a distinctive payload,
integers and bools with the byte ``0xE5`` repeated. After each kernel, the buffers it should have
written are checked for that exact bit pattern, and so is every output of the call (a training
forward's outputs include what it saves for the backward). A hit raises :class:`UnwrittenMemory`,
naming the graph, the buffer and the kernel that should have written it (8-bit integer buffers are
filled but not checked: 0xE5 is one of their values). The inputs' strides are
checked too: a kernel indexes an input by the strides the graph was compiled for, and reads past
its end when a producer (a forward's saved activation) has others.

A NaN payload survives copies and most arithmetic on x86 (an operand NaN's payload is kept), so a
value computed from unwritten memory usually shows the pattern too. Slow: for debugging and CI.
Imports only torch (a generated wrapper imports it).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["UnwrittenMemory", "PATTERNS", "empty", "fill", "fill_all", "check", "check_outputs",
           "check_strides"]


class UnwrittenMemory(RuntimeError):
    """A buffer still holds the fill pattern after the kernel that should have written it."""


#: dtype -> (integer dtype of the same size, the pattern's bits as that integer)
PATTERNS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float32: (torch.int32, 0x7FE5E5E5),
    torch.float64: (torch.int64, 0x7FFE5E5E5E5E5E5E),
    torch.bfloat16: (torch.int16, 0x7FE5),
    torch.float16: (torch.int16, 0x7EE5),
    torch.int64: (torch.int64, -0x1A1A1A1A1A1A1A1B),   # 0xE5E5E5E5E5E5E5E5
    torch.int32: (torch.int32, -0x1A1A1A1B),           # 0xE5E5E5E5
    torch.int16: (torch.int16, -0x1A1B),               # 0xE5E5
    torch.int8: (torch.int8, -0x1B),                   # 0xE5
    torch.uint8: (torch.uint8, 0xE5),
    torch.bool: (torch.uint8, 0xE5),                   # not a valid bool: never a real value
}


def _bits(t: torch.Tensor) -> torch.Tensor | None:
    p = PATTERNS.get(t.dtype)
    if p is None or t.layout != torch.strided:
        return None
    return t.view(p[0]) if t.dtype != p[0] else t


def fill(t: torch.Tensor) -> torch.Tensor:
    """``t`` (the elements it views) filled with its dtype's pattern; returns ``t``."""
    b = _bits(t)
    if b is not None and t.numel():
        b.fill_(PATTERNS[t.dtype][1])
    return t


def empty(size: Sequence[int], stride: Sequence[int], *, dtype: torch.dtype,
          device: Any = None) -> torch.Tensor:
    """``torch.empty_strided`` filled with the pattern (the wrapper's ``_empty``; a GPU
    target's wrapper passes ``device``)."""
    return fill(torch.empty_strided(size, stride, dtype=dtype, device=device))


def fill_all(buffers: Sequence[torch.Tensor]) -> None:
    for t in buffers:
        fill(t)


#: filled but not checked: every byte is a valid 8-bit integer, so the pattern is a value real
#: results hold (a sort of random uint8 values has 1 in 256 of them equal to 0xE5)
UNCHECKED = (torch.uint8, torch.int8)


def _first_hit(t: torch.Tensor) -> tuple[int, list[int]] | None:
    b = _bits(t)
    if b is None or not t.numel() or t.dtype in UNCHECKED:
        return None
    hit = b == PATTERNS[t.dtype][1]
    n = int(hit.sum())
    if not n:
        return None
    return n, [int(i) for i in hit.nonzero()[0]]


def check(graph: str, kernel: str, name: str, t: torch.Tensor) -> None:
    """Raise if ``t`` (buffer ``name``, written by ``kernel``) still holds the fill pattern."""
    found = _first_hit(t)
    if found is not None:
        n, at = found
        raise UnwrittenMemory(
            f"ember-inductor debug_fill: graph {graph}: buffer {name} {list(t.shape)} "
            f"{t.dtype} still holds the fill pattern in {n} of {t.numel()} elements (first at "
            f"index {at}) after {kernel}, which should have written it")


def check_outputs(graph: str, outputs: Sequence[Any], writers: Sequence[Any]) -> None:
    """Check every tensor output; ``writers[i]`` is ``(buffer, kernel)`` of output ``i`` or None
    (an input or a constant passed through)."""
    for i, (t, w) in enumerate(zip(outputs, writers)):
        if w is None or not isinstance(t, torch.Tensor):
            continue
        buf, kernel = w
        check(graph, kernel, f"{buf} (output {i})", t)


def check_strides(graph: str, name: str, t: Any, size: Sequence[int],
                  stride: Sequence[int]) -> None:
    """Raise if input ``name`` does not have the sizes and strides the graph was compiled for
    (size-1 dims aside): its kernels would index it wrongly."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return
    if list(t.shape) != list(size):
        raise UnwrittenMemory(
            f"ember-inductor debug_fill: graph {graph}: input {name} has sizes {list(t.shape)}; "
            f"the graph was compiled for {list(size)}")
    if t.numel() and any(
            a != b for n, a, b in zip(size, t.stride(), stride) if n != 1):
        raise UnwrittenMemory(
            f"ember-inductor debug_fill: graph {graph}: input {name} has sizes {list(t.shape)} "
            f"and strides {list(t.stride())}; the graph was compiled for {list(size)} and "
            f"{list(stride)} (its kernels index it so): its producer returned another layout")
