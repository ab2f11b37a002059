"""Capture one call of a user function: trace it symbolically, compile the graph with the
backend, and generate the entry function that serves later calls while the guards hold."""

from __future__ import annotations

import inspect
import logging
import operator
import time
import types
from typing import Any, Callable

import torch
import torch.fx

from .. import _logging, events
from ..backends import compile_graph
from ..exc import Unsupported
from .interpreter import Frame, LazyVar, Tracer
from .output import OutputGraph, Reconstructor, build_entry
from .variables import CellVar, DictVar, ListVar, NNModuleVar, ObjectVar, SetVar

log = logging.getLogger("ember.capture")
graph_log = _logging.get_artifact_logger("graph")

_IMPURE_FUNCTIONS = {operator.setitem, torch._C._set_grad_enabled,
                     torch.amp.autocast_mode._enter_autocast,
                     torch.amp.autocast_mode._exit_autocast}
_RANDOM_WORDS = ("rand", "dropout", "bernoulli", "normal", "multinomial", "uniform", "poisson",
                 "exponential", "cauchy", "geometric", "log_normal", "random")


def _is_impure(node: torch.fx.Node) -> bool:
    t = node.target
    if t in _IMPURE_FUNCTIONS:
        return True
    name = t if isinstance(t, str) else getattr(t, "__name__", "")
    if name.startswith("i") and getattr(operator, name, None) is t:  # operator.iadd & co.
        return True
    if name.endswith("_") and not name.endswith("__"):
        return True
    if "out" in node.kwargs:
        return True
    if any(w in name for w in _RANDOM_WORDS):
        return True
    if isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable:
        return True
    return False


def _dce(graph: torch.fx.Graph) -> None:
    for node in reversed(list(graph.nodes)):
        if node.op in ("call_function", "call_method") and not node.users and \
                not _is_impure(node):
            graph.erase_node(node)


def convert_frame(fn: Callable[..., Any], args: tuple, kwargs: dict, *, backend: Any,
                  options: dict[str, Any], fullgraph: bool) -> Callable[..., Any]:
    t0 = time.perf_counter()
    code: types.CodeType = fn.__code__
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        raise Unsupported(f"{code.co_name} is a generator or coroutine; Ember compiles plain "
                          "functions", where=f"{code.co_filename}:{code.co_firstlineno}")
    try:
        bound = inspect.signature(fn, follow_wrapped=False).bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"arguments do not match the signature of {code.co_name}: {e}")
    bound.apply_defaults()
    out = OutputGraph(fn.__globals__)
    out.namespace["___fn"] = fn
    tracer = Tracer(out, fn)
    locals_ = {name: LazyVar(value, name) for name, value in bound.arguments.items()}
    cells: dict[str, CellVar] = {}
    if fn.__closure__:
        for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__)):
            cells[name] = CellVar(None, real_cell=cell, source=f"___fn.__closure__[{i}]")
    # Global state the graph was traced under.
    grad = torch.is_grad_enabled()
    out.guards.add(f"___torch.is_grad_enabled() is {grad}")
    out.guards.add(f"___torch.get_default_dtype() is {out.ns(torch.get_default_dtype(), 'dtype')}")
    frame = Frame(tracer, code, fn.__globals__, "___G", locals_, cells)
    if code.co_cellvars:
        for name in code.co_cellvars:
            if isinstance(frame.cells[name].value, LazyVar):
                lv = frame.cells[name].value
                frame.cells[name].value = tracer.wrap(lv.value, lv.source)
    try:
        result = frame.run()
    finally:
        torch._C._set_grad_enabled(grad)
    if torch.is_grad_enabled() != grad:  # pragma: no cover - restored above
        torch._C._set_grad_enabled(grad)

    rec = Reconstructor(out)
    body: list[str] = []
    result_expr = rec.expr(result)
    body.append(f"___r = {result_expr}")
    assigns: list[str] = []
    temp = 0

    def tmp(expr: str) -> str:
        nonlocal temp
        name = f"___t{temp}"
        temp += 1
        body.append(f"{name} = {expr}")
        return name

    for c in out.mutated_containers:
        if c.source is None:
            continue
        t = tmp(rec.expr(c, allow_source=False))
        if isinstance(c, ListVar):
            assigns.append(f"{c.source}[:] = {t}")
        elif isinstance(c, (DictVar, SetVar)):
            assigns.append(f"{c.source}.clear(); {c.source}.update({t})")
    last_store: dict[tuple[int, str], tuple[Any, str, Any]] = {}
    for kind, payload in out.side_effects:
        if kind == "setattr":
            obj, name, value = payload
            last_store[(id(obj.value), name)] = (obj, name, value)
        elif kind == "global":
            name, value = payload
            last_store[(0, name)] = (None, name, value)
    for (_, _), (obj, name, value) in last_store.items():
        t = tmp(rec.expr(value))
        if obj is None:
            assigns.append(f"___G[{name!r}] = {t}")
        elif isinstance(obj, (NNModuleVar, ObjectVar)):
            assigns.append(f"{obj.source}.{name} = {t}")
    body += assigns

    graph = out.graph
    outputs = rec.graph_outputs
    has_ops = any(n.op in ("call_function", "call_method") for n in graph.nodes)
    input_exprs: list[str] = []
    if has_ops:
        graph.output(tuple(outputs))
        _dce(graph)
        # Placeholders that no node uses are dropped from the call.
        used = []
        for var, source, value in out.inputs:
            if var.node.users:
                used.append((var, source, value))
            else:
                graph.erase_node(var.node)
        gm = torch.fx.GraphModule(torch.nn.Module(), graph, class_name="EmberGraph")
        gm.recompile()
        example_inputs = [value for _, _, value in used]
        input_exprs = [source for _, source, _ in used]
        n_ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
        events.counters["stats"]["graphs"] += 1
        events.counters["stats"]["ops"] += n_ops
        if graph_log.isEnabledFor(logging.INFO):
            graph_log.info("captured graph for %s:%d %s (%d ops):\n%s", code.co_filename,
                           code.co_firstlineno, code.co_name, n_ops,
                           gm.print_readable(print_output=False))
        events.emit("graph_captured", function=f"{code.co_filename}:{code.co_firstlineno}",
                    name=code.co_name, ops=n_ops, graph=gm)
        compiled = compile_graph(gm, example_inputs, backend, options)
    else:
        compiled = _no_graph
    entry = build_entry(fn, out, compiled, input_exprs, [], body, "___r")
    if not has_ops:
        entry_src = entry.source.replace("    ___o = ___compiled()\n", "")
        ns = dict(entry.__globals__)
        exec(compile(entry_src, f"<ember entry for {code.co_name}>", "exec"), ns)
        e2 = ns["___entry"]
        e2.__defaults__, e2.__kwdefaults__ = entry.__defaults__, entry.__kwdefaults__
        e2.failed_guard, e2.source, e2.guards = entry.failed_guard, entry_src, entry.guards
        entry = e2
    entry.graph_module = gm if has_ops else None  # type: ignore[attr-defined]
    events.counters["stats"]["entries"] += 1
    events.emit("timing", stage="capture", function=code.co_name,
                seconds=time.perf_counter() - t0)
    return entry


def _no_graph(*args: Any) -> tuple:
    return ()
