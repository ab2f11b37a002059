"""From the lowered graph to an ordered schedule.

* dependencies: each ComputedBuffer's body runs once under a recording ``ops`` handler, which lists
  the buffers it loads and at which index;
* dead code: what no output needs is dropped;
* fusion: consecutive C++ kernels (between ATen calls) are grouped into loop nests that share their
  outer loops. A node joins a group when its outer iteration space is the group's (a reduction's
  output space, or a prefix of a pointwise node's space) and every value it reads from the group is
  read at exactly the index where the group wrote it in the same outer iteration — so the group can
  run its outer loop in parallel. Reductions feeding consumers in the same group stay in registers;
  pointwise values consumed in the same inner loop are never stored;
* order: the program order, with a node moved up into the earliest group it can legally join;
* storage (for the wrapper): a buffer takes over the storage of one dead at an earlier step
  (:func:`plan_buffer_reuse`); on the Triton target a kernel also writes a result over a buffer it
  reads and that dies with it, each element read before it is overwritten
  (:func:`plan_in_place`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import sympy
import torch

from .ir import Buffer, ComputedBuffer, ExternKernel, MultiOutput, Reduction, ReinterpretView
from .sizes import FloorDiv, ModularIndexing, product, rvar, sym, var
from .virtualized import set_ops_handler

__all__ = ["Scheduler", "FusedGroup", "CppRegion", "LoopBlock", "plan_buffer_reuse",
           "plan_in_place", "step_uses", "last_uses"]


class _RecordHandler:
    """An ops handler that records loads (buffer name, index) and nothing else."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, Any]] = []
        self._n = 0

    def load(self, name: str, index: Any) -> Any:
        self.loads.append((name, index))
        return None

    def index_expr(self, expr: Any, dtype: Any) -> Any:
        # not a load; recorded under the name "" so that loop rewrites see every index use
        self.loads.append(("", expr))
        return None

    def indirect_indexing(self, value: Any, size: Any, wrap_negative: bool = True) -> Any:
        self._n += 1
        return sym(f"_ind{self._n}")

    def masked(self, mask: Any, body: Any, other: Any, dtype: Any) -> Any:
        return body()

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def _nontrivial(sizes: Sequence[Any]) -> list[Any]:
    return [s for s in sizes if s != 1]


@dataclasses.dataclass
class Member:
    node: ComputedBuffer
    index: list[Any]      # per range dim: a loop variable or 0
    rindex: list[Any]     # per reduction dim
    inner: list[Any]      # sizes of this member's inner loops (non-1)
    loads: list[tuple[str, Any]]
    store_index: Any


def loop_order(node: ComputedBuffer) -> list[int]:
    """The non-size-1 dims of ``node``'s ranges, outermost loop first: in the order of the stored
    layout's strides, so the innermost loop writes contiguously."""
    ranges, _ = node.iteration()
    dims = [i for i, s in enumerate(ranges) if s != 1]
    stride = node.layout.stride
    if len(stride) != len(ranges):
        return dims
    try:
        return sorted(dims, key=lambda i: -int(stride[i]))
    except TypeError:  # symbolic strides: ordered by their example values (a heuristic)
        from .sizes import SymbolicUnsupported, size_hint
        try:
            return sorted(dims, key=lambda i: -size_hint(stride[i]))
        except SymbolicUnsupported:
            return dims


def loop_sizes(node: ComputedBuffer) -> list[Any]:
    ranges, _ = node.iteration()
    return [ranges[i] for i in loop_order(node)]


def _member(node: ComputedBuffer, k: int) -> Member | None:
    """``node`` split as ``k`` outer loops plus its inner loops; None if it cannot be."""
    ranges, rranges = node.iteration()
    order = loop_order(node)
    nt = [ranges[i] for i in order]
    if isinstance(node.data, Reduction):
        if len(nt) != k:
            return None
        inner = _nontrivial(rranges)
    else:
        if len(nt) < k:
            return None
        inner = nt[k:]
    index: list[Any] = [0] * len(ranges)
    for j, d in enumerate(order):
        index[d] = var(j) if j < k else rvar(j - k)
    rindex: list[Any] = []
    j = 0
    for s in rranges:
        if s == 1:
            rindex.append(0)
        else:
            rindex.append(rvar(j))
            j += 1
    rec = _RecordHandler()
    with set_ops_handler(rec):
        node.body(index, rindex)
    return Member(node, index, rindex, inner, rec.loads, node.layout.index(index))


def _member_refined(node: ComputedBuffer, outer: list[Any]) -> Member | None:
    """A pointwise ``node`` in a group whose outer loops refine its own leading loops: each of
    its loop dims (outermost first) is the product of a run of consecutive ``outer`` dims until
    ``outer`` is used up (a [8192, 3072] cast after a [16, 512, 3072] GELU; a [8192, 768] cast
    after a LayerNorm over rows [16, 512]: the reshape between them), its remaining dims its
    inner loops. Its index is each run's row-major combination, a bijection onto its own
    points. None where the sizes do not line up (static sizes only)."""
    if isinstance(node.data, Reduction):
        return None
    ranges, rranges = node.iteration()
    order = loop_order(node)
    nt = [ranges[i] for i in order]
    try:
        nt_i = [int(x) for x in nt]
        outer_i = [int(x) for x in outer]
    except TypeError:
        return None
    if not outer_i:
        return None
    index: list[Any] = [0] * len(ranges)
    inner: list[Any] = []
    j = 0
    merged = False
    for d, size, size_i in zip(order, nt, nt_i):
        if j == len(outer_i):  # outer used up: an inner loop
            index[d] = rvar(len(inner))
            inner.append(size)
            continue
        expr: Any = sympy.Integer(0)
        p, first = 1, j
        while j < len(outer_i) and p < size_i:
            expr = expr * outer_i[j] + var(j)
            p *= outer_i[j]
            j += 1
        if p != size_i or j == first:
            return None
        merged = merged or j - first > 1
        index[d] = expr
    if j != len(outer_i) or not merged:
        return None  # no run of dims: equal sizes join the usual way
    rindex = [0] * len(rranges)
    rec = _RecordHandler()
    with set_ops_handler(rec):
        node.body(index, rindex)
    return Member(node, index, rindex, inner, rec.loads, node.layout.index(index))


@dataclasses.dataclass
class LoopBlock:
    inner: list[Any]
    members: list[Member]


@dataclasses.dataclass
class FusedGroup:
    outer: list[Any]
    members: list[Member]
    blocks: list[LoopBlock] = dataclasses.field(default_factory=list)
    #: programs sharing each row of the group's one looped reduction block (0: not split), as
    #: the target's split policy decided (Scheduler.split_policy)
    split: int = 0
    #: whether the rows' elements lie next to each other across rows (a reduction over all but
    #: a channels-last tensor's channels): tiles then span rows, not one row's elements
    xcontig: bool = False

    def names(self) -> set[str]:
        return {m.node.name for m in self.members}


@dataclasses.dataclass
class CppRegion:
    name: str
    groups: list[FusedGroup]
    reads: list[str] = dataclasses.field(default_factory=list)
    writes: list[str] = dataclasses.field(default_factory=list)


def _reads_of(op: Buffer) -> set[str]:
    names: set[str] = set()
    if isinstance(op, ExternKernel):
        def visit(a: Any) -> None:
            if isinstance(a, (Buffer, ReinterpretView)):
                names.add(a.storage().name)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)
            elif isinstance(a, dict):
                for x in a.values():
                    visit(x)
        visit(op.args)
        visit(op.kwargs)
    elif isinstance(op, MultiOutput):
        names.add(op.parent.name)
    return names


#: a pointwise value read only by later loop blocks of its group (a softmax's ``exp(x - max)``,
#: read back by the normalization) is kept in a row of at most this many elements on the stack
ROW_SCRATCH_MAX = 4096


#: reductions a split can finish by combining partial results of the same kind
SPLITTABLE = ("sum", "prod", "max", "min", "any", "all")


class Scheduler:
    """``split_policy(rows, row_length, xcontig) -> parts`` (the target's; None: never) says how
    many programs should share each row of a reduction with few long rows; a group whose
    looped blocks all get parts is cut into one group per looped block (codegen/triton.py
    ``generate_split``)."""

    def __init__(self, graph: Any, row_scratch: bool = False, split_policy: Any = None):
        self.graph = graph
        self.split_policy = split_policy
        self.steps: list[Any] = []            # CppRegion | ExternKernel | MultiOutput
        self.local: set[str] = set()          # buffers never stored (kept in registers)
        # (C++ only) buffers of ``local`` kept in a per-row stack array instead: name -> length
        self.row_scratch = row_scratch
        self.row_local: dict[str, int] = {}
        # (C++ only) buffers of ``local`` written into the one buffer that reads them, at the
        # same index, before it overwrites them (a softmax's exp(x - max), then its division)
        self.row_alias: dict[str, str] = {}
        # (Triton only, set by the target: plan_in_place) buffer -> the dead buffer its kernel
        # reads and writes it over, element by element
        self.in_place: dict[str, str] = {}
        self.output_names: set[str] = set()
        for o in graph.outputs:
            if isinstance(o, (Buffer, ReinterpretView)):
                self.output_names.add(o.storage().name)
        self._members: dict[str, Member] = {}
        self.run()

    # -- dependencies and dead code ---------------------------------------------------------------
    def _deps(self, op: Buffer) -> set[str]:
        if isinstance(op, ComputedBuffer):
            m = self._members.get(op.name)
            if m is None:
                m = _member(op, len(loop_sizes(op)))
                self._members[op.name] = m
            return {n for n, _ in m.loads if n}
        return _reads_of(op)

    def run(self) -> None:
        ops_ = self.graph.operations
        live = set(self.output_names)
        kept: list[Buffer] = []
        for op in reversed(ops_):
            side_effect = (isinstance(op, ExternKernel) and op.kind == "fallback" and op.multi
                           and not any(isinstance(o, MultiOutput) and o.parent is op for o in ops_))
            if op.name in live or side_effect:
                kept.append(op)
                live |= self._deps(op)
        kept.reverse()
        self.live = live
        self.users: dict[str, list[Any]] = {}
        for op in kept:
            for d in self._deps(op):
                self.users.setdefault(d, []).append(op)
        # fusion
        region: list[FusedGroup] = []
        regions = 0

        def flush() -> None:
            nonlocal region, regions
            if region:
                self.steps.append(CppRegion(f"kernel{regions}", region))
                regions += 1
                region = []

        for op in kept:
            if isinstance(op, ComputedBuffer):
                self._place(op, region)
            else:
                flush()
                self.steps.append(op)
        flush()
        for step in self.steps:
            if isinstance(step, CppRegion):
                if self.split_policy is not None:
                    step.groups = [p for g in step.groups for p in self._split_long_rows(g)]
                for g in step.groups:
                    self._blocks(g)
                    # (a hint for the kernel's tile candidates) before loops merge
                    g.xcontig = g.xcontig or any(
                        _x_contiguous(b, len(g.outer)) for b in g.blocks
                        if b.inner and any(isinstance(m.node.data, Reduction) for m in b.members))
                    merge_loops(g)
                self._region_io(step)

    def _place(self, node: ComputedBuffer, region: list[FusedGroup]) -> None:
        deps = self._deps(node)
        # search from the latest group back; stop at a group this node reads from
        for gi in range(len(region) - 1, -1, -1):
            g = region[gi]
            if self._try_join(g, node):
                return
            if deps & g.names():
                break
        sizes = loop_sizes(node)
        m = _member(node, len(sizes))
        region.append(FusedGroup(sizes, [m]))  # type: ignore[list-item]

    def _try_join(self, g: FusedGroup, node: ComputedBuffer) -> bool:
        k = len(g.outer)
        nt = loop_sizes(node)
        is_red = isinstance(node.data, Reduction)
        if nt[:k] != g.outer or (is_red and len(nt) != k):
            # a reduction may re-split a group of plain pointwise loops at its output space
            if (is_red and len(nt) < k and g.outer[:len(nt)] == nt and len(nt) > 0
                    and all(not m.inner and not isinstance(m.node.data, Reduction)
                            and loop_sizes(m.node)[:len(nt)] == nt for m in g.members)):
                members = [_member(m.node, len(nt)) for m in g.members]
                new = FusedGroup(nt, members)  # type: ignore[arg-type]
                if self._legal(new, node):
                    g.outer, g.members = new.outer, new.members
                    g.members.append(_member(node, len(nt)))  # type: ignore[arg-type]
                    return True
            # a pointwise node over a reshape of the group's outer loops (fewer, larger dims)
            if not is_red and g.members:
                m = _member_refined(node, g.outer)
                if m is not None and self._legal(g, node, m):
                    g.members.append(m)
                    return True
            return False
        if k == 0 and nt and 0 not in nt:  # product(nt) > 1, also for symbolic sizes
            return False  # would serialize a whole loop nest behind a scalar
        if self._legal(g, node):
            g.members.append(_member(node, k))  # type: ignore[arg-type]
            return True
        return False

    def _legal(self, g: FusedGroup, node: ComputedBuffer, m: Member | None = None) -> bool:
        m = m if m is not None else _member(node, len(g.outer))
        if m is None:
            return False
        stores = {mm.node.name: mm.store_index for mm in g.members}
        for name, index in m.loads:
            if name in stores and sympy.expand(index - stores[name]) != 0:
                return False
        return True

    @staticmethod
    def _partition(members: list[Member]) -> list[LoopBlock]:
        """Consecutive members over the same inner loops, none reading a reduction of its
        block, share a loop block."""
        blocks: list[LoopBlock] = []
        for m in members:
            b = blocks[-1] if blocks else None
            reads = {n for n, _ in m.loads}
            if (b is not None and b.inner == m.inner and
                    not any(isinstance(x.node.data, Reduction) and x.node.name in reads
                            for x in b.members)):
                b.members.append(m)
            else:
                blocks.append(LoopBlock(m.inner, [m]))
        return blocks

    def _split_long_rows(self, g: FusedGroup) -> list[FusedGroup]:
        """``g`` as it is, or, where the split policy gives every looped block of it parts (few
        rows, long ones: a batch norm's statistics over N*H*W per channel), one group per
        looped block, each with the row-sized members that follow it. Values a later block
        reads from an earlier one are then stored and loaded (a second read of the rows where
        the group would have kept them in registers): the price of filling the GPU."""
        blocks = self._partition(g.members)
        looped = [b for b in blocks if b.inner]
        if not looped:
            return [g]
        k = len(g.outer)
        parts = []
        for b in looped:
            reds = [m for m in b.members if isinstance(m.node.data, Reduction)]
            if not reds or any(m.node.data.reduction_type not in SPLITTABLE for m in reds):
                return [g]
            xc = _x_contiguous(b, k)
            n = self.split_policy(_hint(product(g.outer) if g.outer else 1),
                                  _hint(product(b.inner)), xc)
            if not n:
                return [g]
            parts.append((n, xc))
        # row-sized members before the first looped block: a group of their own (every part
        # of a split kernel would compute them)
        out: list[FusedGroup] = []
        i = 0
        for b in blocks:
            if b.inner:
                n, xc = parts[i]
                i += 1
                out.append(FusedGroup(list(g.outer), list(b.members), split=n, xcontig=xc))
            elif out:
                out[-1].members.extend(b.members)
            else:
                out.append(FusedGroup(list(g.outer), list(b.members)))
        return out

    def _blocks(self, g: FusedGroup) -> None:
        blocks = self._partition(g.members)
        g.blocks = blocks
        # which values never need storing
        pending: list[tuple[Member, list[Any]]] = []
        for bi, b in enumerate(blocks):
            for m in b.members:
                name = m.node.name
                if name in self.output_names:
                    continue
                users = self.users.get(name, [])
                if isinstance(m.node.data, Reduction):
                    ok = all(u in [x.node for x in g.members] for u in users)
                else:
                    ok = all(u in [x.node for x in b.members] for u in users)
                    if not ok and self._row_scratch_ok(g, bi, m, users):
                        pending.append((m, users))
                if ok:
                    self.local.add(name)
        for m, users in pending:  # once the users' own storage is known
            alias = self._row_alias(g, m, users)
            if alias is not None:
                self.row_alias[m.node.name] = alias
            elif self._row_scratch_len(m):
                self.row_local[m.node.name] = int(m.inner[0])
            else:
                continue
            self.local.add(m.node.name)

    def _row_scratch_ok(self, g: FusedGroup, bi: int, m: Member, users: list[Any]) -> bool:
        """``m`` (pointwise, one inner loop) is read only by members of its own block and of later
        blocks of ``g`` over the same inner loop, where it was written (the scheduler's legality
        rule): a stack row of its values replaces the buffer (computed once, not recomputed, and
        not written to memory: a residual read back by the next norm of the row)."""
        if not self.row_scratch or len(m.inner) != 1 or not users:
            return False
        # users in its own block read it from a register; later blocks from the row
        later = {id(x.node): b.inner for b in g.blocks[bi:] for x in b.members}
        return (all(id(u) in later and list(later[id(u)]) == list(m.inner) for u in users)
                and any(id(u) in later for b in g.blocks[bi + 1:] for u in users
                        if u in [x.node for x in b.members]))

    @staticmethod
    def _row_scratch_len(m: Member) -> bool:
        n = m.inner[0]
        return isinstance(n, (int, sympy.Integer)) and 1 < int(n) <= ROW_SCRATCH_MAX

    def _row_alias(self, g: FusedGroup, m: Member, users: list[Any]) -> str | None:
        """The one user of ``m`` that stores its result where ``m`` would, in the same dtype:
        ``m``'s values can be written there and read back (then overwritten) by it."""
        if len(users) != 1:
            return None
        u = next((x for x in g.members if x.node is users[0]), None)
        if (u is None or isinstance(u.node.data, Reduction) or u.node.dtype != m.node.dtype
                or u.node.name in self.local):
            return None
        try:
            if sympy.expand(u.store_index - m.store_index) != 0:
                return None
        except TypeError:
            return None
        return u.node.name

    def _region_io(self, r: CppRegion) -> None:
        written = []
        read: list[str] = []
        for g in r.groups:
            for m in g.members:
                if m.node.name not in self.local:
                    written.append(m.node.name)
        for g in r.groups:
            for m in g.members:
                for n, _ in m.loads:
                    if n and n not in written and n not in self.local and n not in read:
                        read.append(n)
        r.reads, r.writes = read, written


def _hint(n: Any) -> int:
    """A size as an integer (a symbolic one: its example value, which steers heuristics only)."""
    try:
        return int(n)
    except TypeError:
        from .sizes import size_hint
        return int(size_hint(n))


def _x_contiguous(b: LoopBlock, k: int) -> bool:
    """Whether more of ``b``'s loads walk memory along the rows' innermost outer loop than
    along the innermost loop of a row (loads that depend on the row loops only)."""
    if k == 0:
        return False
    xv = var(k - 1)
    votes = 0
    for m in b.members:
        rvs = [r for r in m.rindex if r != 0] if isinstance(m.node.data, Reduction) else []
        if not rvs:
            continue
        rv = rvs[-1]
        for _, e in m.loads:
            e = sympy.expand(sympy.sympify(e))
            if e.coeff(rv) == 0 and not any(e.coeff(r) != 0 for r in rvs):
                continue
            if e.coeff(xv) == 1:
                votes += 1
            elif e.coeff(rv) == 1:
                votes -= 1
    return votes > 0


def _coeffs(e: Any, vs: Sequence[Any]) -> list[Any] | None:
    """Coefficients of ``e`` in the loop variables ``vs``; None unless ``e`` is affine in them."""
    # expanded first: e.coeff(v) reads only the terms of a sum, so s*(x1 + 64) (a symbolic
    # stride times an offset index: sympy distributes only numbers) gave x1 the coefficient 0,
    # and loops were merged that the access does not walk as one (wrong elements read)
    e = sympy.expand(sympy.sympify(e))
    # e.coeff(v) does not see v inside a function: Min/Max (a clamp, a pooling window's size)
    # read as not depending on v, and merging loops then evaluated them at v = 0
    for atom in e.atoms(FloorDiv, ModularIndexing, sympy.Min, sympy.Max):
        if atom.free_symbols & set(vs):
            return None
    out = []
    for v in vs:
        c = e.coeff(v)
        if c.free_symbols & set(vs):
            return None
        out.append(c)
    return out


def _try_merge(exprs: list[Any], vs: list[Any], sizes: list[Any]) -> dict[Any, Any] | None:
    """A substitution merging two adjacent loops into one, when every index expression walks
    them as one (coefficient of the outer = coefficient of the inner * the inner's size)."""
    coeffs = [_coeffs(e, vs) for e in exprs]
    if any(c is None for c in coeffs):
        return None
    for i in range(len(vs) - 2, -1, -1):
        if all(c[i] == c[i + 1] * sizes[i + 1] for c in coeffs):  # type: ignore[index]
            sub: dict[Any, Any] = {vs[i]: sympy.Integer(0), vs[i + 1]: vs[i]}
            for j in range(i + 2, len(vs)):
                sub[vs[j]] = vs[j - 1]
            return {"at": i, "sub": sub}
    return None


def _subst(m: Member, sub: dict[Any, Any], inner: bool) -> None:
    m.index = [sympy.sympify(i).xreplace(sub) for i in m.index]
    m.rindex = [sympy.sympify(i).xreplace(sub) for i in m.rindex]
    m.loads = [(n, sympy.sympify(e).xreplace(sub)) for n, e in m.loads]
    m.store_index = sympy.sympify(m.store_index).xreplace(sub)


def merge_loops(g: FusedGroup) -> None:
    """Merge adjacent loops that every access walks contiguously as one (NCHW elementwise work
    becomes one long vectorizable loop instead of short rows)."""
    def exprs(members: Sequence[Member]) -> list[Any]:
        out = []
        for m in members:
            out.append(m.store_index)
            out.extend(e for _, e in m.loads)
        return out

    if all(not b.inner for b in g.blocks):
        while len(g.outer) > 1:
            vs = [var(i) for i in range(len(g.outer))]
            r = _try_merge(exprs(g.members), vs, g.outer)
            if r is None:
                break
            i = r["at"]
            for m in g.members:
                _subst(m, r["sub"], False)
            g.outer = g.outer[:i] + [g.outer[i] * g.outer[i + 1]] + g.outer[i + 2:]
        return
    for b in g.blocks:
        while len(b.inner) > 1:
            vs = [rvar(i) for i in range(len(b.inner))]
            r = _try_merge(exprs(b.members), vs, b.inner)
            if r is None:
                break
            i = r["at"]
            for m in b.members:
                _subst(m, r["sub"], True)
            b.inner = b.inner[:i] + [b.inner[i] * b.inner[i + 1]] + b.inner[i + 2:]
            for m in b.members:
                m.inner = b.inner





def _extent(layout: Any) -> int | None:
    """Elements of storage a dense-or-strided layout spans (None when sizes are symbolic)."""
    try:
        size = [int(s) for s in layout.size]
        stride = [int(s) for s in layout.stride]
        offset = int(getattr(layout, "offset", 0) or 0)
    except TypeError:
        return None
    if any(s == 0 for s in size):
        return None
    return offset + 1 + sum((s - 1) * st for s, st in zip(size, stride))


def _returns_alias(op: Any) -> bool:
    schema = getattr(op, "_schema", None)
    if schema is None:
        return True
    return any(r.alias_info is not None for r in schema.returns)


# ATen ops whose ``out=`` overload the wrapper calls to write into a dead buffer; each takes the
# default overload's arguments plus ``out`` and keeps ``out``'s strides when its size is right
_OUT_OPS = ("mm", "addmm", "bmm", "baddbmm")


def out_overload(op: Any) -> Any:
    """The ``.out`` overload an extern call of ``op`` may write through, or None."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return None
    if op._overloadname != "default" or op._schema.name.split("::")[-1] not in _OUT_OPS:
        return None
    return getattr(op.overloadpacket, "out", None)


def _dense(layout: Any) -> bool:
    """Non-overlapping and dense, offset 0: any same-extent storage can hold it through a view."""
    try:
        size = [int(s) for s in layout.size]
        stride = [int(s) for s in layout.stride]
        if int(getattr(layout, "offset", 0) or 0) != 0:
            return False
    except TypeError:
        return False
    expect = 1
    for sz, st in sorted(((sz, st) for sz, st in zip(size, stride) if sz != 1),
                         key=lambda p: p[1]):
        if st != expect:
            return False
        expect *= sz
    return True


def step_uses(st: Any) -> list[str]:
    """The buffers a schedule step reads or writes: a wrapper frees each after the last step
    that uses it."""
    if isinstance(st, CppRegion):
        return list(st.reads) + list(st.writes)
    out = list(_reads_of(st))
    out.append(st.name)
    return out


def last_uses(steps: Sequence[Any]) -> dict[str, int]:
    """Each buffer's last step (:func:`step_uses`)."""
    last: dict[str, int] = {}
    for i, st in enumerate(steps):
        for n in step_uses(st):
            last[n] = i
    return last


def _aliased(steps: Sequence[Any]) -> set[str]:
    """Buffers that share storage with another name: read by an ATen op whose result aliases an
    argument (a view), that result, and the elements of multi-output results."""
    aliased: set[str] = set()
    for st in steps:
        if isinstance(st, ExternKernel) and _returns_alias(st.op):
            aliased |= _reads_of(st)
            aliased.add(st.name)
        elif isinstance(st, MultiOutput):
            aliased.add(st.name)
    return aliased


def _owned(steps: Sequence[Any]) -> set[str]:
    """Buffers whose storage the graph made: a region's writes, single ATen results."""
    owned: set[str] = set()
    for st in steps:
        if isinstance(st, CppRegion):
            owned.update(st.writes)
        elif isinstance(st, ExternKernel) and not st.multi:
            owned.add(st.name)
    return owned


def _same_layout(a: Any, b: Any) -> bool:
    """Same sizes, strides, offset 0, dtype and device (sympy-equal expressions for symbolic
    ones)."""
    try:
        return (len(a.size) == len(b.size) and len(a.stride) == len(b.stride)
                and a.dtype == b.dtype and str(a.device) == str(b.device)
                and all(sympy.sympify(x - y) == 0 for x, y in zip(a.size, b.size))
                and all(sympy.sympify(x - y) == 0 for x, y in zip(a.stride, b.stride))
                and sympy.sympify(a.offset) == 0 and sympy.sympify(b.offset) == 0)
    except (TypeError, AttributeError):
        return False


def plan_in_place(sched: "Scheduler", outputs: bool) -> dict[str, str]:
    """Which buffers a kernel writes over a buffer it reads that dies with it (Triton only).

    A Triton kernel (one fused group of a region at step ``i``) writing ``N`` may store into the
    storage of a buffer ``O`` when
    * ``O`` is a buffer the region reads whose last use is step ``i``, and which the graph made and
      owns (a region's write, or an ATen result whose schema says it is a fresh tensor; not an
      input, a constant, an output, a view or an alias: :func:`plan_buffer_reuse`'s rules), read
      by no later group of the region;
    * ``N`` fits in ``O``'s storage: the same layout (sizes, strides, offset 0, dtype, device),
      or, with static sizes, the same dtype and device and a dense ``N`` spanning no more
      elements than ``O`` (a 2-d product read back as 3-d activations);
    * ``N``'s member reads ``O``, and every load of ``O`` in the group is at exactly ``N``'s
      store index, in ``N``'s member, in a member before it in its loop block, or in an earlier
      loop block over the same inner loops: so each element of ``O`` is read, by the program
      that writes it, before ``N``'s value (computed from it) replaces it;
    * ``N`` is not a graph output unless ``outputs`` (the target keeps no buffers between calls:
      a kept buffer's storage must never be returned).

    The C++ target does not call this: its kernels declare their pointers ``__restrict__``.
    Returns ``{N: O}``."""
    graph = sched.graph
    steps = sched.steps
    last = last_uses(steps)
    keep = (set(sched.output_names) | {b.name for b in graph.inputs}
            | set(getattr(graph, "constants", {})))
    buffers = {b.name: b for b in graph.operations}
    aliased, owned = _aliased(steps), _owned(steps)
    out: dict[str, str] = {}
    for i, st in enumerate(steps):
        if not isinstance(st, CppRegion):
            continue
        readers: dict[str, int] = {}  # buffer -> the last group of the region that loads it
        for gi, g in enumerate(st.groups):
            for m in g.members:
                for n, _ in m.loads:
                    if n:
                        readers[n] = gi
        for gi, g in enumerate(st.groups):
            for o in st.reads:
                if (readers.get(o) != gi or last.get(o) != i or o in keep or o in aliased
                        or o not in owned or o not in buffers):
                    continue
                olay = getattr(buffers[o], "layout", None)
                if olay is None or _overlaps(olay):
                    continue
                n = next((m.node.name for bn, b in enumerate(g.blocks) for m in b.members
                          if m.node.name in st.writes and m.node.name not in out
                          and (outputs or m.node.name not in sched.output_names)
                          and _fits_over(m.node.layout, olay) and _in_place_ok(g, bn, m, o)),
                         None)
                if n is not None:
                    out[n] = o
    return out


def _fits_over(new: Any, old: Any) -> bool:
    """``new`` can be stored in ``old``'s storage: the same layout, or (static sizes) the same
    dtype and device, offsets 0, ``new`` dense and spanning no more elements than ``old`` (a
    product of 2-d operands, ``[8192, 3072]``, read as the activations ``[8, 1024, 3072]``).
    Which element goes where is the loads' matter (:func:`_in_place_ok`: each is read at the
    storage index it is overwritten at)."""
    if _same_layout(old, new):
        return True
    try:
        if (new.dtype != old.dtype or str(new.device) != str(old.device)
                or int(sympy.sympify(old.offset)) != 0):
            return False
    except TypeError:
        return False
    n, o = _extent(new), _extent(old)
    return _dense(new) and n is not None and o is not None and n <= o


def _overlaps(layout: Any) -> bool:
    """A dim of more than one element with stride 0 (elements share storage); symbolic sizes
    and strides: only a literal 0 stride counts."""
    for sz, st in zip(layout.size, layout.stride):
        if sympy.sympify(st) == 0 and sympy.sympify(sz) != 1:
            return True
    return False


def _in_place_ok(g: FusedGroup, bn: int, mn: Member, o: str) -> bool:
    """Every load of ``o`` in ``g`` is at ``mn``'s store index and runs before ``mn``'s store:
    in ``mn`` itself, in a member before it in its block ``bn``, or in an earlier block over
    the same inner loops; and ``mn`` itself reads ``o`` (each value it stores then depends on
    the element it overwrites: no thread of the program stores it before that is loaded)."""
    if not any(n == o for n, _ in mn.loads):
        return False
    for bi, b in enumerate(g.blocks):
        before = True
        for m in b.members:
            for n, e in m.loads:
                if n != o:
                    continue
                if bi > bn or (bi == bn and not before) or (bi < bn and b.inner != g.blocks[
                        bn].inner):
                    return False
                try:
                    if sympy.expand(sympy.sympify(e) - mn.store_index) != 0:
                        return False
                except TypeError:
                    return False
            if m is mn:
                before = False
    return True


def plan_buffer_reuse(steps: Sequence[Any], buffers: dict[str, Any], last: dict[str, int],
                      keep: set[str], in_place: dict[str, str] | None = None
                      ) -> tuple[dict[str, str], set[str]]:
    """Which buffers a wrapper can take over from dead ones instead of allocating.

    ``steps`` are the schedule's steps, ``last[name]`` the step of each buffer's last use,
    ``keep`` the names never freed (inputs, outputs, constants). A buffer written by a C++ region
    may reuse the storage of a buffer that died at an earlier step (a region's buffer, or the
    result of an ATen call whose schema says it is a fresh tensor) of the same dtype, device and
    storage extent; so may the dense result of an ATen call with an ``out=`` overload
    (:func:`out_overload`), which the wrapper then writes through ``out=``. A buffer dead after
    step ``j`` is offered from step ``j + 1`` on, so a call never writes into its own input. A
    dead buffer is held for reuse only when a later allocation of its kind is
    still unmatched, so nothing is kept alive that would not be reused. ``in_place`` (from
    :func:`plan_in_place`, ``{N: O}``): ``N`` allocates nothing, and ``O``'s storage lives on
    as ``N``'s.

    Returns ``(reuse, held)``: ``reuse[new] = old`` and the names held instead of freed."""
    in_place = in_place or {}
    aliased = _aliased(steps)

    def key(name: str) -> Any:
        b = buffers.get(name)
        lay = getattr(b, "layout", None)
        if lay is None or name in aliased or name in keep:
            return None
        ext = _extent(lay)
        return None if ext is None else (lay.dtype, str(lay.device), ext)

    allocs: list[tuple[int, str, Any]] = []
    for i, st in enumerate(steps):
        if isinstance(st, CppRegion):
            for n in st.writes:
                k = key(n)
                if k is not None and n not in in_place:
                    allocs.append((i, n, k))
        elif (isinstance(st, ExternKernel) and not st.multi and out_overload(st.op) is not None
              and "out" not in st.kwargs and _dense(st.layout)):
            k = key(st.name)
            if k is not None:
                allocs.append((i, st.name, k))
    reusable_origin = _owned(steps) - set(in_place.values())
    deaths: dict[int, list[str]] = {}
    for n, j in last.items():
        if n in reusable_origin and key(n) is not None:
            deaths.setdefault(j, []).append(n)
    pool: dict[Any, list[str]] = {}
    reuse: dict[str, str] = {}
    held: set[str] = set()
    ai = 0
    for i in range(len(steps)):
        # allocations of step i (before its call)
        while ai < len(allocs) and allocs[ai][0] == i:
            _, n, k = allocs[ai]
            ai += 1
            if pool.get(k):
                reuse[n] = pool[k].pop(0)
        # deaths after step i: hold a buffer if a later allocation of its kind is unmatched
        for n in sorted(deaths.get(i, [])):
            k = key(n)
            later = sum(1 for (j, _, kk) in allocs[ai:] if kk == k)
            if later > len(pool.get(k, [])):
                pool.setdefault(k, []).append(n)
                held.add(n)
    # a held buffer nobody took (cannot happen with the count above, but stay safe): not held
    taken = set(reuse.values())
    held &= taken
    return reuse, held
