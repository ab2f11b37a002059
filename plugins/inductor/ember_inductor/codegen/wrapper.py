"""The wrapper: readable Python that allocates buffers, calls the compiled C++ regions through
ctypes and the ATen kernels through ``torch.ops``, frees buffers after their last use, and returns
the outputs. A buffer takes over the storage of one dead at an earlier step, and on the Triton
target a kernel writes its result over a dead buffer it reads (scheduler.plan_buffer_reuse,
plan_in_place); :class:`BufferPlan` is that plan, and the memory it holds at each step. It imports only torch, ctypes and ember_inductor's runtime, so it can be stored and
loaded on its own (the body of a precompiled artifact)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import sympy
import torch

from ..ir import Buffer, ExternKernel, InputBuffer, MultiOutput, NoneValue, ReinterpretView
from ..scheduler import (CppRegion, Scheduler, _extent, _reads_of, _returns_alias, _same_layout,
                         last_uses, out_overload, plan_buffer_reuse)
from ..sizes import to_py

__all__ = ["generate_wrapper", "WrapperWriter", "BufferPlan"]

# Buffers below this size are not pooled by default: malloc serves them from its heap without
# page faults once warm, and hands a freed one's cache-hot memory to the next allocation, which a
# kept buffer at its own address loses. Measured (2 cores, interleaved, pool all / 4 MiB / none):
# convnet training 1.14x / 1.12x (its 8 MiB activations faulted on every call), transformer_block
# and bert training 0.96-1.05x with either, inference unchanged
POOL_MIN_BYTES = 4 << 20

_DTYPE_NAMES = {d: str(d) for d in (torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                                    torch.bool)}


def _const(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return f"float({str(v)!r})"
        return repr(v)
    if isinstance(v, complex):
        return f"complex({_const(v.real)}, {_const(v.imag)})"
    if isinstance(v, (bool, int, str, type(None))):
        return repr(v)
    if isinstance(v, sympy.Expr) and v.is_Integer:
        return repr(int(v))
    if isinstance(v, sympy.Expr):
        return to_py(v)  # a symbolic size, computed from the symbols bound at the top of call()
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_const(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    raise NotImplementedError(f"cannot write {type(v).__name__} into the wrapper")


def _op_path(op: Any) -> str:
    if isinstance(op, torch._ops.OpOverload):
        ns = op.namespace
        return f"torch.ops.{ns}.{op._schema.name.split('::')[-1]}.{op._overloadname}"
    raise NotImplementedError(f"extern call of {op!r}")


def _tuple(xs: Any) -> str:
    xs = [to_py(x) for x in xs]
    return "(" + ", ".join(xs) + ("," if len(xs) == 1 else "") + ")"


# an in-place ATen op may resize or restride a buffer (which the next call would then see), or
# make it an alias of another tensor: a buffer any in-place op reads is not pooled
def _in_place(op: Any) -> bool:
    name = getattr(op, "_schema", None)
    name = name.name.split("::")[-1] if name is not None else ""
    return name.endswith("_") or not name


#: ATen ops whose result is always a fresh dense row-major tensor (no check of its strides)
_FRESH_DENSE = {getattr(torch.ops.aten, n).default
                for n in ("mm", "addmm", "bmm", "baddbmm", "mv", "dot")}
try:  # oneDNN's linear (patterns.fuse_linears): a fresh row-major result too
    _FRESH_DENSE.add(torch.ops.mkldnn._linear_pointwise.default)
except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
    pass


@dataclasses.dataclass
class BufferPlan:
    """What a wrapper allocates, takes over and frees: the schedule's ``steps``, each buffer's
    ``last`` step, the names it never frees (``keep``: inputs, outputs, constants), ``reuse``
    and ``held`` (scheduler.plan_buffer_reuse), ``in_place`` (scheduler.plan_in_place), the
    ``pooled`` buffers, and every buffer by name (``buffers``)."""

    steps: list[Any]
    last: dict[str, int]
    keep: set[str]
    reuse: dict[str, str]
    held: set[str]
    in_place: dict[str, str]
    pooled: set[str]
    buffers: dict[str, Any]

    def live_bytes(self) -> list[int]:
        """Bytes of storage the wrapper holds during each step (the inputs' and constants'
        aside): every storage from the step that makes it (a region's allocation, an ATen
        result; a pooled buffer: the whole call) to the last step of any name that refers to it
        (a buffer that took it over or writes it in place, a view, an element of a tuple
        result; a returned one: the end). Symbolic sizes count at their example values."""
        roots: dict[str, set[str]] = {}   # name -> the storages it refers to
        start: dict[str, int] = {}
        nbytes: dict[str, int] = {}
        step_of: dict[str, int] = {}

        def new(name: str, i: int) -> None:
            lay = self.buffers[name].layout
            span = lay.storage_span()
            try:
                n = int(span)
            except TypeError:
                from ..sizes import size_hint
                n = int(size_hint(span))
            roots[name] = {name}
            start[name] = 0 if name in self.pooled else i
            nbytes[name] = n * lay.dtype.itemsize

        def refs(names: Any) -> set[str]:
            return set().union(*(roots.get(n, set()) for n in names)) if names else set()

        for i, st in enumerate(self.steps):
            if isinstance(st, CppRegion):
                for n in st.writes:
                    taken = self.in_place.get(n) or self.reuse.get(n)
                    if taken is not None:
                        roots[n] = set(roots.get(taken, set()))
                    else:
                        new(n, i)
                continue
            step_of[st.name] = i
            if isinstance(st, MultiOutput):
                parent = st.parent
                if _returns_alias(parent.op):
                    roots[st.name] = set(roots.get(parent.name, set()))
                else:  # a tuple of fresh tensors: made by the parent's step, held by it too
                    new(st.name, step_of.get(parent.name, i))
                    roots.setdefault(parent.name, set()).add(st.name)
            elif st.name in self.reuse:
                roots[st.name] = set(roots.get(self.reuse[st.name], set()))
            elif _returns_alias(st.op):
                roots[st.name] = refs(_reads_of(st))
            elif st.multi:
                roots.setdefault(st.name, set())
            else:
                new(st.name, i)
        end = len(self.steps) - 1
        stop: dict[str, int] = {r: start[r] for r in start}
        for name, rs in roots.items():
            j = end if name in self.keep else self.last.get(name, 0)
            for r in rs:
                stop[r] = max(stop[r], end if r in self.pooled else j)
        return [sum(nbytes[r] for r in start if start[r] <= i <= stop[r])
                for i in range(len(self.steps))]

    def peak_bytes(self) -> int:
        """The largest of :meth:`live_bytes` (0 for a wrapper without steps)."""
        return max(self.live_bytes(), default=0)


class WrapperWriter:
    def __init__(self, graph: Any, sched: Scheduler, sources: Any, key: str,
                 options: dict[str, Any] | None = None, target: Any = None):
        from .target import CppTarget

        self.g = graph
        self.s = sched
        self.sources = sources
        self.key = key
        self.options = options or {}
        self.target = target if target is not None else CppTarget()
        self._dev = self.target.alloc_kwargs()

    def value(self, v: Any) -> str:
        if isinstance(v, ReinterpretView):
            lay = v.layout
            return (f"_view({v.buffer.name}, {_tuple(lay.size)}, {_tuple(lay.stride)}, "
                    f"{to_py(lay.offset)})")
        if isinstance(v, Buffer):
            return v.name
        if isinstance(v, NoneValue):
            return "None"
        if isinstance(v, (list, tuple)):
            inner = ", ".join(self.value(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
        return _const(v)

    def generate(self) -> str:
        g, s = self.g, self.s
        regions = [st for st in s.steps if isinstance(st, CppRegion)]
        head = [
            f"# ember-inductor wrapper, graph {self.key[:16]}",
            "import ctypes",
            "import torch",
        ]
        if regions:
            head.extend(self.target.imports())
        # the pool's import goes here when the wrapper has one (known only below)
        pool_import = len(head)
        debug = bool(self.options.get("debug_fill"))
        if debug:  # runtime/debug_fill.py: every buffer filled, every write checked
            head.append("from ember_inductor.runtime import debug_fill as _dbg")
        head += [
            "",
            "_empty = _dbg.empty" if debug else "_empty = torch.empty_strided",
            "",
            "",
            "def _view(t, size, stride, offset):",
            "    return t.as_strided(size, stride, t.storage_offset() + offset)",
            "",
        ]
        consts = [t for t in g.constants]
        head.append(f"CONSTANTS = {consts!r}  # get_attr tensors, bound by the loader")
        if any(getattr(r, "checked", False) for r in regions):
            head += [
                "",
                "",
                "def _kernel_failed(status, kernel, ops):",
                "    # the kernel found what eager refuses (it read element 0 instead)",
                "    if status == 1:",
                "        raise IndexError(f\"index out of range in {ops} (Ember kernel {kernel})\")",
                "    raise RuntimeError(f\"ZeroDivisionError: integer division by zero in {ops} \"",
                "                       f\"(Ember kernel {kernel})\")",
                "",
            ]
        if regions:
            head.extend(self.target.header(regions, self.sources))
        head.append("")
        head.append("")
        arg_names = getattr(g, "arg_names", None) or [b.name for b in g.inputs]
        args = ", ".join(arg_names)
        body = [f"def call({args}):"]
        for sname, src in getattr(g, "sym_bindings", {}).items():
            body.append(f"    {sname} = {src}")
        gkey = repr(self.key[:16])
        if debug:
            body.extend(self._debug_input_checks(arg_names, gkey))
        # last use of every buffer, to free it early
        last = last_uses(s.steps)
        declared = False  # an ATen result checked against its declared strides (_as_declared)
        keep = set(s.output_names) | {b.name for b in g.inputs} | set(g.constants)
        # buffers a kernel writes over a dead one it reads (Triton: scheduler.plan_in_place)
        in_place = dict(getattr(s, "in_place", {}))
        # dead buffers whose storage a later buffer of the same dtype and extent takes over
        reuse, held = plan_buffer_reuse(s.steps, self._by_name, last, keep, in_place)
        # internal buffers kept between calls (runtime/pool.py): index in the pool, and the
        # symbols their sizes use (the pool's key)
        pooled, pool_syms = self._pooled(reuse, in_place)
        self.plan = BufferPlan(list(s.steps), last, keep, reuse, held, in_place, set(pooled),
                               self._by_name)
        pool_var = "pool"
        while pool_var in arg_names or pool_var in getattr(g, "sym_bindings", {}):
            pool_var += "_"
        # buffers a C++ region writes, and ATen results written through ``out=`` into a reused
        # buffer: in their declared layout (an ATen call's own result may come back with other
        # strides than its metadata's, so it is always viewed)
        region_writes = {n for st in s.steps if isinstance(st, CppRegion) for n in st.writes}
        region_writes |= {st.name for st in s.steps
                          if isinstance(st, ExternKernel) and st.name in reuse}
        for i, st in enumerate(s.steps):
            if isinstance(st, CppRegion):
                for n in st.writes:
                    buf = self._buffer(n)
                    lay = buf.layout
                    src = in_place.get(n)
                    if src is not None:
                        # the kernel reads each element of the dead buffer, then writes this
                        # one's over it (one in/out parameter): not filled in debug mode
                        note = f"in place: {st.name} writes {n} over {src}"
                        if src in region_writes and _same_layout(self._buffer(src).layout, lay):
                            body.append(f"    {n} = {src}  # {note}")
                        else:
                            body.append(f"    {n} = _view({src}, {_tuple(lay.size)}, "
                                        f"{_tuple(lay.stride)}, 0)  # {note}")
                        continue
                    old = reuse.get(n)
                    if old is not None:
                        olay = self._buffer(old).layout
                        if old in region_writes and _same_layout(olay, lay):
                            # the dead buffer already has this geometry: take the tensor as it
                            # is (an as_strided call costs about 2-3 us per line)
                            body.append(f"    {n} = {old}; del {old}  # reuse")
                        else:
                            body.append(f"    {n} = _view({old}, {_tuple(lay.size)}, "
                                        f"{_tuple(lay.stride)}, 0); del {old}  # reuse")
                        if debug:
                            body.append(f"    _dbg.fill({n})")
                        continue
                    if n in pooled:
                        body.append(f"    {n} = {pool_var}[{pooled[n]}]")
                        continue
                    body.append(f"    {n} = _empty({_tuple(lay.size)}, {_tuple(lay.stride)}, "
                                f"dtype={_DTYPE_NAMES[lay.dtype]}{self._dev})")
                args = list(st.reads + st.writes) + list(getattr(st, "size_args", []))
                desc = "; ".join(
                    f"{m.node.name}{list(m.node.layout.size)} <- "
                    f"{'+'.join(dict.fromkeys(getattr(m.node.data, 'origins', [])))[:60]}"
                    for grp in st.groups for m in grp.members if m.node.name not in s.local)
                ops = sorted({o for grp in st.groups for m in grp.members
                              for o in getattr(m.node.data, "origins", [])})
                body.extend(self.target.call(st, args, desc, ", ".join(ops)[:120]))
                if debug:
                    for n in st.writes:
                        body.append(f"    _dbg.check({gkey}, {st.name!r}, {n!r}, {n})")
            elif isinstance(st, ExternKernel):
                call = f"{_op_path(st.op)}({', '.join(self.value(a) for a in st.args)}"
                if st.kwargs:
                    call += (", " if st.args else "") + ", ".join(
                        f"{k}={self.value(v)}" for k, v in st.kwargs.items())
                shape = "" if st.multi else f" {list(st.layout.size)}"
                old = reuse.get(st.name)
                if old is not None:
                    # write into the dead buffer through the op's out= overload, in exactly
                    # the declared layout (out= keeps the strides of an out of the right size)
                    lay = st.layout
                    target = old
                    if not (old in region_writes and _same_layout(self._buffer(old).layout, lay)):
                        target = f"_view({old}, {_tuple(lay.size)}, {_tuple(lay.stride)}, 0)"
                    if debug:
                        body.append(f"    _dbg.fill({target})")
                    lin = self._linear_args(st)
                    if lin is not None:  # see below: linear.out runs addmm.out
                        body.append(f"    {st.name} = torch._C._nn.linear({', '.join(lin)}, "
                                    f"out={target}); del {old}  # {st.kind}{shape} reuse, "
                                    "addmm as linear")
                    else:
                        call = call.replace(_op_path(st.op), _op_path(out_overload(st.op)), 1)
                        call += (", " if st.args or st.kwargs else "") + f"out={target})"
                        body.append(f"    {st.name} = {call}; del {old}  # {st.kind}{shape} "
                                    "reuse")
                    if debug:
                        body.append(f"    _dbg.check({gkey}, {_op_path(st.op)!r}, "
                                    f"{st.name!r}, {st.name})")
                elif self._linear_args(st) is not None:
                    # addmm(bias, x, W.t()) of a linear layer: ATen's linear runs exactly that
                    # addmm (2-d input, a bias; linear.out: addmm.out) and transposes W in C++,
                    # where a view written here costs a Python call and an as_strided per
                    # layer (4x4 layers, one thread: 17.8 -> 13.6 us per layer; 20 -> 4 us
                    # with out=)
                    x, w, bias = self._linear_args(st)
                    body.append(f"    {st.name} = torch._C._nn.linear({x}, {w}, {bias})"
                                f"  # {st.kind}{shape} addmm as linear")
                elif not st.multi and st.layout is not None and st.op not in _FRESH_DENSE:
                    # ATen picks a result's strides from its inputs' layouts, which lowering
                    # may have stored otherwise than the graph's metadata says, and a fake
                    # kernel may predict other strides than the real one: checked per call,
                    # and copied to the strides the kernels read it at where they differ
                    lay = st.layout
                    declared = True
                    body.append(f"    {st.name} = _as_declared({call}), {_tuple(lay.size)}, "
                                f"{_tuple(lay.stride)})  # {st.kind}{shape}")
                else:
                    call += ")"
                    body.append(f"    {st.name} = {call}  # {st.kind}{shape}")
            elif isinstance(st, MultiOutput):
                idx = "".join(f"[{p}]" for p in st.path)
                lay = st.layout
                if lay is not None and getattr(st.parent, "op", None) not in _FRESH_DENSE:
                    declared = True
                    body.append(f"    {st.name} = _as_declared({st.parent.name}{idx}, "
                                f"{_tuple(lay.size)}, {_tuple(lay.stride)})")
                else:
                    body.append(f"    {st.name} = {st.parent.name}{idx}")
            dead = [n for n, j in last.items() if j == i and n not in keep and n not in held]
            if dead:
                body.append(f"    del {', '.join(sorted(dead))}")
        outs = []
        for o in g.outputs:
            outs.append(self.value(o))
        if debug:
            body.append(f"    _outs = ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
            body.append(f"    _dbg.check_outputs({gkey}, _outs, {self._writers()!r})")
            body.append("    return _outs")
        else:
            body.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        if declared:
            # an ATen result in the strides the kernels read it at (runtime/strides.py)
            head[pool_import:pool_import] = [
                "from ember_inductor.runtime.strides import as_declared as _as_declared"]
        if pooled:
            head[pool_import:pool_import] = ["from ember_inductor.runtime.pool import BufferPool"]
            head[-2:-2] = self._pool_lines(pooled, pool_syms)
            nsyms = len(getattr(g, "sym_bindings", {}))
            body[1 + nsyms:] = ([f"    {pool_var} = _pool.take({', '.join(pool_syms)})"]
                                + ([f"    _dbg.fill_all({pool_var})"] if debug else [])
                                + ["    try:"]
                                + ["    " + line for line in body[1 + nsyms:]]
                                + ["    finally:", f"        _pool.release({pool_var})"])
        return "\n".join(head + body) + "\n"

    def _debug_input_checks(self, arg_names: list[str], gkey: str) -> list[str]:
        """debug_fill: each tensor input with static sizes checked against the strides the
        graph was compiled for."""
        lines = []
        for name, b in zip(arg_names, self.g.inputs):
            lay = getattr(b, "layout", None)
            if lay is None:
                continue
            try:
                size = [int(x) for x in lay.size]
                stride = [int(x) for x in lay.stride]
            except TypeError:
                continue
            lines.append(f"    _dbg.check_strides({gkey}, {name!r}, {name}, {size}, {stride})")
        return lines

    def _writers(self) -> list[Any]:
        """debug_fill: (buffer, kernel or op) that writes each output's storage, or None."""
        writer: dict[str, str] = {}
        for st in self.s.steps:
            if isinstance(st, CppRegion):
                for n in st.writes:
                    writer[n] = st.name
            elif isinstance(st, ExternKernel):
                writer[st.name] = _op_path(st.op) if st.op is not None else st.kind
            elif isinstance(st, MultiOutput):
                writer[st.name] = f"{st.parent.name} output {list(st.path)}"
        out = []
        for o in self.g.outputs:
            if isinstance(o, (Buffer, ReinterpretView)):
                name = o.storage().name
                out.append((name, writer[name]) if name in writer else None)
            else:
                out.append(None)
        return out

    def _linear_args(self, st: ExternKernel) -> tuple[str, str, str] | None:
        """``(x, W, bias)`` when ``st`` is ``addmm(bias, x, W.t())`` with ``W`` a dense 2-d
        graph input (whose strides the guards fix) read through its exact transpose, a 1-d
        bias and float operands; else None."""
        if st.op is not torch.ops.aten.addmm.default or st.kwargs or len(st.args) != 3:
            return None
        bias, x, wt = st.args
        if not isinstance(wt, ReinterpretView) or not isinstance(wt.buffer, InputBuffer):
            return None
        if not all(isinstance(a, (Buffer, ReinterpretView)) for a in (bias, x)):
            return None
        lay, wlay = wt.layout, wt.buffer.layout
        vals = [*lay.size, *lay.stride, lay.offset, *wlay.size, *wlay.stride, wlay.offset]
        if not all(isinstance(v, int) or (isinstance(v, sympy.Integer)) for v in vals):
            return None
        if len(lay.size) != 2 or len(wlay.size) != 2 or lay.dtype not in (torch.float32,
                                                                            torch.float64):
            return None
        n, k = (int(v) for v in wlay.size)
        if ([int(v) for v in wlay.stride] != [k, 1] or int(wlay.offset) != 0
                or [int(v) for v in lay.size] != [k, n] or [int(v) for v in lay.stride] != [1, k]
                or int(lay.offset) != 0):
            return None
        blay = bias.layout
        if len(blay.size) != 1 or blay.size[0] != n or len(x.layout.size) != 2:
            return None
        return self.value(x), wt.buffer.name, self.value(bias)

    def _pooled(self, reuse: dict[str, str], in_place: dict[str, str]
                ) -> tuple[dict[str, int], list[str]]:
        """The buffers this wrapper allocates that can be kept between calls, numbered in the
        order they are made, and the size symbols of the pool's key. A buffer is kept when no
        buffer that shares its storage (one that took it over, an ATen result that aliases it)
        is a graph output, and no in-place ATen op reads any of them. A buffer a kernel writes
        in place, and the one it writes over, are not kept."""
        g, s = self.g, self.s
        if not self.options.get("buffer_pool", True) or not self.target.keeps_buffers():
            return {}, []
        shared = set(in_place) | set(in_place.values())
        roots = [n for st in s.steps if isinstance(st, CppRegion) for n in st.writes
                 if n not in reuse and n not in s.output_names and n not in shared]
        if not roots:
            return {}, []
        # names whose storage may outlive the call, closed under "shares storage with"
        escapes = set(s.output_names)
        for st in s.steps:
            if isinstance(st, ExternKernel) and _in_place(st.op):
                escapes |= _reads_of(st)
        changed = True
        while changed:
            changed = False
            for st in s.steps:
                if st.__class__ is CppRegion:
                    continue
                name = getattr(st, "name", None)
                if name in escapes:
                    shared = set()
                    if isinstance(st, MultiOutput):
                        shared.add(st.parent.name)
                    elif isinstance(st, ExternKernel) and _returns_alias(st.op):
                        shared |= _reads_of(st)
                    if not shared <= escapes:
                        escapes |= shared
                        changed = True
            for new, old in list(reuse.items()) + list(in_place.items()):
                if new in escapes and old not in escapes:
                    escapes.add(old)
                    changed = True
        bound = set(getattr(g, "sym_bindings", {}))
        min_bytes = self.options.get("buffer_pool_min_bytes", POOL_MIN_BYTES)
        pooled: dict[str, int] = {}
        used: set[str] = set()
        for n in roots:
            lay = self._buffer(n).layout
            if min_bytes > 0:
                ext = _extent(lay)  # None when symbolic: pooled only when every size is
                if ext is None or ext * lay.dtype.itemsize < min_bytes:
                    continue
            syms = {str(x) for e in (*lay.size, *lay.stride)
                    for x in getattr(sympy.sympify(e), "free_symbols", ())}
            if n in escapes or not syms <= bound or lay.dtype not in _DTYPE_NAMES:
                continue
            pooled[n] = len(pooled)
            used |= syms
        return pooled, [k for k in getattr(g, "sym_bindings", {}) if k in used]

    def _pool_lines(self, pooled: dict[str, int], syms: list[str]) -> list[str]:
        params = (" " + ", ".join(syms)) if syms else ""
        lines = ["", "# call()'s internal buffers (never returned), kept between calls: a buffer "
                 "is written", "# before it is read, as a fresh one would be (runtime/pool.py)",
                 f"_pool = BufferPool(lambda{params}: ["]
        for n in pooled:
            lay = self._buffer(n).layout
            lines.append(f"    _empty({_tuple(lay.size)}, {_tuple(lay.stride)}, "
                         f"dtype={_DTYPE_NAMES[lay.dtype]}{self._dev}),  # {n}")
        lines.append("])")
        return lines

    def _buffer(self, name: str) -> Buffer:
        return self._by_name[name]

    @property
    def _by_name(self) -> dict[str, Buffer]:
        if not hasattr(self, "_names"):
            self._names = {b.name: b for b in self.g.operations}
            self._names.update({b.name: b for b in self.g.inputs})
        return self._names



def generate_wrapper(graph: Any, sched: Scheduler, sources: Any, key: str,
                     options: dict[str, Any] | None = None, target: Any = None) -> str:
    """The wrapper's source; ``sources`` are the kernels ``target`` generated (default: the
    C++ target's sources). ``options["buffer_pool"]`` (default True) keeps its internal
    buffers allocated between calls (runtime/pool.py)."""
    return WrapperWriter(graph, sched, sources, key, options, target).generate()

