"""Triton code generation over the same IR and schedule as the C++ target.

Each fused group of the scheduler (codegen/target.py: the Triton target) becomes one Triton
kernel, written by :class:`TritonOps`, an ``ops`` handler like the C++ one:

* **pointwise** groups (no inner loops) flatten their outer loops into one index, tiles of
  ``XBLOCK``, a mask on the ragged last tile; where some access is strided along the last loop
  while contiguous along another (a transpose), the group is tiled in 2-D (``YBLOCK`` x
  ``XBLOCK``) so both the reads and the writes stay coalesced;
* **reduction** groups run ``XBLOCK`` rows per program; each loop block of the group reduces its
  inner loops (flattened, tiles of ``RBLOCK``), *persistent* (the whole row at once, in
  registers: values loaded once serve every block) when every row is short and static, *looped*
  otherwise. A statistic (a LayerNorm's mean and variance) stays in registers for the
  blocks after it, as in the C++ target;
* ``max``/``min``/``argmax``/``argmin`` propagate NaN as eager; argmax/argmin take the first
  index on ties; ``sum`` of bfloat16/float16 accumulates in float32 (every low-precision value is
  computed in float32 and rounded where stored or cast);
* an indirect index (embedding, gather, index) out of range raises eager's ``IndexError``, and an
  integer division by zero eager's ``ZeroDivisionError``: the kernel writes a status that the
  wrapper checks after the launch (and meanwhile reads element 0 / divides by 1);
* integer ``//`` and ``%`` round toward negative infinity (Python's rule, as eager), float
  ``/`` and ``sqrt`` are IEEE-rounded (``div_rn``, ``sqrt_rn``).

The kernels of a graph are one Python module (``TRITON_SOURCE`` in the wrapper); the runtime
(runtime/triton.py) builds each ahead with Triton's compile API and launches it without Triton's
per-call dispatch.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any, Sequence

import sympy
import torch

from ..ir import Reduction
from ..scheduler import CppRegion, FusedGroup, LoopBlock, Member, Scheduler
from ..sizes import (FloorDiv, ModularIndexing, is_symbolic, operand, print_sum, product,
                     size_hint, sym, to_py)
from ..virtualized import set_ops_handler

__all__ = ["generate_triton", "TritonSources", "KernelSpec", "wrapper_header", "wrapper_call"]

TL_DTYPE = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.bfloat16: "tl.bfloat16",
    torch.float16: "tl.float16", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}
#: Triton's signature type of a pointer to each dtype
PTR_TYPE = {
    torch.float32: "*fp32", torch.float64: "*fp64", torch.bfloat16: "*bf16",
    torch.float16: "*fp16", torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16",
    torch.int8: "*i8", torch.uint8: "*u8", torch.bool: "*i1",
}

ERR_INDEX = 1
ERR_ZERO_DIV = 2

#: Helpers every kernel module starts with (``libdevice`` is Triton's on a GPU, numpy's
#: functions under the interpreter: runtime/triton_math.py).
PRELUDE = '''import triton
import triton.language as tl
from ember_inductor.runtime.triton_math import select_libdevice

libdevice = select_libdevice()  # Triton's; numpy's under TRITON_INTERPRET=1


# Only Triton builtins and the helpers below: triton.language's own jit functions (tl.sum,
# tl.cdiv, tl.zeros_like) are made when triton is imported, interpreted or compiled for good,
# while these follow TRITON_INTERPRET as it is when this module is imported.
@triton.jit
def _sum(a, b):
    return a + b


@triton.jit
def _cdiv(a, b):
    return (a + b - 1) // b


@triton.jit
def _zeros_like(a):
    return tl.full(a.shape, 0, a.dtype)


@triton.jit
def _max_nan(a, b):
    # NaN wins; a tie (0.0 and -0.0) keeps the first operand, as eager's maximum does
    return tl.where((a != a) | (a >= b), a, b)


@triton.jit
def _min_nan(a, b):
    return tl.where((a != a) | (a <= b), a, b)


@triton.jit
def _prod(a, b):
    return a * b


@triton.jit
def _argmax(a, ia, b, ib):
    # NaN wins, then the larger value, then the first index
    take = (a > b) | ((a != a) & (b == b)) | (((a == b) | ((a != a) & (b != b))) & (ia < ib))
    return tl.where(take, a, b), tl.where(take, ia, ib)


@triton.jit
def _argmin(a, ia, b, ib):
    take = (a < b) | ((a != a) & (b == b)) | (((a == b) | ((a != a) & (b != b))) & (ia < ib))
    return tl.where(take, a, b), tl.where(take, ia, ib)


@triton.jit
def _floordiv_i(a, b):
    # Python's floor division (b == 0 was flagged by the caller: any value will do)
    q = a // b
    return tl.where((a % b != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def _remainder_i(a, b):
    m = a % b
    return tl.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


@triton.jit
def _remainder_f(a, b):
    m = libdevice.fmod(a, b)
    return tl.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


@triton.jit
def _floordiv_f(a, b):
    # eager's float floor_divide: (a - fmod(a, b)) / b, rounded to the nearest integer below
    mod = libdevice.fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1, fl)
    fl = tl.where(div == 0, libdevice.copysign(_zeros_like(div), a / b), fl)
    return tl.where(b == 0, a / b, fl)
'''


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _tl(e: Any) -> str:
    """Print an index expression as Triton (integer arithmetic, non-negative operands)."""
    e = sympy.sympify(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if isinstance(e, FloorDiv):
        return f"({operand(e.args[0], _tl)} // {operand(e.args[1], _tl)})"
    if isinstance(e, ModularIndexing):
        a, d, m = e.args
        inner = operand(a, _tl) if d == 1 else f"({operand(a, _tl)} // {operand(d, _tl)})"
        return f"({inner} % {operand(m, _tl)})"
    if isinstance(e, (sympy.Max, sympy.Min)):
        f = "tl.maximum" if isinstance(e, sympy.Max) else "tl.minimum"
        out = _tl(e.args[0])
        for a in e.args[1:]:
            out = f"{f}({out}, {_tl(a)})"
        return out
    if e.is_Add:
        return print_sum(e, _tl)
    if e.is_Mul:
        parts = []
        for a in e.args:
            s = _tl(a)
            parts.append(f"({s})" if s.startswith("-") else s)
        return "*".join(parts)
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return "*".join([_tl(e.base)] * int(e.exp))
    raise NotImplementedError(f"Triton codegen: cannot print index {e!r}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def literal(value: Any, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return _nan_literal(v, dtype)
        if math.isinf(v):
            return f'float("{"-" if v < 0 else ""}inf")'
        return repr(v)
    v = int(value)
    if dtype in _INT_BITS:  # a Python int converted to the dtype as eager converts it
        bits, signed = _INT_BITS[dtype]
        v %= 1 << bits  # (uint8: -1 is 255; Triton refuses a negative scalar with unsigned)
        if signed and v >= 1 << (bits - 1):
            v -= 1 << bits
    return str(v)


#: integer dtypes narrower than 64 bits: (bits, signed)
_INT_BITS = {torch.uint8: (8, False), torch.int8: (8, True), torch.int16: (16, True),
             torch.int32: (32, True)}


def _nan_literal(v: float, dtype: torch.dtype) -> str:
    """A NaN with eager's bits: its sign and payload survive (``torch.full(..., -nan)``; a
    Python scalar converted to the compute type, as eager converts it)."""
    if compute_dtype(dtype) == torch.float64:
        bits = struct.unpack("<q", struct.pack("<d", v))[0]
        if bits == 0x7FF8000000000000:
            return 'float("nan")'
        return f"tl.full([], {bits}, tl.int64).to(tl.float64, bitcast=True)"
    bits = torch.tensor([v], dtype=torch.float32).view(torch.int32).item()
    if bits == 0x7FC00000:
        return 'float("nan")'
    return f"tl.full([], {bits}, tl.int32).to(tl.float32, bitcast=True)"


class TVar:
    """A value in a kernel: a name (or a literal, ``const``), its dtype as the IR sees it
    (bfloat16/float16 values are held in float32), and which index dimensions it varies along
    (``"x"``, ``"r"``, ``"y"``: the shape of the Triton tensor)."""

    __slots__ = ("name", "dtype", "dims", "const")

    def __init__(self, name: str, dtype: torch.dtype, dims: frozenset = frozenset(),
                 const: Any = None):
        self.name = name
        self.dtype = dtype
        self.dims = dims
        self.const = const

    def __str__(self) -> str:
        return self.name


_UNARY = {
    "abs": "tl.abs({0})", "neg": "-{0}", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})",
    "expm1": "libdevice.expm1({0})", "log": "tl.log({0})", "log2": "tl.log2({0})",
    "log10": "libdevice.log10({0})", "log1p": "libdevice.log1p({0})", "sin": "tl.sin({0})",
    "cos": "tl.cos({0})", "tan": "libdevice.tan({0})", "asin": "libdevice.asin({0})",
    "acos": "libdevice.acos({0})", "atan": "libdevice.atan({0})", "sinh": "libdevice.sinh({0})",
    "cosh": "libdevice.cosh({0})", "tanh": "libdevice.tanh({0})",
    "asinh": "libdevice.asinh({0})", "acosh": "libdevice.acosh({0})",
    "atanh": "libdevice.atanh({0})", "sqrt": "tl.sqrt_rn({0})", "rsqrt": "tl.rsqrt({0})",
    "reciprocal": "tl.div_rn(1.0, {0})", "sigmoid": "tl.div_rn(1.0, 1.0 + tl.exp(-{0}))",
    "erf": "tl.erf({0})", "erfc": "libdevice.erfc({0})", "lgamma": "libdevice.lgamma({0})",
    "floor": "tl.floor({0})", "ceil": "tl.ceil({0})", "trunc": "libdevice.trunc({0})",
    "round": "libdevice.nearbyint({0})", "frac": "{0} - libdevice.trunc({0})",
    # eager's sign: (x > 0) - (x < 0), so NaN and -0.0 give +0.0
    "sign": "tl.where({0} > 0, 1.0, 0.0) - tl.where({0} < 0, 1.0, 0.0)",
    # eager's relu keeps -0.0 (max(x, 0) keeps its first operand on a tie)
    "relu": "tl.where(({0} != {0}) | ({0} >= 0), {0}, 0.0)",
    "silu": "tl.div_rn({0}, 1.0 + tl.exp(-{0}))",
}
# float64 has no div_rn/sqrt_rn: its / and sqrt are IEEE already
_UNARY64 = dict(_UNARY, sqrt="tl.sqrt({0})", reciprocal="1.0 / {0}",
                sigmoid="1.0 / (1.0 + tl.exp(-{0}))", silu="{0} / (1.0 + tl.exp(-{0}))")
_INT_UNARY = {
    "abs": "tl.abs({0})", "neg": "-{0}", "sign": "tl.where({0} > 0, 1, tl.where({0} < 0, -1, 0))",
    "relu": "tl.where({0} > 0, {0}, 0)", "bitwise_not": "~{0}", "floor": "{0}", "ceil": "{0}",
    "trunc": "{0}", "round": "{0}",
}
_PRED = {"isnan": "{0} != {0}", "isinf": "tl.abs({0}) == float(\"inf\")",
         "isfinite": "tl.abs({0}) < float(\"inf\")", "signbit": "libdevice.signbit({0}) != 0",
         "logical_not": "{0} == 0"}
_INT_PRED = {"isnan": "{0} != {0}", "isinf": "{0} != {0}", "isfinite": "{0} == {0}",
             "signbit": "{0} < 0", "logical_not": "{0} == 0"}
_BINARY = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}",
    "truediv": "tl.div_rn({0}, {1})", "floordiv": "_floordiv_f({0}, {1})",
    "truncdiv": "libdevice.trunc({0} / {1})", "remainder": "_remainder_f({0}, {1})",
    "fmod": "libdevice.fmod({0}, {1})", "pow": "libdevice.pow({0}, {1})",
    "maximum": "_max_nan({0}, {1})", "minimum": "_min_nan({0}, {1})",
    "fmax": "tl.where(({0} > {1}) | ({1} != {1}), {0}, {1})",
    "fmin": "tl.where(({0} < {1}) | ({1} != {1}), {0}, {1})",
    "atan2": "libdevice.atan2({0}, {1})", "copysign": "libdevice.copysign({0}, {1})",
    "hypot": "libdevice.hypot({0}, {1})",
}
_BINARY64 = dict(_BINARY, truediv="{0} / {1}")
_INT_BINARY = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}",
    "floordiv": "_floordiv_i({0}, {1})", "truncdiv": "{0} // {1}",
    "remainder": "_remainder_i({0}, {1})", "fmod": "{0} % {1}",
    "maximum": "tl.maximum({0}, {1})", "minimum": "tl.minimum({0}, {1})",
    "fmax": "tl.maximum({0}, {1})", "fmin": "tl.minimum({0}, {1})",
    "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}", "bitwise_xor": "{0} ^ {1}",
    "lshift": "{0} << {1}", "rshift": "{0} >> {1}",
}
_BOOL_BINARY = {"add": "{0} | {1}", "mul": "{0} & {1}", "maximum": "{0} | {1}",
                "minimum": "{0} & {1}", "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}",
                "bitwise_xor": "{0} ^ {1}", "sub": "{0} ^ {1}"}
_COMPARE = {"eq": "{0} == {1}", "ne": "{0} != {1}", "lt": "{0} < {1}", "le": "{0} <= {1}",
            "gt": "{0} > {1}", "ge": "{0} >= {1}", "logical_and": "({0} != 0) & ({1} != 0)",
            "logical_or": "({0} != 0) | ({1} != 0)", "logical_xor": "({0} != 0) ^ ({1} != 0)"}
_INT_DIVISIONS = {"floordiv", "truncdiv", "remainder", "fmod"}


def _dims_of(index: Any, symdims: dict[str, frozenset]) -> frozenset:
    out: set = set()
    for s in getattr(sympy.sympify(index), "free_symbols", ()):
        out |= symdims.get(s.name, frozenset())
    return frozenset(out)


class TritonOps:
    """The ``ops`` handler writing one Triton kernel's statements (see :class:`TritonKernel`)."""

    def __init__(self, k: "TritonKernel"):
        self.k = k

    def _emit(self, expr: str, dtype: torch.dtype, *args: Any) -> TVar:
        dims: frozenset = frozenset()
        for a in args:
            dims |= getattr(a, "dims", frozenset())
        return self.k.cse(expr, dtype, dims)

    # -- memory --------------------------------------------------------------------------------
    def load(self, name: str, index: Any) -> TVar:
        local = self.k.local_values.get(name)
        if local is not None:
            return local
        name = self.k.read_as.get(name, name)  # a dead buffer this kernel writes over
        dtype = self.k.dtypes[name]
        self.k.use(name)
        idims = _dims_of(index, self.k.symdims)
        mask, mdims = self.k.mask_for(idims)
        ptr = f"{name} + {_tl(index)}" if index != 0 else name
        if not mdims <= idims:  # the mask varies along more dims than the index: broadcast
            ptr += f" + {self.k.zeros(mdims - idims)}"
            idims = idims | mdims
        if not idims:
            expr = f"tl.load({ptr})"
        else:
            other = ", other=0" if mask and dtype != torch.bool else ""
            expr = f"tl.load({ptr}{', ' + mask if mask else ''}{other})"
        if dtype in (torch.bfloat16, torch.float16):
            expr += ".to(tl.float32)"
        return self.k.cse(expr, dtype, idims, hoist=not self.k.mask_stack)

    def constant(self, value: Any, dtype: torch.dtype) -> TVar:
        return TVar(literal(value, dtype), dtype, frozenset(), const=value)

    def index_expr(self, expr: Any, dtype: torch.dtype) -> TVar:
        dims = _dims_of(expr, self.k.symdims)
        expr = sympy.sympify(expr)
        if not expr.free_symbols and expr.is_Integer:
            return self.constant(int(expr), dtype)
        return self.k.cse(f"({_tl(expr)}).to({TL_DTYPE[compute_dtype(dtype)]})", dtype, dims)

    def indirect_indexing(self, value: TVar, size: Any, wrap_negative: bool = True) -> Any:
        """``value`` as an index into a dimension of ``size``: negative values count from the
        end where eager does so (``x[idx]``); an index eager refuses sets the status (the
        wrapper raises IndexError) and reads element 0 instead."""
        k = self.k
        v = self._emit(f"{self._cast(value, torch.int64)}", torch.int64, value)
        n = _tl(size)
        if wrap_negative:
            v = self._emit(f"tl.where({v} < 0, {v} + {n}, {v})", torch.int64, v)
        bad = self._emit(f"({v} < 0) | ({v} >= {n})", torch.bool, v)
        k.check(bad, ERR_INDEX)
        w = self._emit(f"tl.where({bad}, 0, {v})", torch.int64, v)
        k.symdims[w.name] = w.dims
        return sym(w.name)

    def _cast(self, x: TVar, dtype: torch.dtype) -> str:
        if x.const is not None:
            return literal(x.const, dtype)
        return f"{x}.to({TL_DTYPE[compute_dtype(dtype)]})"

    def to_dtype(self, x: TVar, dtype: torch.dtype) -> TVar:
        if x.dtype == dtype:
            return x
        if x.const is not None:
            v = x.const
            if dtype == torch.bool:
                v = bool(v)
            elif dtype.is_floating_point:
                v = float(v)
            elif not (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
                v = int(v)
            return self.constant(v, dtype)
        if x.dtype in (torch.float16, torch.bfloat16):
            # a 16-bit value is held in float32 (a fused op's result unrounded): converted to
            # another dtype as the 16-bit value eager stored (half(6.999) -> int32 is 7, not 6)
            x = self._emit(f"{x}.to({TL_DTYPE[x.dtype]}).to(tl.float32)", x.dtype, x)
        if dtype == torch.bool:
            return self._emit(f"{x} != 0", dtype, x)
        if dtype in (torch.bfloat16, torch.float16):
            # held in float32, rounded to the storage type now (as eager computes)
            src = str(x) if compute_dtype(x.dtype) == torch.float32 else f"{x}.to(tl.float32)"
            return self._emit(f"{src}.to({TL_DTYPE[dtype]}).to(tl.float32)", dtype, x)
        if compute_dtype(x.dtype) == compute_dtype(dtype):
            return TVar(x.name, dtype, x.dims)
        return self._emit(f"{x}.to({TL_DTYPE[dtype]})", dtype, x)

    def rand(self, seed: TVar, offset: TVar) -> TVar:
        """Philox uniform in [0, 1) at (seed, offset) (lowering/random.py)."""
        off = self.k.full(offset) if offset.const is not None else offset  # a 0-d tensor's
        return self._emit(f"tl.rand({seed}, {off})", torch.float32, seed, offset)

    def randn(self, seed: TVar, offset: TVar) -> TVar:
        """Philox standard normal at (seed, offset)."""
        off = self.k.full(offset) if offset.const is not None else offset
        return self._emit(f"tl.randn({seed}, {off})", torch.float32, seed, offset)

    def where(self, c: TVar, a: TVar, b: TVar) -> TVar:
        return self._emit(f"tl.where({c}, {a}, {b})", a.dtype, c, a, b)

    def masked(self, mask: TVar, body: Any, other: Any, dtype: torch.dtype) -> TVar:
        k = self.k
        k.mask_stack.append(mask)
        try:
            v = body()
        finally:
            k.mask_stack.pop()
        if v.dtype != dtype:
            v = self.to_dtype(v, dtype)
        return self._emit(f"tl.where({mask}, {v}, {literal(other, dtype)})", dtype, mask, v)

    # -- math ----------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def op(*args: TVar) -> TVar:
            dt = args[0].dtype
            fmt = [str(a) for a in args]
            if name in _COMPARE:
                return self._emit(_COMPARE[name].format(*fmt), torch.bool, *args)
            if len(args) == 1:
                if name in _PRED:
                    table = _PRED if dt.is_floating_point else _INT_PRED
                    return self._emit(table[name].format(*fmt), torch.bool, *args)
                if dt == torch.bool and name == "bitwise_not":
                    return self._emit(f"{fmt[0]} == 0", dt, *args)
                if dt.is_floating_point:
                    table = _UNARY64 if dt == torch.float64 else _UNARY
                else:
                    table = _INT_UNARY
                if name not in table:
                    raise NotImplementedError(f"Triton codegen: {name} on {dt}")
                if args[0].const is not None:  # a function of a literal: a typed tensor
                    fmt = [self.k.full(args[0])]
                return self._emit(table[name].format(*fmt), dt, *args)
            if len(args) == 2:
                if dt == torch.bool and name in _BOOL_BINARY:
                    return self._emit(_BOOL_BINARY[name].format(*fmt), dt, *args)
                if dt.is_floating_point:
                    table = _BINARY64 if dt == torch.float64 else _BINARY
                else:
                    table = _INT_BINARY
                if name == "pow" and not dt.is_floating_point:
                    raise NotImplementedError("Triton codegen: integer pow")
                if name not in table:
                    raise NotImplementedError(f"Triton codegen: {name} on {dt}")
                if table is _INT_BINARY and name in _INT_DIVISIONS:
                    b = args[1]
                    if b.const is None or int(b.const) == 0:
                        zero = self._emit(f"{b} == 0", torch.bool, b)
                        # eager raises on the CPU; eager's CUDA kernels do not (no check there)
                        if not self.k.raise_zero_div:
                            pass
                        elif b.const is None:
                            self.k.check(zero, ERR_ZERO_DIV)
                        else:
                            self.k.check_always(ERR_ZERO_DIV)
                        fmt[1] = str(self._emit(f"tl.where({zero}, 1, {b})", b.dtype, b))
                if table is _INT_BINARY and name in _INT_DIVISIONS and dt != torch.int64:
                    # narrower integers divide in 64 bits (int32 division gave wrong values in
                    # alternate elements on the H200 with Triton 3.6; int64 was right): same
                    # results, the quotient fits
                    wide = [f"{a}.to(tl.int64)" if a.const is None else str(a) for a in args]
                    fmt = [wide[0], fmt[1] if args[1].const is not None else
                           f"{fmt[1]}.to(tl.int64)"]
                    if args[0].const is not None and args[1].const is not None:
                        fmt[0] = f"tl.full([], {args[0]}, tl.int64)"
                    expr = table[name].format(*fmt)
                    return self._emit(f"({expr}).to({TL_DTYPE[dt]})", dt, *args)
                if all(a.const is not None for a in args):
                    fmt[0] = self.k.full(args[0])
                elif args[0].const is not None and name in (
                        "truediv", "pow", "atan2", "copysign", "hypot", "fmod", "floordiv",
                        "remainder", "maximum", "minimum", "fmax", "fmin"):
                    # a literal first operand: a tensor shaped and typed as the other one
                    fmt[0] = f"(_zeros_like({args[1]}) + {args[0]})"
                return self._emit(table[name].format(*fmt), dt, *args)
            raise NotImplementedError(f"Triton codegen: {name}")
        return op


_INIT = {"sum": 0, "prod": 1, "any": False, "all": True}


def _reduction_init(rtype: str, dtype: torch.dtype) -> str:
    if rtype in _INIT:
        return literal(_INIT[rtype], dtype)
    if dtype == torch.bool:
        return "False" if rtype in ("max", "argmax") else "True"
    if dtype.is_floating_point:
        return literal(-math.inf if rtype in ("max", "argmax") else math.inf, dtype)
    info = torch.iinfo(dtype)
    return literal(info.min if rtype in ("max", "argmax") else info.max, dtype)


@dataclasses.dataclass
class KernelSpec:
    """What the runtime needs to build and launch one kernel: its name, its parameters (buffer
    names, then ``status`` if checked, then size symbols) and their Triton signature types, the
    launch-grid form (``"1d"``: cdiv(xnumel, XBLOCK); ``"2d"``: cdiv(ynumel, YBLOCK) *
    cdiv(xnumel, XBLOCK)), the default configuration (block sizes, warps) and the candidates
    tuning may time on a GPU. ``inout``: the parameters the kernel reads and then writes over
    (a result stored in place of a dead buffer: scheduler.plan_in_place); tuning times the
    kernel on copies of them, and a kernel with one is another kernel than one without."""
    name: str
    params: list[str]
    signature: list[str]
    grid: str
    config: dict[str, int]
    candidates: list[dict[str, int]]
    checked: bool = False
    inout: list[str] = dataclasses.field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not self.inout:  # (the wrappers of kernels without one stay as they were)
            del out["inout"]
        return out


@dataclasses.dataclass
class TritonSources:
    source: str
    kernels: dict[str, KernelSpec]


class TritonKernel:
    """Writes the Triton kernel of one fused group."""

    def __init__(self, name: str, group: FusedGroup, sched: Scheduler,
                 dtypes: dict[str, torch.dtype], interpret: bool,
                 in_place: dict[str, str] | None = None):
        self.name = name
        self.g = group
        self.sched = sched
        self.dtypes = dtypes
        self.interpret = interpret
        # {N: O}: the group stores N over O, which it reads through N's parameter
        self.in_place = dict(in_place or {})
        self.read_as = {o: n for n, o in self.in_place.items()}
        self.raise_zero_div = True
        self.lines: list[str] = []
        self.indent = 1
        self.scopes: list[dict[str, TVar]] = [{}]
        self.local_values: dict[str, TVar] = {}
        self.symdims: dict[str, frozenset] = {}
        self.mask_stack: list[TVar] = []
        self.used: list[str] = []
        self.written: list[str] = []
        self.checked = False
        self._tmp = 0
        self.in_inner = False
        self.hoist: dict[str, Any] | None = None
        self.shape = {"x": "XBLOCK", "r": "RBLOCK", "y": "YBLOCK"}

    # -- helpers -------------------------------------------------------------------------------
    def line(self, s: str) -> None:
        self.lines.append("    " * self.indent + s)

    def new_tmp(self) -> str:
        self._tmp += 1
        return f"tmp{self._tmp - 1}"

    def use(self, name: str) -> None:
        if name not in self.used:
            self.used.append(name)

    def cse(self, expr: str, dtype: torch.dtype, dims: frozenset, hoist: bool = False) -> TVar:
        key = f"{expr}|{dtype}"
        for sc in reversed(self.scopes):
            v = sc.get(key)
            if v is not None:
                return v
        name = self.new_tmp()
        v = TVar(name, dtype, dims)
        if hoist and self.hoist is not None and "r" not in dims and not any(
                s.startswith("tmp") for s in self._syms(expr)):
            # loop-invariant in a looped reduction (a LayerNorm's mean): read before the loop
            h = self.hoist
            self.lines.insert(h["pos"], "    " * h["indent"] + f"{name} = {expr}")
            h["pos"] += 1
            h["scope"][key] = v
            return v
        self.line(f"{name} = {expr}")
        self.scopes[-1][key] = v
        return v

    @staticmethod
    def _syms(expr: str) -> list[str]:
        import re
        return re.findall(r"\b(tmp\d+)\b", expr)

    def zeros(self, dims: frozenset) -> str:
        return f"tl.full({self._shape(dims)}, 0, tl.int32)"

    def _shape(self, dims: frozenset) -> str:
        order = [d for d in self.dim_order if d in dims]
        full = []
        for d in self.dim_order:
            full.append(self.shape[d] if d in order else "1")
        return "[" + ", ".join(full) + "]"

    def full(self, v: TVar) -> str:
        """A literal as a typed Triton scalar tensor (so that math on it has its dtype)."""
        return f"tl.full([], {v.name}, {TL_DTYPE[compute_dtype(v.dtype)]})"

    def mask_for(self, idims: frozenset) -> tuple[str, frozenset]:
        """The mask of an access varying along ``idims``: the block masks of those dims and of
        every enclosing ``ops.masked`` condition."""
        parts = [self.block_mask[d] for d in self.dim_order if d in idims and d in self.block_mask]
        dims = frozenset(d for d in idims if d in self.block_mask)
        for m in self.mask_stack:
            parts.append(m.name)
            dims |= m.dims
        return " & ".join(parts), dims

    def check(self, bad: TVar, code: int) -> None:
        """Record ``code`` in the status where ``bad`` holds (inside the current masks)."""
        self.checked = True
        mask, mdims = self.mask_for(bad.dims)
        cond = f"{bad} & {mask}" if mask else str(bad)
        dims = bad.dims | mdims
        z = f"tl.full({self._shape(dims)}, 0, tl.int32)" if dims else "0"
        self.line(f"tl.store(status + {z}, {z} + {code}, {cond})")

    def check_always(self, code: int) -> None:
        self.checked = True
        mask, mdims = self.mask_for(frozenset(self.dim_order))
        z = f"tl.full({self._shape(mdims)}, 0, tl.int32)"
        self.line(f"tl.store(status + {z}, {z} + {code}, {mask})")

    # -- the kernel ----------------------------------------------------------------------------
    def generate(self) -> tuple[str, KernelSpec]:
        g = self.g
        reduction = any(b.inner for b in g.blocks)
        static = not any(is_symbolic(s) for s in g.outer) and not any(
            is_symbolic(s) for b in g.blocks for s in b.inner)
        self.static = static
        if reduction:
            body, spec = self._reduction_kernel()
        elif self._tile_2d():
            body, spec = self._pointwise_2d()
        else:
            body, spec = self._pointwise_1d()
        return body, spec

    def split_parts(self) -> int:
        """How many programs share each row of this group's one looped reduction block: the
        scheduler's decision (Scheduler._split_long_rows, from the target's split policy), 0
        where the group is not split."""
        g = self.g
        if not g.split or not g.blocks or not g.blocks[0].inner:
            return 0
        if any(b.inner for b in g.blocks[1:]):
            return 0
        return g.split

    def generate_split(self, split: int) -> list[tuple[str, KernelSpec]]:
        """Two kernels. ``<name>``: program ``p`` reduces part ``p % split`` of the rows of
        tile ``p // split`` (XBLOCK rows, a tile's width when the rows lie side by side in
        memory) into a workspace, partial result per row and part, and stores the block's
        row-length values of its part; ``<name>_fin`` combines each row's partial results,
        stores them as the group would have, and computes the group's row-sized members
        after them (a batch norm's running statistics, its scale)."""
        g = self.g
        self.split = split
        self.static = not any(is_symbolic(x) for x in g.outer) and not any(
            is_symbolic(x) for x in g.blocks[0].inner)
        self.dim_order = ["x", "r"]
        self.block_mask = {"x": "xmask"}
        xnumel = product(g.outer) if g.outer else 1
        self.line(f"xnumel = {_tl(xnumel)}")
        pid = "tl.program_id(0).to(tl.int64)" if self._wide() else "tl.program_id(0)"
        self.line(f"xindex = ({pid} // {split}) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        self.line("xmask = xindex < xnumel")
        names = [f"x{i}" for i in range(len(g.outer))]
        self._index_vars("x", "xindex", g.outer, names)
        for nm in names:
            self.symdims[nm] = frozenset("x")
        self.line("rbase = tl.arange(0, RBLOCK)[None, :]")
        ops = TritonOps(self)
        b = g.blocks[0]
        with set_ops_handler(ops):
            self._looped_block(b, 0)
        reds = [m for m in b.members if isinstance(m.node.data, Reduction)]
        for m in reds:
            self.use(f"ws_{m.node.name}")
            self.written.append(f"ws_{m.node.name}")
            self.dtypes[f"ws_{m.node.name}"] = _ws_dtype(m)
        xn = size_hint(xnumel) if is_symbolic(xnumel) else int(xnumel)
        cfg, cands = _split_configs(xn, g.xcontig, self.interpret)
        part_src, part_spec = self._finish(["XBLOCK", "RBLOCK"], "split", cfg, cands,
                                           [xnumel, split])
        part_spec.allocs = [(f"ws_{m.node.name}", to_py(xnumel * split), _ws_dtype(m))
                            for m in reds]  # type: ignore[attr-defined]
        # the finishing kernel: partial results, then the members after the loop
        fin = TritonKernel(self.name + "_fin", g, self.sched, self.dtypes, self.interpret,
                           self.in_place)
        fin.raise_zero_div = self.raise_zero_div
        fin.static = self.static
        fin.dim_order = ["x", "r"]
        fin.block_mask = {"x": "xmask"}
        fin._x_axis(xnumel, "[:, None]")
        fin.line("rindex = tl.arange(0, RBLOCK)[None, :]")
        fin.line(f"rmask = rindex < {split}")
        for m in reds:
            red = m.node.data
            ws = f"ws_{m.node.name}"
            fin.use(ws)
            init = _reduction_init(red.reduction_type, red.src_dtype)
            v = fin.new_tmp()
            fin.line(f"{v} = tl.load({ws} + (xindex * {split} + rindex), xmask & rmask, "
                     f"other={init})")
            out = fin.new_tmp()
            fin.line(f"{out} = {fin._combine(red.reduction_type, v, 'rindex')}")
            fin._finish_reduction(m, out)
        with set_ops_handler(TritonOps(fin)):
            for later in g.blocks[1:]:
                fin.block_mask = {"x": "xmask"}
                fin._members(later, fin._degenerate_reductions(later))
        rb = next_pow2(split)
        fcfg = {"XBLOCK": max(1, min(next_pow2(xn), 64, max(1, 4096 // rb))), "RBLOCK": rb,
                "num_warps": 1 if self.interpret else 4}
        fin_src, fin_spec = fin._finish(["XBLOCK", "RBLOCK"], "1d", fcfg, [], [xnumel])
        return [(part_src, part_spec), (fin_src, fin_spec)]

    def _header(self, size_syms: list[str], constexprs: list[str]) -> tuple[str, list[str],
                                                                               list[str]]:
        params, sig = [], []
        for n in self.used:
            if n not in self.written:
                params.append(n)
                sig.append(PTR_TYPE[self.dtypes[n]])
        for n in self.written:
            params.append(n)
            sig.append(PTR_TYPE[self.dtypes[n]])
        if self.checked:
            params.append("status")
            sig.append("*i32")
        for s in size_syms:
            params.append(s)
            sig.append("i64")
        head = f"def {self.name}({', '.join(params + [f'{c}: tl.constexpr' for c in constexprs])}):"
        return head, params, sig

    def _size_syms(self) -> list[str]:
        import re
        text = "\n".join(self.lines)
        return sorted(set(re.findall(r"\b(s\d+)\b", text)), key=lambda s: int(s[1:]))

    def _index_vars(self, prefix: str, flat: str, sizes: Sequence[Any], names: Sequence[str]
                    ) -> None:
        """Define ``names[i]`` (the loop variables of ``sizes``) from the flat index ``flat``."""
        n = len(sizes)
        for i, (nm, s) in enumerate(zip(names, sizes)):
            inner = product(sizes[i + 1:])
            e = flat if inner == 1 else f"({flat} // {operand(inner, _tl)})"
            if i > 0:
                e = f"{e} % {operand(s, _tl)}"
            self.line(f"{nm} = {e}")
        del n, prefix

    def _store(self, m: Member, value: TVar) -> None:
        name = m.node.name
        dtype = m.node.dtype
        if value.dtype != dtype:
            value = TritonOps(self).to_dtype(value, dtype)
        self.local_values[name] = value
        if name in self.sched.local:
            return
        if name not in self.written:
            self.written.append(name)
        idims = _dims_of(m.store_index, self.symdims)
        ptr = f"{name} + {_tl(m.store_index)}" if m.store_index != 0 else name
        if not value.dims <= idims:  # one element written by a block (a full reduction)
            ptr += f" + {self.zeros(value.dims - idims)}"
            idims = idims | value.dims
        mask, mdims = self.mask_for(idims)
        v = str(value)
        if value.const is not None:
            v = self.full(value)
        if not mdims <= idims:
            ptr += f" + {self.zeros(mdims - idims)}"
        if dtype in (torch.bfloat16, torch.float16, torch.bool) or value.const is not None or \
                compute_dtype(value.dtype) != dtype:
            v = f"{v}.to({TL_DTYPE[dtype]})" if dtype != torch.bool or value.const is None \
                else v
        self.line(f"tl.store({ptr}, {v}{', ' + mask if mask and (idims or mdims) else ''})")

    def _members(self, b: LoopBlock, reductions: dict[str, Any]) -> None:
        ops = TritonOps(self)
        for m in b.members:
            value = m.node.body(m.index, m.rindex)
            red = m.node.data
            if isinstance(red, Reduction):
                if value.dtype != red.src_dtype:
                    value = ops.to_dtype(value, red.src_dtype)
                reductions[m.node.name](value)
            else:
                self._store(m, value)

    # 1-D pointwise ----------------------------------------------------------------------------
    def _x_axis(self, xnumel: Any, suffix: str = "") -> None:
        """The program's rows: ``xindex`` over ``xnumel`` (``suffix`` broadcasts it against the
        reduction axis), its mask, and the group's outer index variables."""
        g = self.g
        self.line(f"xnumel = {_tl(xnumel)}")
        pid = "tl.program_id(0).to(tl.int64)" if self._wide() else "tl.program_id(0)"
        self.line(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK){suffix}")
        self.line("xmask = xindex < xnumel")
        names = [f"x{i}" for i in range(len(g.outer))]
        self._index_vars("x", "xindex", g.outer, names)
        for nm in names:
            self.symdims[nm] = frozenset("x")

    def _pointwise_1d(self) -> tuple[str, KernelSpec]:
        g = self.g
        self.dim_order = ["x"]
        self.block_mask = {"x": "xmask"}
        xnumel = product(g.outer) if g.outer else 1
        self._x_axis(xnumel, "")
        ops = TritonOps(self)
        with set_ops_handler(ops):
            for b in g.blocks:
                self._members(b, self._degenerate_reductions(b))
        cfg, cands = self._pointwise_configs(xnumel)
        return self._finish(["XBLOCK"], "1d", cfg, cands, [xnumel])

    def _degenerate_reductions(self, b: LoopBlock) -> dict[str, Any]:
        """Reductions over only size-1 dims (no inner loop): the value itself."""
        out = {}
        for m in b.members:
            red = m.node.data
            if isinstance(red, Reduction):
                def done(value: TVar, m: Member = m, red: Reduction = red) -> None:
                    if red.reduction_type in ("argmax", "argmin"):
                        value = TVar("0", torch.int64, frozenset(), const=0)
                    elif red.reduction_type in ("any", "all"):
                        value = TritonOps(self).to_dtype(value, torch.bool)
                    self._store(m, value)
                out[m.node.name] = done
        return out

    def _wide(self) -> bool:
        """64-bit indexing: symbolic sizes or any buffer of 2**31 elements or more."""
        if not self.static:
            return True
        for m in self.g.members:
            try:
                if int(m.node.layout.storage_span()) >= 2 ** 31:
                    return True
            except TypeError:
                return True
        spans = _spans(self.sched.graph)
        for n, _ in (ld for m in self.g.members for ld in m.loads):
            if n and spans.get(n, 0) >= 2 ** 31:
                return True
        return False

    def _pointwise_configs(self, xnumel: Any) -> tuple[dict[str, int], list[dict[str, int]]]:
        n = size_hint(xnumel) if is_symbolic(xnumel) else int(xnumel)
        if self.interpret:
            return {"XBLOCK": max(1, min(next_pow2(n), 4096)), "num_warps": 1}, []
        xb = max(16, min(1024, next_pow2(n)))
        cfg = {"XBLOCK": xb, "num_warps": 4 if xb >= 512 else max(1, xb // 128)}
        cands = [{"XBLOCK": b, "num_warps": w} for b, w in
                 ((256, 2), (512, 4), (1024, 4), (2048, 8)) if b <= max(xb, 256)]
        return cfg, cands

    # 2-D tiled pointwise ---------------------------------------------------------------------
    def _tile_2d(self) -> bool:
        g = self.g
        if len(g.outer) < 2 or not self.static:
            return False
        last = sympy.Symbol(f"x{len(g.outer) - 1}", integer=True, nonnegative=True)
        others = [sympy.Symbol(f"x{i}", integer=True, nonnegative=True)
                  for i in range(len(g.outer) - 1)]
        for m in g.members:
            for e in [m.store_index] + [e for n, e in m.loads if n]:
                try:
                    e = sympy.expand(sympy.sympify(e))  # coeff() reads a sum's terms only
                    if e.coeff(last) != 1 and any(e.coeff(o) == 1 for o in others):
                        return int(g.outer[-1]) >= 16 and int(product(g.outer[:-1])) >= 16
                except Exception:
                    return False
        return False

    def _pointwise_2d(self) -> tuple[str, KernelSpec]:
        g = self.g
        self.dim_order = ["y", "x"]
        self.block_mask = {"y": "ymask", "x": "xmask"}
        ynumel, xnumel = product(g.outer[:-1]), g.outer[-1]
        self.line(f"ynumel = {_tl(ynumel)}")
        self.line(f"xnumel = {_tl(xnumel)}")
        wide = self._wide()
        pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
        self.line(f"pid = {pid}")
        self.line("xtiles = _cdiv(xnumel, XBLOCK)")
        self.line("yindex = (pid // xtiles) * YBLOCK + tl.arange(0, YBLOCK)[:, None]")
        self.line("xindex = (pid % xtiles) * XBLOCK + tl.arange(0, XBLOCK)[None, :]")
        self.line("ymask = yindex < ynumel")
        self.line("xmask = xindex < xnumel")
        k = len(g.outer)
        names = [f"x{i}" for i in range(k - 1)]
        self._index_vars("y", "yindex", g.outer[:-1], names)
        for nm in names:
            self.symdims[nm] = frozenset("y")
        self.line(f"x{k - 1} = xindex")
        self.symdims[f"x{k - 1}"] = frozenset("x")
        ops = TritonOps(self)
        with set_ops_handler(ops):
            for b in g.blocks:
                self._members(b, self._degenerate_reductions(b))
        if self.interpret:
            cfg = {"YBLOCK": min(64, next_pow2(int(ynumel))),
                   "XBLOCK": min(64, next_pow2(int(xnumel))), "num_warps": 1}
            cands: list[dict[str, int]] = []
        else:
            cfg = {"YBLOCK": 32, "XBLOCK": 32, "num_warps": 4}
            cands = [{"YBLOCK": y, "XBLOCK": x, "num_warps": w}
                     for y, x, w in ((32, 32, 4), (64, 64, 4), (16, 128, 4), (64, 32, 8))]
        return self._finish(["YBLOCK", "XBLOCK"], "2d", cfg, cands, [ynumel, xnumel])

    # reductions ------------------------------------------------------------------------------
    def _reduction_kernel(self) -> tuple[str, KernelSpec]:
        g = self.g
        self.dim_order = ["x", "r"]
        self.block_mask = {"x": "xmask"}
        xnumel = product(g.outer) if g.outer else 1
        inners = [product(b.inner) for b in g.blocks if b.inner]
        persistent = self.static and max(int(n) for n in inners) <= (
            4096 if self.interpret else 1024)
        self._x_axis(xnumel, "[:, None]")
        if persistent:
            self.line("rbase = tl.arange(0, RBLOCK)[None, :]")
        else:
            self.line("rbase = tl.arange(0, RBLOCK)[None, :]")
        ops = TritonOps(self)
        prev_inner: Any = None
        with set_ops_handler(ops):
            for bi, b in enumerate(g.blocks):
                if not b.inner:
                    self.block_mask = {"x": "xmask"}
                    self._members(b, self._degenerate_reductions(b))
                    continue
                if persistent:
                    self._persistent_block(b, bi, same=(b.inner == prev_inner))
                else:
                    self._looped_block(b, bi)
                prev_inner = b.inner
                self.block_mask = {"x": "xmask"}
        rmax = max(size_hint(n) if is_symbolic(n) else int(n) for n in inners)
        xn = size_hint(xnumel) if is_symbolic(xnumel) else int(xnumel)
        if persistent:
            rb = next_pow2(rmax)
            if self.interpret:
                cfg = {"XBLOCK": max(1, min(next_pow2(xn), 8192 // rb)), "RBLOCK": rb,
                       "num_warps": 1}
                cands: list[dict[str, int]] = []
            else:
                xb = max(1, min(next_pow2(xn), 4096 // rb, 64))
                w = max(1, min(8, rb * xb // 256))
                cfg = {"XBLOCK": xb, "RBLOCK": rb, "num_warps": w}
                cands = [{"XBLOCK": x, "RBLOCK": rb, "num_warps": ww}
                         for x in sorted({1, 2, 4, 8, xb}) for ww in (max(1, w // 2), w)
                         if x * rb <= 8192 and x <= next_pow2(xn)][:6]
        else:
            if self.interpret:
                cfg = {"XBLOCK": max(1, min(next_pow2(xn), 64)),
                       "RBLOCK": min(1024, next_pow2(rmax)), "num_warps": 1}
                cands = []
            else:
                cfg = {"XBLOCK": 1 if xn < 1024 else 4, "RBLOCK": 1024 if xn < 1024 else 256,
                       "num_warps": 8 if xn < 1024 else 4}
                cands = [{"XBLOCK": x, "RBLOCK": r, "num_warps": w}
                         for x, r, w in ((1, 1024, 8), (1, 2048, 8), (4, 256, 4), (8, 128, 4),
                                         (2, 512, 4))]
                if g.xcontig:  # rows side by side (a bias gradient): tiles across rows first
                    cands = _split_configs(xn, True, False)[1][:1] + [
                        _split_configs(xn, True, False)[0]] + cands
        self.persistent = persistent
        return self._finish(["XBLOCK", "RBLOCK"], "1d", cfg, cands, [xnumel])

    def _rvars(self, b: LoopBlock, rindex: str) -> None:
        names = [f"r{i}" for i in range(len(b.inner))]
        self._index_vars("r", rindex, b.inner, names)
        for nm in names:
            self.symdims[nm] = frozenset("r")

    def _persistent_block(self, b: LoopBlock, bi: int, same: bool) -> None:
        rnumel = product(b.inner)
        if not same:
            self.scopes.append({})  # loads and index values of another inner space: new scope
            self.line(f"# block {bi}: rows of {_tl(rnumel)}, persistent")
            self.line("rindex = rbase")
            self.line(f"rmask{bi} = rindex < {_tl(rnumel)}")
            self._rvars(b, "rindex")
            self._rmask = f"rmask{bi}"
        self.block_mask = {"x": "xmask", "r": self._rmask}
        self.symdims["rindex"] = frozenset("r")
        finals: dict[str, Any] = {}

        def make(m: Member) -> Any:
            red = m.node.data
            rt = red.reduction_type

            def done(value: TVar) -> None:
                init = _reduction_init(rt, red.src_dtype)
                full = f"xmask & {self._rmask}"
                v = value.name if value.dims >= {"x", "r"} else \
                    f"({self.full(value) if value.const is not None else value} + " \
                    f"{self.zeros(frozenset('xr'))}.to({TL_DTYPE[compute_dtype(value.dtype)]}))"
                masked = self.new_tmp()
                self.line(f"{masked} = tl.where({full}, {v}, {init})")
                out = self.new_tmp()
                self.line(f"{out} = {self._combine(rt, masked, 'rindex')}")
                self._finish_reduction(m, out)
            return done

        for m in b.members:
            if isinstance(m.node.data, Reduction):
                finals[m.node.name] = make(m)
        self._members(b, finals)

    def _combine(self, rt: str, v: str, rindex: str) -> str:
        if rt == "sum":
            return f"tl.reduce({v}, 1, _sum)[:, None]"
        if rt == "max":
            return f"tl.reduce({v}, 1, _max_nan)[:, None]"
        if rt == "min":
            return f"tl.reduce({v}, 1, _min_nan)[:, None]"
        if rt == "prod":
            return f"tl.reduce({v}, 1, _prod)[:, None]"
        if rt == "any":
            return f"(tl.reduce({v}.to(tl.int8), 1, _max_nan) > 0)[:, None]"
        if rt == "all":
            return f"(tl.reduce({v}.to(tl.int8), 1, _min_nan) > 0)[:, None]"
        if rt in ("argmax", "argmin"):
            idx = f"({rindex} + _zeros_like({v}).to(tl.int64))"
            return f"tl.reduce(({v}, {idx}), 1, _{rt})[1][:, None]"
        raise NotImplementedError(f"Triton codegen: reduction {rt}")

    def _finish_reduction(self, m: Member, out: str) -> None:
        red = m.node.data
        if getattr(self, "split", 0):  # a partial result: into the workspace
            ws = f"ws_{m.node.name}"
            self.line(f"tl.store({ws} + (xindex * {self.split} + tl.program_id(0) % "
                      f"{self.split}), {out}, xmask)")
            return
        dt = torch.int64 if red.reduction_type in ("argmax", "argmin") else red.src_dtype
        if red.reduction_type in ("any", "all"):
            dt = torch.bool
        v = TVar(out, dt, frozenset("x"))
        self.scopes[0][f"__red_{m.node.name}"] = v
        self._store(m, v)

    def _looped_block(self, b: LoopBlock, bi: int) -> None:
        rnumel = product(b.inner)
        reds = [m for m in b.members if isinstance(m.node.data, Reduction)]
        accs: dict[str, str] = {}
        for m in reds:
            red = m.node.data
            at = TL_DTYPE[compute_dtype(red.src_dtype)]
            if red.src_dtype == torch.bool:
                at = "tl.int1"
            acc = f"_acc_{m.node.name}"
            init = _reduction_init(red.reduction_type, red.src_dtype)
            self.line(f"{acc} = tl.full([XBLOCK, RBLOCK], {init}, {at})")
            if red.reduction_type in ("argmax", "argmin"):
                self.line(f"{acc}_i = tl.full([XBLOCK, RBLOCK], 0, tl.int64)")
            accs[m.node.name] = acc
        split = getattr(self, "split", 0)
        if split:
            self.line(f"# block {bi}: rows of {_tl(rnumel)}, split in {split} parts")
            # parts start on a multiple of RBLOCK (aligned loads; the last parts may be empty)
            self.line(f"rchunk = _cdiv(_cdiv({_tl(rnumel)}, {split}), RBLOCK) * RBLOCK")
            self.line("rstart = (tl.program_id(0) % " + str(split) + ") * rchunk")
            self.line(f"rend = tl.minimum(rstart + rchunk, {_tl(rnumel)})")
            self.line("for roffset in range(rstart, rend, RBLOCK):")
        else:
            self.line(f"# block {bi}: rows of {_tl(rnumel)}, looped")
            self.line(f"for roffset in range(0, {_tl(rnumel)}, RBLOCK):")
        self.indent += 1
        self.hoist = {"pos": len(self.lines) - 1, "indent": self.indent - 1,
                      "scope": self.scopes[-1]}
        self.scopes.append({})
        self.line("rindex = roffset + rbase")
        self.line(f"rmask = rindex < {'rend' if split else _tl(rnumel)}")
        self._rvars(b, "rindex")
        self.symdims["rindex"] = frozenset("r")
        self.block_mask = {"x": "xmask", "r": "rmask"}

        def make(m: Member) -> Any:
            red = m.node.data
            rt = red.reduction_type
            acc = accs[m.node.name]

            def done(value: TVar) -> None:
                v = self.full(value) if value.const is not None else str(value)
                full = "xmask & rmask"
                if rt in ("argmax", "argmin"):
                    idx = "(rindex + _zeros_like(" + acc + ").to(tl.int64))"
                    nv, ni = self.new_tmp(), self.new_tmp()
                    self.line(f"{nv}, {ni} = _{rt}({acc}, {acc}_i, {v} + _zeros_like({acc}), "
                              f"{idx})")
                    self.line(f"{acc} = tl.where({full}, {nv}, {acc})")
                    self.line(f"{acc}_i = tl.where({full}, {ni}, {acc}_i)")
                    return
                comb = {"sum": f"{acc} + {v}", "prod": f"{acc} * {v}",
                        "max": f"_max_nan({acc}, {v})", "min": f"_min_nan({acc}, {v})",
                        "any": f"{acc} | ({v} != 0)", "all": f"{acc} & ({v} != 0)"}[rt]
                self.line(f"{acc} = tl.where({full}, {comb}, {acc})")
            return done

        finals = {m.node.name: make(m) for m in reds}
        pw_names = []
        self._members(b, finals)
        for m in b.members:
            if not isinstance(m.node.data, Reduction):
                pw_names.append(m.node.name)
        self.scopes.pop()
        self.hoist = None
        self.indent -= 1
        for n in pw_names:  # values of the loop body are out of scope now
            self.local_values.pop(n, None)
        self.block_mask = {"x": "xmask"}
        for m in reds:
            red = m.node.data
            acc = accs[m.node.name]
            out = self.new_tmp()
            rt = red.reduction_type
            if rt in ("argmax", "argmin"):
                self.line(f"{out} = tl.reduce(({acc}, {acc}_i), 1, _{rt})[1][:, None]")
            else:
                self.line(f"{out} = {self._combine(rt, acc, 'rindex')}")
            self._finish_reduction(m, out)

    # ------------------------------------------------------------------------------------------
    def _finish(self, constexprs: list[str], grid: str, cfg: dict[str, int],
                cands: list[dict[str, int]], numels: list[Any]) -> tuple[str, KernelSpec]:
        syms = self._size_syms()
        head, params, sig = self._header(syms, constexprs)
        origins = []
        for m in self.g.members:
            origins.extend(getattr(m.node.data, "origins", []))
        desc = ", ".join(m.node.name for m in self.g.members)
        comment = f"    # {desc}: outer {[to_py(s) for s in self.g.outer]}"
        if origins:
            comment += f"; from {', '.join(dict.fromkeys(origins))}"[:100]
        inout = [n for n in self.in_place if n in self.used and n in self.written]
        notes = [f"    # in place: {n} is written over {self.in_place[n]}, each element read "
                 "before it is written" for n in inout]
        src = "\n".join(["@triton.jit", head, comment[:100]] + notes + self.lines) + "\n"
        spec = KernelSpec(self.name, params, sig, grid, cfg, cands, self.checked, inout)
        spec.numels = [to_py(n) for n in numels]  # type: ignore[attr-defined]
        return src, spec


#: the split policy (Scheduler.split_policy, TritonTarget): rows of at least SPLIT_MIN_LENGTH
#: elements are split when their tiles leave the GPU's multiprocessors idle, into parts of at
#: least SPLIT_CHUNK elements (at most SPLIT_MAX_PARTS); lists so that tests can change them
#: (and turn splitting on under the interpreter, which is given SPLIT_INTERPRETER_SMS)
SPLIT_MIN_LENGTH = [16384]
SPLIT_CHUNK = [2048]
SPLIT_MAX_PARTS = 512
SPLIT_IN_INTERPRETER = [False]
SPLIT_INTERPRETER_SMS = 4


def split_policy(sms: int, interpret: bool) -> Any:
    """``policy(rows, row_length, xcontig) -> parts`` for a GPU of ``sms`` multiprocessors: a
    reduction whose row tiles (``_split_configs``) number fewer than the multiprocessors gets
    about two programs per multiprocessor, each over a part of every row of its tile."""
    def policy(xn: int, rn: int, xcontig: bool) -> int:
        if interpret and not SPLIT_IN_INTERPRETER[0]:
            return 0
        if rn < SPLIT_MIN_LENGTH[0]:
            return 0
        tiles = -(-xn // _split_configs(xn, xcontig, interpret)[0]["XBLOCK"])
        if tiles >= sms:
            return 0
        parts = min(-(-2 * sms // tiles), rn // SPLIT_CHUNK[0], SPLIT_MAX_PARTS)
        return parts if parts >= 2 else 0
    return policy


def _split_configs(xn: int, xcontig: bool,
                   interpret: bool) -> tuple[dict[str, int], list[dict[str, int]]]:
    """The first kernel of a split reduction: its default tile and the candidates tuning times.
    Rows side by side in memory (``xcontig``: a channels-last batch norm's statistics) take a
    tile of many rows, each load then contiguous across rows; a row's own elements otherwise."""
    if interpret:
        return {"XBLOCK": max(1, min(next_pow2(xn), 16)) if xcontig else 1,
                "RBLOCK": 64 if xcontig else 256, "num_warps": 1}, []
    if xcontig:
        xb = max(1, min(next_pow2(xn), 64))
        shapes = [(xb, 2048, 4), (xb, 4096, 8), (xb, 1024, 4), (max(1, xb // 2), 2048, 4)]
    else:
        shapes = [(1, 1024, 4), (1, 2048, 8), (1, 512, 4), (2, 1024, 8)]
    cfgs = [{"XBLOCK": x, "RBLOCK": max(8, n // x), "num_warps": w} for x, n, w in shapes]
    return cfgs[0], cfgs[1:]


def _ws_dtype(m: Member) -> torch.dtype:
    red = m.node.data
    if red.reduction_type in ("any", "all"):
        return torch.bool
    return compute_dtype(red.src_dtype)


def _spans(graph: Any) -> dict[str, int]:
    """Elements of storage each named buffer spans (2**62 where symbolic)."""
    cached = getattr(graph, "_triton_spans", None)
    if cached is not None:
        return cached
    out: dict[str, int] = {}
    for b in list(getattr(graph, "operations", [])) + list(getattr(graph, "inputs", [])):
        try:
            out[b.name] = int(b.layout.storage_span())
        except (TypeError, AttributeError):
            out[b.name] = 2 ** 62
    for name, t in getattr(graph, "constants", {}).items():
        out[name] = t.numel() if hasattr(t, "numel") else 0
    graph._triton_spans = out
    return out


def generate_triton(sched: Scheduler, dtypes: dict[str, torch.dtype],
                    interpret: bool | None = None, device: str = "cuda",
                    tune: str = "light") -> TritonSources:
    """The Triton module of a graph: one kernel per fused group of each region, in order. Each
    region records its kernels (``region.kernels``: their specs) for the wrapper. An integer
    division by zero raises as eager does on ``device`` (on the CPU; not on CUDA)."""
    import os
    if interpret is None:
        interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    parts = [PRELUDE]
    kernels: dict[str, KernelSpec] = {}
    seen: dict[str, KernelSpec] = {}
    # CPU tensors a CUDA graph's kernels read (0-d constants made by the program, CPU scalar
    # inputs: eager's CUDA ops accept them): copied to the device at the launch
    # (constants: copied once, kept on the device — runtime/triton.py on_device; inputs: each call)
    host: set[str] = set()
    host_consts: set[str] = set()
    if device != "cpu":
        graph = sched.graph
        host = {b.name for b in getattr(graph, "inputs", [])
                if getattr(b.layout.device, "type", "cpu") == "cpu"}
        host_consts = {n for n, t in getattr(graph, "constants", {}).items()
                       if getattr(getattr(t, "device", None), "type", "cpu") == "cpu"}
        host |= host_consts
        for step in sched.steps:
            for g in getattr(step, "groups", []) if isinstance(step, CppRegion) else []:
                for m in g.members:
                    if getattr(m.node.layout.device, "type", "cpu") == "cpu":
                        # a value eager keeps on the CPU (a copy of a CPU constant): not a GPU
                        # kernel's to write; the graph runs eagerly with this reason
                        raise NotImplementedError(
                            f"ember-inductor (Triton): {m.node.name} is computed on the CPU in "
                            f"a {device} graph (from {', '.join(m.node.data.origins[:3])})")
    in_place = getattr(sched, "in_place", {})
    for step in sched.steps:
        if not isinstance(step, CppRegion):
            continue
        specs = []
        for gi, g in enumerate(step.groups):
            name = f"{step.name}_{gi}" if len(step.groups) > 1 else step.name
            members = {m.node.name for m in g.members}
            tk = TritonKernel(name, g, sched, dict(dtypes), interpret,
                              {n: o for n, o in in_place.items() if n in members})
            tk.raise_zero_div = device == "cpu"
            split = tk.split_parts()
            made = tk.generate_split(split) if split else [tk.generate()]
            for src, spec in made:
                spec.host = [p for p in spec.params if p in host]  # type: ignore[attr-defined]
                spec.host_consts = [p for p in spec.host  # type: ignore[attr-defined]
                                    if p in host_consts]
                if tune != "full":  # the default configuration and its first two neighbours
                    spec.candidates = [c for c in spec.candidates if c != spec.config][:2]
                specs.append(spec)
                # a kernel identical to an earlier one but for its name and its parameters'
                # names (a model's repeated layers) is that kernel, called with its own
                # arguments: one definition, one compile, one tuning
                key = _canonical_kernel(src, spec)
                first = seen.get(key)
                if first is not None:
                    spec.name = first.name
                    continue
                seen[key] = spec
                parts.append("\n" + src)
                kernels[spec.name] = spec
        step.kernels = specs  # type: ignore[attr-defined]
        step.checked = any(s.checked for s in specs)  # type: ignore[attr-defined]
        step.size_args = []  # type: ignore[attr-defined]
    if device == "cuda" and not interpret and kernels:
        # a graph generated now is (almost always) compiled next: start the compile workers so
        # that their start-up (Python, Triton's import) overlaps the rest of this compile
        from ..runtime.triton import start_workers

        start_workers(sum(1 + len(k.candidates) for k in kernels.values()))
    return TritonSources("\n".join(parts), kernels)


def _canonical_kernel(src: str, spec: KernelSpec) -> str:
    """``src`` (one kernel) with its name and parameters renamed by position and comment lines
    dropped, and what else decides its binary and its launch (types, grid form, configurations):
    equal for kernels that differ only in names."""
    import json
    import re

    index = {p: f"_p{i}" for i, p in enumerate(spec.params)}
    lines = [ln for ln in src.split("\n") if ln.strip() and not ln.lstrip().startswith("#")]
    text = "\n".join(lines).replace(f"def {spec.name}(", "def _kernel(", 1)
    if index:
        pat = re.compile(r"\b(" + "|".join(map(re.escape, index)) + r")\b")
        text = pat.sub(lambda m: index[m.group(0)], text)
    inout = [index[p] for p in spec.inout]  # an in/out parameter: another kernel
    return text + "\0" + json.dumps([spec.signature, spec.grid, spec.config, spec.candidates,
                                      spec.checked, inout], sort_keys=True)


# -- the wrapper's part ---------------------------------------------------------------------------

def wrapper_header(regions: list[Any], sources: TritonSources) -> list[str]:
    head = ["TRITON_SOURCE = r'''" + sources.source + "'''", ""]
    specs = {n: s.as_json() | {"numels": s.numels}  # type: ignore[attr-defined]
             for n, s in sources.kernels.items()}
    head.append("KERNELS = " + repr(specs))
    head.append("_k = load_kernels(TRITON_SOURCE, KERNELS)  # built ahead; launchers")
    for n in sources.kernels:
        head.append(f"{n} = _k[{n!r}]")
    return head


def wrapper_call(region: Any, args: list[str], desc: str, ops: str, device: str) -> list[str]:
    lines = []
    if getattr(region, "checked", False):
        lines.append(f"    status = torch.zeros(1, dtype=torch.int32, device={device!r})")
    for spec in region.kernels:
        for ws, size, dtype in getattr(spec, "allocs", []):
            lines.append(f"    {ws} = torch.empty(({size},), dtype={dtype}, device={device!r})"
                         "  # partial results of a split reduction")
        numels = ", ".join(spec.numels)
        consts = getattr(spec, "host_consts", ())
        params = [f"_on_device({p}, {device!r})" if p in consts
                  else f"{p}.to({device!r})" if p in getattr(spec, "host", ()) else p
                  for p in spec.params]
        call = f"{spec.name}({numels}, {', '.join(params)})"
        lines.append(f"    {call}")
    if region.kernels:
        lines[-1] += f"  # {desc}"[:200]
    ws = [w for spec in region.kernels for w, _, _ in getattr(spec, "allocs", [])]
    if ws:
        lines.append(f"    del {', '.join(ws)}")
    if getattr(region, "checked", False) and device != "cpu":
        # a sync: only graphs with checked indices or divisions; not while a CUDA graph records
        # (kernels do not run then, and a sync would break the capture): replays go unchecked
        lines.append("    if not _capturing() and status.item():")
    elif getattr(region, "checked", False):
        lines.append("    if status.item():  # a sync: only graphs with checked indices or divisions")
    if getattr(region, "checked", False):
        lines.append(f"        _kernel_failed(status.item(), {region.name!r}, {ops!r})")
    return lines
