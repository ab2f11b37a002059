"""Shared machinery for the capture and graph-break corpora.

A *program* is a factory (decorated with :func:`program`) that builds fresh state and returns
``(callable, calls)`` or ``(callable, calls, state)``:

* ``callable``: a plain function or an ``nn.Module``;
* ``calls``: a list of argument tuples or :class:`Call` objects (``R(...)`` must recompile,
  ``M(...)`` may recompile, a plain tuple must not recompile);
* ``state``: an optional zero-argument function returning whatever side effects the caller can
  observe (a closure's list, an object's attributes...). For modules the state_dict is compared
  as well.

The test harnesses call every factory twice under the same seed: one instance runs eagerly (the
reference), the other one compiled, so mutations of inputs, containers and modules can be compared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import math
import random
from typing import Any, Callable

import torch

__all__ = ["Call", "R", "M", "Program", "program", "Built", "t", "build", "invoke",
           "assert_same", "CountingBackend", "torch_calls", "registry"]


@dataclasses.dataclass
class Call:
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    #: True: must recompile; False: must not; None: either is fine.
    recompile: bool | None = False
    #: Run before the call (e.g. ``m.eval()``).
    before: Callable[[], Any] | None = None
    #: A context-manager factory wrapping the call (e.g. ``torch.no_grad``).
    ctx: Callable[[], Any] | None = None


def R(*args: Any, _before: Callable | None = None, _ctx: Callable | None = None,
      **kwargs: Any) -> Call:
    """A call that must recompile."""
    return Call(args, kwargs, True, _before, _ctx)


def M(*args: Any, _before: Callable | None = None, _ctx: Callable | None = None,
      **kwargs: Any) -> Call:
    """A call that may or may not recompile."""
    return Call(args, kwargs, None, _before, _ctx)


def K(*args: Any, _before: Callable | None = None, _ctx: Callable | None = None,
      **kwargs: Any) -> Call:
    """A call that must not recompile (a plain tuple means the same, without kwargs)."""
    return Call(args, kwargs, False, _before, _ctx)


@dataclasses.dataclass
class Program:
    name: str
    factory: Callable[[], tuple]
    #: Expected to compile without falling back to eager.
    full: bool = True
    #: Run backward through outputs that require grad and compare gradients.
    backward: bool = False
    tags: tuple[str, ...] = ()


@dataclasses.dataclass
class Built:
    fn: Any
    calls: list[Call]
    state: Callable[[], Any] | None


def registry() -> dict[str, Program]:
    return {}


def program(reg: dict[str, Program], **opts: Any) -> Callable:
    def deco(factory: Callable) -> Callable:
        name = factory.__name__
        assert name not in reg, f"duplicate program {name}"
        reg[name] = Program(name, factory, **opts)
        return factory
    return deco


def t(*shape: int, dtype: torch.dtype = torch.float32, rg: bool = False) -> torch.Tensor:
    """A tiny random tensor (deterministic under the harness seed)."""
    if dtype.is_floating_point:
        x = torch.randn(*shape).to(dtype)
    elif dtype == torch.bool:
        x = torch.randn(*shape) > 0
    else:
        x = torch.randint(-4, 5, shape).to(dtype)
    if rg:
        x.requires_grad_(True)
    return x


def seed(s: int = 0) -> None:
    torch.manual_seed(s)
    random.seed(s)


def build(prog: Program) -> Built:
    seed(0)
    res = prog.factory()
    fn, calls = res[0], res[1]
    state = res[2] if len(res) > 2 else None
    norm = []
    for i, c in enumerate(calls):
        if not isinstance(c, Call):
            c = Call(tuple(c))
        if i == 0:
            c = dataclasses.replace(c, recompile=False)
        norm.append(c)
    return Built(fn, norm, state)


def invoke(fn: Callable, call: Call) -> Any:
    if call.before is not None:
        call.before()
    cm = call.ctx() if call.ctx is not None else contextlib.nullcontext()
    with cm:
        return fn(*call.args, **call.kwargs)


def snapshot_state(built: Built) -> Any:
    out: dict[str, Any] = {}
    if isinstance(built.fn, torch.nn.Module):
        out["state_dict"] = {k: v.detach().clone() for k, v in built.fn.state_dict().items()}
        out["training"] = [m.training for m in built.fn.modules()]
        out["grads"] = {n: (None if p.grad is None else p.grad.clone())
                        for n, p in built.fn.named_parameters()}
    if built.state is not None:
        out["user"] = built.state()
    return out


def _float_tensors(obj: Any, acc: list) -> list:
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad and obj.dtype.is_floating_point:
            acc.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _float_tensors(o, acc)
    elif isinstance(obj, dict):
        for o in obj.values():
            _float_tensors(o, acc)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _float_tensors(getattr(obj, f.name), acc)
    return acc


def run_backward(out: Any) -> bool:
    ts = _float_tensors(out, [])
    if not ts:
        return False
    sum(x.float().sum() for x in ts).backward()
    return True


def input_grads(args: Any) -> list:
    acc: list = []

    def walk(o: Any) -> None:
        if isinstance(o, torch.Tensor):
            if o.is_leaf and o.requires_grad:
                acc.append(o.grad)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)
    walk(args)
    return acc


def assert_same(actual: Any, expected: Any, path: str = "out", _seen: set | None = None) -> None:
    """Structural comparison: tensors with assert_close (plus requires_grad), containers element
    by element with their exact type, dataclasses/plain objects by their attributes."""
    seen = _seen if _seen is not None else set()
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual)}"
        torch.testing.assert_close(actual, expected, equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
        assert actual.requires_grad == expected.requires_grad, (
            f"{path}: requires_grad {actual.requires_grad} != {expected.requires_grad}")
        return
    assert type(actual) is type(expected), (
        f"{path}: type {type(actual).__name__} != {type(expected).__name__} "
        f"({actual!r:.80} vs {expected!r:.80})")
    if id(expected) in seen:
        return
    if isinstance(expected, (list, tuple)):
        seen.add(id(expected))
        assert len(actual) == len(expected), f"{path}: len {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]", seen)
    elif isinstance(expected, dict):
        seen.add(id(expected))
        assert list(actual.keys()) == list(expected.keys()), (
            f"{path}: keys {list(actual.keys())} != {list(expected.keys())}")
        for k in expected:
            assert_same(actual[k], expected[k], f"{path}[{k!r}]", seen)
    elif isinstance(expected, (set, frozenset)):
        assert actual == expected, f"{path}: {actual} != {expected}"
    elif isinstance(expected, float):
        assert (math.isnan(actual) and math.isnan(expected)) or math.isclose(
            actual, expected, rel_tol=1e-5, abs_tol=1e-6), f"{path}: {actual} != {expected}"
    elif isinstance(expected, (int, str, bool, type(None), torch.dtype, torch.device, torch.Size,
                               bytes, complex, range, slice)):
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
    elif isinstance(expected, torch.nn.Module):
        seen.add(id(expected))
        assert_same(dict(actual.state_dict()), dict(expected.state_dict()), f"{path}.state_dict",
                    seen)
    elif dataclasses.is_dataclass(expected):
        seen.add(id(expected))
        for f in dataclasses.fields(expected):
            assert_same(getattr(actual, f.name), getattr(expected, f.name), f"{path}.{f.name}",
                        seen)
    elif hasattr(expected, "__dict__") and not callable(expected):
        seen.add(id(expected))
        assert_same(dict(vars(actual)), dict(vars(expected)), f"{path}.__dict__", seen)
    elif callable(expected):
        pass  # functions: nothing meaningful to compare across instances
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def identity_map(out: Any, args: tuple) -> list:
    """For each top-level output (or element of a top-level tuple/list), the index of the input
    argument it *is*, or None: a compiled function must return the caller's own objects."""
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    res = []
    for o in items:
        idx = None
        for j, a in enumerate(args):
            if o is a and not isinstance(a, (int, float, bool, str, type(None))):
                idx = j
        res.append(idx)
    return res


class CountingBackend:
    """An in-process backend ``(gm, example_inputs) -> gm.forward`` that records every graph."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.__name__ = "counting"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs.append(gm)
        return gm.forward

    def node_counts(self, start: int = 0) -> list[int]:
        return [torch_calls(g) for g in self.graphs[start:]]


def torch_calls(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes
               if n.op in ("call_function", "call_method", "call_module"))


def graph_ops(gm: torch.fx.GraphModule) -> list[str]:
    out = []
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method", "call_module"):
            tgt = n.target
            out.append(tgt if isinstance(tgt, str) else getattr(tgt, "__name__", str(tgt)))
    return out


# --------------------------------------------------------------------------------------------------
# Running a program: freeze what the caller can observe after each call
# --------------------------------------------------------------------------------------------------

def freeze(o: Any, _memo: dict | None = None) -> Any:
    """A deep snapshot of ``o`` (tensors cloned), so later mutation cannot change a record."""
    memo = _memo if _memo is not None else {}
    if id(o) in memo:
        return memo[id(o)]
    if isinstance(o, torch.Tensor):
        c = o.detach().clone()
        if o.requires_grad:
            c.requires_grad_(True)
        res: Any = c
    elif isinstance(o, torch.nn.Module):
        res = ("<module>", type(o).__name__,
               {k: v.detach().clone() for k, v in o.state_dict().items()})
    elif isinstance(o, tuple) and hasattr(o, "_fields"):
        res = type(o)(*[freeze(v, memo) for v in o])
    elif isinstance(o, tuple) and type(o).__module__ == "torch.return_types":
        res = type(o)([freeze(v, memo) for v in o])
    elif isinstance(o, tuple):
        res = tuple(freeze(v, memo) for v in o) if type(o) is tuple else o
    elif isinstance(o, list):
        res = [freeze(v, memo) for v in o]
    elif isinstance(o, dict):
        res = ("<" + type(o).__name__ + ">", {k: freeze(v, memo) for k, v in o.items()})
    elif isinstance(o, (set, frozenset)):
        res = set(o)
    elif dataclasses.is_dataclass(o) and not isinstance(o, type):
        res = ("<dc>", type(o).__name__,
               {f.name: freeze(getattr(o, f.name), memo) for f in dataclasses.fields(o)})
    elif isinstance(o, (int, float, str, bool, type(None), torch.dtype, torch.device, torch.Size,
                        bytes, complex, range, slice)):
        res = o
    elif callable(o) or isinstance(o, type):
        res = ("<callable>",)
    elif hasattr(o, "__dict__"):
        res = ("<obj>", type(o).__name__, {k: freeze(v, memo) for k, v in vars(o).items()})
    else:
        res = o
    memo[id(o)] = res
    return res


@dataclasses.dataclass
class Record:
    out: Any
    args: Any
    state: Any
    grads: Any
    ident: list
    extra: dict


def run_program(prog: Program, wrap: Callable[[Any], Any] | None = None,
                observe: Callable[[int, Call], dict] | None = None,
                built: Built | None = None, limit: int | None = None,
                stdout: bool = False) -> list[Record]:
    """Build ``prog`` (unless ``built`` is given), optionally wrap its callable (compile it), run
    every call and return one frozen Record per call. ``observe(i, call)`` runs after call i."""
    built = built if built is not None else build(prog)
    fn = built.fn if wrap is None else wrap(built.fn)
    records = []
    for i, call in enumerate(built.calls[:limit]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf) if stdout else contextlib.nullcontext():
            out = invoke(fn, call)
        if prog.backward:
            run_backward(out)
        records.append(Record(
            out=freeze(out), args=freeze((call.args, call.kwargs)),
            state=freeze(snapshot_state(built)), grads=freeze(input_grads(call.args)),
            ident=identity_map(out, call.args),
            extra=dict(observe(i, call) if observe is not None else {},
                       **({"stdout": buf.getvalue()} if stdout else {}))))
    return records


class LogTap(logging.Handler):
    """Collects fallback / break / recompile log lines of Ember for failure messages."""

    NAMES = ("ember.fallback", "ember.graph_breaks", "ember.recompiles", "ember.capture")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._old: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(f"{record.name}: {record.getMessage()}")
        except Exception:  # noqa: BLE001 - a broken log call must not break the test harness
            self.lines.append(f"{record.name}: <unformattable {record.msg!r}>")

    def __enter__(self) -> "LogTap":
        for n in self.NAMES:
            lg = logging.getLogger(n)
            self._old[n] = lg.level
            if not lg.isEnabledFor(logging.INFO):
                lg.setLevel(logging.INFO)
            lg.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        for n in self.NAMES:
            lg = logging.getLogger(n)
            lg.removeHandler(self)
            lg.setLevel(self._old[n])

    def text(self, limit: int = 12) -> str:
        return "\n".join(self.lines[-limit:]) or "<no ember log lines>"


def compare_records(actual: list[Record], expected: list[Record]) -> None:
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a.out, e.out, f"call[{i}].out")
        assert_same(a.args, e.args, f"call[{i}].inputs_after_call")
        assert_same(a.state, e.state, f"call[{i}].state")
        assert_same(a.grads, e.grads, f"call[{i}].input_grads")
        assert a.ident == e.ident, (
            f"call[{i}]: output identity with inputs differs: {a.ident} != {e.ident} "
            "(index of the input argument each output *is*)")
