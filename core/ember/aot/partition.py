"""Split a functional joint graph into a forward and a backward graph with a min cut.

The question is which values the forward saves for the backward. Every value the backward uses
that does not depend on a tangent is either saved (costs its bytes of memory until the backward
runs) or recomputed in the backward from other saved values (costs time). We build a flow
network in which each forward value ``n`` is an edge ``n_in -> n_out`` whose capacity is its size
in bytes; values that are cheap to recompute (pointwise and view ops) pass flow on to their users
for free, values that must exist in the forward (inputs, values the forward outputs need, and
expensive or random ops, which we never recompute) are fed from the source, and values the
backward consumes drain into the sink. A minimum cut is then the cheapest set of values to save:
expensive results (matmul, convolution, reductions, random masks) are saved; chains of pointwise
ops after them are recomputed.

Random ops are never recomputed, so the backward always reuses the forward's random draw.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
from typing import Any

import torch
import torch.fx as fx

__all__ = ["Partition", "partition_joint", "saved_bytes"]

aten = torch.ops.aten
INF = 1 << 62
# Added to the cost of saving a value that shares memory with a forward output without being
# one (a view of an output, the base an output views; for a backend without recompute, the
# outputs too). The user may write into that output between the forward and the backward
# (eager allows it wherever eager's own formulas saved something else); such a saved value
# would then be stale, and autograd refuses a saved view made in the forward whose base was
# written. Large, but finite: when nothing else can be saved, it still is (and autograd's
# version check reports the write).
_ALIAS_OF_OUTPUT = 1 << 40

# Recomputing these in the backward is cheap (memory-bound, usually fused by a real backend).
_CHEAP_EXTRA = {
    aten.clone.default, aten._to_copy.default, aten.full.default, aten.zeros.default,
    aten.ones.default, aten.scalar_tensor.default, aten.full_like.default,
    aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default,
    aten.empty.memory_format, aten.expand.default, aten.view.default, aten._unsafe_view.default,
    aten.reshape.default, aten.squeeze.dim, aten.unsqueeze.default, aten.permute.default,
    aten.t.default, aten.transpose.int, aten.slice.Tensor, aten.select.int,
    aten.alias.default, aten.detach.default, aten.where.self, aten.lift_fresh_copy.default,
}


def is_random(n: fx.Node) -> bool:
    t = n.target
    return (n.op == "call_function" and isinstance(t, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in t.tags)


def is_recomputable(n: fx.Node, compute: bool = True) -> bool:
    """May the backward recompute ``n`` rather than have it saved? Views (no work) always;
    cheap memory-bound ops (pointwise, copies, fills) only with ``compute``: a backend that fuses
    them into its kernels recomputes them for free, one that runs each op as a kernel of its own
    (``aot_eager``, ``cudagraphs``) would pay an extra pass over memory for each."""
    if n.op != "call_function":
        return False
    t = n.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload) or is_random(n):
        return False
    if t.is_view:
        return True
    return compute and (t in _CHEAP_EXTRA or torch.Tag.pointwise in t.tags)


def is_checkpointed(n: fx.Node) -> bool:
    """A forward value of an activation-checkpointed region (``torch.utils.checkpoint``):
    recomputed in the backward, never saved (random ops excepted)."""
    return "ember_recompute" in n.meta.get("custom", ()) and not is_random(n)


def _leaves_region(n: fx.Node, fwd_needed: set[fx.Node]) -> bool:
    """Does a forward value of a checkpointed region feed forward code outside the region
    (``fwd_needed``: what the forward outputs are computed from)?"""
    region = n.meta["custom"]["ember_recompute"]
    return any(u.op == "output" or (u in fwd_needed and
                                    u.meta.get("custom", {}).get("ember_recompute") != region)
               for u in n.users)


def _tensor_bytes(v: Any) -> int | None:
    if isinstance(v, torch.Tensor):
        return max(1, _hint(v.numel() * v.element_size()))
    return None


def _hint(v: Any) -> int:
    """A size as an int: a symbolic one by its example value (no guard added; a data-dependent
    one by a stand-in value)."""
    if isinstance(v, torch.SymInt):
        from .symbolic import example_hint

        return int(example_hint(v))
    return int(v)


def is_sym_node(n: fx.Node) -> bool:
    """A node whose value is a SymInt/SymFloat/SymBool (a size, under dynamic shapes)."""
    return isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))


def saved_bytes(nodes: list[fx.Node]) -> int:
    return sum(_tensor_bytes(n.meta.get("val")) or 0 for n in nodes)


@dataclasses.dataclass
class Partition:
    # inputs: primals; outputs: forward outputs, then saved tensors, then saved sizes (SymInts)
    fw: fx.GraphModule
    # inputs: saved tensors, then saved sizes, then tangents; outputs: gradients
    bw: fx.GraphModule
    n_saved: int  # saved tensors
    saved_names: list[str]
    saved_bytes: int
    # per gradient output: the tangent positions it depends on (all None -> gradient is None)
    grad_tangent_deps: list[frozenset[int]] = dataclasses.field(default_factory=list)
    # per primal: the forward outputs (positions) whose value it flows into. A gradient that
    # depends on no tangent at all (a zeros tensor: angle or sgn of a real input, the gradient of
    # copysign's sign argument) exists in eager as soon as one of these outputs gets a gradient.
    primal_reaches: list[frozenset[int]] = dataclasses.field(default_factory=list)
    # dynamic shapes: sizes (SymInts) the backward reads, returned by the forward after the
    # saved tensors as ints (never recomputed in the backward from a tensor it does not have)
    n_saved_sym: int = 0


class _FlowGraph:
    """Dinic's max flow over string-named vertices."""

    def __init__(self) -> None:
        self.idx: dict[str, int] = {}
        self.adj: list[list[int]] = []
        self.to: list[int] = []
        self.cap: list[int] = []

    def v(self, name: str) -> int:
        i = self.idx.get(name)
        if i is None:
            i = self.idx[name] = len(self.adj)
            self.adj.append([])
        return i

    def add(self, a: str, b: str, c: int) -> None:
        u, w = self.v(a), self.v(b)
        self.adj[u].append(len(self.to)); self.to.append(w); self.cap.append(c)
        self.adj[w].append(len(self.to)); self.to.append(u); self.cap.append(0)

    def _bfs(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self.adj)
        level[s] = 0
        q = collections.deque([s])
        while q:
            u = q.popleft()
            for e in self.adj[u]:
                if self.cap[e] > 0 and level[self.to[e]] < 0:
                    level[self.to[e]] = level[u] + 1
                    q.append(self.to[e])
        return level if level[t] >= 0 else None

    def max_flow(self, s_name: str, t_name: str) -> set[int]:
        """Runs max flow; returns the vertices reachable from the source in the residual graph."""
        s, t = self.v(s_name), self.v(t_name)
        while True:
            level = self._bfs(s, t)
            if level is None:
                break
            it = [0] * len(self.adj)
            path: list[int] = []
            u = s
            while True:  # iterative blocking-flow search (graphs can be thousands deep)
                if u == t:
                    f = min(self.cap[e] for e in path)
                    for e in path:
                        self.cap[e] -= f
                        self.cap[e ^ 1] += f
                    path.clear()
                    u = s
                    continue
                advanced = False
                while it[u] < len(self.adj[u]):
                    e = self.adj[u][it[u]]
                    w = self.to[e]
                    if self.cap[e] > 0 and level[w] == level[u] + 1:
                        path.append(e)
                        u = w
                        advanced = True
                        break
                    it[u] += 1
                if not advanced:
                    if u == s:
                        break
                    level[u] = -1  # dead end in this phase
                    e = path.pop()
                    u = self.to[e ^ 1]
                    it[u] += 1
        seen = {s}
        q = collections.deque([s])
        while q:
            u = q.popleft()
            for e in self.adj[u]:
                if self.cap[e] > 0 and self.to[e] not in seen:
                    seen.add(self.to[e])
                    q.append(self.to[e])
        return seen


def partition_joint(joint: fx.GraphModule, n_primals: int, n_fwd_outs: int,
                    mutated_primals: set[int], recompute: bool = True) -> Partition:
    """Partition ``joint`` (inputs: primals then tangents; outputs: forward outputs then grads).
    ``recompute``: the backend fuses cheap ops (see :func:`is_recomputable`); without it only
    views are recomputed, and the backward gets what it reads, as eager saves it."""
    g = joint.graph
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    primals, tangents = placeholders[:n_primals], placeholders[n_primals:]
    out_node = next(n for n in g.nodes if n.op == "output")
    outs = list(out_node.args[0])
    fwd_outs, grad_outs = outs[:n_fwd_outs], outs[n_fwd_outs:]
    order = {n: i for i, n in enumerate(g.nodes)}

    deps: dict[fx.Node, frozenset[int]] = {t: frozenset([i]) for i, t in enumerate(tangents)}
    for n in g.nodes:
        if n.op == "call_function":
            d = frozenset().union(*[deps.get(a, frozenset()) for a in n.all_input_nodes])
            if d:
                deps[n] = d
    tangent_dep: set[fx.Node] = set(deps)

    bw_needs: set[fx.Node] = set()  # forward values the backward reads directly
    for n in _ancestors([o for o in grad_outs if isinstance(o, fx.Node)]):
        if n in tangent_dep:
            bw_needs.update(a for a in n.all_input_nodes
                            if a not in tangent_dep and a.op != "get_attr")
    for o in grad_outs:
        if isinstance(o, fx.Node) and o not in tangent_dep:
            bw_needs.add(o)

    saved: list[fx.Node] = []
    if bw_needs:
        fwd_needed = _ancestors([o for o in fwd_outs if isinstance(o, fx.Node)])
        aliases_output = _aliases_of_outputs(g, fwd_outs)
        if not recompute:
            # Without recompute a backend would save the outputs themselves more often (eager
            # does: a sigmoid's result); one the user writes in place after the call makes the
            # whole graph's backward raise, even when only an output the loss never reads
            # needed it (eager checks only the nodes its backward reaches). Recomputed instead
            # where possible, as the aliases of outputs are.
            aliases_output |= {o for o in fwd_outs
                               if isinstance(o, fx.Node) and o.op == "call_function"}
        fg = _FlowGraph()
        fg.v("source"); fg.v("sink")
        for n in g.nodes:
            if n.op in ("output", "get_attr") or n in tangent_dep:
                continue  # constants (get_attr) are available to both graphs for free
            nb = _tensor_bytes(n.meta.get("val"))
            if nb is None and is_sym_node(n):
                nb = 1  # a size costs next to nothing to save (never recomputed: not cheap)
            # a value of a checkpointed region that only its own region reads is never saved;
            # the region's outputs may be (the next region's inputs, as eager saves them)
            ckpt = n.op != "placeholder" and is_checkpointed(n) and not _leaves_region(
                n, fwd_needed)
            cost = nb if nb is not None and not ckpt else INF
            if n in aliases_output and cost < INF:
                cost += _ALIAS_OF_OUTPUT
            fg.add(f"{n.name}_in", f"{n.name}_out", cost)
            # Inputs and expensive/random ops exist in the forward; a cheap op the forward needs
            # may still be recomputed in the backward from what is saved. Values of a
            # checkpointed region are all recomputed, from the region's inputs.
            # Without ``recompute``, a cheap op the forward does not need still goes to the
            # backward when that saves bytes: computed once either way (sin's cos(x)).
            if n.op == "placeholder" or not (ckpt or is_recomputable(
                    n, recompute or n not in fwd_needed or n in aliases_output)):
                fg.add("source", f"{n.name}_in", INF)
            if n in bw_needs:
                fg.add(f"{n.name}_out", "sink", INF)
            for u in n.users:
                if u.op != "output" and u not in tangent_dep:
                    fg.add(f"{n.name}_out", f"{u.name}_in", INF)
        reach = fg.max_flow("source", "sink")
        for n in g.nodes:
            if n.op in ("output", "get_attr") or n in tangent_dep:
                continue
            if fg.idx[f"{n.name}_in"] in reach and fg.idx[f"{n.name}_out"] not in reach:
                saved.append(n)
        saved.sort(key=order.__getitem__)
    # saved sizes go after the saved tensors (the runtime keeps them apart: autograd saves
    # tensors only)
    saved_sym = [n for n in saved if is_sym_node(n)]
    saved = [n for n in saved if not is_sym_node(n)] + saved_sym

    fw = _build_forward(joint, primals, fwd_outs, saved, tangent_dep, mutated_primals)
    bw = _build_backward(joint, saved, tangents, grad_outs)
    grad_deps = [deps.get(o, frozenset()) if isinstance(o, fx.Node) else frozenset()
                 for o in grad_outs]
    return Partition(fw, bw, len(saved) - len(saved_sym), [n.name for n in saved],
                     saved_bytes(saved), grad_deps,
                     _primal_reaches(g, primals, fwd_outs, tangent_dep), len(saved_sym))


def _viewed(n: fx.Node) -> fx.Node | None:
    """The value ``n`` is a view of (None when it is not a view)."""
    t = n.target
    src = n.args[0] if n.op == "call_function" and n.args else None
    if isinstance(src, fx.Node) and (
            (isinstance(t, torch._ops.OpOverload) and t.is_view)
            or (t is operator.getitem and src.op == "call_function"
                and isinstance(src.target, torch._ops.OpOverload) and src.target.is_view)):
        return src
    return None


def _memory_root(n: fx.Node, roots: dict[fx.Node, fx.Node]) -> fx.Node:
    """The value whose memory ``n`` views (``n`` itself when it is not a view); ``roots``
    remembers every node of the chain walked (a loop, not recursion: chains of views may be long)."""
    chain = []
    while n not in roots and (src := _viewed(n)) is not None:
        chain.append(n)
        n = src
    root = roots.setdefault(n, n)
    for c in chain:
        roots[c] = root
    return root


def _aliases_of_outputs(g: fx.Graph, fwd_outs: list[Any]) -> set[fx.Node]:
    """Forward values, other than the forward outputs and the inputs, that share memory with a
    forward output: its views and the bases it views."""
    roots: dict[fx.Node, fx.Node] = {}
    outs = {o for o in fwd_outs if isinstance(o, fx.Node)}
    out_roots = {_memory_root(o, roots) for o in outs}
    return {n for n in g.nodes
            if n.op == "call_function" and n not in outs
            and _memory_root(n, roots) in out_roots}


def _primal_reaches(g: fx.Graph, primals: list[fx.Node], fwd_outs: list[Any],
                    tangent_dep: set[fx.Node]) -> list[frozenset[int]]:
    src: dict[fx.Node, frozenset[int]] = {p: frozenset([i]) for i, p in enumerate(primals)}
    for n in g.nodes:
        if n.op == "call_function" and n not in tangent_dep and _differentiable(n):
            d = frozenset().union(*[src.get(a, frozenset()) for a in n.all_input_nodes])
            if d:
                src[n] = d
    reach: list[set[int]] = [set() for _ in primals]
    for k, o in enumerate(fwd_outs):
        if isinstance(o, fx.Node):
            for i in src.get(o, ()):
                reach[i].add(k)
    return [frozenset(r) for r in reach]


def _differentiable(n: fx.Node) -> bool:
    """Whether gradients can flow through ``n``'s value (integer and bool results, such as argmax
    indices or masks, carry none)."""
    if is_sym_node(n):  # a size: no gradient flows through it
        return False
    vals = [v for v in _flat_vals(n.meta.get("val")) if isinstance(v, torch.Tensor)]
    return not vals or any(v.is_floating_point() or v.is_complex() for v in vals)


def _flat_vals(v: Any) -> list[Any]:
    if isinstance(v, (tuple, list)):
        return [x for item in v for x in _flat_vals(item)]
    return [v]


def _ancestors(roots: list[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


def _copy_meta(new: fx.Node, old: fx.Node) -> None:
    new.meta.update(old.meta)


def _build_forward(joint: fx.GraphModule, primals: list[fx.Node], fwd_outs: list[Any],
                   saved: list[fx.Node], tangent_dep: set[fx.Node],
                   mutated_primals: set[int]) -> fx.GraphModule:
    # Random ops run in the forward even when unused, so the RNG stream matches eager's.
    roots = [o for o in fwd_outs if isinstance(o, fx.Node)] + saved
    roots += [n for n in joint.graph.nodes if is_random(n) and n not in tangent_dep]
    keep = _ancestors(roots)
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for p in primals:
        env[p] = g.placeholder(p.name)
        _copy_meta(env[p], p)
    for n in joint.graph.nodes:
        if n.op in ("call_function", "get_attr") and n in keep:
            env[n] = g.node_copy(n, env.__getitem__)
    saved_vals = []
    mutated_nodes = {primals[i] for i in mutated_primals}
    for s in saved:
        v = env[s]
        if s in mutated_nodes:  # the runtime overwrites this input; keep the original value
            v = g.call_function(aten.clone.default, (v,))
            _copy_meta(v, s)
        saved_vals.append(v)
    g.output(tuple([env[o] if isinstance(o, fx.Node) else o for o in fwd_outs] + saved_vals))
    g.eliminate_dead_code()  # keeps impure (random) nodes
    return fx.GraphModule(joint, g)


def _build_backward(joint: fx.GraphModule, saved: list[fx.Node], tangents: list[fx.Node],
                    grad_outs: list[Any]) -> fx.GraphModule:
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in saved + tangents:
        env[n] = g.placeholder(n.name)
        _copy_meta(env[n], n)
    need: set[fx.Node] = set()
    stack = [o for o in grad_outs if isinstance(o, fx.Node)]
    while stack:
        n = stack.pop()
        if n in need or n in env:
            continue
        if n.op == "placeholder":
            raise AssertionError(f"partition: backward needs input {n.name} but it was not saved")
        need.add(n)
        stack.extend(n.all_input_nodes)
    for n in joint.graph.nodes:
        if n in need:
            env[n] = g.node_copy(n, env.__getitem__)
    g.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in grad_outs))
    return fx.GraphModule(joint, g)
