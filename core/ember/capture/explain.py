"""``ember.explain(fn)(*args)``: run ``fn`` once under Ember and report what capture did.

The report lists every graph (with its op counts and readable code), every graph break (reason
and the user's file:line), the guards of each compiled entry, recompilations and fallbacks. It
prints readably and is plain data (``report.graphs``, ``report.breaks``, ...).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable

import pluggy

__all__ = ["ExplainReport", "GraphInfo", "BreakInfo", "explain"]


@dataclasses.dataclass
class GraphInfo:
    function: str
    where: str
    ops: int
    op_counts: dict[str, int]
    code: str


@dataclasses.dataclass
class BreakInfo:
    reason: str
    where: str
    function: str


@dataclasses.dataclass
class ExplainReport:
    graphs: list[GraphInfo] = dataclasses.field(default_factory=list)
    breaks: list[BreakInfo] = dataclasses.field(default_factory=list)
    guards: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)
    recompiles: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    fallbacks: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    result: Any = None

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def break_count(self) -> int:
        return len(self.breaks)

    @property
    def op_count(self) -> int:
        return sum(g.ops for g in self.graphs)

    def __str__(self) -> str:
        lines = [f"Graphs: {self.graph_count}  (ops: {self.op_count})",
                 f"Graph breaks: {self.break_count}"]
        for i, b in enumerate(self.breaks, 1):
            lines.append(f"  {i}. {b.reason}\n     at {b.where} in {b.function}")
        for i, g in enumerate(self.graphs, 1):
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(g.op_counts.items()))
            lines.append(f"Graph {i}: {g.function} ({g.where}), {g.ops} ops: {ops}")
        if self.recompiles:
            lines.append(f"Recompiles: {len(self.recompiles)}")
            lines += [f"  {fn}: guard failed: {why}" for fn, why in self.recompiles]
        if self.fallbacks:
            lines.append(f"Ran eagerly: {len(self.fallbacks)}")
            lines += [f"  {fn}: {why}" for fn, why in self.fallbacks]
        lines.append(f"Guards ({sum(len(g) for _, g in self.guards)} in {len(self.guards)} "
                     "entries):")
        for fn, gs in self.guards:
            lines.append(f"  {fn}:")
            lines += [f"    {g}" for g in gs]
        return "\n".join(lines)

    __repr__ = __str__


class _Recorder:
    def __init__(self, report: ExplainReport):
        self.report = report

    @pluggy.HookimplMarker("ember")
    def ember_compile_event(self, event: Any) -> None:
        d, r = event.data, self.report
        if event.kind == "graph_captured":
            gm = d.get("graph")
            counts: collections.Counter = collections.Counter()
            code = ""
            if gm is not None:
                for n in gm.graph.nodes:
                    if n.op in ("call_function", "call_method"):
                        t = n.target
                        counts[t if isinstance(t, str) else getattr(t, "__name__", str(t))] += 1
                code = gm.print_readable(print_output=False)
            r.graphs.append(GraphInfo(d.get("name", "?"), d.get("function", "?"),
                                      d.get("ops", 0), dict(counts), code))
        elif event.kind == "graph_break":
            r.breaks.append(BreakInfo(d.get("reason", "?"), d.get("where", "?"),
                                      d.get("function", "?")))
        elif event.kind == "entry_guards":
            r.guards.append((d.get("function", "?"), list(d.get("guards", ()))))
        elif event.kind == "recompile":
            r.recompiles.append((d.get("function", "?"), d.get("reason", "?")))
        elif event.kind in ("fallback", "skip"):  # skip: its own code ran eagerly
            r.fallbacks.append((d.get("function", "?"), d.get("reason", "?")))


def explain(fn: Callable[..., Any], *, compile_fn: Callable[..., Any],
            reset_fn: Callable[[], None], **compile_kwargs: Any) -> Callable[..., ExplainReport]:
    """``ember.explain(fn, backend=...)(*args, **kwargs) -> ExplainReport``.

    Clears Ember's caches first (``reset_fn``, ``ember.reset``) so that everything is captured
    afresh, then calls ``fn`` once compiled with ``compile_fn`` (``ember.compile``, passed in by
    the API layer: capture does not import the layers above it); ``report.result`` holds what
    it returned.
    """
    from ..plugins import plugin_manager

    ember_compile, reset = compile_fn, reset_fn

    compile_kwargs.setdefault("backend", "eager")

    def run(*args: Any, **kwargs: Any) -> ExplainReport:
        reset()
        report = ExplainReport()
        recorder = _Recorder(report)
        pm = plugin_manager()
        pm.register(recorder, name=f"ember-explain-{id(recorder)}")
        try:
            report.result = ember_compile(fn, **compile_kwargs)(*args, **kwargs)
        finally:
            pm.unregister(recorder)
        return report

    return run
