"""Resume functions: the rest of a frame after a graph break, as a real code object.

A resume function is the original code object with a short prologue in front of it. Its
parameters are every local of the original frame (in the original slots, so the body's
``LOAD_FAST`` indexes stay valid) followed by the values that were on the stack at the break.
The prologue pushes those stack values back (``PUSH_NULL`` for CPython's NULL markers, ``iter()``
around iterators passed as lists), deletes the locals that were unbound, and jumps to the
instruction where execution continues. CPython 3.11+ jumps are relative, so the body's bytes are
kept as they are; the exception table and the location table are shifted by the prologue.
"""

from __future__ import annotations

import dis
import sys
import types
from typing import Any

from ..exc import Unsupported

__all__ = ["resume_code", "STACK_PLAIN", "STACK_NULL", "STACK_ITER"]

PY312 = sys.version_info >= (3, 12)
OP = dis.opmap
STACK_PLAIN, STACK_NULL, STACK_ITER = "plain", "null", "iter"

_DEREF_OPS = {OP[n] for n in ("LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF", "LOAD_CLOSURE",
                              "MAKE_CELL", "LOAD_CLASSDEREF") if n in OP}
_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08
_CO_GENERATOR_LIKE = 0x20 | 0x80 | 0x100 | 0x200


def _caches(opname: str) -> int:
    table = dis._inline_cache_entries  # type: ignore[attr-defined]
    if isinstance(table, dict):  # pragma: no cover - 3.13+
        return table.get(opname, 0)
    return table[OP[opname]]


def _emit(out: bytearray, opname: str, arg: int = 0) -> None:
    if arg > 255:
        raise Unsupported("resume prologue argument too large")
    out += bytes([OP[opname], arg])
    out += b"\x00\x00" * _caches(opname)


# -- exception table (varint) ------------------------------------------------------------------

def _parse_varint(data: bytes, i: int) -> tuple[int, int]:
    b = data[i]
    i += 1
    val = b & 63
    while b & 64:
        b = data[i]
        i += 1
        val = (val << 6) | (b & 63)
    return val, i


def _write_varint(out: bytearray, val: int, start: bool) -> None:
    chunks = [val & 63]
    val >>= 6
    while val:
        chunks.append(val & 63)
        val >>= 6
    chunks.reverse()
    for j, c in enumerate(chunks):
        b = c | (64 if j < len(chunks) - 1 else 0)
        if j == 0 and start:
            b |= 128
        out.append(b)


def _shift_exception_table(table: bytes, units: int) -> bytes:
    out = bytearray()
    i = 0
    while i < len(table):
        start, i = _parse_varint(table, i)
        length, i = _parse_varint(table, i)
        target, i = _parse_varint(table, i)
        dl, i = _parse_varint(table, i)
        _write_varint(out, start + units, True)
        _write_varint(out, length, False)
        _write_varint(out, target + units, False)
        _write_varint(out, dl, False)
    return bytes(out)


def _no_location_entries(units: int) -> bytes:
    out = bytearray()
    while units > 0:
        n = min(units, 8)
        out.append(0x80 | (15 << 3) | (n - 1))
        units -= n
    return bytes(out)


def _remap_derefs(code_bytes: bytes, shift: int, old_nlocals: int) -> bytes:
    if shift == 0:
        return code_bytes
    out = bytearray(code_bytes)
    ext = False
    for i in range(0, len(out), 2):
        op, arg = out[i], out[i + 1]
        if op == OP["EXTENDED_ARG"]:
            ext = True
            continue
        if op in _DEREF_OPS and arg >= old_nlocals:
            if ext or arg + shift > 255:
                raise Unsupported("resume: closure variable index out of range")
            out[i + 1] = arg + shift
        ext = False
    return bytes(out)


_cache: dict[tuple, types.CodeType] = {}
#: resume code -> (the user's original code object, bytes of prologue in front of it)
_origin: dict[types.CodeType, tuple[types.CodeType, int]] = {}


#: resume code -> {cell variable: the parameter that brings its cell object}
cell_params: dict[types.CodeType, dict[str, str]] = {}


def original_position(code: types.CodeType, offset: int) -> tuple[types.CodeType, int]:
    """Map an offset in a (possibly resume) code object to the user's original code, so that a
    break inside a loop resumes through the same code object on every iteration."""
    origin = _origin.get(code)
    if origin is None:
        return code, offset
    orig, shift = origin
    if offset < shift:
        raise Unsupported("graph break inside a resume prologue")
    return orig, offset - shift


def resume_code(code: types.CodeType, target_offset: int, stack_kinds: tuple[str, ...],
                unbound: frozenset[str]) -> types.CodeType:
    """Code object that continues ``code`` at ``target_offset``.

    Parameters: ``code.co_varnames`` (all locals, unbound ones passed as None; a local that is
    a cell variable passed as its cell) then one per non-NULL stack value, bottom first, then the
    cells of the other cell variables (``co_cellvars`` order).
    """
    key = (code, target_offset, stack_kinds, unbound)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    if code.co_flags & _CO_GENERATOR_LIKE:
        raise Unsupported("graph break in a generator or coroutine")
    nv = len(code.co_varnames)
    stack_names = tuple(f"___stack{nv + i}" for i, k in enumerate(stack_kinds)
                        if k != STACK_NULL)
    # Cell variables travel as the cell objects themselves: a parameter that is a cell gets its
    # cell in its own slot; every other cell arrives as an extra parameter that the prologue
    # stores into the cell's slot (STORE_FAST on a cell slot stores the cell object).
    pure_cells = tuple(c for c in code.co_cellvars if c not in code.co_varnames)
    cell_names = tuple(f"___cell_{c}" for c in pure_cells)
    varnames = code.co_varnames + stack_names + cell_names
    prologue = bytearray()
    if code.co_freevars:
        _emit(prologue, "COPY_FREE_VARS", len(code.co_freevars))
    _emit(prologue, "RESUME", 0)
    for name in sorted(unbound):
        _emit(prologue, "DELETE_FAST", code.co_varnames.index(name))
    for j, name in enumerate(cell_names):
        _emit(prologue, "LOAD_FAST", varnames.index(name))
        _emit(prologue, "STORE_FAST", len(varnames) + j)
    consts = code.co_consts + (iter,)
    iter_const = len(consts) - 1
    j = 0
    for k in stack_kinds:
        if k == STACK_NULL:
            _emit(prologue, "PUSH_NULL")
            continue
        idx = nv + j
        j += 1
        if k == STACK_ITER:
            _emit(prologue, "PUSH_NULL")
            _emit(prologue, "LOAD_CONST", iter_const)
            _emit(prologue, "LOAD_FAST", idx)
            if not PY312:
                _emit(prologue, "PRECALL", 1)
            _emit(prologue, "CALL", 1)
        else:
            _emit(prologue, "LOAD_FAST", idx)
    if iter_const > 255:
        raise Unsupported("resume: too many constants")
    # EXTENDED_ARG x2 + JUMP_FORWARD: a fixed-size jump to the body.
    jump_at = len(prologue)
    total = jump_at + 6
    delta_units = (total + target_offset - (jump_at + 6)) // 2
    prologue += bytes([OP["EXTENDED_ARG"], (delta_units >> 16) & 255,
                       OP["EXTENDED_ARG"], (delta_units >> 8) & 255,
                       OP["JUMP_FORWARD"], delta_units & 255])
    units = len(prologue) // 2
    body = _remap_derefs(code.co_code, len(stack_names) + len(cell_names), nv)
    flags = code.co_flags & ~(_CO_VARARGS | _CO_VARKEYWORDS)
    new = code.replace(
        co_code=bytes(prologue) + body,
        co_varnames=varnames,
        co_nlocals=len(varnames),
        co_argcount=len(varnames),
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_flags=flags,
        co_consts=consts,
        co_stacksize=code.co_stacksize + len(stack_kinds) + 3,
        co_exceptiontable=_shift_exception_table(code.co_exceptiontable, units),
        co_linetable=_no_location_entries(units) + code.co_linetable,
        co_name=f"__resume_at_{target_offset}_{code.co_name}",
        co_qualname=f"__resume_at_{target_offset}_{code.co_qualname}",
    )
    _cache[key] = new
    _origin[new] = (code, len(prologue))
    cells = {c: c for c in code.co_cellvars if c in code.co_varnames}
    cells.update(zip(pure_cells, cell_names))
    if cells:
        cell_params[new] = cells
    return new


def make_function(code: types.CodeType, original: Any) -> types.FunctionType:
    return types.FunctionType(code, original.__globals__, code.co_name, None,
                              original.__closure__)
