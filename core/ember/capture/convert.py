"""Capture one call of a user function: trace it symbolically, compile the graph with the
backend, and generate the entry function that serves later calls while the guards hold.

A graph break is handled in two passes. The first trace fails somewhere (maybe deep inside an
inlined call) and records the instruction of the *compiled* frame that was executing; the second
trace stops cleanly right before that instruction. The graph so far is compiled, and the entry
function runs it, replays side effects, performs the breaking instruction in plain Python (a call,
or a branch on a tensor's value) and continues in a resume function (resume.py) that Ember
compiles on its first call.
"""

from __future__ import annotations

import inspect
import logging
import operator
import re
import time
import types
from typing import Any, Callable

import torch
import torch.fx

from .. import _logging, events
from ..context import InputInfo, graph_id_for
from ..state import global_state, set_global_state
from ..exc import Unsupported
from . import resume as resume_mod
from . import artifact
from .artifact import Capture, CaptureInput
from .aliasing import mutated_input_guards
from .guards import FN, function_state_guards
from .sources import ClosureCell, Local, NamespaceRef
from .interpreter import BreakHere, Frame, LazyVar, Tracer
from .output import OutputGraph, Reconstructor, build_entry, entry_source
from .variables import (BoundMethodVar, CellVar, DictVar, FunctionVar,
                        IteratorVar, ListVar, NNModuleVar, NullVar, ObjectVar, PyRaise, SetVar,
                        TensorVar,
                        Var)

log = logging.getLogger("ember.capture")
graph_log = _logging.get_artifact_logger("graph")
break_log = _logging.get_artifact_logger("graph_breaks")

from .output import restore_autocast as _restore_autocast

_IMPURE_FUNCTIONS = {operator.setitem, torch._C._set_grad_enabled, _restore_autocast,
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


def _fold_grad_switches(graph: torch.fx.Graph, initial: bool) -> tuple[bool, bool]:
    """Consecutive grad-mode switches collapse into the last one, which is dropped when it sets
    the mode already in effect (``with no_grad(): with enable_grad(): ...`` closing together).
    Returns (whether switches remain, the mode in effect at the end of the graph)."""
    mode = initial
    run: list[torch.fx.Node] = []

    def flush() -> None:
        nonlocal mode
        if not run:
            return
        *extra, last = run
        for n in extra:
            graph.erase_node(n)
        if last.args[0] == mode:
            graph.erase_node(last)
        else:
            mode = bool(last.args[0])
        run.clear()

    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            run.append(node)
        elif node.op in ("call_function", "call_method", "output"):
            flush()
    remaining = any(n.op == "call_function" and n.target is torch._C._set_grad_enabled
                    for n in graph.nodes)
    return remaining, mode


def convert_frame(fn: Callable[..., Any], args: tuple, kwargs: dict, *, backend: Any,
                  options: dict[str, Any], compile_graph: Callable[..., Any], fullgraph: bool,
                  root_module: bool = False, policy: Any = None) -> Callable[..., Any]:
    """Capture ``fn(*args, **kwargs)``; returns its entry. ``root_module``: ``fn`` is the
    ``forward`` of the module ``args[0]`` that ``ember.compile`` wrapped, called without
    ``Module.__call__``: the entry also checks that the module has no hooks."""
    extra = ()
    if root_module:
        me = fn.__code__.co_varnames[0]
        if fn.__code__.co_argcount == 0:  # forward(*args, **kwargs) (a decorator's wrapper)
            me = f"{me}[0]"
        # Module.__call__ would run hooks, an instance-level forward, or the class's current
        # forward: the entry serves only calls where none of that differs.
        # Global module hooks (register_module_forward_hook) apply to the root module too.
        mm = "___torch.nn.modules.module"
        extra = (f"not ({me})._forward_pre_hooks and not ({me})._forward_hooks and "
                 f"not ({me})._backward_hooks and not ({me})._backward_pre_hooks and "
                 f"'forward' not in ({me}).__dict__ and type({me}).forward is ___fn",
                 f"not ({mm}._global_forward_hooks or {mm}._global_forward_pre_hooks or "
                 f"{mm}._global_backward_hooks or {mm}._global_backward_pre_hooks)")
    return _convert_frame(fn, args, kwargs, backend=backend, options=options,
                          compile_graph=compile_graph,
                          fullgraph=fullgraph, extra_guards=extra, policy=policy)


def _convert_frame(fn: Callable[..., Any], args: tuple, kwargs: dict, *, backend: Any,
                   options: dict[str, Any], compile_graph: Callable[..., Any], fullgraph: bool,
                   extra_guards: tuple[str, ...], policy: Any = None) -> Callable[..., Any]:
    try:
        return _convert(fn, args, kwargs, backend, options, None, None, extra_guards, policy,
                        compile_graph)
    except Unsupported as e:
        bp = getattr(e, "break_point", None)
        if fullgraph or bp is None:
            raise
        first = e
    try:
        if isinstance(first, PyRaise):
            # Nothing in the traced code catches it. Breaking there would raise it for real,
            # but under a compiler code can take another path than eagerly (``if mask is None
            # and not is_torchdynamo_compiling(): mask = ...``): as torch.compile does, the frame
            # runs as Python (its own exceptions, if any, are eager's), with the modules it
            # calls compiled.
            skip = Unsupported(f"{first.reason}, and the compiled code does not catch it; the "
                               "frame runs eagerly, with the modules it calls compiled",
                               where=first.where)
            skip.skip_frame = True  # type: ignore[attr-defined]  (frame.py: nested compile)
            raise skip from first
        if _inside_loop(fn.__code__, bp[0]):
            skip = Unsupported(f"graph break inside a loop ({first.reason}); the frame runs "
                               "eagerly, with the modules it calls compiled", where=first.where)
            skip.skip_frame = True  # type: ignore[attr-defined]  (frame.py: nested compile)
            raise skip from first
        try:
            return _convert(fn, args, kwargs, backend, options, bp, first, extra_guards, policy,
                            compile_graph)
        except Unsupported as e2:
            if e2 is first or getattr(e2, "break_point", None) is not None:
                raise first
            log.debug("graph break could not be resumed: %s", e2)
            raise first from e2
    finally:
        # `first`'s traceback holds this frame, whose locals hold `first`: a cycle that would
        # keep the call's arguments (the user's model) alive until a full collection
        first = None


def _distinct_mutables_guard(out: OutputGraph, tracer: Tracer) -> None:
    """Lists, dicts, sets and plain objects of the call that were distinct objects while
    tracing stay distinct, when the capture mutates one of them (``f(x, a, a)`` appending to
    the first and reading the second must see the append)."""
    objs = [v for v in tracer.mutable_by_id.values() if v.source is not None]
    if len(objs) < 2:
        return
    mutated = {id(v) for v in out.mutated_containers}
    mutated |= {id(p[0]) for k, p in out.side_effects if k == "setattr"}
    if not any(id(v) in mutated for v in objs):
        return
    out.guards.add(_distinct_guard([v.source for v in objs]))


def _distinct_guard(sources: list[Any]) -> str:
    """The objects at ``sources`` are distinct objects."""
    return f"len({{{', '.join(f'id({s})' for s in sources)}}}) == {len(sources)}"


def _in_try_block(code: types.CodeType, offset: int) -> bool:
    """Is ``offset`` protected by a try/except or try/finally (not only by a `with` block)?"""
    import dis
    from .interpreter import _instructions
    try:
        entries = dis._parse_exception_table(code)  # type: ignore[attr-defined]
    except Exception:  # pragma: no cover - private helper; be conservative
        return bool(code.co_exceptiontable)
    by_offset = {i.offset: k for k, i in enumerate(_instructions(code))}
    ins = _instructions(code)
    for e in entries:
        if e.start <= offset < e.end:
            k = by_offset.get(e.target)
            handler = [i.opname for i in ins[k:k + 4]] if k is not None else []
            if "WITH_EXCEPT_START" not in handler and "CLEANUP_THROW" not in handler and \
                    "RERAISE" not in handler[:2]:
                return True
    return False


def _inside_loop(code: types.CodeType, index: int) -> bool:
    """Is instruction ``index`` inside a loop body (a later jump goes back to or before it)?"""
    from .interpreter import _instructions
    ins = _instructions(code)
    at = ins[index].offset
    for i in ins[index:]:
        if "JUMP" in i.opname and isinstance(i.argval, int) and i.argval <= at:
            return True
    return False


def _root_frame(fn: Callable[..., Any], args: tuple, kwargs: dict, tracer: Tracer) -> Frame:
    """The frame of a call of ``fn``: its arguments as lazily wrapped locals (sources are the
    parameter names of the entry function), its closure cells by ``___fn.__closure__``."""
    code = fn.__code__
    try:
        bound = inspect.signature(fn, follow_wrapped=False).bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"arguments do not match the signature of {code.co_name}: {e}")
    bound.apply_defaults()
    locals_ = {name: LazyVar(value, Local(name)) for name, value in bound.arguments.items()}
    cells: dict[str, CellVar] = {}
    if fn.__closure__:
        for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__)):
            cells[name] = CellVar(None, real_cell=cell, source=ClosureCell(Local(FN), i))
    frame = Frame(tracer, code, fn.__globals__, NamespaceRef("___G"), locals_, cells)
    for name in code.co_cellvars:
        cv = frame.cells[name].value
        if isinstance(cv, LazyVar):
            frame.cells[name].value = tracer.wrap(cv.value, cv.source)
    return frame


def list_breaks(fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[Unsupported]:
    """Every graph break a trace of ``fn`` can see (for fullgraph=True errors): the trace goes
    on past a breaking call with its result unknown, and past a tensor branch on one side."""
    tracer = Tracer(OutputGraph(fn.__globals__), fn)
    tracer.collect_breaks = []
    grad = torch.is_grad_enabled()
    try:
        _root_frame(fn, args, kwargs, tracer).run()
    except Unsupported as e:
        if not getattr(e, "from_unknown", False) and e not in tracer.collect_breaks:
            tracer.collect_breaks.append(e)
    except Exception as e:  # diagnostics only: never hide the first break behind this
        log.debug("listing breaks stopped: %s", e)
    finally:
        torch._C._set_grad_enabled(grad)
    return tracer.collect_breaks


def _convert(fn: Callable[..., Any], args: tuple, kwargs: dict, backend: Any,
             options: dict[str, Any], break_at: tuple[int, int] | None,
             reason: Unsupported | None, extra_guards: tuple[str, ...] = (),
             policy: Any = None, compile_graph: Callable[..., Any] | None = None
             ) -> Callable[..., Any]:
    code: types.CodeType = fn.__code__
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        raise Unsupported(f"{code.co_name} is a generator or coroutine; Ember compiles plain "
                          "functions", where=f"{code.co_filename}:{code.co_firstlineno}")
    out = OutputGraph(fn.__globals__, policy)
    try:
        return _capture_and_compile(out, fn, args, kwargs, backend, options, break_at, reason,
                                    extra_guards, policy, compile_graph)
    finally:
        # The capture's structures form cycles (output graph <-> tracer <-> frames) that hold
        # the call's objects: dropped now, whether it compiled or broke, the user's model is
        # freed when the user drops it, not at the next full collection.
        out.release()


def _capture_and_compile(out: OutputGraph, fn: Callable[..., Any], args: tuple, kwargs: dict,
                         backend: Any, options: dict[str, Any],
                         break_at: tuple[int, int] | None, reason: Unsupported | None,
                         extra_guards: tuple[str, ...], policy: Any,
                         compile_graph: Callable[..., Any] | None) -> Callable[..., Any]:
    t0 = time.perf_counter()
    code: types.CodeType = fn.__code__
    tracer = Tracer(out, fn)
    out.tracer = tracer
    tracer.break_at = break_at
    frame = _root_frame(fn, args, kwargs, tracer)
    grad = torch.is_grad_enabled()
    for g in extra_guards:
        out.guards.add(g)
    out.guards.add(f"___torch.is_grad_enabled() is {grad}")
    out.guards.add(f"___torch.get_default_dtype() is {out.ns(torch.get_default_dtype(), 'dtype')}")
    # Ambient autocast: graphs (and AOT's baked-in casts) are only valid under the same state.
    for dev in ("cpu", "cuda"):
        if torch.is_autocast_enabled(dev):
            dt = torch.get_autocast_dtype(dev)
            out.guards.add(f"___torch.is_autocast_enabled({dev!r}) and "
                           f"___torch.get_autocast_dtype({dev!r}) is {out.ns(dt, str(dt))}")
        else:
            out.guards.add(f"not ___torch.is_autocast_enabled({dev!r})")
    broke: BreakHere | None = None
    break_grad = grad
    state = global_state()
    try:
        result: Var | None = frame.run()
    except BreakHere as b:
        # control flow, not an error: its traceback (this frame among others) would make a
        # cycle through `broke` that keeps the call's arguments alive until a full collection
        broke, result = b.with_traceback(None), None
        break_grad = torch.is_grad_enabled()
        # Close the graph's open `with` regions (innermost first): the entry re-opens them in
        # Python around the break, so every graph leaves global state as it found it.
        from .variables import ExitVar
        for v in reversed(b.frame.stack):
            if isinstance(v, ExitVar) and v.source is None:  # opened by this graph
                v.restore()
    finally:
        set_global_state(state)

    if len(out.arg_tensor_sources) > 1:
        out.guards.add(_distinct_guard(out.arg_tensor_sources))
    for g in mutated_input_guards(out):  # a mutated input must not alias another input
        out.guards.add(g)
    _distinct_mutables_guard(out, tracer)
    rec = Reconstructor(out)
    pre: list[str] = []  # values computed before any side effect is replayed
    tail: list[str] = []  # the break instruction and the return

    def snapshot(expr: str) -> str:
        name = f"___p{len(pre)}"
        pre.append(f"{name} = {expr}")
        return name

    if broke is None:
        assert result is not None
        tail.append(f"return {snapshot(rec.expr(result))}")
    else:
        assert reason is not None
        tail = _break_code(fn, broke, rec, snapshot, backend, options, grad, break_grad,
                           reason)
        _count_break(fn, broke, reason)

    # Side effects, replayed after the graph in program order (values snapshotted first).
    assigns: list[str] = []
    for c in out.mutated_containers:
        if c.source is None:
            continue
        t = snapshot(rec.expr(c, allow_source=False))
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
        elif kind == "cell":
            cell, value = payload
            last_store[(id(cell), "cell_contents")] = (cell, "cell_contents", value)
    for obj, name, value in last_store.values():
        t = snapshot(rec.expr(value))
        if obj is None:
            assigns.append(f"___G[{name!r}] = {t}")
        elif isinstance(obj, CellVar):
            assigns.append(f"{obj.source}.cell_contents = {t}")
        elif isinstance(obj, (NNModuleVar, ObjectVar)):
            assigns.append(f"{obj.source}.{name} = {t}")
    body = rec.lines + pre + assigns + tail

    graph = out.graph
    outputs = rec.graph_outputs
    has_ops = any(n.op in ("call_function", "call_method") for n in graph.nodes)
    input_exprs: list[str] = []
    gm = None
    example_inputs: list[Any] = []
    inputs: list[CaptureInput] = []
    if has_ops:
        graph.output(tuple(outputs))
        _dce(graph)
        switches, final_grad = _fold_grad_switches(graph, grad)
        if switches:
            # A backend may run the graph without its Python-level grad switches (AOT traces
            # them away): the entry sets the mode the graph ends in itself.
            body.insert(0, f"___torch._C._set_grad_enabled({final_grad})")
        used = []
        for var, source, value in out.inputs:
            if var.node.users:
                used.append((var, source, value))
            else:
                graph.erase_node(var.node)
        gm = torch.fx.GraphModule(torch.nn.Module(), graph, class_name="EmberGraph")
        gm.recompile()
        example_inputs = [value for _, _, value in used]
        input_exprs = [str(out.fetch.get(source, source)) for _, source, _ in used]
        for _, source, _ in used:
            kind = out.input_kinds.get(source, "user")
            inputs.append(CaptureInput(kind, str(source), str(out.fetch.get(source, source)),
                                       kind in ("parameter", "buffer") and
                                       source not in out.unstable_inputs, origin=source))
        n_ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
        events.counters["stats"]["graphs"] += 1
        events.counters["stats"]["ops"] += n_ops
        if graph_log.isEnabledFor(logging.INFO):
            graph_log.info("captured graph for %s:%d %s (%d ops):\n%s", code.co_filename,
                           code.co_firstlineno, code.co_name, n_ops,
                           gm.print_readable(print_output=False))
        events.emit("graph_captured", function=f"{code.co_filename}:{code.co_firstlineno}",
                    name=code.co_name, ops=n_ops, graph=gm)
    prologue: tuple[str, ...] = ()
    if out.autocast_exits:
        prologue = ("___n0 = ___autocast_nesting()",)
        body.insert(0, f"___settle_autocast({tuple(out.autocast_exits)!r}, ___n0)"
                    if all(type(e[2]) is not torch.dtype for e in out.autocast_exits) else
                    f"___settle_autocast({out.ns(tuple(out.autocast_exits), 'exits')}, ___n0)")
    generated = "\n".join(out.guards.exprs + body + input_exprs + list(prologue))
    out.guards.add_first(function_state_guards(
        fn, out.ns, uses_globals=re.search(r"___G(?![A-Za-z0-9_])", generated) is not None))
    cap = Capture(function=f"{code.co_filename}:{code.co_firstlineno} in {code.co_name}",
                  graph_id=_next_graph_id(code) if gm is not None else "", graph=gm,
                  inputs=tuple(inputs), guards=tuple(out.guards.exprs),
                  break_reason=reason.reason if broke is not None and reason is not None
                  else None, example_inputs=example_inputs, body=tuple(body))
    cap.entry_source = entry_source(fn, out, gm is not None, input_exprs, body, prologue)
    events.emit("timing", stage="capture", function=code.co_name,
                seconds=time.perf_counter() - t0)
    return compile_capture(fn, cap, out, input_exprs, prologue, backend, options, compile_graph)


def compile_capture(fn: Callable[..., Any], cap: Capture, out: OutputGraph,
                    input_exprs: list[str], prologue: tuple[str, ...], backend: Any,
                    options: dict[str, Any], compile_graph: Callable[..., Any] | None
                    ) -> Callable[..., Any]:
    """The second step: compile the captured graph with ``backend`` and build the entry.
    ``compile_graph`` is the runtime's (:func:`ember.backends.compile_graph`), passed in:
    capture does not import the stages after it."""
    code = fn.__code__
    compiled = None
    fake_mode = out.fake_mode if out.symbolic is not None and out.symbolic.has_symbols else None
    if cap.graph is not None:
        assert compile_graph is not None, "compile_capture needs the runtime's compile_graph"
        infos = [InputInfo(i.kind, i.source, i.stable_address) for i in cap.inputs]
        extra = {"fake_mode": fake_mode} if fake_mode is not None else {}
        compiled = compile_graph(cap.graph, cap.example_inputs or [], backend, options,
                                 inputs=infos, graph_id=cap.graph_id, **extra)
    cap.example_inputs = None  # a kept Capture must not keep the call's tensors alive
    if out.symbolic is not None:
        # After the backend: AOT traces under the same ShapeEnv and may add guards of its own.
        out.add_symbolic_guards()
        cap.guards = tuple(out.guards.exprs)
        cap.entry_source = entry_source(fn, out, cap.graph is not None, input_exprs,
                                        list(cap.body), prologue)
    entry = build_entry(fn, out, compiled, input_exprs, list(cap.body), prologue)
    entry.graph_module = cap.graph  # type: ignore[attr-defined]
    entry.capture = cap  # type: ignore[attr-defined]
    artifact.record(cap)
    events.counters["stats"]["entries"] += 1
    events.emit("entry_guards", function=f"{code.co_name} ({code.co_filename}:"
                f"{code.co_firstlineno})", guards=list(out.guards.exprs))
    out.release()
    return entry


_graph_counts: dict[types.CodeType, int] = {}


def _next_graph_id(code: types.CodeType) -> str:
    n = _graph_counts.get(code, 0)
    _graph_counts[code] = n + 1
    return graph_id_for(code, n)


# ---------------------------------------------------------------------------------------------
# Graph breaks
# ---------------------------------------------------------------------------------------------

def _stack_arg(rec: Reconstructor, snapshot: Callable[[str], str], v: Var) -> tuple[str, str]:
    if isinstance(v, NullVar):
        return resume_mod.STACK_NULL, ""
    if isinstance(v, IteratorVar):
        return resume_mod.STACK_ITER, snapshot("[" + ", ".join(rec.expr(i) for i in v.rest()) + "]")
    return resume_mod.STACK_PLAIN, snapshot(rec.expr(v))


def _resume_call(fn: Any, frame: Frame, rec: Reconstructor, snapshot: Callable[[str], str],
                 offset: int, stack: list[Var], extra: list[str], backend: Any,
                 options: dict[str, Any], compiled: bool) -> str:
    """Expression calling the resume function for ``offset`` with the frame's live state."""
    code, offset = resume_mod.original_position(frame.code, offset)
    local_exprs, unbound = [], []
    for name in code.co_varnames:
        v = frame.locals.get(name)
        if name in code.co_cellvars:  # passed as its cell (see resume.resume_code)
            local_exprs.append(snapshot(rec.expr(frame.cells[name])))
        elif v is None:
            local_exprs.append("None")
            unbound.append(name)
        elif isinstance(v, LazyVar):
            local_exprs.append(snapshot(v.source))
        else:
            local_exprs.append(snapshot(rec.expr(v)))
    kinds, stack_exprs = [], []
    for v in stack:
        k, e = _stack_arg(rec, snapshot, v)
        kinds.append(k)
        if e:
            stack_exprs.append(e)
    kinds += [resume_mod.STACK_PLAIN] * len(extra)
    extra = extra + [snapshot(rec.expr(frame.cells[c])) for c in code.co_cellvars
                     if c not in code.co_varnames]
    rcode = resume_mod.resume_code(code, offset, tuple(kinds), frozenset(unbound))
    rfn = resume_mod.make_function(rcode, fn)
    # The resume function runs with this function's closure and globals: functions sharing
    # the code object (one factory's closures) must not reach it through this entry.
    out = rec.out
    out.guards.add_first([f"{FN}.__globals__ is ___G"] + (
        [f"{FN}.__closure__ is {out.ns(fn.__closure__, 'closure')}"] if fn.__closure__ else []))
    if compiled:
        from .frame import CompiledFunction
        target: Any = CompiledFunction(rfn, backend, options, dynamic=rec.out.policy.mode)
    else:
        target = rfn
    name = rec.out.ns(target, "resume")
    return f"{name}({', '.join(local_exprs + stack_exprs + extra)})"


def _user_code(f: types.FunctionType) -> bool:
    """Code Ember compiles as its own frame at a break (not torch's, not the standard library's
    modules that Ember never traces)."""
    from . import rules
    mod = getattr(f, "__module__", "") or ""
    return not mod.startswith("torch") and not rules.is_skipped_module(mod)


class _CompileCall:
    """Calls a function created at run time (a lambda, a nested def) through Ember."""

    def __init__(self, backend: Any, options: dict[str, Any], dynamic: bool | None = None):
        self.backend, self.options, self.dynamic = backend, options, dynamic

    def __call__(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from .frame import CompiledFunction
        if not isinstance(fn, types.FunctionType):
            return fn(*args, **kwargs)
        return CompiledFunction(fn, self.backend, self.options,
                                dynamic=self.dynamic)(*args, **kwargs)


def _callee(fn_var: Var, rec: Reconstructor, backend: Any, options: dict[str, Any]
            ) -> tuple[str, list[str]]:
    name, lead = _callee_inner(fn_var, rec, backend, options)
    target = rec.out.namespace.get(name)
    inner = getattr(target, "fn", None)
    if inner is not None and isinstance(inner, types.FunctionType):
        try:
            inner._ember_callee_of_break = True  # type: ignore[attr-defined]
        except AttributeError:
            pass
    return name, lead


def _callee_inner(fn_var: Var, rec: Reconstructor, backend: Any, options: dict[str, Any]
                  ) -> tuple[str, list[str]]:
    """The callable to use at a call that broke the graph, plus leading arguments. User
    functions and modules are compiled as their own frames."""
    from .frame import CompiledFunction, is_disabled
    out = rec.out
    if isinstance(fn_var, FunctionVar) and isinstance(fn_var.value, types.FunctionType) and \
            not is_disabled(fn_var.value) and _user_code(fn_var.value):
        dyn = out.policy.mode  # callees compiled at a break follow ember.compile(dynamic=)
        return out.ns(CompiledFunction(fn_var.value, backend, options, dynamic=dyn),
                      "compiled_fn"), []
    if isinstance(fn_var, BoundMethodVar) and isinstance(fn_var.fn, FunctionVar) and \
            isinstance(fn_var.fn.value, types.FunctionType) and \
            not is_disabled(fn_var.fn.value) and _user_code(fn_var.fn.value):
        cf = CompiledFunction(fn_var.fn.value, backend, options, dynamic=out.policy.mode)
        return out.ns(cf, "compiled_method"), [rec.expr(fn_var.self_var)]
    if isinstance(fn_var, ObjectVar):
        call = inspect.getattr_static(type(fn_var.value), "__call__", None)
        if isinstance(call, types.FunctionType) and _user_code(call):
            cf = CompiledFunction(call, backend, options, dynamic=out.policy.mode)
            return out.ns(cf, "compiled_call"), [rec.expr(fn_var)]
    from .variables import NestedFunctionVar
    if isinstance(fn_var, NestedFunctionVar):
        return f"{out.ns(_CompileCall(backend, options, out.policy.mode), 'compile_call')}", [
            rec.expr(fn_var)]
    if isinstance(fn_var, NNModuleVar):
        m = fn_var.value
        from torch.nn.modules import module as _mm
        if not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or _mm._global_forward_hooks or _mm._global_forward_pre_hooks
                or _mm._global_backward_hooks) and \
                "forward" not in m.__dict__ and type(m).forward is not torch.nn.Module.forward:
            # the forward is called without Module.__call__: only while no hook would run
            mm = out.ns(_mm, "module_mod")
            out.guards.add(f"not ({mm}._global_forward_hooks or {mm}._global_forward_pre_hooks "
                           f"or {mm}._global_backward_hooks)")
            cf = CompiledFunction(type(m).forward, backend, options, dynamic=out.policy.mode)
            return out.ns(cf, "compiled_forward"), [rec.expr(fn_var)]
    return rec.expr(fn_var), []


def _compiled_callee_on_stack(stack: list[Var], ins: Any, rec: Reconstructor, backend: Any,
                              options: dict[str, Any]) -> tuple[list[Var], bool]:
    """The stack of a call with its callee replaced by the compiled callee (when it is user
    code), and whether it was replaced."""
    from .variables import ConstVar
    if ins.opname == "CALL":
        i = len(stack) - ins.arg - 2
        if i < 0:
            return stack, False
        k = i + 1 if isinstance(stack[i], NullVar) else i
    else:
        k = len(stack) - (3 if ins.arg & 1 else 2)
        if k < 0:
            return stack, False
    fn_var = stack[k]
    try:
        name, lead = _callee(fn_var, rec, backend, options)
    except Unsupported:
        return stack, False
    target = rec.out.namespace.get(name)
    if target is None or len(lead) > 1:
        return stack, False
    if lead:
        self_var = fn_var.self_var if isinstance(fn_var, BoundMethodVar) else fn_var
        new: Var = BoundMethodVar(ConstVar(target), self_var)
    else:
        new = ConstVar(target)
    return stack[:k] + [new] + stack[k + 1:], True


def _binary(ins: Any, ops: list[str], out: Any) -> str:
    from . import rules
    from .interpreter import _NB_OPS
    fn = rules.BINARY_OPS[_NB_OPS[ins.arg]]
    return f"{out.ns(fn, fn.__name__)}({ops[0]}, {ops[1]})"


def _compare(ins: Any, ops: list[str], out: Any) -> str:
    from . import rules
    fn = rules.COMPARE_OPS[ins.argval]
    return f"{out.ns(fn, fn.__name__)}({ops[0]}, {ops[1]})"


#: Instructions that, at a graph break, are performed as one Python expression in the entry
#: function (operands popped, result pushed), after which a compiled resume function continues.
_SIMPLE_BREAK_OPS: dict[str, tuple[int, Callable[..., str]]] = {
    "BINARY_SUBSCR": (2, lambda i, o, out: f"{o[0]}[{o[1]}]"),
    "BINARY_OP": (2, _binary),
    "COMPARE_OP": (2, _compare),
    "CONTAINS_OP": (2, lambda i, o, out: f"({o[0]} {'not in' if i.arg else 'in'} {o[1]})"),
    "IS_OP": (2, lambda i, o, out: f"({o[0]} {'is not' if i.arg else 'is'} {o[1]})"),
    "UNARY_NOT": (1, lambda i, o, out: f"(not {o[0]})"),
    "UNARY_NEGATIVE": (1, lambda i, o, out: f"(-{o[0]})"),
    "UNARY_INVERT": (1, lambda i, o, out: f"(~{o[0]})"),
    "LOAD_ATTR": (1, lambda i, o, out: f"{o[0]}.{i.argval}"),
    "LOAD_METHOD": (1, lambda i, o, out: f"{o[0]}.{i.argval}"),
    "BINARY_SLICE": (3, lambda i, o, out: f"{o[0]}[{o[1]}:{o[2]}]"),
}


def _refuse_generator_callee(fn_var: Var, reason: Unsupported) -> None:
    """A generator made at a break could only be iterated as plain Python afterwards: the frame
    runs eagerly instead (as torch.compile skips it)."""
    from .variables import NestedFunctionVar
    code = getattr(fn_var, "code", None) if isinstance(fn_var, NestedFunctionVar) else getattr(
        getattr(fn_var, "value", None), "__code__", None)
    if isinstance(code, types.CodeType) and code.co_flags & inspect.CO_GENERATOR:
        raise Unsupported(f"graph break inside the generator {code.co_name} "
                          f"({reason.reason}); the frame runs eagerly")


def _count_break(fn: Any, broke: BreakHere, reason: Unsupported) -> None:
    frame = broke.frame
    ins = frame.instructions[broke.index]
    line = (ins.positions.lineno if ins.positions else None) or frame.lineno
    where = f"{frame.code.co_filename}:{line}"
    text = reason.reason
    op0 = ins.opname
    # A branch on a tensor inside a function that Ember compiles because its caller broke at
    # the call is the same event the caller already counted (torch.compile counts it once too).
    # Likewise a branch on a tensor after an earlier break of the same frame (in a resume
    # function) continues that frame's already-counted split.
    in_resume = frame.code in resume_mod._origin
    if not ((getattr(fn, "_ember_callee_of_break", False) or in_resume)
            and op0.startswith("POP_JUMP")):
        events.counters["graph_breaks"][text] += 1
        events.counters["stats"]["graph_breaks"] += 1
    events.emit("graph_break", reason=text, where=where, function=frame.code.co_name)
    break_log.info("graph break in %s at %s: %s", frame.code.co_name, where, text)


def _break_code(fn: Any, broke: BreakHere, rec: Reconstructor, snapshot: Callable[[str], str],
                backend: Any, options: dict[str, Any], entry_grad: bool, break_grad: bool,
                reason: Unsupported) -> list[str]:
    frame = broke.frame
    ins = frame.instructions[broke.index]
    stack = list(frame.stack)
    nxt = frame.instructions[broke.index + 1].offset if broke.index + 1 < len(
        frame.instructions) else None
    tail: list[str] = []
    grad_fix = (f"___torch._C._set_grad_enabled({break_grad})"
                if break_grad != entry_grad else None)
    op = ins.opname
    orig_code, orig_offset = resume_mod.original_position(frame.code, ins.offset)
    # Performing the instruction in the entry would take it out of a try block: then the rest of
    # the frame, this instruction included, runs as Python so the handler stays in force.
    in_try = _in_try_block(orig_code, orig_offset)
    exits = [v for v in stack if type(v).__name__ == "ExitVar"]
    if op in ("CALL", "CALL_FUNCTION_EX") and nxt is not None and not in_try:
        if op == "CALL":
            argc = ins.arg
            items = stack[len(stack) - argc - 2:]
            below = stack[:len(stack) - argc - 2]
            if isinstance(items[0], NullVar):
                fn_var, args = items[1], items[2:]
            else:
                fn_var, args = items[0], items[1:]
            kw_names = frame.kw_names
            kw = dict(zip(kw_names, args[len(args) - len(kw_names):])) if kw_names else {}
            pos = args[:len(args) - len(kw_names)] if kw_names else args
            _refuse_generator_callee(fn_var, reason)
            callee, lead = _callee(fn_var, rec, backend, options)
            callee = snapshot(callee)
            arg_exprs = lead + [snapshot(rec.expr(a)) for a in pos]
            arg_exprs += [f"{k}={snapshot(rec.expr(v))}" for k, v in kw.items()]
        else:
            has_kw = bool(ins.arg & 1)
            kw_var = stack[-1] if has_kw else None
            args_var = stack[-2] if has_kw else stack[-1]
            fn_var = stack[-3] if has_kw else stack[-2]
            n_pop = 3 if has_kw else 2
            below = stack[:len(stack) - n_pop]
            if below and isinstance(below[-1], NullVar):
                below = below[:-1]
            callee, lead = _callee(fn_var, rec, backend, options)
            callee = snapshot(callee)
            arg_exprs = lead + [f"*{snapshot(rec.expr(args_var))}"]
            if kw_var is not None:
                arg_exprs.append(f"**{snapshot(rec.expr(kw_var))}")
        resume = _resume_call(fn, frame, rec, snapshot, nxt, below, ["___res"], backend,
                              options, compiled=True)
        if grad_fix:
            tail.append(grad_fix)
        call = f"___res = {callee}({', '.join(arg_exprs)})"
        if exits:
            # An exception out of the call must still leave the split `with` blocks.
            tail += ["try:", f"    {call}", "except BaseException:"]
            tail += [f"    {rec.expr(v)}(None, None, None)" for v in reversed(exits)]
            tail += ["    raise"]
        else:
            tail.append(call)
        tail.append(f"return {resume}")
        return tail
    if op.startswith("POP_JUMP") and ("IF_FALSE" in op or "IF_TRUE" in op) and \
            stack and isinstance(stack[-1], TensorVar) and nxt is not None and not in_try:
        cond = snapshot(rec.expr(stack[-1]))
        rest = stack[:-1]
        jump_when = "IF_TRUE" in op
        on_jump = _resume_call(fn, frame, rec, snapshot, ins.argval, rest, [], backend, options,
                               compiled=True)
        on_next = _resume_call(fn, frame, rec, snapshot, nxt, rest, [], backend, options,
                               compiled=True)
        if grad_fix:
            tail.append(grad_fix)
        tail.append(f"if {'' if jump_when else 'not '}{cond}:")
        tail.append(f"    return {on_jump}")
        tail.append(f"return {on_next}")
        return tail
    simple = _SIMPLE_BREAK_OPS.get(op)
    if simple is not None and nxt is not None and not in_try and \
            not (op == "LOAD_ATTR" and ins.arg & 1):
        n, fmt = simple
        operands = [snapshot(rec.expr(v)) for v in stack[len(stack) - n:]]
        below = stack[:len(stack) - n]
        extra = ["___res"]
        if op == "LOAD_METHOD" or (op == "LOAD_ATTR" and ins.arg & 1):
            from .variables import NullVar as _Null
            below = below + [_Null()]
        expr = fmt(ins, operands, rec.out)
        resume = _resume_call(fn, frame, rec, snapshot, nxt, below, extra, backend, options,
                              compiled=True)
        if grad_fix:
            tail.append(grad_fix)
        tail.append(f"___res = {expr}")
        tail.append(f"return {resume}")
        return tail
    # Any other instruction (or one inside a try block): the rest of the frame, from this
    # instruction on, runs as Python. A call inside a try block still compiles its callee: the
    # callee on the stack is replaced by its compiled form.
    if op in ("CALL", "CALL_FUNCTION_EX") and in_try:
        stack, swapped = _compiled_callee_on_stack(stack, ins, rec, backend, options)
    else:
        swapped = False
    if not swapped and not any(n.op in ("call_function", "call_method")
                               for n in rec.out.graph.nodes):
        raise Unsupported(reason.reason, where=reason.where)  # nothing gained: run eagerly
    resume = _resume_call(fn, frame, rec, snapshot, ins.offset, stack, [], backend, options,
                          compiled=False)
    if grad_fix:
        tail.append(grad_fix)
    tail.append(f"return {resume}")
    return tail
