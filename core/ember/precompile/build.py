"""``ember.precompile``: capture a whole computation as one graph, compile it with a backend and
write the result as a standalone artifact (Python source + cache container).

The steps, each a plain call into the stage before it:

1. capture ``fn(*example_inputs)`` with ``fullgraph=True`` through a recording backend: it keeps
   the torch-level graph and its real example inputs (user tensors, and the parameters and
   buffers of the modules among the arguments, already lifted to graph inputs by capture);
2. map every graph input back to where it comes from: an argument (``x``, ``batch[0]['ids']``)
   or a parameter/buffer of a module argument (``model`` + ``'encoder.0.weight'``), by identity;
3. map the function's result onto the graph's outputs (a fake run of the graph, by identity);
4. compile: level "torch" backends get the graph itself; level "aten" backends go through Ember's
   AOT autograd (forward-only, or forward + backward partitioned), recording each ATen graph and
   what the backend returned for it;
5. write the source: per compiled graph either its fx code (the backend runs it as is: eager,
   aot_eager) or the backend's own fragment (``compiled.ember_precompile(name)``, or the
   plugin hook ``ember_precompile_graph`` of :mod:`ember.hookspecs`), then the checks, the
   autograd glue and the calling convention.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import pprint
import logging
import platform
import textwrap
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.utils import _pytree as pytree

from .. import config
from ..exc import GraphBreakError, Unsupported
from ..plugins import Backend, get_backend
from . import container
from .codegen import PRELUDE, graph_source
from .errors import PrecompileError, PrecompileGraphBreak

__all__ = ["Artifact", "precompile", "FORMAT_VERSION"]

log = logging.getLogger("ember.precompile")

FORMAT_VERSION = 1
_SIMPLE = (int, float, bool, str, type(None))


@dataclasses.dataclass
class Artifact:
    """What :func:`ember.precompile` returns.

    ``source``: standalone Python (imports torch and ``ember.precompile.runtime`` only);
    ``cache``: the container bytes (see :mod:`ember.precompile.container`); ``meta``: what was
    precompiled (function, backend, graphs, inputs), also written into the source.
    """

    source: str
    cache: bytes
    meta: dict[str, Any]

    def __repr__(self) -> str:
        return (f"<ember precompile Artifact: {self.meta.get('function')}, backend "
                f"{self.meta.get('backend')!r} ({self.meta.get('kind')}), source "
                f"{len(self.source)} chars, cache {len(self.cache)} bytes>")

    def save(self, path: str) -> None:
        """Write ``path/artifact.py`` and ``path/artifact.cache`` (the folder is created)."""
        from .loader import save

        save(self, path)

    def load(self) -> Any:
        """The callable, built from this artifact in this process (as ``ember.precompile.load``)."""
        from .loader import load

        return load(source=self.source, cache=self.cache)


# ---------------------------------------------------------------------------------------------
# 1. capture
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Backward:
    """A ``tensor.backward(...)`` call the function made after its graph (a training step)."""
    tensor: Any
    gradient: Any
    retain_graph: Any
    where: str  # file:line of the call


@dataclasses.dataclass
class _Captured:
    gm: torch.fx.GraphModule
    example_inputs: list[torch.Tensor]
    fake_outputs: tuple
    result: Any
    entry: Any
    backward: list[_Backward] = dataclasses.field(default_factory=list)
    entries: list[Any] = dataclasses.field(default_factory=list)  # every entry capture made


def _fake_run(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> tuple:
    """The graph's outputs as FakeTensors (identity tells them apart; nothing is computed, no
    input is mutated). Falls back to a real run on detached clones."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode, torch.no_grad():
            fakes = [mode.from_tensor(t) for t in inputs]
            return tuple(gm(*fakes))
    except Exception as e:  # an op without a meta kernel: compute it instead
        log.debug("fake run failed (%s); running the graph on clones", e)
        with torch.no_grad():
            return tuple(gm(*[t.detach().clone() for t in inputs]))


_BACKWARD_BREAK = "Tensor.backward()"


def _is_backward_break(b: Any) -> bool:
    return str(b).lstrip().startswith(_BACKWARD_BREAK)


def _break_location(b: Any) -> str:
    """``file:line in func`` of a graph break, from capture's message (its ``at ...`` line)."""
    for ln in str(b).splitlines():
        ln = ln.strip()
        if ln.startswith("at "):
            return ln[3:].split(" <- ")[0]
    return "?"


def _capture(call: Callable[..., Any], bound_self: Any, args: tuple) -> _Captured:
    """Capture ``call(*args)`` as one graph. A function whose only graph breaks are
    ``tensor.backward()`` calls (a training step) is captured again with breaks allowed: the
    graph is what comes before them, and each backward call is recorded (not run) so the
    artifact can replay it on the graph's outputs."""
    try:
        return _capture_once(call, bound_self, args, step=False)
    except PrecompileGraphBreak as e:
        breaks = getattr(e, "breaks", [])
        if not breaks or not all(_is_backward_break(b) for b in breaks):
            raise
    return _capture_once(call, bound_self, args, step=True,
                         where=[_break_location(b) for b in breaks])


def _capture_once(call: Callable[..., Any], bound_self: Any, args: tuple, step: bool,
                  where: Sequence[str] = ()) -> _Captured:
    from ..capture import frame as frame_mod

    records: list[Any] = []
    backward: list[_Backward] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any], **_: Any) -> Any:
        def run(*inputs: Any) -> Any:
            outs = _fake_run(gm, inputs)
            records.append((gm, list(example_inputs), outs))
            return outs
        return run

    def record_backward(self: torch.Tensor, gradient: Any = None, retain_graph: Any = None,
                        create_graph: bool = False, inputs: Any = None) -> None:
        loc = where[len(backward)] if len(backward) < len(where) else "?"
        if create_graph or inputs is not None:
            raise PrecompileError(
                f"ember.precompile: {loc}: backward(create_graph=True) or backward(inputs=...) "
                "is not supported in a precompiled step; call backward() without them")
        backward.append(_Backward(self, gradient, retain_graph, loc))

    backend = Backend(name="precompile-capture", compile=record, level="torch")
    cf = frame_mod.CompiledFunction(call, backend, {}, fullgraph=not step, bound_self=bound_self)
    before = set(frame_mod._code_caches)
    saved_backward = torch.Tensor.backward
    try:
        with config.patch(suppress_errors=False):
            if step:  # the call runs for real: backward() is recorded, never run
                torch.Tensor.backward = record_backward  # type: ignore[method-assign]
            result = cf(*args)
    except GraphBreakError as e:
        breaks = getattr(e, "breaks", [])
        text = str(e).replace("ember.compile(fullgraph=True)", "ember.precompile")
        hint = ("\nember.precompile needs the whole computation as one graph; a training step "
                "may call loss.backward() (see docs/precompile.md, 'Training').")
        err = PrecompileGraphBreak(text + hint)
        err.breaks = breaks  # type: ignore[attr-defined]
        raise err from None
    except Unsupported as e:
        raise PrecompileError(f"ember.precompile: capture failed: {e}") from None
    finally:
        torch.Tensor.backward = saved_backward  # type: ignore[method-assign]
        made = [c for k, c in list(frame_mod._code_caches.items()) if k not in before]
        entries = [e for c in made for e in c.entries]
        for k, c in list(frame_mod._code_caches.items()):
            if k not in before or c is cf.cache:
                del frame_mod._code_caches[k]
    if not records:
        raise PrecompileError("ember.precompile: the function performs no tensor operation; "
                              "there is nothing to precompile")
    if len(records) > 1:
        if step:
            raise PrecompileError(
                f"ember.precompile: the training step computes with tensors after calling "
                f"backward() ({backward[0].where if backward else '?'}); capture made "
                f"{len(records)} graphs. Compute everything before backward() and return it "
                "(e.g. the loss); after backward() the step may only return.")
        raise PrecompileError(f"ember.precompile: capture produced {len(records)} graphs; "
                              "expected one")
    gm, example_inputs, outs = records[0]
    if step and not backward:
        raise PrecompileError("ember.precompile: the function breaks the graph at a "
                              "backward() call that was never made")
    entry = cf.cache.entries[0] if cf.cache.entries else None
    return _Captured(gm, example_inputs, outs, result, entry, backward, entries)


_ENTRY_OK = ("___p", "___v", "return ", "___torch._C._set_grad_enabled(")


def _noop_store(line: str, values: dict[str, str], ns: dict[str, Any]) -> bool:
    """Is ``target = ___pN`` a store of the value the target already holds (a library that sets
    a global and puts it back, as transformers' output collector does)? Both sides are
    evaluated in the entry's namespace; anything that needs the call's arguments is not."""
    target, _, value = (p.strip() for p in line.partition(" = "))
    expr = values.get(value)
    if not target or expr is None or "___o" in expr:
        return False
    try:
        return eval(target, dict(ns)) is eval(expr, dict(ns))  # noqa: S307 - Ember's own code
    except Exception:
        return False


def _check_no_side_effects(entry: Any) -> None:
    """The entry replays Python side effects (attribute stores, list mutations, globals) after
    the graph: an artifact cannot, so it refuses them (stores that change nothing excepted)."""
    from ..capture.lifetime import namespace

    lines = getattr(entry, "source", "").splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("___o = "))
    except StopIteration:
        return
    values: dict[str, str] = {}
    for ln in lines[start + 1:]:
        s = ln.strip()
        if s.startswith("___p") and " = " in s:
            name, _, expr = s.partition(" = ")
            values[name.strip()] = expr.strip()
        if s and not s.startswith(_ENTRY_OK) and \
                not _noop_store(s, values, namespace(entry)):
            raise PrecompileError(
                "ember.precompile: the function has a Python side effect that a precompiled "
                f"artifact cannot replay (generated step: {s!r}). Precompile a function that "
                "only computes and returns tensors.")


#: Lines of a training step's entry (capture's generated code around the graph break at
#: backward()) that only pass values along: anything else is a Python side effect.
_STEP_ENTRY_OK = ("___p", "___o = ", "___res = ", "return ",
                  "___torch._C._set_grad_enabled(")


def _check_step_entry(entry: Any) -> None:
    """A training step captured with its backward() break: the generated code around the graph
    may only pass values to the graph, the backward call and the rest of the function."""
    lines = getattr(entry, "source", "").splitlines()
    misses = [i for i, ln in enumerate(lines) if ln.strip() == "return ___MISS"]
    if not misses:
        return
    start = misses[-1] + 1  # after the guards
    for ln in lines[start:]:
        s = ln.strip()
        if s and not s.startswith(_STEP_ENTRY_OK):
            raise PrecompileError(
                "ember.precompile: the training step has a Python side effect that a "
                f"precompiled artifact cannot replay (generated step: {s!r}). Precompile a step "
                "that computes tensors, calls backward() and returns.")


def _backward_lines(calls: list[_Backward], out_index: dict[int, int],
                    arg_expr: dict[int, str]) -> list[str]:
    """The ``call`` lines replaying the step's backward() calls on the graph's outputs: autograd
    runs the compiled backward and accumulates into ``.grad`` as in eager."""
    lines = []
    for c in calls:
        if id(c.tensor) not in out_index:
            raise PrecompileError(f"ember.precompile: {c.where}: backward() is called on a "
                                  "tensor that is not computed by the precompiled graph")
        args = []
        if c.gradient is not None:
            if not isinstance(c.gradient, torch.Tensor):
                raise PrecompileError(f"ember.precompile: {c.where}: backward(gradient=...) "
                                      "must be a tensor")
            g = id(c.gradient)
            if g in out_index:
                args.append(f"r[{out_index[g]}]")
            elif g in arg_expr:
                args.append(arg_expr[g])
            else:
                raise PrecompileError(f"ember.precompile: {c.where}: backward's gradient is "
                                      "neither an argument nor computed by the graph")
        if c.retain_graph is not None:
            args.append(f"retain_graph={bool(c.retain_graph)!r}")
        lines.append(f"    r[{out_index[id(c.tensor)]}].backward({', '.join(args)})"
                     f"  # {c.where}")
    return lines


# ---------------------------------------------------------------------------------------------
# 2. where each graph input comes from; 3. what the result is made of
# ---------------------------------------------------------------------------------------------

#: Names the generated ``call``/``check`` functions use themselves: arguments never take them.
_RESERVED = {"inputs", "r", "run", "check", "call", "make", "cache", "sub_cache", "torch",
             "ARTIFACT", "inf", "nan", "device", "NoneType", "CompiledGraph"}
_RESERVED_PREFIXES = ("_", "p_", "STATE_", "MODES_", "graph_", "make_", "run_", "WRAPPER_", "N_")


def _pyname(i: int, name: str) -> str:
    ok = name.isidentifier() and name not in _RESERVED and not name.startswith(_RESERVED_PREFIXES)
    return name if ok else f"arg{i}"


@dataclasses.dataclass
class _Args:
    names: list[str]
    checks: list[str]  # source lines of the check function
    decls: list[str]  # module-level declarations used by the checks
    tensor_expr: dict[int, str]  # id(tensor) -> expression in the call function
    meta: list[dict[str, Any]]


def _module_state(m: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, bool]]:
    tensors: dict[str, torch.Tensor] = {}
    modes: dict[str, bool] = {}
    for prefix, sub in m.named_modules(remove_duplicate=False):
        modes[prefix] = bool(sub.training)
        dot = prefix + "." if prefix else ""
        for k, v in list(sub._parameters.items()) + list(sub._buffers.items()):
            if v is not None:
                tensors[dot + k] = v
    return tensors, modes


def _t(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)!r}, {t.dtype!r}, {str(t.device)!r}, {bool(t.requires_grad)}"


def _walk_args(names: list[str], args: tuple) -> _Args:
    a = _Args(names, [], [], {}, [])
    aliases: list[tuple[str, str, str]] = []  # (label, expr, expr of the first occurrence)

    def note(t: torch.Tensor, expr: str, label: str) -> None:
        first = a.tensor_expr.setdefault(id(t), expr)
        if first != expr:  # the graph reads one input for both: they must stay one tensor
            aliases.append((label, expr, first))

    def leaf(expr: str, label: str, v: Any, depth: int) -> None:
        if isinstance(v, torch.Tensor):
            if type(v) not in (torch.Tensor, torch.nn.Parameter):
                raise PrecompileError(f"argument {label!r}: tensor subclass {type(v).__name__} "
                                      "is not supported by precompile")
            a.checks.append(
                f"_rt.check_tensor({label!r}, {expr}, {tuple(v.shape)!r}, {tuple(v.stride())!r}, "
                f"{v.dtype!r}, {str(v.device)!r}, {v.layout!r}, {bool(v.requires_grad)})")
            note(v, expr, f"argument {label!r}")
        elif isinstance(v, torch.nn.Module):
            if depth:
                raise PrecompileError(f"argument {label!r}: a module inside a container; pass "
                                      "modules as direct arguments")
            tensors, modes = _module_state(v)
            cls = f"{type(v).__module__}.{type(v).__qualname__}"
            state = ",\n".join(f"    {k!r}: ({_t(t)})" for k, t in tensors.items())
            a.decls.append(f"STATE_{expr} = {{\n{state}\n}}")
            a.decls.append(f"MODES_{expr} = {modes!r}")
            hooked = sorted(p for p, sub in v.named_modules(remove_duplicate=False)
                            if sub._forward_hooks or sub._forward_pre_hooks)
            a.checks.append(f"p_{expr} = _rt.check_module({label!r}, {expr}, {cls!r}, "
                            f"STATE_{expr}, MODES_{expr}"
                            + (f", frozenset({hooked!r}))" if hooked else ")"))
            for k, t in tensors.items():
                note(t, f"p_{expr}[{k!r}]", f"{label}.{k}")
            a.meta.append({"argument": label, "module": cls, "tensors": len(tensors)})
        elif isinstance(v, (list, tuple)) and type(v) in (list, tuple):
            a.checks.append(f"_rt.check_value({label + ' (container)'!r}, "
                            f"(type({expr}), len({expr})), ({type(v).__name__}, {len(v)}))")
            for i, item in enumerate(v):
                leaf(f"{expr}[{i}]", f"{label}[{i}]", item, depth + 1)
        elif type(v) is dict and all(type(k) in (str, int) for k in v):
            a.checks.append(f"_rt.check_value({label + ' (keys)'!r}, list({expr}), "
                            f"{list(v)!r})")
            for k, item in v.items():
                leaf(f"{expr}[{k!r}]", f"{label}[{k!r}]", item, depth + 1)
        elif type(v) in _SIMPLE and not (isinstance(v, float) and v != v):
            a.checks.append(f"_rt.check_value({label!r}, {expr}, {v!r})")
        elif isinstance(v, (torch.dtype, torch.device)):
            a.checks.append(f"_rt.check_value({label!r}, {expr}, {_const(v)})")
        else:
            raise PrecompileError(
                f"argument {label!r} of type {type(v).__name__}: precompile takes tensors, "
                "modules, numbers, strings, None, dtypes, devices and lists/tuples/dicts of "
                "them as arguments")

    for name, v in zip(names, args):
        leaf(name, name, v, 0)
    for label, expr, first in aliases:
        a.checks.append(f"_rt.check_alias({label!r}, {expr}, {first})")
    return a


def _const(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return repr(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return f"float({str(v)!r})"
    if type(v) in _SIMPLE:
        return repr(v)
    raise PrecompileError(f"ember.precompile: the result holds a {type(v).__name__} "
                          f"({v!r:.80}), which cannot be written as source")


def _result_expr(result: Any, out_index: dict[int, int], arg_expr: dict[int, str]) -> str:
    """Python expression rebuilding ``result`` from ``r`` (the graph's flat outputs)."""
    if isinstance(result, torch.Tensor):
        if id(result) in out_index:
            return f"r[{out_index[id(result)]}]"
        if id(result) in arg_expr:
            return arg_expr[id(result)]
        raise PrecompileError("ember.precompile: the result holds a tensor that is neither a "
                              "graph output nor an argument (a global or closure tensor?)")
    if type(result) is tuple:
        inner = ", ".join(_result_expr(v, out_index, arg_expr) for v in result)
        return f"({inner}{',' if len(result) == 1 else ''})"
    if type(result) is list:
        return "[" + ", ".join(_result_expr(v, out_index, arg_expr) for v in result) + "]"
    if type(result) is dict:
        return "{" + ", ".join(f"{_const(k)}: {_result_expr(v, out_index, arg_expr)}"
                               for k, v in result.items()) + "}"
    if isinstance(result, torch.Size):
        return f"torch.Size({list(result)!r})"
    return _const(result)


_GUARD_BUILTINS = {"type", "int", "float", "bool", "str", "len", "tuple", "list", "dict", "None",
                   "True", "False", "hasattr", "getattr", "isinstance", "bytes", "range"}


def _value_guards(guards: list[str], orig: list[str], new: list[str], args: tuple) -> list[str]:
    """Capture's guards on plain Python values reached from the arguments (a module's
    ``heads`` or ``eps``, a config flag, ``hasattr(model, 'config')``): the graph was
    specialized on them, so the artifact checks them too. Only guards that name nothing but the
    arguments and a few builtins are kept (identity guards on objects of the tracing process
    cannot hold for another model); each is renamed to the artifact's argument names and must
    hold for the example inputs."""
    import ast

    rename = dict(zip(orig, new))
    env = dict(zip(new, args))
    out = []
    for g in guards:
        try:
            tree = ast.parse(g, mode="eval")
        except SyntaxError:
            continue
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        if not names or not names & set(orig) or not names <= set(orig) | _GUARD_BUILTINS:
            continue

        class _Rename(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.AST:
                if node.id in rename:
                    return ast.copy_location(ast.Name(rename[node.id], node.ctx), node)
                return node

        expr = ast.unparse(_Rename().visit(tree))
        try:
            ok = eval(expr, {"__builtins__": __builtins__}, dict(env)) is True  # noqa: S307
        except Exception:
            ok = False
        if ok:
            out.append(f"_rt.check_guard({expr!r}, lambda: {expr})")
    return out


# ---------------------------------------------------------------------------------------------
# 4. compile
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Compiled:
    kind: str  # "torch", "inference", "training"
    graphs: list[tuple[str, torch.fx.GraphModule, Any]]  # (name, gm, backend's callable)
    runtime: Any = None  # AOT's ForwardOnly / Training


def _input_infos(cap: _Captured, exprs: list[str]) -> list[Any]:
    """What the backend is told about each graph input. Parameters and buffers are read from
    the model passed at each call of the artifact: their addresses are *not* stable (a backend
    must not bake their values or addresses in)."""
    from ..context import InputInfo

    infos = []
    for t, e in zip(cap.example_inputs, exprs):
        if e.startswith("p_"):
            kind = "parameter" if isinstance(t, torch.nn.Parameter) else "buffer"
        else:
            kind = "user"
        infos.append(InputInfo(kind, e, False))
    return infos


def _compile(cap: _Captured, be: Backend, options: dict[str, Any], exprs: list[str]
             ) -> _Compiled:
    from ..backends import (_global_state, _run_passes, _set_global_state, call_backend,
                            make_context)

    recorded: list[tuple[torch.fx.GraphModule, Any]] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list[Any], *, context: Any = None,
                  **kw: Any) -> Any:
        fn = call_backend(be, gm, example_inputs, kw, context)
        recorded.append((gm, fn))
        return fn

    rec_be = dataclasses.replace(be, compile=recording)
    gm = _run_passes(cap.gm, "torch")
    ctx = make_context(gm, cap.example_inputs, be, options, _input_infos(cap, exprs),
                       "precompile")
    state = _global_state()
    try:
        if be.level == "torch":
            fn = call_backend(rec_be, gm, list(cap.example_inputs), options, ctx)
            return _Compiled("torch", [("graph", gm, fn)])
        from ..aot import aot_compile

        aot = aot_compile(gm, list(cap.example_inputs), backend=rec_be, options=options,
                          context=ctx)
    finally:
        _set_global_state(state)
    (runtime,) = aot._variants.values()
    if type(runtime).__name__ == "ForwardOnly":
        (g, fn), = recorded
        return _Compiled("inference", [("forward", g, fn)], runtime)
    (fg, ffn), (bg, bfn) = recorded
    return _Compiled("training", [("forward", fg, ffn), ("backward", bg, bfn)], runtime)


def _graph_code(name: str, gm: torch.fx.GraphModule, fn: Any, backend: str,
                options: dict[str, Any]) -> tuple[str, dict[str, bytes], str]:
    """(source defining ``make_{name}(cache)``, cache entries, how it runs): the compiled
    callable's own ``ember_precompile(name)``, else the first plugin answering the
    ``ember_precompile_graph`` hook, else the graph itself when the backend runs it as is."""
    hook = getattr(fn, "ember_precompile", None)
    if hook is None:
        from ..plugins import ensure_loaded, plugin_manager

        ensure_loaded()
        res = plugin_manager().hook.ember_precompile_graph(backend=backend, name=name, gm=gm,
                                                           compiled=fn, options=dict(options))
        if res is not None:
            hook = lambda _name: res  # noqa: E731
    if hook is not None:
        fragment, entries = hook(name)
        entries = {f"{name}/{k}": bytes(v) for k, v in dict(entries).items()}
        return fragment.rstrip() + "\n", entries, f"backend {backend!r}'s own code"
    if getattr(fn, "__self__", None) is gm and getattr(fn, "__name__", "") == "forward":
        code, self_expr = graph_source(gm, f"graph_{name}")
        make = (f"\n\ndef make_{name}(cache):\n"
                f"    consts = {self_expr}\n"
                f"    return lambda *args: graph_{name}(consts, *args)\n")
        return code + make, {}, "the graph as is"
    raise PrecompileError(
        f"backend {backend!r} does not support precompile: the callable it returned for the "
        f"{name} graph ({type(fn).__name__}) has no ember_precompile method. See "
        "docs/precompile.md ('Backends') for the protocol; 'eager' and 'aot_eager' support it.")


# ---------------------------------------------------------------------------------------------
# 5. source
# ---------------------------------------------------------------------------------------------

def _outputs_expr(info: Any, n: int) -> list[str]:
    """The flat outputs of the captured graph from AOT's outputs ``outs`` (its OutputInfo)."""
    # an output that aliases another may come before it: its base is a graph output
    exprs = [f"outs[{o.index}]" if o.kind == "graph" else "" for o in info.outputs]
    for k, o in enumerate(info.outputs):
        if o.kind == "graph":
            continue
        if o.kind == "input_alias":
            base = f"inputs[{o.index}]" + (".detach()" if getattr(o, "detached", False) else "")
            exprs[k] = (f"inputs[{o.index}]" if o.same else
                        f"_rt.input_alias({base}, {o.size!r}, {o.stride!r}, "
                        f"{o.offset}, {getattr(o, 'base_offset', 0)}, {_const(o.dtype)})")
        elif o.kind == "output_alias":
            b = exprs[o.index]
            db = f"({b}).detach()" if getattr(o, "detached", False) else b
            exprs[k] = (b if o.same else
                        f"_rt.output_alias({db}, {o.size!r}, {o.stride!r}, {o.offset}, "
                        f"{_const(o.dtype)})")
        else:
            exprs[k] = _const(o.value)
    return exprs


def _runtime_code(comp: _Compiled, n_inputs: int) -> list[str]:
    """Lines of ``make`` (4-space indented) that define ``run(inputs) -> r`` (flat outputs)."""
    if comp.kind == "torch":
        return ["run_graph = make_graph(sub_cache(cache, 'graph'))",
                "",
                "def run(inputs):",
                "    return run_graph(*inputs)"]
    rt = comp.runtime
    info = rt.info
    n_user = len(info.graph_out_flat)
    if list(pytree.tree_unflatten(list(range(len(info.outputs))), info.out_spec)) != \
            list(range(len(info.outputs))):
        raise PrecompileError("ember.precompile: unexpected output structure of the graph")
    copies = [f"    _rt.copy_back(inputs[{i}], outs[{n_user + j}])"
              for j, i in enumerate(info.mutated)]
    regen = _outputs_expr(info, n_user)
    tail = copies + ["    return [" + ", ".join(regen) + "]"]
    if comp.kind == "inference":
        return ["run_forward = make_forward(sub_cache(cache, 'forward'))",
                "",
                "def run(inputs):",
                "    with _rt.no_autocast():",
                "        outs = run_forward(*inputs)",
                *tail]
    part = rt.partition
    tangent_meta = []
    for node in list(part.bw.graph.nodes)[part.n_saved:]:
        if node.op != "placeholder":
            break
        v = node.meta["val"]
        tangent_meta.append((tuple(v.shape), tuple(v.stride()), v.dtype, str(v.device)))
    deps = [sorted(d) for d in part.grad_tangent_deps]
    return [
        "run_forward = make_forward(sub_cache(cache, 'forward'))",
        "run_backward = make_backward(sub_cache(cache, 'backward'))",
        f"N_FWD, N_SAVED, N_INPUTS = {rt.n_fwd}, {part.n_saved}, {n_inputs}",
        f"NONDIFF_OUTS = {rt.nondiff_outs!r}  # forward outputs that need no gradient",
        f"DIFF_OUTS = {rt.diff_outs!r}",
        f"TANGENTS = {tangent_meta!r}  # (shape, stride, dtype, device) per tangent",
        f"RG_IDX = {rt.rg_idx!r}  # inputs that require grad",
        f"GRAD_DEPS = {[set(d) for d in deps]!r}  # tangents each input gradient depends on",
        "",
        "class CompiledGraph(torch.autograd.Function):",
        "    @staticmethod",
        "    def forward(ctx, *inputs):",
        "        with _rt.no_autocast():",
        "            outs = run_forward(*inputs)",
        "        ctx.save_for_backward(*outs[N_FWD:N_FWD + N_SAVED])",
        "        ctx.set_materialize_grads(False)",
        "        ctx.mark_non_differentiable(*[outs[k] for k in NONDIFF_OUTS])",
        "        return tuple(outs[:N_FWD])",
        "",
        "    @staticmethod",
        "    def backward(ctx, *grads):",
        "        if torch.is_grad_enabled():",
        "            raise RuntimeError('double backward through a precompiled artifact is not "
        "supported')",
        "        tangents, present = _rt.tangents(grads, DIFF_OUTS, TANGENTS)",
        "        if not present:",
        "            return (None,) * N_INPUTS",
        "        with _rt.no_autocast():",
        "            gin = run_backward(*ctx.saved_tensors, *tangents)",
        "        result = [None] * N_INPUTS",
        "        for i, g, deps in zip(RG_IDX, gin, GRAD_DEPS):",
        "            result[i] = g if deps & present else None",
        "        return tuple(result)",
        "",
        "def run(inputs):",
        "    outs = CompiledGraph.apply(*inputs)",
        *tail,
    ]


def _state_line() -> str:
    ac = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")]
    return (f"_rt.check_state({torch.is_grad_enabled()}, {torch.get_default_dtype()!r}, "
            f"{ac!r})")


def _platform(backend: str) -> dict[str, Any]:
    """What cached binaries need from the machine that loads them (compared by load)."""
    from .runtime import cpu_flags

    return {"torch": torch.__version__, "machine": platform.machine(), "backend": backend,
            "cpu_flags_sha256": container.sha256(cpu_flags())}


def _describe(fn: Any) -> str:
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    if code is None:
        return name
    return f"{name} ({code.co_filename}:{code.co_firstlineno})"


def precompile(fn: Any, *example_inputs: Any, backend: str | Backend = "aot_eager",
               options: dict[str, Any] | None = None) -> Artifact:
    """Capture ``fn(*example_inputs)`` as one graph, compile it with ``backend`` and return an
    :class:`Artifact`. See docs/precompile.md."""
    from ..api import _check_python

    _check_python()
    be = get_backend(backend)
    options = dict(options or {})
    be.check_options(options, "ember.precompile")
    if inspect.ismethod(fn) and isinstance(fn.__self__, torch.nn.Module):
        # model.forward (or another method of a module): the module is the first argument
        # of the loaded callable, as for a module passed as fn.
        mod, func = fn.__self__, fn.__func__
        call, bound_self, args = func, mod, (mod, *example_inputs)
        names = ["model"] + list(inspect.signature(func).parameters)[1:]
        what = f"{type(mod).__qualname__}.{func.__name__}"
    elif isinstance(fn, torch.nn.Module):
        call, bound_self, args = type(fn).forward, fn, (fn, *example_inputs)
        params = list(inspect.signature(type(fn).forward).parameters)
        names = ["model"] + params[1:]
        what = f"{type(fn).__qualname__}.forward"
    else:
        if not callable(fn) or getattr(fn, "__code__", None) is None:
            raise TypeError(f"ember.precompile expects a Python function or an nn.Module, got "
                            f"{type(fn).__name__}")
        call, bound_self, args = fn, None, example_inputs
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [p.name for p in params]
        what = _describe(fn)
    names = [_pyname(i, names[i] if i < len(names) else "") for i in range(len(args))]
    if len(set(names)) != len(names):
        names = [f"arg{i}" for i in range(len(args))]
    walked = _walk_args(names, args)
    cap = _capture(call, bound_self, example_inputs)
    if cap.backward:
        for e in cap.entries:
            _check_step_entry(e)
    else:
        _check_no_side_effects(cap.entry)
    orig = list(call.__code__.co_varnames[:call.__code__.co_argcount])[:len(args)]
    walked.checks += _value_guards(list(getattr(cap.entry, "guards", [])), orig, names, args)
    if not all(isinstance(t, torch.Tensor) for t in cap.example_inputs):
        raise PrecompileError("ember.precompile: the graph has non-tensor inputs")
    input_exprs = []
    for node, t in zip([n for n in cap.gm.graph.nodes if n.op == "placeholder"],
                       cap.example_inputs):
        e = walked.tensor_expr.get(id(t))
        if e is None:
            raise PrecompileError(
                f"ember.precompile: the graph reads the tensor {node.name!r} (shape "
                f"{tuple(t.shape)}), which is not an argument nor a parameter/buffer of a module "
                "argument (a global or a closure?). Pass it, or the model that holds it, as an "
                "argument: ember.precompile(lambda model, x: model(x), model, x).")
        input_exprs.append(e)
    out_index = {id(o): i for i, o in enumerate(cap.fake_outputs)}
    result = _result_expr(cap.result, out_index, walked.tensor_expr)
    backward_lines = _backward_lines(cap.backward, out_index, walked.tensor_expr)

    comp = _compile(cap, be, options, input_exprs)
    parts, entries, how = [], {}, []
    for name, g, cfn in comp.graphs:
        code, ents, desc = _graph_code(name, g, cfn, be.name, options)
        n_ops = sum(1 for n in g.graph.nodes if n.op == "call_function")
        parts.append(f"# {'=' * 90}\n# graph {name!r}: {n_ops} ops; runs {desc}\n"
                     f"# {'=' * 90}\n{code}")
        entries.update(ents)
        how.append({"graph": name, "ops": n_ops, "runs": desc})

    meta = {
        "format": FORMAT_VERSION,
        "function": what,
        "backend": be.name,
        "kind": comp.kind,
        "backward_in_function": len(cap.backward),
        "arguments": names,
        "modules": walked.meta,
        "graphs": how,
        "options": {k: repr(v) for k, v in options.items()},
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    sig = ", ".join(names)
    check_body = [_state_line()] + walked.checks
    module_vars = sorted({c.split(" = ")[0] for c in walked.checks if " = " in c})
    check_body.append(f"return {', '.join(module_vars)}" if len(module_vars) != 1
                      else f"return {module_vars[0]},")
    if not module_vars:
        check_body[-1] = "return ()"
    make_body = _runtime_code(comp, len(input_exprs)) + [
        "",
        f"def call({sig}):",
        f"    {', '.join(module_vars) + ',' if module_vars else '_'} = check({sig})",
        f"    inputs = [{', '.join(input_exprs)}]",
        "    r = run(inputs)",
        *backward_lines,
        f"    return {result}",
        "",
        "call.check = check",
        "return call",
    ]
    header = textwrap.dedent(f'''\
        """Ember precompiled artifact: {what}, backend {be.name!r} ({comp.kind}).

        Generated by ember.precompile (format {FORMAT_VERSION}) on {meta["created"]} with torch
        {torch.__version__}. Loading this file executes it: load it only from where you would
        load code. Call: call({sig}) with arguments like those it was precompiled with (the
        checks below say which); model weights are read from the model passed at each call.
        """
        import torch
        from ember.precompile import runtime as _rt

        ''')
    src = [header, PRELUDE,
           "ARTIFACT = " + pprint.pformat(meta, width=96) + "\n\n",
           "\n\n".join(parts),
           "\n\n# " + "=" * 90 + "\n# checks: what the graph was traced for\n# " + "=" * 90,
           "\n" + "\n\n".join(walked.decls) + ("\n" if walked.decls else ""),
           f"\n\ndef check({sig}):\n" + textwrap.indent("\n".join(check_body), "    ") + "\n",
           "\n\ndef sub_cache(cache, name):\n"
           "    if cache is None:\n"
           "        return None\n"
           "    return {k[len(name) + 1:]: v for k, v in cache.items() "
           "if k.startswith(name + '/')}\n",
           "\n\ndef make(cache):\n"
           '    """The compiled function. ``cache``: name -> bytes (from the artifact\'s cache '
           'container), or None to build everything from this source."""\n'
           + textwrap.indent("\n".join(make_body), "    ") + "\n"]
    source = "".join(src)
    source = "\n".join(ln.rstrip() for ln in source.splitlines()) + "\n"
    try:
        compile(source, "<ember precompiled artifact>", "exec")
    except SyntaxError as e:  # an Ember bug: show the line
        raise PrecompileError(f"ember.precompile generated invalid source at line {e.lineno}: "
                              f"{source.splitlines()[(e.lineno or 1) - 1]!r}") from e
    cache = container.pack(entries, source_sha256=container.sha256(source),
                           platform=_platform(be.name))
    return Artifact(source, cache, meta)
