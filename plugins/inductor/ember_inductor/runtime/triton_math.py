"""``libdevice`` for Ember's Triton kernels: Triton's own (``triton.language.extra.libdevice``)
when kernels are compiled for a GPU, and under ``TRITON_INTERPRET=1`` (where Triton's libdevice
functions are stubs) the same functions computed by numpy on the interpreter's arrays, so the
CPU test suite runs the very kernels a GPU runs."""

from __future__ import annotations

import os
from typing import Any, Callable

__all__ = ["libdevice", "interpreting", "select_libdevice"]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class _NumpyLibdevice:
    """The subset of libdevice Ember's code generator calls, on interpreter tensors."""

    def __init__(self) -> None:
        import numpy as np

        self._np = np
        unary = {
            "expm1": np.expm1, "log10": np.log10, "log1p": np.log1p, "tan": np.tan,
            "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
            "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh,
            "atanh": np.arctanh, "trunc": np.trunc, "nearbyint": np.rint,
            "signbit": lambda a: np.signbit(a).astype(np.int32),
            "erfc": self._erfc, "lgamma": self._lgamma,
        }
        binary = {"fmod": np.fmod, "pow": np.power, "atan2": np.arctan2,
                  "copysign": np.copysign, "hypot": np.hypot}
        for name, f in unary.items():
            setattr(self, name, self._wrap(f, keep_type=name != "signbit"))
        for name, f in binary.items():
            setattr(self, name, self._wrap(f))

    def _erfc(self, a: Any) -> Any:
        import math
        np = self._np
        return np.vectorize(math.erfc, otypes=[a.dtype])(a) if a.size else a

    def _lgamma(self, a: Any) -> Any:
        import math
        np = self._np

        def lg(v: float) -> float:
            try:
                return math.lgamma(v)
            except ValueError:  # poles: +inf as libm
                return float("inf")
        return np.vectorize(lg, otypes=[a.dtype])(a) if a.size else a

    def _wrap(self, f: Callable[..., Any], keep_type: bool = True) -> Callable[..., Any]:
        np = self._np

        def call(*args: Any) -> Any:
            import triton.language as tl
            from triton.runtime.interpreter import TensorHandle

            ref = next(a for a in args if isinstance(a, tl.core.tensor))
            sdt = ref.dtype
            npdt = ref.handle.data.dtype
            datas = [a.handle.data if isinstance(a, tl.core.tensor) else np.asarray(a, npdt)
                     for a in args]
            with np.errstate(all="ignore"):
                out = f(*datas)
            if keep_type:
                out = np.asarray(out).astype(npdt)
                dt = sdt
            else:
                out = np.asarray(out)
                dt = tl.int32
            block = any(isinstance(a, tl.core.tensor) and a.type.is_block() for a in args)
            ty = tl.block_type(dt, list(out.shape)) if block and out.shape else dt
            return tl.core.tensor(TensorHandle(out, dt), ty)
        return call


def select_libdevice() -> Any:
    """numpy's functions under the interpreter (read now: a kernel module calls this when it is
    imported), else Triton's libdevice."""
    if interpreting():
        return _NumpyLibdevice()
    from triton.language.extra import libdevice as lib

    return lib


def __getattr__(name: str) -> Any:
    if name == "libdevice":
        return select_libdevice()
    raise AttributeError(name)
