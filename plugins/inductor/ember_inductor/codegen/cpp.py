"""C++ code generation: one source per graph, one ``extern "C"`` function per region (a run of
fused loop nests between ATen calls), OpenMP over the outer loops, inner loops left simple and
contiguous so gcc vectorizes them. bfloat16/float16 are computed in float and rounded when stored
(or when the program casts). No fast-math: NaN and infinity behave as in eager."""

from __future__ import annotations

import math
import os
import re
import struct
from typing import Any, Sequence

import sympy
import torch

from ..ir import Reduction
from ..scheduler import CppRegion, FusedGroup, LoopBlock, Member, Scheduler
from ..sizes import current_size_env, is_symbolic, product, size_hint, statically_true, sym, to_c
from ..virtualized import set_ops_handler
from . import vecmath

__all__ = ["generate_cpp", "PRELUDE", "STORAGE_TYPE", "compute_type"]

STORAGE_TYPE = {
    torch.float32: "float", torch.float64: "double", torch.bfloat16: "uint16_t",
    torch.float16: "_Float16", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
}

PARALLEL_MIN_WORK = 32768
# float sums over at least this many elements accumulate in double
DOUBLE_ACC_MIN = 1024

PRELUDE = r"""
// no headers: gcc builtins only (parsing <cmath> costs more than compiling the kernels)
typedef __INT64_TYPE__ int64_t;
typedef __INT32_TYPE__ int32_t;
typedef __INT16_TYPE__ int16_t;
typedef __INT8_TYPE__ int8_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __UINT32_TYPE__ uint32_t;
extern "C" int omp_get_max_threads(void) noexcept;
@@SIMD_DECLS@@
@@VECMATH@@
static inline float e_bf16_to_float(uint16_t v) { uint32_t b = (uint32_t)v << 16; float f; __builtin_memcpy(&f, &b, 4); return f; }
static inline uint16_t e_float_to_bf16(float f) {
  if (f != f) return 0x7fc0;
  uint32_t b; __builtin_memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return (uint16_t)(b >> 16);
}
static inline float e_round_bf16(float f) { return e_bf16_to_float(e_float_to_bf16(f)); }
static inline float e_round_f16(float f) { return (float)(_Float16)f; }
static inline float e_fmod(float a, float b) { return __builtin_fmodf(a, b); }
static inline double e_fmod(double a, double b) { return __builtin_fmod(a, b); }
static inline float e_floor(float a) { return __builtin_floorf(a); }
static inline double e_floor(double a) { return __builtin_floor(a); }
static inline float e_copysign(float a, float b) { return __builtin_copysignf(a, b); }
static inline double e_copysign(double a, double b) { return __builtin_copysign(a, b); }
template <class T> static inline T e_max(T a, T b) { return (a != a || a >= b) ? a : b; }
template <class T> static inline T e_min(T a, T b) { return (a != a || a <= b) ? a : b; }
template <class T> static inline bool e_gt(T v, T a) { return v > a || (v != v && a == a); }
template <class T> static inline bool e_lt(T v, T a) { return v < a || (v != v && a == a); }
template <class T> static inline T e_floordiv_f(T a, T b) {
  if (b == 0) return a / b;
  T mod = e_fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
  T fl;
  if (div != 0) { fl = e_floor(div); if (div - fl > T(0.5)) fl += T(1); }
  else fl = e_copysign(T(0), a / b);
  return fl;
}
template <class T> static inline T e_floordiv_i(T a, T b) {
  if (b == 0) return 0;
  T q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
template <class T> static inline T e_remainder_f(T a, T b) {
  T m = e_fmod(a, b);
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  return m;
}
template <class T> static inline T e_remainder_i(T a, T b) {
  if (b == 0) return 0;
  T m = a % b;
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  return m;
}
template <class T> static inline T e_pow_i(T a, T b) {
  if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  T r = 1;
  while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
  return r;
}
template <class T> static inline T e_sign(T a) { return (T)((T(0) < a) - (a < T(0))); }
"""


# libm functions glibc's libmvec has vector variants of (glibc >= 2.35): declared "omp declare
# simd" so gcc vectorizes loops that call them (without -ffast-math: libmvec's results are within
# a few ulp, NaN and infinity as libm). Float exp, erf and log use vecmath's inline functions
# instead (more accurate than libmvec's, and as fast or faster; see vecmath.py).
SIMD_MATH = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin",
             "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc")
SIMD_MATH2 = ("pow", "atan2", "hypot")
# gcc merges sin(x) and cos(x) of one argument into one sincos call, which has no vector variant,
# so the whole loop stays scalar (5x slower for the pointwise zoo model's backward). Declared under
# other names bound to the same symbols (asm labels), gcc no longer knows them as sin/cos.
NO_SINCOS = ("sin", "cos")


def _simd_decls() -> str:
    lines = []
    for name in SIMD_MATH:
        for sfx, t in (("f", "float"), ("", "double")):
            lines.append("#pragma omp declare simd notinbranch")
            if name in NO_SINCOS:
                lines.append(f'extern "C" {t} e_{name}{sfx}({t}) noexcept __asm__("{name}{sfx}") '
                             '__attribute__((const));')
            else:
                lines.append(f'extern "C" {t} {name}{sfx}({t}) noexcept;')
    for name in SIMD_MATH2:
        for sfx, t in (("f", "float"), ("", "double")):
            lines.append("#pragma omp declare simd notinbranch")
            lines.append(f'extern "C" {t} {name}{sfx}({t}, {t}) noexcept;')
    return "\n".join(lines)


PRELUDE = PRELUDE.replace("@@SIMD_DECLS@@", _simd_decls()).replace("@@VECMATH@@",
                                                                 vecmath.SOURCE.strip())


def _at_least(v: Any, n: int) -> bool:
    """``v >= n`` for a size; for a symbolic one, True unless it is known to be smaller (used
    where the answer only picks the safer of two correct codes: a double accumulator)."""
    if not is_symbolic(v):
        return v >= n
    return not statically_true(sympy.sympify(v) < n)


def _hint(v: Any) -> int:
    """The example value of a size, for heuristics only."""
    return size_hint(v) if is_symbolic(v) else v


def _parallel_if(work: Any) -> str | None:
    """None: run serially; "": ``omp parallel for``; " if(...)": parallel when the symbolic amount
    of work, computed at run time, is worth it. The threshold is this machine's, calibrated
    once (calibrate.py; PARALLEL_MIN_WORK where it cannot be)."""
    from ..calibrate import parallel_min_work

    least = parallel_min_work()
    if not is_symbolic(work):
        return "" if work >= least else None
    if statically_true(sympy.sympify(work) >= least):
        return ""
    return f" if({to_c(work)} >= {least})"


def compute_type(dtype: torch.dtype) -> str:
    if dtype in (torch.bfloat16, torch.float16):
        return "float"
    return STORAGE_TYPE[dtype]


def _nan_literal(v: float, ct: str) -> str:
    """A NaN with eager's bits: its sign and payload survive (``torch.full(..., -nan)``), as a
    scalar converted to the compute type does in eager."""
    if ct == "float":
        bits = torch.tensor([v], dtype=torch.float32).view(torch.int32).item() & 0xFFFFFFFF
        if bits == 0x7FC00000:
            return '__builtin_nanf("")'
        return f"__builtin_bit_cast(float, {bits:#x}u)"
    bits = struct.unpack("<Q", struct.pack("<d", v))[0]
    if bits == 0x7FF8000000000000:
        return '__builtin_nan("")'
    return f"__builtin_bit_cast(double, {bits:#x}ull)"


def literal(value: Any, dtype: torch.dtype) -> str:
    ct = compute_type(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        suffix = "f" if ct == "float" else ""
        if math.isnan(v):
            return _nan_literal(v, ct)
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}__builtin_inf{suffix}()"
        return f"{v!r}{suffix}"
    v = int(value)
    if v == -(2 ** 63):
        return f"({ct})(-9223372036854775807LL - 1)"
    return f"({ct}){v}LL"


class CppVar:
    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: torch.dtype):
        self.name = name
        self.dtype = dtype

    def __str__(self) -> str:
        return self.name


_FLOAT_UNARY = {
    "abs": "std::abs({0})", "neg": "-{0}", "exp": "std::exp({0})", "exp2": "std::exp2({0})",
    "expm1": "std::expm1({0})", "log": "std::log({0})", "log2": "std::log2({0})",
    "log10": "std::log10({0})", "log1p": "std::log1p({0})", "sin": "std::sin({0})",
    "cos": "std::cos({0})", "tan": "std::tan({0})", "asin": "std::asin({0})",
    "acos": "std::acos({0})", "atan": "std::atan({0})", "sinh": "std::sinh({0})",
    "cosh": "std::cosh({0})", "tanh": "std::tanh({0})", "asinh": "std::asinh({0})",
    "acosh": "std::acosh({0})", "atanh": "std::atanh({0})", "sqrt": "std::sqrt({0})",
    "rsqrt": "({T})1 / std::sqrt({0})", "reciprocal": "({T})1 / {0}",
    "sigmoid": "({T})1 / (({T})1 + std::exp(-{0}))", "erf": "std::erf({0})",
    "erfc": "std::erfc({0})", "lgamma": "std::lgamma({0})", "floor": "std::floor({0})",
    "ceil": "std::ceil({0})", "trunc": "std::trunc({0})", "round": "std::nearbyint({0})",
    "frac": "{0} - std::trunc({0})", "sign": "e_sign({0})", "relu": "e_max({0}, ({T})0)",
    "silu": "{0} / (({T})1 + std::exp(-{0}))", "bitwise_not": "!{0}",
}
_INT_UNARY = {
    "abs": "({0} < 0 ? -{0} : {0})", "neg": "-{0}", "sign": "e_sign({0})",
    "relu": "({0} > 0 ? {0} : ({T})0)", "bitwise_not": "~{0}", "floor": "{0}", "ceil": "{0}",
    "trunc": "{0}", "round": "{0}",
}
_PRED = {"isnan": "{0} != {0}", "isinf": "std::isinf({0})", "isfinite": "std::isfinite({0})",
         "signbit": "std::signbit({0})", "logical_not": "!{0}"}
_INT_PRED = {"isnan": "false", "isinf": "false", "isfinite": "true", "signbit": "{0} < 0",
             "logical_not": "!{0}"}
_FLOAT_BINARY = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "truediv": "{0} / {1}",
    "floordiv": "e_floordiv_f({0}, {1})", "truncdiv": "std::trunc({0} / {1})",
    "remainder": "e_remainder_f({0}, {1})", "fmod": "std::fmod({0}, {1})",
    "pow": "std::pow({0}, {1})", "maximum": "e_max({0}, {1})", "minimum": "e_min({0}, {1})",
    "fmax": "std::fmax({0}, {1})", "fmin": "std::fmin({0}, {1})", "atan2": "std::atan2({0}, {1})",
    "copysign": "std::copysign({0}, {1})", "hypot": "std::hypot({0}, {1})",
}
_INT_BINARY = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}",
    "floordiv": "e_floordiv_i({0}, {1})", "truncdiv": "({1} == 0 ? ({T})0 : {0} / {1})",
    "remainder": "e_remainder_i({0}, {1})", "fmod": "({1} == 0 ? ({T})0 : {0} % {1})",
    "pow": "e_pow_i({0}, {1})", "maximum": "({0} > {1} ? {0} : {1})",
    "minimum": "({0} < {1} ? {0} : {1})", "fmax": "({0} > {1} ? {0} : {1})",
    "fmin": "({0} < {1} ? {0} : {1})", "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}",
    "bitwise_xor": "{0} ^ {1}", "lshift": "{0} << {1}", "rshift": "{0} >> {1}",
}
_BOOL_BINARY = {"add": "{0} || {1}", "mul": "{0} && {1}", "maximum": "{0} || {1}",
                "minimum": "{0} && {1}", "bitwise_and": "{0} && {1}", "bitwise_or": "{0} || {1}",
                "bitwise_xor": "{0} != {1}", "sub": "{0} != {1}"}
_COMPARE = {"eq": "{0} == {1}", "ne": "{0} != {1}", "lt": "{0} < {1}", "le": "{0} <= {1}",
            "gt": "{0} > {1}", "ge": "{0} >= {1}", "logical_and": "({0} != 0) && ({1} != 0)",
            "logical_or": "({0} != 0) || ({1} != 0)", "logical_xor": "({0} != 0) != ({1} != 0)"}


#: status codes a kernel returns (0: fine); the wrapper turns them into eager's exceptions
ERR_INDEX = 1
ERR_ZERO_DIV = 2
_INT_DIVISIONS = {"floordiv", "truncdiv", "remainder", "fmod"}
_LITERAL = re.compile(r"\(?(\(\w+\))?-?[1-9][0-9]*[LlUu]*\)?")

_GENERIC_BUILTINS = {"isinf", "isfinite", "signbit"}
_RENAMED = {"abs": "fabs"}
_STD = re.compile(r"std::(\w+)\(")


def builtins(expr: str, ctype: str) -> str:
    """``std::exp(x)`` -> ``__builtin_expf(x)`` (float) / ``__builtin_exp(x)`` (double)."""
    sfx = "f" if ctype == "float" else ""

    def sub(m: "re.Match[str]") -> str:
        name = m.group(1)
        if name in _GENERIC_BUILTINS:
            return f"__builtin_{name}("
        if sfx and name in vecmath.FLOAT_FUNCS:
            return f"{vecmath.FLOAT_FUNCS[name]}("
        if name in SIMD_MATH or name in SIMD_MATH2:
            return f"{'e_' if name in NO_SINCOS else ''}{name}{sfx}("
        return f"__builtin_{_RENAMED.get(name, name)}{sfx}("
    return _STD.sub(sub, expr)


class CppOps:
    """The ``ops`` handler that writes C++ statements into a :class:`CppKernel`."""

    def __init__(self, kernel: "CppKernel"):
        self.k = kernel

    def _emit(self, expr: str, dtype: torch.dtype, ctype: str | None = None) -> CppVar:
        if "std::" in expr:
            expr = builtins(expr, ctype or compute_type(dtype))
        return self.k.cse(expr, dtype)

    # -- memory --------------------------------------------------------------------------------
    def load(self, name: str, index: Any) -> CppVar:
        local = self.k.local_values.get(name)
        if local is not None:
            return local
        if name in self.k.sched.row_local:  # kept in a stack row (scheduler._row_scratch_ok)
            return self._emit(f"row_{name}[r0]", self.k.dtypes[name], compute_type(self.k.dtypes[name]))
        if name in self.k.sched.row_alias:  # kept in its user's output (scheduler._row_alias)
            alias = self.k.sched.row_alias[name]
            return self._emit(f"{alias}[{to_c(index)}]", self.k.dtypes[name])
        dtype = self.k.dtypes[name]
        expr = f"{name}[{to_c(index)}]"
        if dtype == torch.bool:
            # read as bytes: gcc vectorizes no loop that loads a C++ bool (a causal mask's
            # masked_fill left the softmax around it scalar)
            expr = f"(((const uint8_t*){name})[{to_c(index)}] != 0)"
        elif dtype == torch.bfloat16:
            expr = f"e_bf16_to_float({expr})"
        elif dtype == torch.float16:
            expr = f"(float){expr}"
        if self.k.hoistable(index):
            return self.k.hoisted(expr, dtype)
        return self._emit(expr, dtype)

    def constant(self, value: Any, dtype: torch.dtype) -> CppVar:
        return CppVar(literal(value, dtype), dtype)

    def index_expr(self, expr: Any, dtype: torch.dtype) -> CppVar:
        return self._emit(f"({compute_type(dtype)})({to_c(expr)})", dtype)

    def indirect_indexing(self, value: CppVar, size: Any, wrap_negative: bool = True) -> Any:
        """``value`` as an index into a dimension of ``size``; negative values count from the end
        where the op does so in eager (``x[idx]``), elsewhere (embedding, gather) they are out of
        range."""
        v = self._emit(f"(int64_t){value}", torch.int64)
        w = self._emit(f"{v} < 0 ? {v} + {to_c(size)} : {v}" if wrap_negative else f"{v}",
                       torch.int64)
        # an index eager would refuse: flag it (the wrapper raises) and read element 0 meanwhile
        self.k.check(f"(unsigned long long){w} >= (unsigned long long)({to_c(size)})",
                     ERR_INDEX, f"{w} = 0;")
        return sym(w.name)

    def to_dtype(self, x: CppVar, dtype: torch.dtype) -> CppVar:
        if x.dtype == dtype:
            return x
        if x.dtype in (torch.float16, torch.bfloat16):
            # a 16-bit value is held in float (a fused op's result unrounded): converted to
            # another dtype as the 16-bit value eager stored (half(6.999) -> int32 is 7, not 6)
            x = self._emit(f"e_round_{'f16' if x.dtype == torch.float16 else 'bf16'}({x})",
                           x.dtype)
        ct = compute_type(dtype)
        if dtype == torch.bool:
            return self._emit(f"{x} != 0", dtype)
        if x.dtype == torch.bool:
            # a select, not a cast: gcc vectorizes no loop converting a C++ bool to a number
            # (a max's gradient, (x == max) * g, left a whole backward reduction scalar)
            return self._emit(f"{x} ? ({ct})1 : ({ct})0", dtype)
        if dtype == torch.bfloat16:
            src = x if compute_type(x.dtype) == "float" else f"(float){x}"
            return self._emit(f"e_round_bf16({src})", dtype)
        if dtype == torch.float16:
            src = x if compute_type(x.dtype) == "float" else f"(float){x}"
            return self._emit(f"e_round_f16({src})", dtype)
        if compute_type(x.dtype) == ct:
            return CppVar(x.name, dtype)
        return self._emit(f"({ct}){x}", dtype)

    def where(self, c: CppVar, a: CppVar, b: CppVar) -> CppVar:
        return self._emit(f"{c} ? {a} : {b}", a.dtype)

    def masked(self, mask: CppVar, body: Any, other: Any, dtype: torch.dtype) -> CppVar:
        name = self.k.new_tmp()
        self.k.line(f"{compute_type(dtype)} {name} = {literal(other, dtype)};")
        self.k.line(f"if ({mask}) {{")
        self.k.push()
        self.k.masked_depth += 1  # a load under a mask may be out of bounds: never hoisted
        try:
            v = body()
        finally:
            self.k.masked_depth -= 1
        if v.dtype != dtype:
            v = self.to_dtype(v, dtype)
        self.k.line(f"{name} = {v};")
        self.k.pop()
        self.k.line("}")
        return CppVar(name, dtype)

    # -- math ----------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def op(*args: CppVar) -> CppVar:
            dt = args[0].dtype
            T = compute_type(dt)
            fmt = [str(a) for a in args]
            if name in _COMPARE:
                return self._emit(_COMPARE[name].format(*fmt), torch.bool)
            if len(args) == 1:
                if name in _PRED:
                    table = _PRED if dt.is_floating_point else _INT_PRED
                    return self._emit(table[name].format(*fmt, T=T), torch.bool, T)
                table = _FLOAT_UNARY if dt.is_floating_point else _INT_UNARY
                if dt == torch.bool and name == "bitwise_not":
                    return self._emit(f"!{fmt[0]}", dt)
                if name not in table:
                    raise NotImplementedError(f"C++ codegen: {name} on {dt}")
                return self._emit(table[name].format(*fmt, T=T), dt)
            if len(args) == 2:
                if dt == torch.bool and name in _BOOL_BINARY:
                    return self._emit(_BOOL_BINARY[name].format(*fmt), dt)
                table = _FLOAT_BINARY if dt.is_floating_point else _INT_BINARY
                if name not in table:
                    raise NotImplementedError(f"C++ codegen: {name} on {dt}")
                if table is _INT_BINARY and name in _INT_DIVISIONS and not _LITERAL.fullmatch(
                        fmt[1]):
                    self.k.check(f"{fmt[1]} == 0", ERR_ZERO_DIV)  # eager raises
                return self._emit(table[name].format(*fmt, T=T), dt)
            raise NotImplementedError(f"C++ codegen: {name}")
        return op


_INIT = {"sum": 0, "prod": 1, "any": False, "all": True}
# (reduction, of floats) -> the OpenMP reduction operator of an "omp simd" inner loop
_SIMD_REDUCTION = {("sum", True): "+", ("prod", True): "*", ("max", True): "max",
                   ("min", True): "min", ("max", False): "max", ("min", False): "min"}


def _reduction_init(rtype: str, dtype: torch.dtype) -> str:
    if rtype in _INIT:
        return literal(_INIT[rtype], dtype)
    if dtype == torch.bool:
        return "false" if rtype in ("max", "argmax") else "true"
    if dtype.is_floating_point:
        return literal(-math.inf if rtype in ("max", "argmax") else math.inf, dtype)
    info = torch.iinfo(dtype)
    return literal(info.min if rtype in ("max", "argmax") else info.max, dtype)


class CppKernel:
    """Writes one region: a C function running its fused groups in order."""

    def __init__(self, region: CppRegion, sched: Scheduler, dtypes: dict[str, torch.dtype]):
        self.region = region
        self.sched = sched
        self.dtypes = dtypes
        self.lines: list[str] = []
        self.indent = 1
        self.scopes: list[dict[str, CppVar]] = [{}]
        self.local_values: dict[str, CppVar] = {}
        self._tmp = 0
        self.checked = False  # some statement can fail as eager would: return a status
        # where loads that do not move along the inner loop go (see hoistable); None: nowhere
        self.hoist: dict[str, Any] | None = None
        self.hoisted_names: set[str] = set()
        self.masked_depth = 0

    _INVARIANT = re.compile(r"^[xs]\d+$")
    # the column form's vector loop runs inside the reduction loops: those are invariant too
    _INVARIANT_R = re.compile(r"^[xsr]\d+$")

    def hoistable(self, index: Any) -> bool:
        """A load inside an inner (reduction) loop whose index uses only outer loop variables
        and size symbols: read once before the loop. Inside an OpenMP-outlined loop the pointers
        lose ``restrict``, so gcc cannot move such a load out itself, and a loop with an invariant
        load it must keep (a LayerNorm backward's mean/rstd) is not vectorized at all. The same
        holds for the last loop of a pointwise nest (``hoist["moving"]``: its variable): a value
        broadcast along it (a sum's gradient, a per-row scale) is read before that loop."""
        if self.hoist is None or self.masked_depth:
            return False
        free = getattr(index, "free_symbols", ())
        moving = self.hoist.get("moving")
        pat = self._INVARIANT_R if self.hoist.get("rvars") else self._INVARIANT
        return all(pat.match(str(v)) and str(v) != moving for v in free)

    def hoisted(self, expr: str, dtype: torch.dtype) -> CppVar:
        h = self.hoist
        assert h is not None
        key = f"{expr}|{dtype}"
        v = self._seen(key)
        if v is not None:
            return v
        name = self.new_tmp()
        self._insert_hoisted(f"{compute_type(dtype)} {name} = {expr};")
        self.hoisted_names.add(name)
        v = CppVar(name, dtype)
        h["scope"][key] = v
        return v

    def _insert_hoisted(self, text: str) -> None:
        h = self.hoist
        assert h is not None
        self.lines.insert(h["pos"], "  " * h["indent"] + text)
        h["pos"] += 1

    _IDENT = re.compile(r"\b[A-Za-z_]\w*\b(?!\s*\()")
    _TYPES = frozenset(("float", "double", "int64_t", "int32_t", "int16_t", "int8_t", "uint8_t",
                        "uint16_t", "bool", "true", "false", "unsigned", "long", "int",
                        "_Float16"))

    def invariant_expr(self, expr: str) -> bool:
        """``expr`` uses only values read or computed before the inner loop (hoisted) and loop
        variables that do not move along it: it is computed there too (an embedding's index
        conversion and range check, a per-row scale), so the inner loop keeps no scalar work."""
        h = self.hoist
        if h is None or self.masked_depth:
            return False
        names = self.hoisted_names  # in scope where CSE finds them: before any inner loop here
        moving = h.get("moving")
        pat = self._INVARIANT_R if h.get("rvars") else self._INVARIANT
        for ident in self._IDENT.findall(expr):
            if ident in self._TYPES or ident in names:
                continue
            if pat.match(ident) and ident != moving:
                continue
            if ident.startswith("acc_") and h.get("finished_accs"):
                continue  # an earlier block's finished reduction (a softmax's sum)
            return False
        return True

    def check(self, cond: str, code: int, then: str = "") -> None:
        """Flag ``code`` in the kernel's status when ``cond`` holds (rare: an index out of range,
        an integer division by zero); the wrapper raises eager's exception after the call."""
        self.checked = True
        text = (f"if (__builtin_expect({cond}, 0)) {{ "
                f"__atomic_store_n(&e_status, {code}, __ATOMIC_RELAXED);{f' {then}' if then else ''} }}")
        key = f"check|{text}"
        if self._seen(key) is not None:
            return  # the same value checked already (an index a later loop reads again)
        if self.invariant_expr(cond) and self.invariant_expr(then.replace("=", " ").rstrip(";")):
            self._insert_hoisted(text)  # on values computed before the inner loop: checked there
            self.hoist["scope"][key] = CppVar("", torch.bool)  # type: ignore[index]
        else:
            self.line(text)
            self.scopes[-1][key] = CppVar("", torch.bool)

    # -- emission helpers ----------------------------------------------------------------------
    def _seen(self, key: str) -> CppVar | None:
        """The variable already holding ``key`` (expression and dtype) in an enclosing scope."""
        for sc in reversed(self.scopes):
            v = sc.get(key)
            if v is not None:
                return v
        return None

    def line(self, s: str) -> None:
        self.lines.append("  " * self.indent + s)

    def new_tmp(self) -> str:
        self._tmp += 1
        return f"tmp{self._tmp - 1}"

    def push(self) -> None:
        self.scopes.append({})
        self.indent += 1

    def pop(self) -> None:
        self.scopes.pop()
        self.indent -= 1

    def cse(self, expr: str, dtype: torch.dtype) -> CppVar:
        key = f"{expr}|{dtype}"
        v = self._seen(key)
        if v is not None:
            return v
        if self.invariant_expr(expr):
            return self.hoisted(expr, dtype)
        name = self.new_tmp()
        self.line(f"{compute_type(dtype)} {name} = {expr};")
        v = CppVar(name, dtype)
        self.scopes[-1][key] = v
        return v

    # -- stores --------------------------------------------------------------------------------
    def store(self, m: Member, value: CppVar) -> None:
        name = m.node.name
        dtype = m.node.dtype
        if value.dtype != dtype:
            value = CppOps(self).to_dtype(value, dtype)
        if name in self.sched.row_local:
            self.line(f"row_{name}[r0] = {value};")
            return
        if name in self.sched.row_alias:  # written where its one user writes, read back there
            self.line(f"{self.sched.row_alias[name]}[{to_c(m.store_index)}] = {value};")
            return
        if name in self.sched.local:
            return
        idx = to_c(m.store_index)
        if dtype == torch.bfloat16:
            self.line(f"{name}[{idx}] = e_float_to_bf16({value});")
        elif dtype == torch.float16:
            self.line(f"{name}[{idx}] = (_Float16){value};")
        else:
            self.line(f"{name}[{idx}] = {value};")

    # -- loops ---------------------------------------------------------------------------------
    def generate(self) -> str:
        r = self.region
        params = []
        for n in r.reads:
            params.append(f"const {STORAGE_TYPE[self.dtypes[n]]}* __restrict__ {n}")
        for n in r.writes:
            params.append(f"{STORAGE_TYPE[self.dtypes[n]]}* __restrict__ {n}")
        with set_ops_handler(CppOps(self)):
            for g in r.groups:
                self.group(g)
        # symbolic sizes: the symbols this function's loops and indices use come in as arguments
        env = current_size_env()
        size_args: list[str] = []
        if env is not None and env.hints:
            text = "\n".join(self.lines)
            used = set(re.findall(r"\b(s\d+)\b", text))
            size_args = [s.name for s in env.hints if s.name in used]
            params.extend(f"int64_t {n}" for n in size_args)
        r.size_args = size_args  # type: ignore[attr-defined]
        r.checked = self.checked  # type: ignore[attr-defined]
        if self.checked:
            head = f'extern "C" int {r.name}({", ".join(params)})'
            body = ["  int e_status = 0;", *self.lines, "  return e_status;"]
        else:
            head = f'extern "C" void {r.name}({", ".join(params)})'
            body = self.lines
        return head + " {\n" + "\n".join(body) + "\n}\n"

    def _column_plan(self, g: FusedGroup) -> list[list[tuple[list[Member], list[Any]]]] | None:
        """Reductions whose outputs are contiguous in the last outer loop while the values they
        combine are strided along the reduction (sums over a batch dim, e.g. bias gradients; a
        mean, max or variance over a middle axis; a softmax over dim 0): better run with the
        reduction loops outside and tiles of accumulators inside, a vector of outputs per step.
        Returns the runs of loop blocks, each run sharing one loop over output tiles, or None.

        Independent reductions over different ranges run one tile loop after the other (a
        LayerNorm's weight and bias gradients next to a linear's bias gradient). Blocks that read
        an earlier block's result (a variance after its mean, a sum of ``exp(x - max)`` after the
        max) run in one tile loop, the earlier result kept in a tile of values; pointwise blocks
        over the outputs alone (a mean's division) run per tile as well."""
        if not g.outer or not g.blocks or not any(b.inner for b in g.blocks):
            return None
        if any(m.node.name in self.sched.row_local or m.node.name in self.sched.row_alias
               for m in g.members):
            return None
        names = g.names()
        dependent = any(n in names for m in g.members for n, _ in m.loads)
        if len(g.blocks) > 1 and not dependent:
            inner0 = list(g.blocks[0].inner)
            if all(b.inner for b in g.blocks) and any(list(b.inner) != inner0
                                                      for b in g.blocks[1:]):
                plan = [[(list(b.members), list(b.inner))] for b in g.blocks]
                return plan if all(self._column_ok(g, *run[0]) for run in plan) else None
        run = [(list(b.members), list(b.inner)) for b in g.blocks]
        if not dependent and len(run) == 1:
            return [run] if self._column_ok(g, *run[0]) else None
        if not g.blocks[0].inner:
            return None  # pointwise work before the first reduction: the row form
        if not all(self._column_ok(g, ms, inner, chain=True, need_strided=False)
                   for ms, inner in run if inner):
            return None
        if not any(self._column_ok(g, ms, inner, chain=True, need_strided=True)
                   for ms, inner in run if inner):
            return None
        for ms, inner in run:
            if not inner and not all(self._pointwise_column_ok(g, m) for m in ms):
                return None
        return [run]

    def _pointwise_column_ok(self, g: FusedGroup, m: Member) -> bool:
        from ..sizes import var
        xl = var(len(g.outer) - 1)
        if isinstance(m.node.data, Reduction) and m.node.data.reduction_type not in (
                "sum", "prod", "max", "min", "any", "all"):
            return False
        if m.node.name in self.sched.local:
            return True
        try:
            return sympy.expand(m.store_index).coeff(xl) == 1
        except Exception:
            return False

    def _column_ok(self, g: FusedGroup, members: list[Member], inner: list[Any],
                   chain: bool = False, need_strided: bool = True) -> bool:
        """One loop block in the column form: ``chain`` allows pointwise members (stored per
        (reduction index, output)), results kept in registers, and blocks that read nothing
        strided (``need_strided=False``: a later block of a chain)."""
        from ..sizes import rvar, var
        xl = var(len(g.outer) - 1)
        rl = rvar(len(inner) - 1)
        strided = False
        for m in members:
            red = m.node.data
            if not isinstance(red, Reduction):
                if not chain:
                    return False
                try:
                    if (m.node.name not in self.sched.local
                            and sympy.expand(m.store_index).coeff(xl) != 1):
                        return False
                except Exception:
                    return False
                continue
            if red.reduction_type not in ("sum", "prod", "max", "min", "any", "all"):
                return False
            if m.node.name in self.sched.local and not chain:
                return False
            try:
                if (m.node.name not in self.sched.local
                        and sympy.expand(m.store_index).coeff(xl) != 1):
                    return False
                # the loads that move along the reduction: none that also moves along the outputs
                # may be contiguous in it (one that does not, a per-row value such as a
                # LayerNorm's mean, is a broadcast in the vector loop), and one must be
                # contiguous along the outputs
                # (an index read from a tensor, an embedding's row, may move along anything)
                moving = [e for e in (sympy.expand(e) for n, e in m.loads if n)
                          if e.coeff(rl) != 0 or any(str(v).startswith("_ind")
                                                     for v in e.free_symbols)]
                if any(e.coeff(rl) == 1 and e.coeff(xl) != 0 for e in moving):
                    return False
                strided |= any(e.coeff(xl) == 1 for e in moving)
            except Exception:
                return False
        return strided or not need_strided

    def column_reduction(self, g: FusedGroup, run: list[tuple[list[Member], list[Any]]]) -> None:
        """The column form of :meth:`_column_plan`'s ``run``: for each tile of outputs (the
        last outer loop), each block in turn: its reduction loops outside, a vector loop over
        the tile inside, one accumulator per output; pointwise blocks over the outputs alone
        as one vector loop over the tile."""
        from ..calibrate import column_tile

        k = len(g.outer)
        tile = column_tile()
        members = [m for ms, _ in run for m in ms]
        names = ", ".join(m.node.name for m in members)
        self.line(f"// {names}: reductions over strided values, accumulator tiles of up to {tile}")
        self.line("{")
        self.indent += 1
        work = product(g.outer) * max(product(inner) if inner else 1 for _, inner in run)
        xn = f"x{k - 1}"
        n = to_c(g.outer[-1])
        par = _parallel_if(work)
        rows = _hint(product(g.outer[:-1]))
        step: Any = tile
        if par is not None and rows < 8:
            # few tiles (a bias gradient of 256 columns is one 256-wide tile): narrower tiles, as
            # many as a multiple of the threads, so that every thread gets an equal share
            self.line("const int64_t e_nth = omp_get_max_threads();")
            self.line(f"int64_t e_nt = ({n} + {tile - 1}) / {tile}{f' * {rows}' if rows > 1 else ''};")
            self.line("if (e_nt < 1) e_nt = 1;")
            self.line("if (e_nt % e_nth) e_nt += e_nth - e_nt % e_nth;")
            if rows > 1:
                self.line(f"e_nt = (e_nt + {rows - 1}) / {rows};")
            self.line(f"const int64_t e_tile = (({n} + e_nt - 1) / e_nt + 15) / 16 * 16;")
            step = "e_tile"
        if par is not None:
            self.line(f"#pragma omp parallel for{f' collapse({k})' if k > 1 else ''}{par}")
        for i, sz in enumerate(g.outer[:-1]):
            self.line(f"for (int64_t x{i} = 0; x{i} < {to_c(sz)}; x{i}++) {{")
            self.indent += 1
        self.line(f"for (int64_t xt = 0; xt < {n}; xt += {step}) {{")
        self.indent += 1
        self.line(f"const int64_t xe = xt + {step} < {n} ? xt + {step} : {n};")
        self.scopes.append({})
        j = 0
        chained = len(run) > 1
        for ms, inner in run:
            if not inner:
                # pointwise work over the outputs, and reductions over nothing (a size-1 dim: the
                # value combined with the initial one), one value per output
                trivial = [m for m in ms if isinstance(m.node.data, Reduction)]
                for m in trivial:
                    self.line(f"{compute_type(m.node.dtype)} val{j}[{tile}];")
                    self.local_values.pop(m.node.name, None)
                    j += 1
                self.line("#pragma omp simd")
                self.line(f"for (int64_t {xn} = xt; {xn} < xe; {xn}++) {{")
                self.indent += 1
                self.scopes.append({})
                done = {}
                for m in ms:
                    value = m.node.body(m.index, m.rindex)
                    red = m.node.data
                    if isinstance(red, Reduction):
                        a = j - len(trivial) + trivial.index(m)
                        if value.dtype != red.src_dtype:
                            value = CppOps(self).to_dtype(value, red.src_dtype)
                        init = _reduction_init(red.reduction_type, red.src_dtype)
                        comb = {"sum": "{0} + {1}", "prod": "{0} * {1}", "max": "e_max({0}, {1})",
                                "min": "e_min({0}, {1})", "any": "{0} || {1}",
                                "all": "{0} && {1}"}[red.reduction_type].format(init, value)
                        v = CppVar(f"({comb})", red.src_dtype)
                        if v.dtype != m.node.dtype:
                            v = CppOps(self).to_dtype(v, m.node.dtype)
                        self.line(f"val{a}[{xn} - xt] = {v};")
                        value = CppVar(f"val{a}[{xn} - xt]", m.node.dtype)
                        done[m.node.name] = value
                    self.store(m, value)
                self.scopes.pop()
                self.indent -= 1
                self.line("}")
                self.local_values.update(done)  # read by later blocks inside their own loops
                continue
            reds = [(j + i, m) for i, m in enumerate(x for x in ms
                                                      if isinstance(x.node.data, Reduction))]
            j += len(reds)
            wide: set[int] = set()
            for a, m in reds:
                red = m.node.data
                at = compute_type(red.src_dtype)
                if (at == "float" and red.reduction_type == "sum"
                        and _at_least(product(inner), DOUBLE_ACC_MIN)):
                    at = "double"
                    wide.add(a)
                init = _reduction_init(red.reduction_type, red.src_dtype)
                self.line(f"{at} acc{a}[{tile}];")
                self.line(f"for (int64_t {xn} = xt; {xn} < xe; {xn}++) acc{a}[{xn} - xt] = {init};")
            # long float sums: float tiles over chunks of about DOUBLE_ACC_MIN values (full-width
            # vectors), each chunk added to the double tile (as for the row form's sums)
            rest = product(inner[1:]) if len(inner) > 1 else 1
            chunk = (max(1, DOUBLE_ACC_MIN // int(rest))
                     if wide and not is_symbolic(rest) else None)
            if chunk is not None:
                n0 = to_c(inner[0])
                self.line(f"for (int64_t r0c = 0; r0c < {n0}; r0c += {chunk}) {{")
                self.indent += 1
                self.line(f"const int64_t r0e = r0c + {chunk} < {n0} ? r0c + {chunk} : {n0};")
                for a in sorted(wide):
                    self.line(f"float accp{a}[{tile}];")
                    self.line(f"for (int64_t {xn} = xt; {xn} < xe; {xn}++) accp{a}[{xn} - xt] = 0.0f;")
            for i, sz in enumerate(inner):
                if i == 0 and chunk is not None:
                    self.line("for (int64_t r0 = r0c; r0 < r0e; r0++) {")
                else:
                    self.line(f"for (int64_t r{i} = 0; r{i} < {to_c(sz)}; r{i}++) {{")
                self.indent += 1
            self.scopes.append({})
            # loads that do not move along the tile (a per-row value, an embedding's index) are
            # read before the vector loop
            self.hoist = {"pos": len(self.lines), "indent": self.indent,
                          "scope": self.scopes[-1], "moving": xn, "rvars": True}
            self.line("#pragma omp simd")
            self.line(f"for (int64_t {xn} = xt; {xn} < xe; {xn}++) {{")
            self.indent += 1
            self.scopes.append({})
            acc_of = {id(m): a for a, m in reds}
            pw_local = []
            for m in ms:
                value = m.node.body(m.index, m.rindex)
                red = m.node.data
                if not isinstance(red, Reduction):
                    self.store(m, value)
                    self.local_values[m.node.name] = value
                    pw_local.append(m.node.name)
                    continue
                if value.dtype != red.src_dtype:
                    value = CppOps(self).to_dtype(value, red.src_dtype)
                ai = acc_of[id(m)]
                a = f"acc{'p' if chunk is not None and ai in wide else ''}{ai}[{xn} - xt]"
                comb = {"sum": f"{a} + {value}", "prod": f"{a} * {value}",
                        "max": f"e_max({a}, {value})", "min": f"e_min({a}, {value})",
                        "any": f"{a} || {value}", "all": f"{a} && {value}"}[red.reduction_type]
                self.line(f"{a} = {comb};")
            self.scopes.pop()
            self.hoist = None
            self.indent -= 1
            self.line("}")
            self.scopes.pop()
            for _ in inner:
                self.indent -= 1
                self.line("}")
            if chunk is not None:
                self.line("#pragma omp simd")
                self.line(f"for (int64_t {xn} = xt; {xn} < xe; {xn}++) {{")
                for a in sorted(wide):
                    self.line(f"  acc{a}[{xn} - xt] = acc{a}[{xn} - xt] + accp{a}[{xn} - xt];")
                self.line("}")
                self.indent -= 1
                self.line("}")
            for name in pw_local:  # values of the vector loop are out of scope now
                self.local_values.pop(name, None)
            # the block's results: stored, and kept in a tile of values for the blocks after it
            if not reds:
                continue
            if chained:
                for a, m in reds:
                    self.line(f"{compute_type(m.node.dtype)} val{a}[{tile}];")
            self.line(f"for (int64_t {xn} = xt; {xn} < xe; {xn}++) {{")
            self.indent += 1
            self.scopes.append({})
            for a, m in reds:
                red = m.node.data
                v = CppVar(f"({compute_type(red.src_dtype)})acc{a}[{xn} - xt]", red.src_dtype)
                if v.dtype != m.node.dtype:
                    v = CppOps(self).to_dtype(v, m.node.dtype)
                if chained:
                    self.line(f"val{a}[{xn} - xt] = {v};")
                    v = CppVar(f"val{a}[{xn} - xt]", m.node.dtype)
                self.store(m, v)
            self.scopes.pop()
            self.indent -= 1
            self.line("}")
            if chained:  # read by the later blocks, inside their own loops over the tile
                for a, m in reds:
                    self.local_values[m.node.name] = CppVar(f"val{a}[{xn} - xt]", m.node.dtype)
        self.scopes.pop()
        self.local_values = {}
        self.indent -= 1
        self.line("}")
        for _ in g.outer[:-1]:
            self.indent -= 1
            self.line("}")
        self.indent -= 1
        self.line("}")

    def group(self, g: FusedGroup) -> None:
        plan = self._column_plan(g)
        if plan is not None:
            for run in plan:
                self.column_reduction(g, run)
            return
        origins = []
        for m in g.members:
            origins.extend(getattr(m.node.data, "origins", []))
        desc = ", ".join(m.node.name for m in g.members)
        self.line(f"// {desc}: outer {list(g.outer)}" + (f"; from {', '.join(origins[:8])}"
                                                           if origins else ""))
        self.line("{")
        self.indent += 1
        pure = all(not b.inner for b in g.blocks)
        inner_work = [product(b.inner) for b in g.blocks] + [1]
        if any(is_symbolic(w) for w in inner_work):
            # the longest inner loop for the example sizes (a heuristic; the if() is exact)
            inner_work = [max(inner_work, key=_hint)]
        work = product(g.outer) * max(inner_work)
        nouter = len(g.outer)
        par = _parallel_if(work)
        if par is not None and _hint(product(g.outer)) > 1 and nouter:
            collapse = max(1, nouter - 1) if pure else nouter
            if pure and nouter >= 2 and _hint(product(g.outer[:-1])) < 4:
                collapse = nouter  # too few rows to split: let OpenMP split the whole space
            c = f" collapse({collapse})" if collapse > 1 else ""
            self.line(f"#pragma omp parallel for{c}{par}")
        else:
            collapse = 0
        opened = 0
        # a pure pointwise nest of several loops whose last loop is not collapsed into the
        # parallel one: loads that do not move along the last loop are read before it
        hoist_last = pure and nouter >= 2 and collapse < nouter
        for i, s in enumerate(g.outer):
            if hoist_last and i == nouter - 1:
                self.scopes.append({})
                self.hoist = {"pos": len(self.lines), "indent": self.indent,
                              "scope": self.scopes[-1], "moving": f"x{i}"}
            self.line(f"for (int64_t x{i} = 0; x{i} < {to_c(s)}; x{i}++) {{")
            self.indent += 1
            opened += 1
        self.scopes.append({})
        for m in g.members:
            if m.node.name in self.sched.row_local:
                self.line(f"{compute_type(m.node.dtype)} row_{m.node.name}"
                          f"[{self.sched.row_local[m.node.name]}];  // computed once per row")
        for b in g.blocks:
            self.block(b)
        self.scopes.pop()
        if hoist_last:
            self.hoist = None
            self.scopes.pop()
        for _ in range(opened):
            self.indent -= 1
            self.line("}")
        self.local_values = {}
        self.indent -= 1
        self.line("}")

    def block(self, b: LoopBlock) -> None:
        reds = [m for m in b.members if isinstance(m.node.data, Reduction)]
        accs: dict[str, tuple[str, ...]] = {}
        wide: set[str] = set()
        for m in reds:
            red = m.node.data
            assert isinstance(red, Reduction)
            acc = f"acc_{m.node.name}"
            if red.reduction_type in ("argmax", "argmin"):
                at = compute_type(red.src_dtype)
                self.line(f"{at} {acc}_v = {_reduction_init(red.reduction_type, red.src_dtype)};")
                self.line(f"int64_t {acc} = 0;")
                accs[m.node.name] = (acc, f"{acc}_v")
            else:
                at = compute_type(red.src_dtype)
                if (at == "float" and red.reduction_type == "sum"
                        and _at_least(product(b.inner), DOUBLE_ACC_MIN)):
                    at = "double"  # long float sums: eager sums pairwise; a double keeps up
                self.line(f"{at} {acc} = {_reduction_init(red.reduction_type, red.src_dtype)};")
                accs[m.node.name] = (acc,)
                if at != compute_type(red.src_dtype):
                    wide.add(m.node.name)
        pw_names = []
        simd_minmax = False
        hoist_scopes = 0  # scopes of values read before the innermost reduction loop
        # float max/min reductions over an inner loop: a NaN flag each (see the pragma below)
        minmax_nan = {m.node.name for m in reds if b.inner
                      and m.node.data.reduction_type in ("max", "min")
                      and m.node.data.src_dtype.is_floating_point}
        for n in minmax_nan:
            self.line(f"int acc_{n}_nan = 0;")
        # a long float sum accumulates in double; it runs in chunks of DOUBLE_ACC_MIN summed in
        # float (vectorized as float, a vector of float lanes), each chunk added to the double:
        # as accurate, and faster (a softmax's sum of 8192 exps: 10% faster in all, AMD EPYC)
        chunked = [m.node.name for m in reds if m.node.name in wide] if len(b.inner) == 1 else []
        part = {n: f"acc_{n}_p" for n in chunked}
        if b.inner:
            # before the inner loop: the accumulators named so far are earlier blocks' results
            # (this block's are only read after its loop)
            self.hoist = {"pos": len(self.lines), "indent": self.indent, "scope": self.scopes[-1],
                          "finished_accs": True}
            # every reduction of the block has an OpenMP reduction operator: "omp simd" makes
            # gcc keep one accumulator per vector lane. Float max/min track NaN in a flag (the
            # lanes compare with a plain > or <, which gcc vectorizes; a NaN-propagating
            # compare it leaves scalar) and return NaN after the loop if one was seen.
            ops_ = [_SIMD_REDUCTION.get((m.node.data.reduction_type,
                                         m.node.data.src_dtype.is_floating_point))
                    if m.node.data.src_dtype != torch.bool else None for m in reds]
            if reds and all(ops_):
                clauses = []
                for m, op in zip(reds, ops_):
                    clauses.append(f"reduction({op}:{part.get(m.node.name, f'acc_{m.node.name}')})")
                    if m.node.name in minmax_nan:
                        clauses.append(f"reduction(|:acc_{m.node.name}_nan)")
                pragma = f"#pragma omp simd {' '.join(clauses)}"
                simd_minmax = True
            else:
                pragma = None
            if chunked:
                n = to_c(b.inner[0])
                self.line(f"for (int64_t r0c = 0; r0c < {n}; r0c += {DOUBLE_ACC_MIN}) {{")
                self.indent += 1
                self.line(f"const int64_t r0e = r0c + {DOUBLE_ACC_MIN} < {n} ? "
                          f"r0c + {DOUBLE_ACC_MIN} : {n};")
                for m in reds:
                    if m.node.name in part:
                        red = m.node.data
                        self.line(f"{compute_type(red.src_dtype)} {part[m.node.name]} = "
                                  f"{_reduction_init(red.reduction_type, red.src_dtype)};")
                if pragma:
                    self.line(pragma)
                self.line("for (int64_t r0 = r0c; r0 < r0e; r0++) {")
                self.indent += 1
            else:
                nin = len(b.inner)
                for i, s in enumerate(b.inner):
                    if i == nin - 1 and nin >= 2:
                        # values that move only with the outer reduction loops (a gathered
                        # row's index and its range check, in an embedding summed over its
                        # rows) are read once before the innermost loop, in a scope of their
                        # own: computed inside it they kept it scalar (an atomic status store)
                        self.scopes.append({})
                        hoist_scopes += 1
                        self.hoist = {"pos": len(self.lines), "indent": self.indent,
                                      "scope": self.scopes[-1], "finished_accs": True,
                                      "rvars": True, "moving": f"r{nin - 1}"}
                    if i == nin - 1 and pragma:
                        self.line(pragma)
                    self.line(f"for (int64_t r{i} = 0; r{i} < {to_c(s)}; r{i}++) {{")
                    self.indent += 1
            self.scopes.append({})
        for m in b.members:
            value = m.node.body(m.index, m.rindex)
            red = m.node.data
            if isinstance(red, Reduction):
                rt = red.reduction_type
                if value.dtype != red.src_dtype:
                    value = CppOps(self).to_dtype(value, red.src_dtype)
                acc = part.get(m.node.name, accs[m.node.name][0])
                if rt == "sum":
                    self.line(f"{acc} = {acc} + {value};")
                elif rt == "prod":
                    self.line(f"{acc} = {acc} * {value};")
                elif rt in ("max", "min") and simd_minmax:
                    self.line(f"{acc} = {value} {'>' if rt == 'max' else '<'} {acc} ? {value} : {acc};")
                    if m.node.name in minmax_nan:
                        self.line(f"{acc}_nan |= {value} != {value};")
                elif rt == "max":
                    self.line(f"{acc} = e_max({acc}, {value});")
                elif rt == "min":
                    self.line(f"{acc} = e_min({acc}, {value});")
                elif rt == "any":
                    self.line(f"{acc} = {acc} || {value};")
                elif rt == "all":
                    self.line(f"{acc} = {acc} && {value};")
                elif rt in ("argmax", "argmin"):
                    flat = self._flat_rindex(b.inner)
                    cmp = "e_gt" if rt == "argmax" else "e_lt"
                    self.line(f"if ({cmp}({value}, {acc}_v)) {{ {acc}_v = {value}; {acc} = {flat}; }}")
                else:
                    raise NotImplementedError(f"reduction {rt}")
            else:
                self.store(m, value)
                self.local_values[m.node.name] = value
                pw_names.append(m.node.name)
        if b.inner:
            self.hoist = None
            self.scopes.pop()
            for _ in range(hoist_scopes):
                self.scopes.pop()
            for _ in b.inner:
                self.indent -= 1
                self.line("}")
            if chunked:
                for n in chunked:
                    self.line(f"acc_{n} = acc_{n} + {part[n]};")
                self.indent -= 1
                self.line("}")
            for n in pw_names:  # values of the inner loop are out of scope now
                self.local_values.pop(n, None)
        for m in reds:
            red = m.node.data
            acc = accs[m.node.name][0]
            if m.node.name in minmax_nan:
                self.line(f"if (acc_{m.node.name}_nan) {acc} = "
                          f"{literal(math.nan, red.src_dtype)};")
            if m.node.name in wide:
                self.line(f"{compute_type(red.src_dtype)} {acc}_n = {acc};")
                acc = f"{acc}_n"
            v = CppVar(acc, m.node.dtype if red.reduction_type in ("argmax", "argmin")
                       else red.src_dtype)
            if v.dtype != m.node.dtype:
                v = CppOps(self).to_dtype(v, m.node.dtype)
            self.store(m, v)
            self.local_values[m.node.name] = v

    @staticmethod
    def _flat_rindex(inner: Sequence[Any]) -> str:
        if not inner:
            return "0"
        terms = []
        stride: Any = 1
        for i in reversed(range(len(inner))):
            terms.append(f"r{i}" if stride == 1 else f"r{i}*{to_c(stride)}")
            stride = stride * inner[i]
        return " + ".join(reversed(terms))


# a graph's kernels are split into this many sources at most (built in parallel) once they are
# long enough that gcc's time dominates its start-up
MAX_SOURCES = max(1, min(4, os.cpu_count() or 1))
SPLIT_MIN_LINES = 150


#: the ``cpu_isa`` option's values (gcc ``-march`` names) and the /proc/cpuinfo flags a CPU needs
#: to run code built for each (every level includes the ones below it)
from .isa import CPU_ISAS, cpu_isa  # noqa: E402,F401  (re-exported)


def generate_cpp(sched: Scheduler, dtypes: dict[str, torch.dtype],
                 isa: str = "native") -> list[str]:
    """The C++ sources of a graph: each is the prelude plus some of the regions' functions.
    ``isa`` other than "native" heads each source with ``// ember-cpu-isa: <isa>``, which the
    kernel cache (runtime/cache.py) builds with ``-march=<isa>`` and keys accordingly."""
    funcs = []
    for step in sched.steps:
        if isinstance(step, CppRegion):
            funcs.append(CppKernel(step, sched, dtypes).generate())
    if not funcs:
        return []
    total = sum(f.count("\n") for f in funcs)
    n = min(MAX_SOURCES, len(funcs), max(1, total // SPLIT_MIN_LINES))
    chunks: list[list[str]] = [[] for _ in range(n)]
    sizes = [0] * n
    for f in funcs:  # contiguous chunks of about equal length, in program order
        i = min(n - 1, sum(sizes) * n // max(total, 1))
        chunks[i].append(f)
        sizes[i] += f.count("\n")
    head = "" if isa == "native" else f"// ember-cpu-isa: {isa}\n"
    return [head + PRELUDE + "\n" + "\n".join(c) for c in chunks if c]
