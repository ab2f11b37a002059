"""Byte-wise comparison of CPU tensors, for the per-call check that frozen inputs are unchanged
(backends that fold or embed parameters: ember-inductor's freezing, ember-onnxrt's initializers).

``torch.equal`` on a parameter-sized tensor opens a parallel region: on a machine whose cores are
shared, one stalled thread stalls the whole check (gpt2 small: a median of 11 ms per call for a
256 KB table with 2 threads at a load of 7, against about 75 us when quiet). ``memcmp`` on the
bytes is one thread at memory speed, and it is the stricter test: equal bytes are equal values,
and a tensor holding NaN (never ``torch.equal`` to itself) or a -0.0 that became 0.0 reads as
changed, which costs a refold, never a stale answer.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import torch

__all__ = ["same_contents"]


def _load_memcmp():
    for name in (None, ctypes.util.find_library("c")):
        try:
            fn = ctypes.CDLL(name).memcmp
        except (OSError, AttributeError, TypeError):
            continue
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        fn.restype = ctypes.c_int
        return fn
    return None  # pragma: no cover - no C library found: torch.equal below


_memcmp = _load_memcmp()


def _dense(t: torch.Tensor) -> bool:
    if t.is_contiguous():
        return True
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)


def same_contents(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do ``a`` and ``b`` hold the same values? Byte-wise for dense CPU tensors of one dtype,
    shape and strides (contiguous or channels-last: a snapshot made by ``clone``); ``torch.equal``
    otherwise."""
    if (_memcmp is not None and a.device.type == "cpu" and b.device.type == "cpu"
            and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride() and _dense(a)):
        n = a.numel() * a.element_size()
        return n == 0 or _memcmp(a.data_ptr(), b.data_ptr(), n) == 0
    return bool(torch.equal(a, b))
