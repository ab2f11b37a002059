"""The symbolic interpreter of CPython 3.11/3.12 bytecode.

``Frame`` runs one code object over symbolic values (variables.py); ``Tracer`` holds what all
frames of one capture share: the output graph, the wrapping of real values (with their guards),
and the semantics of calls, attributes and operators. User functions and module ``forward``s are
inlined by running a child ``Frame``; anything it cannot trace raises ``Unsupported`` with the
user's file:line.
"""

from __future__ import annotations

import contextlib
import collections
import dataclasses
import dis
import enum
import functools
import inspect
import logging
import operator
import sys
import types
import weakref
from typing import Any, Callable

import torch
import torch.fx

from .. import config
from ..exc import Unsupported
from .._views import elements_meet, self_overlapping
from . import rules, tensorprops
from .output import OutputGraph
from .sources import (Attr, Buffer, CellContents, ClosureCell, Defaults, GetItem, Global,
                      ModuleChild, NamespaceRef, Param, Source)
from .variables import (AutocastVar, BoundMethodVar, BuiltinVar, CellVar, ClassVar, ConstVar,
                        ContainerMethodVar, DataclassVar, DictVar, ExitVar, FunctionVar,
                        GradModeVar, IteratorVar, ListVar, NestedFunctionVar,
                        NNModuleVar, NullVar, ObjectVar, PyModuleVar, PyRaise, SetVar, SuperVar,
                        TensorMethodVar, TensorVar, TupleVar, Var, PartialVar)

log = logging.getLogger("ember.capture")
#: what torch's argument parser reads a Python scalar type as, where it takes a dtype
_PY_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool,
              complex: torch.complex128}
_NULL = contextlib.nullcontext()  # reusable: no dispatch change for static captures

PY312 = sys.version_info >= (3, 12)
MAX_INSTRUCTIONS = 500_000

_NB_OPS = [op for _, op in dis._nb_ops]  # type: ignore[attr-defined]


class LazyVar(Var):
    """A frame argument not looked at yet: wrapped (and guarded) on first use."""

    def __init__(self, value: Any, source: Source):
        self.value = value
        self.source = source


class UnknownVar(Var):
    """A value that only exists at run time (the result of a call that breaks the graph), met
    while listing breaks for fullgraph=True diagnostics. Any use of it ends the listing."""

    def describe(self) -> str:
        return "a value produced after an earlier graph break"


class BreakHere(Exception):
    """Raised in the root frame at the instruction where a graph break was decided."""

    def __init__(self, frame: "Frame", index: int):
        self.frame = frame
        self.index = index


class _Yield(Exception):
    def __init__(self, value: Var):
        self.value = value


class _Return(Exception):
    def __init__(self, value: Var):
        self.value = value


def _plain_object(value: Any) -> bool:
    """Instances of ordinary Python classes (dataclasses, SimpleNamespace, user classes)."""
    t = type(value)
    if t is types.SimpleNamespace or dataclasses.is_dataclass(value):
        return True
    return (type(t) is type and t.__module__ not in ("builtins",) and
            hasattr(value, "__dict__") and not callable(value) and
            inspect.getattr_static(t, "__getattr__", None) is None and
            inspect.getattr_static(t, "__getattribute__", None) is object.__getattribute__)




def _aliasable(value: Any) -> bool:
    """A mutable object whose guard does not pin its identity (containers, plain objects)."""
    return type(value) in (list, dict, set, collections.OrderedDict,
                           collections.defaultdict) or _plain_object(value)


def _is_model_output(cls: type) -> bool:
    return any(c.__name__ == "ModelOutput" for c in getattr(cls, "__mro__", ()))


def _holds_tensor(r: Any) -> bool:
    return isinstance(r, torch.Tensor) or (
        isinstance(r, (tuple, list)) and any(_holds_tensor(x) for x in r))


class Tracer:
    """State shared by every frame of one capture."""

    def __init__(self, out: OutputGraph, root_fn: Callable[..., Any]):
        self.out = out
        self.root_fn = root_fn
        self.pending_attrs: dict[int, dict[str, Var]] = {}
        self.instructions = 0
        self.frames: list["Frame"] = []
        #: (instruction index, n-th execution) in the root frame where to stop and break.
        self.break_at: tuple[int, int] | None = None
        #: fullgraph diagnostics: when a list, breaks in the root frame are recorded and tracing
        #: goes on past them (a call's result becomes unknown) to list every break it can.
        self.collect_breaks: list[Unsupported] | None = None
        #: the exception an ``except`` clause being traced handles (``sys.exc_info()``)
        self.handled_exc: BaseException | None = None
        #: ids of plain objects copied for real while tracing (stores to them are applied)
        self.owned_objects: set[int] = set()
        #: the cells a resume function received, by id of the real cell
        self.cells_by_id: dict[int, CellVar] = {}
        #: mutable Python objects (lists, dicts, sets, plain objects) wrapped from the call's
        #: state, by id: one object reached through two sources is one Var (see convert.py for
        #: the guard that keeps distinct ones distinct when the capture mutates one)
        self.mutable_by_id: dict[int, Var] = {}

    # =========================================================================================
    # Wrapping real values
    # =========================================================================================
    def wrap(self, value: Any, source: Source | None, *, guard: bool = True) -> Var:
        out = self.out
        if source is None:
            if isinstance(value, (int, float, bool, str, type(None), bytes)):
                return ConstVar(value)
            source = NamespaceRef(out.ns(value, type(value).__name__))
            guard = False
        cached = out.var_by_source.get(source)
        if cached is not None:
            return cached
        aliasable = not isinstance(source, NamespaceRef) and _aliasable(value)
        if aliasable:
            prev = self.mutable_by_id.get(id(value))
            if prev is not None and prev.source is not None:
                # the same list/dict/object through another path: a mutation through one is
                # seen through the other
                if guard:
                    out.guards.add(f"({source}) is ({prev.source})")
                out.var_by_source[source] = prev
                return prev
        v = self._wrap(value, source, guard)
        out.var_by_source[source] = v
        if aliasable and isinstance(v, (ListVar, DictVar, SetVar, ObjectVar)):
            self.mutable_by_id[id(value)] = v
        return v

    def _wrap(self, value: Any, source: Source, guard: bool) -> Var:
        out = self.out
        g = out.guards.add if guard else (lambda e: None)
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided:
                raise Unsupported(f"a tensor with layout {value.layout} ({source}): capture "
                                  "handles strided (dense) tensors only, so this runs eagerly")
            is_param = source.in_module_state() or isinstance(value, torch.nn.Parameter)
            return out.add_input(value, source, is_param=is_param)
        t = type(value)

        def const(expr: str) -> ConstVar:
            return ConstVar(value, source, pending=(lambda: g(expr)) if guard else None)
        if value is None or t is bool:
            return const(f"({source}) is {value!r}")
        if t is int and out.symbolic is not None:  # dynamic shapes: maybe a SymInt argument
            sym = out.symint_arg(value, source)
            if sym is not None:
                return sym
        elif t is int and out.policy.state is not None:
            out.symint_arg(value, source)  # automatic dynamic: remember the value
        if t in (int, float, str, bytes):
            from .guards import const_guard
            return const(const_guard(source, value, out.ns))
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            return const(f"({source}) is {out.ns(value, str(value))}")
        if isinstance(value, torch.device):
            return const(f"({source}) == {out.ns(value, 'device')}")
        if isinstance(value, enum.Enum):
            return const(f"({source}) is {out.ns(value, 'enum')}")
        if t is torch.Size:
            g(f"({source}) == {tuple(value)!r}")
            return TupleVar([ConstVar(int(s)) for s in value], source, cls=torch.Size)
        if isinstance(value, tuple):
            g(f"type({source}) is {out.ns(t, t.__name__)} and len({source}) == {len(value)}")
            items = [self.wrap(x, GetItem(source, i), guard=guard) for i, x in enumerate(value)]
            return TupleVar(items, source, cls=t)
        if t is list:
            g(f"type({source}) is list and len({source}) == {len(value)}")
            return ListVar([self.wrap(x, GetItem(source, i), guard=guard)
                            for i, x in enumerate(value)], source)
        if t in (dict, collections_ordered_dict()):
            keys = list(value.keys())
            if not all(isinstance(k, (str, int, bool, type(None), float)) for k in keys):
                g(f"({source}) is {out.ns(value, 'dict')}")
                return ObjectVar(value, source)
            g(f"type({source}) is {out.ns(t, t.__name__)} and list(({source}).keys()) == {keys!r}")
            return DictVar({k: self.wrap(v, GetItem(source, k), guard=guard)
                            for k, v in value.items()}, source, cls=t)
        if t in (set, frozenset):
            if all(isinstance(k, (str, int, bool, type(None), float)) for k in value):
                # the order too: iteration follows it (strings hash differently per process)
                g(f"type({source}) is {t.__name__} and list({source}) == {list(value)!r}")
                return SetVar([ConstVar(x) for x in value], source, cls=t, real=value)
        if isinstance(value, (range, slice)):
            return const(f"({source}) == {value!r}")
        if isinstance(value, torch.nn.Module):
            if guard:
                by_type = out.module_guard(source, value)
                if by_type is not None:
                    g(by_type)
                else:
                    out.guards.add_identity(source, out.ns(value, type(value).__name__))
            return NNModuleVar(value, source)
        if isinstance(value, types.ModuleType):
            g(f"({source}) is {out.ns(value, value.__name__)}")
            return PyModuleVar(value, source)
        if isinstance(value, type):
            g(f"({source}) is {out.ns(value, value.__name__)}")
            return ClassVar(value, source)
        if isinstance(value, types.FunctionType):
            g(f"({source}) is {out.ns(value, value.__name__)}")
            return FunctionVar(value, source)
        if isinstance(value, types.MethodType):
            g(f"({source}).__func__ is {out.ns(value.__func__, value.__func__.__name__)}")
            fn = self.wrap(value.__func__, Attr(source, "__func__", paren=True), guard=False)
            return BoundMethodVar(fn, self.wrap(value.__self__, Attr(source, "__self__", paren=True),
                                                guard=guard))
        if t is functools.partial and guard and not isinstance(source, NamespaceRef):
            # Read through its parts: ``p.keywords['k'] = 3.0`` (a partial's keywords are a
            # mutable dict) or another process's partial of other arguments (a persisted
            # capture rebinds identity guards) must not replay the arguments traced.
            pa, pk = Attr(source, "args", paren=True), Attr(source, "keywords", paren=True)
            g(f"type({source}) is {out.ns(t, 'partial')} and len({pa}) == {len(value.args)} "
              f"and list({pk}) == {list(value.keywords)!r}")
            pv = PartialVar(self.wrap(value.func, Attr(source, "func", paren=True)),
                            [self.wrap(a, GetItem(pa, i)) for i, a in enumerate(value.args)],
                            {k: self.wrap(a, GetItem(pk, k)) for k, a in value.keywords.items()})
            pv.source = source
            return pv
        if callable(value) and isinstance(value, (types.BuiltinFunctionType,
                                                  types.BuiltinMethodType,
                                                  types.MethodDescriptorType,
                                                  types.WrapperDescriptorType,
                                                  torch._ops.OpOverload,
                                                  torch._ops.OpOverloadPacket,
                                                  functools.partial)):
            g(f"({source}) is {out.ns(value, getattr(value, '__name__', 'fn'))}")
            return BuiltinVar(value, source)
        from .frame import CompiledFunction
        from .output import GradRestore

        if isinstance(value, GradRestore):  # the exit of a grad-mode block split by a break
            g(f"type({source}) is {out.ns(GradRestore, 'GradRestore')} and "
              f"({source}).prev is {value.prev}")
            prev = value.prev

            def restore() -> None:
                from .builtins import _set_grad
                if torch.is_grad_enabled() != prev:
                    _set_grad(self, prev)
            ev = ExitVar(GradModeVar(prev), restore)
            ev.prev_mode = prev  # type: ignore[attr-defined]
            return ev
        from .output import AutocastExit
        if isinstance(value, AutocastExit):  # the exit of an autocast block split by a break
            g(f"type({source}) is {out.ns(AutocastExit, 'AutocastExit')} and "
              f"({source}).device_type == {value.device_type!r} and "
              f"({source}).prev_enabled is {value.prev_enabled} and "
              f"({source}).prev_dtype is {out.ns(value.prev_dtype, str(value.prev_dtype))}")
            ax = value

            def leave() -> None:
                # The graph restores the state (for backends that run Python-level nodes); the
                # entry settles state and autocast's nesting count after the graph, for all.
                from .output import restore_autocast
                restore_autocast(ax.device_type, ax.prev_enabled, ax.prev_dtype)
                out.create_node("call_function", restore_autocast,
                                (ax.device_type, ax.prev_enabled, ax.prev_dtype), {})
                out.autocast_exits.append((ax.device_type, ax.prev_enabled, ax.prev_dtype))
            ev = ExitVar(AutocastVar(value.device_type, None, True), leave)
            ev.source = source
            return ev
        if isinstance(value, CompiledFunction):  # an ember-compiled function called inside
            inner = value.fn
            if value.bound_self is not None:
                return BoundMethodVar(FunctionVar(inner, None), self.wrap(value.bound_self, None))
            g(f"({source}) is {out.ns(value, 'compiled')}")
            return FunctionVar(inner, None)
        if _is_model_output(t) and all(isinstance(k, str) for k in value.keys()):
            # a model's output object made before a break: its fields, as one made while tracing
            keys = list(value.keys())
            g(f"type({source}) is {out.ns(t, t.__name__)} and list(({source}).keys()) == {keys!r}")
            return DataclassVar(t, {k: self.wrap(v, GetItem(source, k), guard=guard)
                                    for k, v in value.items()})
        if _plain_object(value):
            # Attribute reads are guarded one by one, so any instance of the class will do.
            g(f"type({source}) is {out.ns(t, t.__name__)}")
        else:
            g(f"({source}) is {out.ns(value, type(value).__name__)}")
        return ObjectVar(value, source)

    # =========================================================================================
    # Graph operations
    # =========================================================================================
    def _to_node_and_fake(self, v: Var) -> tuple[Any, Any]:
        if isinstance(v, TensorVar):
            return v.node, v.fake
        if isinstance(v, (TupleVar, ListVar)):
            pairs = [self._to_node_and_fake(i) for i in v.items]
            kind = tuple if isinstance(v, TupleVar) else list
            if isinstance(v, TupleVar) and v.cls is torch.Size:
                return tuple(p[0] for p in pairs), torch.Size(p[1] for p in pairs)
            return kind(p[0] for p in pairs), kind(p[1] for p in pairs)
        if isinstance(v, DictVar):
            pairs = {k: self._to_node_and_fake(i) for k, i in v.items.items()}
            return {k: p[0] for k, p in pairs.items()}, {k: p[1] for k, p in pairs.items()}
        if isinstance(v, ConstVar):
            if self.out.symbolic is not None:  # symbolic sizes become nodes of the graph
                return self.out.graph_arg(v.value), v.value
            return v.value, v.value
        if isinstance(v, (BuiltinVar, ClassVar, PyModuleVar)):
            # a Python scalar type where torch takes a dtype (``torch.tensor(0, dtype=int)``,
            # ``x.to(float)``): torch reads it as that dtype; the graph gets the dtype itself
            # (fx cannot write a class into generated code)
            dtype = _PY_DTYPES.get(v.value) if isinstance(v.value, type) else None
            if dtype is not None:
                return dtype, dtype
            return v.value, v.value
        if isinstance(v, SetVar) and v.is_const():
            c = v.as_const()
            return c, c
        raise Unsupported(f"cannot pass {v.describe()} to a torch operation")

    def graph_call(self, op: str, target: Any, args: list[Var], kwargs: dict[str, Var],
                   fake_fn: Callable[..., Any]) -> Var:
        """Add one node (``call_function`` / ``call_method``) and return its symbolic result."""
        nargs, fargs = [], []
        for a in args:
            n, f = self._to_node_and_fake(a)
            nargs.append(n)
            fargs.append(f)
        nkw, fkw = {}, {}
        for k, a in kwargs.items():
            nkw[k], fkw[k] = self._to_node_and_fake(a)
        if self.out.symbolic is not None:
            from .symbolic import composite_dispatch  # sympy: never imported by static captures

            dispatch = composite_dispatch()
        else:
            dispatch = _NULL
        _refuse_overlapping_write(target, fargs, fkw)
        try:
            with self.out.fake_mode, dispatch:
                result = fake_fn(*fargs, **fkw)
        except Unsupported:
            raise
        except Exception as e:
            name = target if isinstance(target, str) else getattr(target, "__name__", target)
            cls = type(e).__name__
            if "DataDependent" in cls or "DynamicOutputShape" in cls:
                raise Unsupported(f"{name}: data-dependent operation ({cls}); its result "
                                  "depends on tensor values") from e
            raise Unsupported(f"{name} failed while tracing with fake tensors: {cls}: {e}") from e
        _refuse_new_leaf(target, result, fargs, fkw)
        node = self.out.create_node(op, target, tuple(nargs), nkw)
        return self.wrap_result(node, result)

    def wrap_result(self, node: torch.fx.Node, result: Any) -> Var:
        if isinstance(result, torch.Tensor):
            node.meta["example_value"] = result
            return TensorVar(node, result)
        if isinstance(result, (tuple, list)) and any(_holds_tensor(r) for r in result):
            node.meta["example_value"] = result
            items = []
            for i, r in enumerate(result):
                if _holds_tensor(r):  # nested lists of tensors too (histogramdd's bin_edges)
                    gi = self.out.create_node("call_function", operator.getitem, (node, i), {})
                    items.append(self.wrap_result(gi, r))
                else:
                    items.append(self.const_result(r))
            if isinstance(result, list):
                return ListVar(items)
            return TupleVar(items, cls=type(result))
        return self.const_result(result)

    def const_result(self, r: Any) -> Var:
        if isinstance(r, torch.Size):
            return TupleVar([ConstVar(s if isinstance(s, torch.SymInt) else int(s)) for s in r],
                            cls=torch.Size)
        if isinstance(r, (int, float, bool, str, type(None), torch.dtype, torch.device)):
            return ConstVar(r)
        if isinstance(r, (tuple, list)):
            items = [self.const_result(x) for x in r]
            return TupleVar(items, cls=type(r)) if isinstance(r, tuple) else ListVar(items)
        if isinstance(r, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            if self.out.symbolic is None:
                raise Unsupported("a symbolic value in a static capture")
            return ConstVar(r)  # a size: Python reads it symbolically (ShapeEnv guards)
        if isinstance(r, torch.Tensor):  # a traced (fake) tensor must never reach the user
            raise Unsupported("a tensor inside an op's result that Ember cannot take apart")
        return ConstVar(r)

    def call_torch_function(self, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
        if rules.changes_state(fn):
            raise Unsupported(f"torch.{getattr(fn, '__name__', fn)} changes (or reads) global "
                              "state such as the random generator's: it runs eagerly")
        return self.graph_call("call_function", fn, args, kwargs, fn)

    def call_tensor_method(self, t: TensorVar, name: str, args: list[Var],
                           kwargs: dict[str, Var]) -> Var:
        if name in rules.TENSOR_BREAK_METHODS:
            raise Unsupported(f"Tensor.{name}() needs the tensor's value in Python "
                              "(a graph break)", hint="keep the value as a tensor, or move this "
                              "call out of the compiled function")
        if name in tensorprops.METHODS and not args and not kwargs:
            v = tensorprops.read(self, t, name)  # not covered by the tensor guard
            if v is not None:
                return v
        if name in rules.TENSOR_META_METHODS and not (name == "type" and args):
            f = t.fake
            cargs = [a.as_const() for a in args]
            ckw = {k: a.as_const() for k, a in kwargs.items()}
            if name == "type":
                return ConstVar(f.type())
            return self.const_result(getattr(f, name)(*cargs, **ckw))
        return self.graph_call("call_method", name, [t, *args], kwargs,
                               lambda s, *a, **k: getattr(s, name)(*a, **k))

    # =========================================================================================
    # Attributes
    # =========================================================================================
    def getattr(self, obj: Var, name: str) -> Var:
        if isinstance(obj, LazyVar):
            raise AssertionError("lazy var leaked")
        if isinstance(obj, TensorVar):
            f = obj.fake
            if name in tensorprops.ATTRS:  # not covered by the tensor guard: guarded if read
                v = tensorprops.read(self, obj, name)
                if v is not None:
                    return v
            if name in rules.TENSOR_META_ATTRS:
                if name == "shape":
                    return self.const_result(f.shape)
                return self.const_result(getattr(f, name))
            if name in rules.TENSOR_GRAPH_ATTRS:
                if name == "data":
                    return self.call_tensor_method(obj, "detach", [], {})
                return self.graph_call("call_function", getattr, [obj, ConstVar(name)], {},
                                       getattr)
            if name == "grad":
                raise Unsupported("reading Tensor.grad inside a compiled region")
            if name == "__class__":
                return ClassVar(obj.cls, None)
            static = inspect.getattr_static(torch.Tensor, name, None)
            if static is None:
                raise Unsupported(f"unknown tensor attribute {name!r}")
            if callable(static) and not isinstance(static, property):
                return TensorMethodVar(obj, name)
            try:
                value = getattr(obj.fake, name)
            except Exception as e:
                raise Unsupported(f"tensor attribute {name!r}: {type(e).__name__}: {e}")
            if isinstance(value, torch.Tensor):
                return self.graph_call("call_function", getattr, [obj, ConstVar(name)], {},
                                       getattr)
            return self.const_result(value)
        if isinstance(obj, NNModuleVar):
            return self.module_getattr(obj, name)
        if isinstance(obj, ObjectVar):
            pend = self.pending_attrs.get(id(obj.value), {})
            if name in pend:
                return pend[name]
            return self.object_getattr(obj, obj.value, name)
        if isinstance(obj, DataclassVar):
            if name in obj.fields:
                return obj.fields[name]
            if name == "__class__":
                return ClassVar(obj.cls, None)
            if name in ("keys", "values", "items", "get") and _is_model_output(obj.cls):
                # a ModelOutput is a dict of its fields that are not None: read through a view
                present = {k: v for k, v in obj.fields.items()
                           if not (isinstance(v, ConstVar) and v.value is None)}
                return ContainerMethodVar(DictVar(present), name)
            attr = inspect.getattr_static(obj.cls, name, None)
            if isinstance(attr, types.FunctionType):
                return BoundMethodVar(FunctionVar(attr), obj)
            if isinstance(attr, property) and attr.fget is not None:
                return self.call(FunctionVar(attr.fget), [obj], {})
            if dataclasses.is_dataclass(obj.cls):
                for fld in dataclasses.fields(obj.cls):
                    if fld.name == name:
                        return ConstVar(None)
            if attr is not None and not callable(attr):
                return self.wrap(attr, None)
            raise Unsupported(f"attribute {name!r} of {obj.describe()}")
        if isinstance(obj, PyModuleVar):
            try:
                value = getattr(obj.value, name)
            except AttributeError:
                raise Unsupported(f"module {obj.value.__name__} has no attribute {name!r}")
            trusted = obj.value.__name__.startswith(rules.TRUSTED_MODULE_PREFIXES)
            if trusted:
                return self.wrap(value, None)
            return self.wrap(value, Attr(obj.source, name) if obj.source else None)
        if isinstance(obj, ClassVar):
            try:
                value = inspect.getattr_static(obj.value, name)
            except AttributeError:
                raise Unsupported(f"class {obj.value.__qualname__} has no attribute {name!r}")
            if isinstance(value, (staticmethod, classmethod)):
                value = getattr(obj.value, name)
                if isinstance(value, types.MethodType):
                    return BoundMethodVar(FunctionVar(value.__func__), obj)
                return self.wrap(value, None)
            value = getattr(obj.value, name)
            trusted = getattr(obj.value, "__module__", "").startswith(rules.TRUSTED_MODULE_PREFIXES)
            src = None if (trusted or obj.source is None) else Attr(obj.source, name)
            return self.wrap(value, src)
        if isinstance(obj, ConstVar):
            val = obj.value
            try:
                attr = getattr(val, name)
            except AttributeError as e:  # the program raises it (its handler may catch it)
                raise PyRaise(e, f"{type(val).__name__} constant has no attribute {name!r}")
            if callable(attr) and not isinstance(attr, type):
                return ContainerMethodVar(obj, name)
            return self.const_result(attr) if not isinstance(attr, (types.ModuleType,)) else \
                self.wrap(attr, None)
        if isinstance(obj, (ListVar, DictVar, SetVar)):
            return ContainerMethodVar(obj, name)
        if isinstance(obj, TupleVar):
            if obj.cls is not tuple and hasattr(obj.cls, "_fields") and name in obj.cls._fields:
                return obj.items[obj.cls._fields.index(name)]
            if obj.cls.__module__ == "torch.return_types":
                idx = {"values": 0, "indices": 1, "eigenvalues": 0, "eigenvectors": 1,
                       "Q": 0, "R": 1, "U": 0, "S": 1, "V": 2}.get(name)
                if idx is not None:
                    return obj.items[idx]
            return ContainerMethodVar(obj, name)
        if isinstance(obj, (FunctionVar, BuiltinVar)):
            val = obj.value
            if name in ("__name__", "__qualname__", "__module__", "__doc__"):
                return ConstVar(getattr(val, name))
            if name == "__self__" and isinstance(obj, BuiltinVar):
                return self.wrap(val.__self__, None)
            if isinstance(obj, FunctionVar) and \
                    (name in getattr(val, "__dict__", {}) or name in _REBINDABLE_FN_ATTRS):
                # A function's attributes can be rebound after compiling (``f.scale = 2.0``,
                # ``f.__defaults__ = ...``): read through a source, so the value is guarded.
                # A function without one (a method found through its class) is fixed by other
                # guards; its attribute is read through a reference to it.
                base = obj.source if obj.source is not None else \
                    NamespaceRef(self.out.ns(val, getattr(val, "__name__", "fn")))
                return self.wrap(getattr(val, name), Attr(base, name, paren=True))
            return self.wrap(getattr(val, name), None)
        if isinstance(obj, NestedFunctionVar):
            if name in ("__name__", "__qualname__"):
                return ConstVar(getattr(obj.code, "co_" + name.strip("_")))
        if isinstance(obj, SuperVar):
            return self.super_getattr(obj, name)
        if isinstance(obj, PartialVar) and name in ("func", "args", "keywords"):
            return {"func": obj.fn, "args": TupleVar(list(obj.args)),
                    "keywords": DictVar(dict(obj.kwargs))}[name]
        if isinstance(obj, BoundMethodVar) and name == "__self__":
            return obj.self_var
        if isinstance(obj, BoundMethodVar) and name == "__func__":
            return obj.fn
        if isinstance(obj, GradModeVar | AutocastVar) and name in ("__enter__", "__exit__"):
            raise Unsupported("explicit __enter__/__exit__ on a grad-mode context")
        raise Unsupported(f"attribute {name!r} of {obj.describe()}")

    def module_getattr(self, obj: NNModuleVar, name: str) -> Var:
        m = obj.value
        pend = self.pending_attrs.get(id(m), {})
        if name in pend:
            return pend[name]
        src = obj.source
        d = m.__dict__
        if name in d.get("_parameters", {}):
            return self.wrap(d["_parameters"][name], Param(src, name) if src else None)
        if name in d.get("_buffers", {}):
            return self.wrap(d["_buffers"][name], Buffer(src, name) if src else None)
        if name in d.get("_modules", {}):
            return self.wrap(d["_modules"][name], ModuleChild(src, name) if src else None)
        return self.object_getattr(obj, m, name)

    def object_getattr(self, obj: Var, value: Any, name: str) -> Var:
        src = obj.source
        if name == "__class__":
            return self.wrap(type(value), None)
        if name == "__dict__":
            d = getattr(value, "__dict__", None)
            if type(d) is not dict or self.pending_attrs.get(id(value)) or \
                    isinstance(value, torch.nn.Module):
                raise Unsupported("reading __dict__ of an object")
            return self.wrap(d, Attr(src, "__dict__") if src else None)
        inst_dict = getattr(value, "__dict__", {})
        if name in inst_dict:
            return self.wrap(inst_dict[name], Attr(src, name) if src else None)
        try:
            static = inspect.getattr_static(value, name)
        except AttributeError:
            static = None
        if isinstance(static, types.FunctionType):
            self.guard_class_attr(obj, value, name, static)
            return BoundMethodVar(FunctionVar(static), obj)
        if isinstance(static, staticmethod):
            self.guard_class_attr(obj, value, name, static.__func__)
            return self.wrap(static.__func__, None)
        if isinstance(static, classmethod):
            self.guard_class_attr(obj, value, name, static.__func__, through="__func__")
            return BoundMethodVar(FunctionVar(static.__func__), ClassVar(type(value), None))
        if isinstance(static, property):
            if static.fget is None:
                raise Unsupported(f"property {name!r} has no getter")
            self.guard_class_attr(obj, value, name, static)
            return self.call(self.wrap(static.fget, None), [obj], {})
        if static is None and not hasattr(value, name):
            if isinstance(value, torch.nn.Module):
                raise Unsupported(f"{type(value).__name__} has no attribute {name!r}")
            getattr_fn = inspect.getattr_static(type(value), "__getattr__", None)
            if isinstance(getattr_fn, types.FunctionType):
                return self.call(FunctionVar(getattr_fn), [obj, ConstVar(name)], {})
            raise Unsupported(f"{type(value).__name__} object has no attribute {name!r}")
        real = getattr(value, name)
        if isinstance(real, types.MethodType) and real.__self__ is value:
            fn = real.__func__
            if isinstance(fn, types.FunctionType):
                return BoundMethodVar(FunctionVar(fn), obj)
        if isinstance(real, (types.BuiltinMethodType, types.MethodWrapperType)):
            # bound to this object: a later call reads it from that call's object
            return BuiltinVar(real, Attr(src, name) if src else None)
        return self.wrap(real, Attr(src, name) if src else None)

    def guard_class_attr(self, obj: Var, value: Any, name: str, attr: Any,
                         through: str = "") -> None:
        """``name`` on ``value`` resolved through its class to ``attr``: guard that the instance
        does not shadow it and the class still provides it (a method replaced after compiling,
        on the instance or on the class, must recompile)."""
        from .guards import class_attr_guard, not_in_dict_guard
        src = obj.source
        if src is None:
            return
        out = self.out
        d = getattr(value, "__dict__", None)
        if isinstance(d, dict):
            # Identity-guarded modules: their instance dict is a fixed object.
            ref = out.ns(d, "dict") if isinstance(obj, NNModuleVar) and \
                not out.is_generic(src) else Attr(src, "__dict__", paren=True)
            out.guards.add(not_in_dict_guard(ref, name))
        cls = type(value)
        if isinstance(obj, NNModuleVar):
            # an identity-guarded module is still of that class (``m.__class__ = Other`` keeps
            # its identity and its dict; plain objects are guarded by type already)
            out.guards.add(f"type({src}) is {out.ns(cls, cls.__name__)}")
        out.guards.add(class_attr_guard(out.ns(cls, cls.__name__), name,
                                        out.ns(attr, getattr(attr, "__name__", "attr")),
                                        through))

    def super_getattr(self, sup: SuperVar, name: str) -> Var:
        obj_type = sup.obj.python_type() if not isinstance(sup.obj, ClassVar) else sup.obj.value
        mro = obj_type.__mro__
        idx = mro.index(sup.cls)
        for klass in mro[idx + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, types.FunctionType):
                    return BoundMethodVar(FunctionVar(attr), sup.obj)
                if isinstance(attr, classmethod):
                    return BoundMethodVar(FunctionVar(attr.__func__), ClassVar(obj_type, None))
                if isinstance(attr, staticmethod):
                    return self.wrap(attr.__func__, None)
                if isinstance(attr, (types.WrapperDescriptorType, types.MethodDescriptorType)):
                    if name == "__init__" and klass is object:
                        return BuiltinVar(lambda *a, **k: None)
                    return BoundMethodVar(BuiltinVar(attr), sup.obj)
                if isinstance(attr, property):
                    return self.call(FunctionVar(attr.fget), [sup.obj], {})
                return self.wrap(attr, None)
        raise Unsupported(f"super() has no attribute {name!r}")

    def setattr(self, obj: Var, name: str, value: Var) -> None:
        if isinstance(obj, DataclassVar):
            obj.fields[name] = value
            return
        if isinstance(obj, ObjectVar) and id(obj.value) in self.owned_objects and \
                value.is_const():
            # a copy made while tracing (a constant of the graph's world): stored for real, so
            # that later reads and folded method calls see it
            setattr(obj.value, name, value.as_const())
            return
        if isinstance(obj, (NNModuleVar, ObjectVar)):
            if obj.source is None:
                raise Unsupported(f"attribute store on {obj.describe()} without a source")
            if isinstance(obj, NNModuleVar) and isinstance(value, TensorVar):
                m = obj.value
                if name in m._parameters:
                    raise Unsupported("assigning a module parameter inside a compiled region")
            self.pending_attrs.setdefault(id(obj.value), {})[name] = value
            self.out.side_effects.append(("setattr", (obj, name, value)))
            return
        raise Unsupported(f"attribute store {name!r} on {obj.describe()}")

    # =========================================================================================
    # Calls
    # =========================================================================================
    def call(self, fn: Var, args: list[Var], kwargs: dict[str, Var]) -> Var:
        if isinstance(fn, BoundMethodVar):
            if isinstance(fn.self_var, NNModuleVar) and isinstance(fn.fn, FunctionVar) and \
                    fn.fn.value in _MODULE_ITER_METHODS:
                return self.module_iter_method(fn.self_var, fn.fn.value.__name__, args, kwargs)
            return self.call(fn.fn, [fn.self_var, *args], kwargs)
        if isinstance(fn, TensorMethodVar):
            return self.call_tensor_method(fn.tensor, fn.name, args, kwargs)
        if isinstance(fn, ContainerMethodVar):
            from .containers import call_container_method
            return call_container_method(self, fn.obj, fn.name, args, kwargs)
        if isinstance(fn, NNModuleVar):
            return self.call_module(fn, args, kwargs)
        if isinstance(fn, (FunctionVar, NestedFunctionVar)):
            return self.call_function_var(fn, args, kwargs)
        if isinstance(fn, ExitVar):
            fn.restore()
            return ConstVar(None)
        if isinstance(fn, PartialVar):
            return self.call(fn.fn, [*fn.args, *args], {**fn.kwargs, **kwargs})
        if isinstance(fn, BuiltinVar) and _python_original(fn.value) is not None:
            return self.call(FunctionVar(_python_original(fn.value)), args, kwargs)
        if isinstance(fn, (BuiltinVar, ClassVar)):
            from .builtins import call_builtin
            return call_builtin(self, fn.value, args, kwargs)
        if isinstance(fn, ConstVar) and callable(fn.value):
            from .builtins import call_builtin
            return call_builtin(self, fn.value, args, kwargs)
        if isinstance(fn, ObjectVar):
            orig = _python_original(fn.value)
            if isinstance(fn.value, functools._lru_cache_wrapper) and \
                    all(a.is_const() for a in args) and all(a.is_const() for a in kwargs.values()):
                # a cached function of constants: its answer is a constant (as the cache assumes)
                try:
                    return self.wrap(fn.value(*[a.as_const() for a in args],
                                              **{k: a.as_const() for k, a in kwargs.items()}),
                                     None)
                except Exception as e:
                    raise Unsupported(f"cached function {fn.value!r} raised {e!r}")
            if orig is not None:
                return self.call(FunctionVar(orig), args, kwargs)
            from .builtins import fold_numpy
            folded = fold_numpy(fn.value, args, kwargs)
            if folded is not None:
                return folded
            call = inspect.getattr_static(type(fn.value), "__call__", None)
            if isinstance(call, types.FunctionType):
                return self.call(FunctionVar(call), [fn, *args], kwargs)
        raise Unsupported(f"calling {fn.describe()}")

    def guard_registry(self, mv: NNModuleVar, registry: str = "_modules") -> None:
        """Guard the names, in order, in one of ``mv``'s registries (``_modules``,
        ``_parameters``, ``_buffers``). What is read from a registry by name is guarded where it
        is read; code that reads a registry as a whole (iteration, ``len``, an index by position,
        ``named_parameters()``) also depends on which names it holds, and a child appended,
        deleted or registered after compiling must recompile."""
        if mv.source is None:
            return
        keys = list(getattr(mv.value, registry))
        ref = self.out.stable_ref(mv.value, mv.source)
        self.out.guards.add(f"list({ref}.{registry}) == {keys!r}")

    def module_iter_method(self, mv: NNModuleVar, name: str, args: list[Var],
                           kwargs: dict[str, Var]) -> Var:
        """named_parameters(), children(), modules() and friends: evaluated on the real module,
        each result wrapped with the attribute path that fetches it again."""
        m = mv.value
        cargs = [a.as_const() for a in args]
        ckw = {k: a.as_const() for k, a in kwargs.items()}
        results = list(getattr(m, name)(*cargs, **ckw))
        subs: dict[str, tuple[torch.nn.Module, Source]] = {"": (m, mv.source)}
        for path, sub in m.named_modules(remove_duplicate=False):
            if path:
                parent, _, leaf = path.rpartition(".")
                psrc = subs[parent][1]
                subs[path] = (sub, ModuleChild(psrc, leaf))
        # The result depends on the whole tree below ``m``: which children, parameters and
        # buffers each module holds, and which of them are shared (duplicates are dropped).
        registries = ("_modules", "_parameters") if "parameters" in name else \
            ("_modules", "_buffers") if "buffers" in name else ("_modules",)
        for path, (sub, ssrc) in subs.items():
            sv = mv if not path else self.wrap(sub, ssrc)
            if isinstance(sv, NNModuleVar):
                for reg in registries:
                    self.guard_registry(sv, reg)

        def source_of(path: str, kind: str) -> Source:
            if kind == "module":
                return subs[path][1]
            parent, _, leaf = path.rpartition(".")
            return (Param if kind == "param" else Buffer)(subs[parent][1], leaf)

        kind = ("param" if "parameters" in name else "buffer" if "buffers" in name else "module")
        out: list[Var] = []
        if name.startswith("named_"):
            if kind == "module" and name == "named_children":
                items = [(n, self.wrap(c, ModuleChild(mv.source, n))) for n, c in results]
            else:
                items = [(n, self.wrap(v, source_of(n, kind))) for n, v in results]
            out = [TupleVar([ConstVar(n), v]) for n, v in items]
        else:
            named = {"parameters": "named_parameters", "buffers": "named_buffers",
                     "modules": "named_modules", "children": "named_children"}[name]
            named_results = list(getattr(m, named)(*cargs, **ckw))
            if named == "named_children":
                out = [self.wrap(c, ModuleChild(mv.source, n)) for n, c in named_results]
            else:
                out = [self.wrap(v, source_of(n, kind)) for n, v in named_results]
        return IteratorVar(out)

    def call_checkpoint(self, args: list[Var], kwargs: dict[str, Var]) -> Var:
        """``torch.utils.checkpoint.checkpoint(fn, *args)``: ``fn`` is inlined into the graph
        as a region whose nodes carry ``meta["custom"]["ember_recompute"]``; AOT autograd's
        partitioner saves the region's inputs and recomputes its values in the backward (random
        ops excepted: their results are saved, so the backward sees the forward's draw, as
        eager's ``preserve_rng_state`` does). No graph break per checkpointed block."""
        kw = dict(kwargs)
        context_fn = kw.pop("context_fn", None)
        for k in ("use_reentrant", "preserve_rng_state", "determinism_check", "debug"):
            kw.pop(k, None)
        if context_fn is not None and not (
                isinstance(context_fn, FunctionVar) and
                context_fn.value.__name__ == "noop_context_fn"):
            raise Unsupported("torch.utils.checkpoint.checkpoint with a context_fn (selective "
                              "activation checkpointing) is not traced",
                              hint="Ember runs it between graphs; drop context_fn to compile it")
        if not args:
            raise Unsupported("torch.utils.checkpoint.checkpoint() without a function")
        graph = self.out.graph
        before = set(graph.nodes)
        _checkpoint_regions[0] += 1
        region = _checkpoint_regions[0]
        res = self.call(args[0], list(args[1:]), kw)
        for n in graph.nodes:
            if n not in before and n.op in ("call_function", "call_method", "call_module"):
                n.meta["custom"] = {**n.meta.get("custom", {}), "ember_recompute": region}
        return res

    def call_function_var(self, fn: Var, args: list[Var], kwargs: dict[str, Var]) -> Var:
        from .frame import is_allowed_in_graph, is_disabled
        if isinstance(fn, FunctionVar):
            f = fn.value
            if _is_checkpoint(f):
                return self.call_checkpoint(args, kwargs)
            if is_disabled(f):
                raise Unsupported(f"{f.__qualname__} is marked ember.disable")
            if is_allowed_in_graph(f):
                return self.call_torch_function(f, args, kwargs)
            if f in rules.COMPILING_TRUE or f.__name__ in rules.COMPILING_TRUE_NAMES:
                return ConstVar(True)
            if f in rules.CONST_RESULTS or f in rules.STATE_QUERIES:
                from .builtins import call_builtin
                return call_builtin(self, f, args, kwargs)
            if f is torch.nn.Module.to and args and isinstance(args[0], NNModuleVar):
                return _module_to(args[0], args[1:], kwargs)
            if f is _FUNCTION_APPLY and args and isinstance(args[0], ClassVar):
                # a custom autograd.Function: one node that applies it; AOT autograd traces its
                # forward into the forward graph and its backward into the backward graph
                return self.call_torch_function(_autograd_function_applier(args[0].value),
                                                args[1:], kwargs)
            if rules.is_torch_op(f):
                return self.call_torch_function(f, args, kwargs)
            if f.__module__ in rules.REAL_EVAL_MODULES or (
                    args and isinstance(args[0], ObjectVar) and
                    type(args[0].value).__module__ in rules.REAL_EVAL_MODULES):
                from .builtins import real_value
                return self.wrap(f(*[real_value(a) for a in args],
                                   **{k: real_value(a) for k, a in kwargs.items()}), None)
            tm = rules.is_tensor_method(f)
            if tm and args and isinstance(args[0], TensorVar):
                return self.call_tensor_method(args[0], tm, args[1:], kwargs)
            if f.__module__ and rules.is_skipped_module(f.__module__):
                from .builtins import fold_numpy
                folded = fold_numpy(f, args, kwargs)
                if folded is not None:
                    return folded
                raise Unsupported(f"call to {f.__module__}.{f.__qualname__} (Ember does not "
                                  f"trace the {f.__module__.split('.')[0]} module)")
            if f.__module__ == "copy" and f.__name__ in ("copy", "deepcopy") and len(args) == 1:
                from .builtins import copy_var
                return copy_var(self, args[0], deep=f.__name__ == "deepcopy")
            if args and isinstance(args[0], ObjectVar):
                from .builtins import fold_config_method
                folded = fold_config_method(self, f, args, kwargs)
                if folded is not None:
                    return folded
            code = f.__code__
            if not (f.__module__ or "").startswith("torch"):
                # f.__code__ can be reassigned: the function is the same object, its body not
                self.out.guards.add(f"{self.out.ns(f, f.__name__)}.__code__ is "
                                    f"{self.out.ns(code, 'code')}")
            cells = self.closure_cells(code, f.__closure__, fn.source)
            return self.inline(code, f.__globals__, self.fn_globals_source(f), args, kwargs,
                               f.__defaults__, f.__kwdefaults__, cells, name=f.__qualname__,
                               defaults_source=Defaults(
                                   fn.source or NamespaceRef(self.out.ns(f, f.__name__))))
        assert isinstance(fn, NestedFunctionVar)
        defaults = tuple(fn.defaults.items) if fn.defaults else None
        kwdefaults = dict(fn.kwdefaults.items) if fn.kwdefaults else None
        cells = {}
        if fn.closure:
            for name, cell in zip(fn.code.co_freevars, fn.closure):
                cells[name] = cell
        return self.inline(fn.code, fn.fn_globals, fn.globals_source, args, kwargs, defaults,
                           kwdefaults, cells, name=fn.code.co_qualname, vars_defaults=True)

    def fn_globals_source(self, f: types.FunctionType) -> Source:
        if f.__globals__ is self.root_fn.__globals__:
            return NamespaceRef("___G")
        return NamespaceRef(self.out.ns(f.__globals__, f"G_{f.__module__}"))

    def closure_cells(self, code: types.CodeType, closure: tuple | None,
                      fn_source: Source | None) -> dict[str, CellVar]:
        cells: dict[str, CellVar] = {}
        if closure:
            for i, (name, cell) in enumerate(zip(code.co_freevars, closure)):
                known = self.cells_by_id.get(id(cell))
                if known is not None:
                    cells[name] = known
                    continue
                src = ClosureCell(fn_source, i) if fn_source else NamespaceRef(
                    self.out.ns(cell, "cell"))
                cells[name] = CellVar(None, real_cell=cell, source=src)
        return cells

    def inline(self, code: types.CodeType, fn_globals: dict, globals_source: Source,
               args: list[Var], kwargs: dict[str, Var], defaults: tuple | None,
               kwdefaults: dict | None, cells: dict[str, CellVar], *, name: str,
               defaults_source: Defaults | None = None, vars_defaults: bool = False) -> Var:
        depth = len(self.frames)
        if depth > config.max_inline_depth:
            raise Unsupported(f"inlining depth limit ({config.max_inline_depth}) reached at {name}")
        if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR |
                            inspect.CO_ITERABLE_COROUTINE):
            raise Unsupported(f"{name} is a coroutine")
        locals_ = self.bind_args(code, args, kwargs, defaults, kwdefaults, name, defaults_source,
                                 vars_defaults)
        frame = Frame(self, code, fn_globals, globals_source, locals_, dict(cells))
        if code.co_flags & inspect.CO_GENERATOR:
            from .variables import GeneratorVar
            frame.is_generator = True
            return GeneratorVar(frame)
        return frame.run()

    def bind_args(self, code: types.CodeType, args: list[Var], kwargs: dict[str, Var],
                  defaults: tuple | None, kwdefaults: dict | None, name: str,
                  defaults_source: Defaults | None, vars_defaults: bool) -> dict[str, Var]:
        names = code.co_varnames
        npos = code.co_argcount
        nkw = code.co_kwonlyargcount
        has_var = bool(code.co_flags & inspect.CO_VARARGS)
        has_kw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
        locals_: dict[str, Var] = {}
        pos_names = names[:npos]
        if len(args) > npos and not has_var:
            raise Unsupported(f"{name}() takes {npos} positional arguments but {len(args)} given")
        for n, a in zip(pos_names, args):
            locals_[n] = a
        extra = list(args[npos:])
        kw_names = names[npos:npos + nkw]
        var_kw: dict[str, Var] = {}
        for k, v in kwargs.items():
            if k in pos_names[code.co_posonlyargcount:] or k in kw_names:
                if k in locals_:
                    raise Unsupported(f"{name}() got multiple values for argument {k!r}")
                locals_[k] = v
            elif has_kw:
                var_kw[k] = v
            else:
                raise Unsupported(f"{name}() got an unexpected keyword argument {k!r}")
        ndef = len(defaults) if defaults else 0
        for i, n in enumerate(pos_names):
            if n not in locals_:
                j = i - (npos - ndef)
                if j < 0:
                    raise Unsupported(f"{name}() missing required argument {n!r}")
                d = defaults[j]  # type: ignore[index]
                if not vars_defaults and defaults_source:
                    # __defaults__ may be reassigned: the tuple (immutable) is the same one
                    self.out.guards.add(f"{defaults_source} is {self.out.ns(defaults, 'defaults')}")
                locals_[n] = d if vars_defaults else self.wrap(
                    d, defaults_source.item(j) if defaults_source else None, guard=False)
        for n in kw_names:
            if n not in locals_:
                if not kwdefaults or n not in kwdefaults:
                    raise Unsupported(f"{name}() missing keyword-only argument {n!r}")
                d = kwdefaults[n]
                if not vars_defaults and defaults_source:
                    # __kwdefaults__ is a mutable dict: guard the value used
                    locals_[n] = self.wrap(d, defaults_source.kwdefaults().item(n))
                    continue
                locals_[n] = d if vars_defaults else self.wrap(d, None, guard=False)
        i = npos + nkw
        if has_var:
            locals_[names[i]] = TupleVar(extra)
            i += 1
        if has_kw:
            locals_[names[i]] = DictVar(var_kw)
        return locals_

    def call_module(self, mv: NNModuleVar, args: list[Var], kwargs: dict[str, Var]) -> Var:
        m = mv.value
        from torch.nn.modules import module as _mm
        if (m._backward_hooks or getattr(m, "_backward_pre_hooks", None) or
                _mm._global_backward_hooks or getattr(_mm, "_global_backward_pre_hooks", None) or
                _mm._global_forward_hooks or _mm._global_forward_pre_hooks):
            raise Unsupported(f"{type(m).__name__} has backward or global hooks")
        if getattr(m, "_forward_hooks_with_kwargs", None) or getattr(
                m, "_forward_pre_hooks_with_kwargs", None):
            raise Unsupported(f"{type(m).__name__} has forward hooks with kwargs")
        src = mv.source
        if src is not None:
            # Backward hooks registered after compiling must recompile too (the trace refuses
            # them: the module then runs through Module.__call__).
            ref = self.out.stable_ref(m, src)
            if not m._forward_pre_hooks and not m._forward_hooks:
                self.out.guards.add(f"not {ref}._forward_pre_hooks and not {ref}._forward_hooks "
                                    f"and not {ref}._backward_hooks and "
                                    f"not {ref}._backward_pre_hooks")
            else:
                self.out.guards.add(
                    f"list(({src})._forward_pre_hooks) == {list(m._forward_pre_hooks)!r} and "
                    f"list(({src})._forward_hooks) == {list(m._forward_hooks)!r}")
                self.out.guards.add(f"not {ref}._backward_hooks and "
                                    f"not {ref}._backward_pre_hooks")
        for hid, hook in m._forward_pre_hooks.items():
            hv = self.wrap(hook, GetItem(Attr(src, "_forward_pre_hooks", paren=True), hid,
                                         paren=False) if src else None)
            res = self.call(hv, [mv, TupleVar(args)], {})
            if not (isinstance(res, ConstVar) and res.value is None):
                args = list(res.items) if isinstance(res, TupleVar) else [res]
        fwd = m.__dict__.get("forward")
        if src is not None:
            # Hooks registered for every module after compiling must recompile.
            mm = self.out.ns(_mm, 'module_mod')
            self.out.guards.add(
                f"not ({mm}._global_forward_hooks or {mm}._global_forward_pre_hooks or "
                f"{mm}._global_backward_hooks or {mm}._global_backward_pre_hooks)")
        if fwd is not None:
            out = self.call(self.wrap(fwd, Attr(src, "forward", paren=True) if src else None),
                            args, kwargs)
        else:
            fwd_fn = type(m).forward
            if fwd_fn is torch.nn.Module.forward:
                raise Unsupported(f"{type(m).__name__} has no forward()")
            self.guard_class_attr(mv, m, "forward", fwd_fn)
            out = self.call(FunctionVar(fwd_fn), [mv, *args], kwargs)
        for hid, hook in m._forward_hooks.items():
            hv = self.wrap(hook, GetItem(Attr(src, "_forward_hooks", paren=True), hid,
                                         paren=False) if src else None)
            res = self.call(hv, [mv, TupleVar(args), out], {})
            if not (isinstance(res, ConstVar) and res.value is None):
                out = res
        return out

    # =========================================================================================
    # Iteration / truthiness helpers
    # =========================================================================================
    def guard_hash_seed(self) -> None:
        """The trace followed a set's iteration order, which for strings depends on the
        process's hash seed: a capture persisted on disk serves only processes with the same."""
        probe = "ember: str hash order"
        self.out.guards.add(f"hash({probe!r}) == {hash(probe)}")

    def iterate(self, v: Var) -> list[Var]:
        if isinstance(v, (TupleVar, ListVar)):
            return list(v.items)
        if isinstance(v, IteratorVar):
            return v.remaining()
        if isinstance(v, DictVar):
            return [ConstVar(k) if not isinstance(k, Var) else k for k in v.items]
        if isinstance(v, SetVar):
            items = v.ordered()
            if any(isinstance(i, ConstVar) and isinstance(i.value, (str, bytes)) for i in items):
                self.guard_hash_seed()
            return items
        if isinstance(v, ConstVar):
            if isinstance(v.value, (set, frozenset)) and \
                    any(isinstance(x, (str, bytes)) for x in v.value):
                self.guard_hash_seed()
            try:
                return [self.const_result(x) if not isinstance(x, (torch.dtype,)) else ConstVar(x)
                        for x in v.value]
            except TypeError:
                raise Unsupported(f"{v.describe()} is not iterable")
        if isinstance(v, TensorVar):
            if v.fake.dim() == 0:
                raise Unsupported("iteration over a 0-d tensor")
            n = v.fake.shape[0]
            return [self.graph_call("call_function", operator.getitem, [v, ConstVar(i)], {},
                                    operator.getitem) for i in range(n)]
        if isinstance(v, NNModuleVar):
            m = v.value
            src = v.source
            if isinstance(m, torch.nn.ModuleDict):
                self.guard_registry(v, "_modules")
                return [ConstVar(k) for k in m._modules]
            if isinstance(m, (torch.nn.Sequential, torch.nn.ModuleList)):
                self.guard_registry(v, "_modules")
                return [self.wrap(c, ModuleChild(src, k)) for k, c in m._modules.items()]
            if isinstance(m, (torch.nn.ParameterList,)):
                self.guard_registry(v, "_parameters")
                return [self.wrap(p, Param(src, k)) for k, p in m._parameters.items()]
            if isinstance(m, torch.nn.ParameterDict):
                self.guard_registry(v, "_parameters")
                return [ConstVar(k) for k in m._parameters]
            it = inspect.getattr_static(type(m), "__iter__", None)
            if isinstance(it, types.FunctionType):
                return self.iterate(self.call(FunctionVar(it), [v], {}))
        if isinstance(v, DataclassVar) and _is_model_output(v.cls):
            return [ConstVar(k) for k, f in v.fields.items()
                    if not (isinstance(f, ConstVar) and f.value is None)]
        if isinstance(v, (DataclassVar, ObjectVar)):
            cls = v.python_type()
            it = inspect.getattr_static(cls, "__iter__", None)
            import collections.abc as cabc
            if issubclass(cls, cabc.Sequence) and getattr(it, "__module__", "") in \
                    ("_collections_abc", "collections.abc"):
                # Sequence's mixin __iter__ stops on IndexError: iterate by len() instead.
                from .builtins import call_builtin, getitem
                n = call_builtin(self, len, [v], {}).as_const()
                return [getitem(self, v, ConstVar(i)) for i in range(n)]
        if isinstance(v, ObjectVar):
            it = inspect.getattr_static(type(v.value), "__iter__", None)
            if isinstance(it, types.FunctionType):
                return self.iterate(self.call(FunctionVar(it), [v], {}))
        raise Unsupported(f"iterating over {v.describe()}")

    def truth(self, v: Var) -> bool:
        if isinstance(v, ConstVar):
            return bool(v.value)
        if isinstance(v, TensorVar):
            raise Unsupported("data-dependent control flow: a branch on a tensor's value "
                              f"({v.describe()})", hint="use torch.where, or move the branch "
                              "out of the compiled function")
        if isinstance(v, (TupleVar, ListVar, SetVar)):
            return len(v.items) > 0
        if isinstance(v, DictVar):
            return len(v.items) > 0
        if isinstance(v, NNModuleVar):
            from .builtins import module_len
            n = module_len(self, v)  # no __bool__ on modules: Python asks __len__, if any
            if n is None:
                return True
            return self.truth(n) if isinstance(n, Var) else n > 0
        if isinstance(v, (FunctionVar, NestedFunctionVar, BuiltinVar, ClassVar, PyModuleVar,
                          BoundMethodVar, TensorMethodVar)):
            return True
        if isinstance(v, DataclassVar):
            if _is_model_output(v.cls):
                return any(not (isinstance(f, ConstVar) and f.value is None)
                           for f in v.fields.values())
            return True
        if isinstance(v, ObjectVar):
            t = type(v.value)
            if not hasattr(t, "__bool__") and not hasattr(t, "__len__"):
                return True
            return bool(v.value)
        if isinstance(v, IteratorVar):  # iterators and generators are always true
            return True
        raise Unsupported(f"truth value of {v.describe()}")


_MODULE_ITER_METHODS = {getattr(torch.nn.Module, n) for n in (
    "named_parameters", "parameters", "named_buffers", "buffers", "named_modules", "modules",
    "named_children", "children")}


def collections_ordered_dict() -> type:
    import collections
    return collections.OrderedDict


# =============================================================================================
# Frames
# =============================================================================================

class Frame:
    def __init__(self, tracer: Tracer, code: types.CodeType, fn_globals: dict,
                 globals_source: Source, locals_: dict[str, Var], cells: dict[str, CellVar]):
        self.tracer = tracer
        self.code = code
        self.fn_globals = fn_globals
        self.globals_source = globals_source
        self.locals = locals_
        self.cells = cells
        from .resume import cell_params
        for name, param in cell_params.get(code, {}).items():
            # a resume function's cells arrive as cell objects (see resume.resume_code)
            lv = locals_.pop(name, None) if param == name else locals_.get(param)
            if isinstance(lv, LazyVar) and isinstance(lv.value, types.CellType):
                cell = CellVar(None, real_cell=lv.value, source=lv.source)
                cell.per_call = True  # type: ignore[attr-defined]
                self.cells[name] = cell
                tracer.cells_by_id[id(lv.value)] = cell  # closures over it share this Var
                if param != name:
                    locals_[param] = cell  # the prologue moves it into the cell slot
        for name in code.co_cellvars:
            if name not in self.cells:
                self.cells[name] = CellVar(locals_.pop(name, None) if name in locals_ else None)
        self.instructions = _instructions(code)
        self.index_of = {ins.offset: i for i, ins in enumerate(self.instructions)}
        self.stack: list[Var] = []
        self.ip = 0
        self.kw_names: tuple[str, ...] = ()
        self.is_generator = False
        self.lineno = code.co_firstlineno

    # -- location for messages ------------------------------------------------------------------
    def where(self) -> str:
        return f"{self.code.co_filename}:{self.lineno} in {self.code.co_name}"

    def user_stack(self) -> str:
        return " <- ".join(f.where() for f in reversed(self.tracer.frames))

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> Var:
        tracer = self.tracer
        is_root = not tracer.frames
        counts: dict[int, int] = {}
        tracer.frames.append(self)
        try:
            while True:
                idx = self.ip
                ins = self.instructions[idx]
                if is_root:
                    counts[idx] = counts.get(idx, 0) + 1
                    if tracer.break_at == (idx, counts[idx]):
                        raise BreakHere(self, idx)
                self.ip += 1
                if ins.starts_line:
                    self.lineno = ins.starts_line if not PY312 or isinstance(
                        ins.starts_line, int) else self.lineno
                    if sys.version_info >= (3, 13):  # pragma: no cover
                        pass
                if ins.positions and ins.positions.lineno:
                    self.lineno = ins.positions.lineno
                self.tracer.instructions += 1
                if self.tracer.instructions > MAX_INSTRUCTIONS:
                    raise Unsupported("instruction budget exhausted (a very long loop?)")
                handler = getattr(self, ins.opname, None)
                if handler is None:
                    raise Unsupported(f"bytecode {ins.opname} is not supported")
                if tracer.collect_breaks is not None and self.stack and \
                        ins.opname not in _STACK_SHUFFLES and any(
                            isinstance(v, UnknownVar) for v in (
                                self.stack if ins.opname.startswith("CALL") else
                                self.stack[-3:])):
                    err = Unsupported("uses a value produced after an earlier graph break")
                    err.from_unknown = True  # type: ignore[attr-defined]
                    raise err
                try:
                    handler(ins)
                except _Return as r:
                    return r.value
                except _Yield:
                    raise
                except Unsupported as e:
                    if isinstance(e, PyRaise) and self._handle_raise(ins, e):
                        continue
                    if e.where is None:
                        e.where = self.where()
                        e.args = (f"{e.reason}\n  at {self.user_stack()}" +
                                  (f"\n  {e.hint}" if e.hint else ""),)
                    if is_root and getattr(e, "break_point", None) is None:
                        e.break_point = (idx, counts[idx])  # type: ignore[attr-defined]
                    if is_root and tracer.collect_breaks is not None and \
                            not getattr(e, "from_unknown", False) and \
                            self._continue_past(ins, e):
                        continue
                    raise
        finally:
            self.tracer.frames.pop()

    def _handle_raise(self, ins: dis.Instruction, e: PyRaise) -> bool:
        """Route a raised Python exception to this frame's handler (its exception table), as
        CPython unwinds: the stack cut to the handler's depth, the raising offset pushed when
        the handler wants it, then the exception. False when nothing here catches it."""
        for entry in _exception_table(self.code):
            if entry.start <= ins.offset < entry.end:
                del self.stack[entry.depth:]
                if entry.lasti:
                    self.push(ConstVar(ins.offset))
                self.push(ConstVar(e.exc))
                self.ip = self.index_of[entry.target]
                self.kw_names = ()
                return True
        return False

    def _continue_past(self, ins: dis.Instruction, e: Unsupported) -> bool:
        """fullgraph diagnostics: record ``e`` and keep tracing after a call (its result
        unknown) or a branch (taking the fall-through path)."""
        self.tracer.collect_breaks.append(e)  # type: ignore[union-attr]
        if ins.opname in ("CALL", "CALL_FUNCTION_EX"):
            self.push(UnknownVar())
            self.kw_names = ()
            return True
        return ins.opname.startswith("POP_JUMP")

    def push(self, v: Var) -> None:
        self.stack.append(v)

    def pop(self) -> Var:
        return self.stack.pop()

    def popn(self, n: int) -> list[Var]:
        if n == 0:
            return []
        out = self.stack[-n:]
        del self.stack[-n:]
        return out

    def jump(self, ins: dis.Instruction) -> None:
        self.ip = self.index_of[ins.argval]

    # -- basics -------------------------------------------------------------------------------
    def NOP(self, ins): pass
    RESUME = NOP
    PRECALL = NOP
    CACHE = NOP
    EXTENDED_ARG = NOP
    COPY_FREE_VARS = NOP
    MAKE_CELL = NOP

    def POP_TOP(self, ins): self.pop()
    def PUSH_NULL(self, ins): self.push(NullVar())

    def COPY(self, ins): self.push(self.stack[-ins.arg])

    def SWAP(self, ins):
        i = ins.arg
        self.stack[-1], self.stack[-i] = self.stack[-i], self.stack[-1]

    def LOAD_CONST(self, ins):
        self.push(self.tracer.wrap(ins.argval, None) if not isinstance(ins.argval, (
            int, float, bool, str, type(None), bytes, tuple, frozenset, types.CodeType,
            type(Ellipsis)))
            else self._const(ins.argval))

    def _const(self, v: Any) -> Var:
        if isinstance(v, tuple):
            return TupleVar([self._const(x) for x in v])
        return ConstVar(v)

    def RETURN_VALUE(self, ins):
        raise _Return(self.pop())

    def RETURN_CONST(self, ins):
        raise _Return(self._const(ins.argval))

    def RETURN_GENERATOR(self, ins):
        if not self.is_generator:
            raise Unsupported("generator outside an inlined call")
        self.push(ConstVar(None))

    def YIELD_VALUE(self, ins):
        if not self.is_generator:
            raise Unsupported("yield in the compiled function itself")
        raise _Yield(self.pop())

    def GET_YIELD_FROM_ITER(self, ins):
        v = self.pop()
        self.push(v if isinstance(v, IteratorVar) else IteratorVar(self.tracer.iterate(v)))

    def SEND(self, ins):
        self.pop()  # the value sent in: always None for an inlined generator
        receiver = self.stack[-1]
        if not isinstance(receiver, IteratorVar):
            raise Unsupported(f"yield from {receiver.describe()}")
        nxt = receiver.next()
        if nxt is None:
            if PY312:
                self.push(ConstVar(None))
            else:
                self.stack[-1] = ConstVar(None)
            self.jump(ins)
        else:
            self.push(nxt)

    def END_SEND(self, ins):
        v = self.pop()
        self.pop()
        self.push(v)

    # -- locals, globals, cells -----------------------------------------------------------------
    def read_local(self, name: str) -> Var:
        try:
            v = self.locals[name]
        except KeyError:
            if name in self.cells:
                return self.read_cell(name)
            raise Unsupported(f"local variable {name!r} referenced before assignment")
        if isinstance(v, LazyVar):
            v = self.tracer.wrap(v.value, v.source)
            self.locals[name] = v
        return v

    def LOAD_FAST(self, ins): self.push(self.read_local(ins.argval))
    LOAD_FAST_CHECK = LOAD_FAST

    def LOAD_FAST_AND_CLEAR(self, ins):
        v = self.locals.pop(ins.argval, None)
        if isinstance(v, LazyVar):
            v = self.tracer.wrap(v.value, v.source)
        self.push(v if v is not None else NullVar())

    def STORE_FAST(self, ins):
        v = self.pop()
        if isinstance(v, NullVar):
            self.locals.pop(ins.argval, None)
        else:
            self.locals[ins.argval] = v

    def DELETE_FAST(self, ins): self.locals.pop(ins.argval, None)

    def LOAD_GLOBAL(self, ins):
        name = ins.argval
        if ins.arg & 1:
            self.push(NullVar())
        self.push(self.load_global(name))

    def load_global(self, name: str) -> Var:
        g = self.fn_globals
        if g is self.tracer.root_fn.__globals__ and name in self.tracer.out.global_stores:
            return self.tracer.out.global_stores[name]
        if name in g:
            value = g[name]
            # A global of the user's code is read through its source and guarded, torch's own
            # objects too: a module-level ``ACT = torch.relu`` or ``DTYPE = torch.float16``
            # rebound later (``torch.tanh``, ``torch.int64``) must recompile, not replay the old
            # graph (identity guards for modules, classes and functions; dtypes and other
            # constants by value, where the value was used). Only torch's own modules' globals
            # (``F`` in torch.nn.modules.linear) are trusted to stay what they were: no guard.
            mod = str(g.get("__name__", ""))
            if (mod.split(".", 1)[0] in rules.TRUSTED_MODULE_PREFIXES
                    or mod.startswith("transformers.utils.")) and \
                    not isinstance(value, (torch.Tensor, torch.nn.Module)):
                return self.tracer.wrap(value, Global(self.globals_source, name), guard=False) \
                    if isinstance(value, (types.ModuleType, type)) else self.tracer.wrap(
                        value, None)
            return self.tracer.wrap(value, Global(self.globals_source, name))
        b = g.get("__builtins__", __builtins__)
        bd = b if isinstance(b, dict) else b.__dict__
        if name in bd:
            # A global of that name defined later would shadow the builtin, and the builtin
            # itself can be replaced (``builtins.abs = ...``): both recompile.
            out = self.tracer.out
            out.guards.add(f"{name!r} not in {self.globals_source}")
            out.guards.add(f"({out.ns(bd, 'builtins')}[{name!r}]) is "
                           f"{out.ns(bd[name], name)}")
            return self.tracer.wrap(bd[name], None)
        raise Unsupported(f"name {name!r} is not defined")

    def STORE_GLOBAL(self, ins):
        v = self.pop()
        if self.fn_globals is not self.tracer.root_fn.__globals__:
            raise Unsupported("global store into another module")
        self.tracer.out.global_stores[ins.argval] = v
        self.tracer.out.side_effects.append(("global", (ins.argval, v)))

    def LOAD_NAME(self, ins):
        self.push(self.load_global(ins.argval))

    def read_cell(self, name: str) -> Var:
        cell = self.cells.get(name)
        if cell is None:
            raise Unsupported(f"free variable {name!r} not found")
        if cell.value is None:
            if cell.real_cell is not None:
                try:
                    contents = cell.real_cell.cell_contents
                except ValueError:
                    raise Unsupported(f"free variable {name!r} referenced before assignment")
                cell.value = self.tracer.wrap(contents, CellContents(cell.source))
            else:
                raise Unsupported(f"free variable {name!r} referenced before assignment")
        return cell.value

    def LOAD_DEREF(self, ins): self.push(self.read_cell(ins.argval))
    LOAD_CLASSDEREF = LOAD_DEREF

    def STORE_DEREF(self, ins):
        cell = self.cells.get(ins.argval)
        v = self.pop()
        if cell is None:
            cell = self.cells[ins.argval] = CellVar(v)
        if cell.real_cell is not None:
            self.tracer.out.side_effects.append(("cell", (cell, v)))
        cell.value = v

    def DELETE_DEREF(self, ins):
        raise Unsupported("del of a closure variable")

    def LOAD_CLOSURE(self, ins):
        cell = self.cells.get(ins.argval)
        if cell is None:
            cell = self.cells[ins.argval] = CellVar(None)
        self.push(cell)

    # -- attributes -----------------------------------------------------------------------------
    def LOAD_ATTR(self, ins):
        obj = self.pop()
        if PY312 and ins.arg & 1:
            self.push(NullVar())
        self.push(self.tracer.getattr(obj, ins.argval))

    def LOAD_METHOD(self, ins):
        obj = self.pop()
        self.push(NullVar())
        self.push(self.tracer.getattr(obj, ins.argval))

    def STORE_ATTR(self, ins):
        obj = self.pop()
        value = self.pop()
        self.tracer.setattr(obj, ins.argval, value)

    def DELETE_ATTR(self, ins):
        obj = self.pop()
        if isinstance(obj, DataclassVar) and ins.argval in obj.fields:
            del obj.fields[ins.argval]
            return
        raise Unsupported("del of an attribute")

    def LOAD_SUPER_ATTR(self, ins):
        self_var = self.pop()
        cls_var = self.pop()
        self.pop()  # the global `super`
        sup = SuperVar(cls_var.as_const(), self_var)
        if ins.arg & 1:
            self.push(NullVar())
        self.push(self.tracer.super_getattr(sup, ins.argval))

    # -- building containers ---------------------------------------------------------------------
    def BUILD_TUPLE(self, ins): self.push(TupleVar(self.popn(ins.arg)))
    def BUILD_LIST(self, ins): self.push(ListVar(self.popn(ins.arg)))

    def BUILD_SET(self, ins):
        s = SetVar([])
        from .containers import set_add
        for it in self.popn(ins.arg):
            set_add(s, it)
        self.push(s)

    def BUILD_MAP(self, ins):
        items = self.popn(2 * ins.arg)
        d = {}
        for i in range(0, len(items), 2):
            d[_key(items[i])] = items[i + 1]
        self.push(DictVar(d))

    def BUILD_CONST_KEY_MAP(self, ins):
        keys = self.pop().as_const()
        vals = self.popn(ins.arg)
        self.push(DictVar(dict(zip(keys, vals))))

    def BUILD_STRING(self, ins):
        parts = self.popn(ins.arg)
        self.push(ConstVar("".join(p.as_const() for p in parts)))

    def FORMAT_VALUE(self, ins):
        fmt_spec = self.pop().as_const() if (ins.arg & 0x04) == 0x04 else ""
        value = self.pop()
        if isinstance(value, TensorVar):
            raise Unsupported("formatting a tensor into a string needs its value")
        v = value.as_const()
        if self.tracer.out.symbolic is not None:
            from .symbolic import concrete  # text needs the values of sizes (guarded)
            v = concrete(v)
        conv = ins.arg & 0x03
        if conv == 1:
            v = str(v)
        elif conv == 2:
            v = repr(v)
        elif conv == 3:
            v = ascii(v)
        self.push(ConstVar(format(v, fmt_spec)))

    def BUILD_SLICE(self, ins):
        items = self.popn(ins.arg)
        vals = []
        for it in items:
            if isinstance(it, TensorVar):
                raise Unsupported("slicing with a tensor bound")
            vals.append(it.as_const())
        self.push(ConstVar(slice(*vals)))

    def LIST_APPEND(self, ins):
        v = self.pop()
        self.stack[-ins.arg].items.append(v)

    def SET_ADD(self, ins):
        from .containers import set_add
        v = self.pop()
        set_add(self.stack[-ins.arg], v)

    def MAP_ADD(self, ins):
        v = self.pop()
        k = self.pop()
        self.stack[-ins.arg].items[_key(k)] = v

    def LIST_EXTEND(self, ins):
        v = self.pop()
        self.stack[-ins.arg].items.extend(self.tracer.iterate(v))

    def SET_UPDATE(self, ins):
        from .containers import set_update
        v = self.pop()
        set_update(self.tracer, self.stack[-ins.arg], v)

    def DICT_UPDATE(self, ins):
        v = self.pop()
        target = self.stack[-ins.arg]
        if isinstance(v, DictVar):
            target.items.update(v.items)
        elif isinstance(v, DataclassVar) and _is_model_output(v.cls):
            target.items.update({k: f for k, f in v.fields.items()
                                 if not (isinstance(f, ConstVar) and f.value is None)})
        else:
            raise Unsupported(f"dict update from {v.describe()}")
    DICT_MERGE = DICT_UPDATE

    def LIST_TO_TUPLE(self, ins):
        self.push(TupleVar(self.pop().items))

    def CALL_INTRINSIC_1(self, ins):
        name = ins.argrepr
        if name == "INTRINSIC_LIST_TO_TUPLE":
            self.push(TupleVar(self.pop().items))
        elif name == "INTRINSIC_UNARY_POSITIVE":
            self.push(self.tracer_unary(operator.pos, self.pop()))
        else:
            raise Unsupported(f"intrinsic {name}")

    # -- unpacking ----------------------------------------------------------------------------------
    def UNPACK_SEQUENCE(self, ins):
        v = self.pop()
        items = self.tracer.iterate(v)
        if len(items) != ins.arg:
            raise Unsupported(f"unpacking {len(items)} values into {ins.arg} names")
        for it in reversed(items):
            self.push(it)

    def UNPACK_EX(self, ins):
        v = self.pop()
        items = self.tracer.iterate(v)
        before = ins.arg & 0xFF
        after = ins.arg >> 8
        if len(items) < before + after:
            raise Unsupported("not enough values to unpack")
        mid = items[before:len(items) - after]
        res = items[:before] + [ListVar(mid)] + items[len(items) - after:]
        for it in reversed(res):
            self.push(it)

    # -- operators ----------------------------------------------------------------------------------
    def tracer_unary(self, op: Callable[[Any], Any], v: Var) -> Var:
        if isinstance(v, TensorVar):
            return self.tracer.call_torch_function(op, [v], {})
        if v.is_const():
            return ConstVar(op(v.as_const()))
        raise Unsupported(f"unary {op.__name__} on {v.describe()}")

    def UNARY_NEGATIVE(self, ins): self.push(self.tracer_unary(operator.neg, self.pop()))
    def UNARY_POSITIVE(self, ins): self.push(self.tracer_unary(operator.pos, self.pop()))
    def UNARY_INVERT(self, ins): self.push(self.tracer_unary(operator.invert, self.pop()))

    def UNARY_NOT(self, ins):
        self.push(ConstVar(not self.tracer.truth(self.pop())))

    def BINARY_OP(self, ins):
        b = self.pop()
        a = self.pop()
        op = rules.BINARY_OPS[_NB_OPS[ins.arg]]
        from .builtins import binary_op
        self.push(binary_op(self.tracer, op, a, b))

    def COMPARE_OP(self, ins):
        b = self.pop()
        a = self.pop()
        from .builtins import binary_op
        self.push(binary_op(self.tracer, rules.COMPARE_OPS[ins.argval], a, b))

    def IS_OP(self, ins):
        b = self.pop()
        a = self.pop()
        from .builtins import is_same
        r = self.const_identity(a, b) if isinstance(a, ConstVar) and isinstance(b, ConstVar) \
            else is_same(a, b)
        self.push(ConstVar(r != bool(ins.arg)))

    def const_identity(self, a: ConstVar, b: ConstVar) -> bool:
        """``a is b`` for two constants. Their guards compare values, and equal ints, floats or
        strings may or may not be one object (``x is y`` of two arguments holding ``10**6``
        depends on how the caller made them): two such values read from the outside world get a
        guard on their identity. Dynamic ints have no identity to test: a graph break."""
        va, vb = a.value, b.value  # reading installs the pending guards (type and value)
        sym = (torch.SymInt, torch.SymFloat, torch.SymBool)
        if isinstance(va, sym) or isinstance(vb, sym):
            if a.python_type() is not b.python_type():  # None, another type: never one object
                return False
            raise Unsupported("an identity test (`is`) on a dynamic int or float")
        r = va is vb
        if type(va) is type(vb) and type(va) not in (type(None), bool, type(...),
                                                      type(NotImplemented)) \
                and a.source is not None and b.source is not None and a.source != b.source:
            self.tracer.out.guards.add(f"(({a.source}) is ({b.source})) is {r}")
        return r

    def CONTAINS_OP(self, ins):
        container = self.pop()
        item = self.pop()
        from .builtins import contains
        r = contains(self.tracer, container, item)
        self.push(ConstVar(r != bool(ins.arg)))

    def BINARY_SUBSCR(self, ins):
        idx = self.pop()
        obj = self.pop()
        from .builtins import getitem
        self.push(getitem(self.tracer, obj, idx))

    def BINARY_SLICE(self, ins):
        end = self.pop()
        start = self.pop()
        obj = self.pop()
        from .builtins import getitem
        self.push(getitem(self.tracer, obj, ConstVar(slice(start.as_const(), end.as_const()))))

    def STORE_SUBSCR(self, ins):
        idx = self.pop()
        obj = self.pop()
        value = self.pop()
        from .builtins import setitem
        setitem(self.tracer, obj, idx, value)

    def STORE_SLICE(self, ins):
        end = self.pop()
        start = self.pop()
        obj = self.pop()
        value = self.pop()
        from .builtins import setitem
        setitem(self.tracer, obj, ConstVar(slice(start.as_const(), end.as_const())), value)

    def DELETE_SUBSCR(self, ins):
        idx = self.pop()
        obj = self.pop()
        from .containers import delitem
        delitem(self.tracer, obj, idx)

    # -- control flow --------------------------------------------------------------------------------
    def JUMP_FORWARD(self, ins): self.jump(ins)
    JUMP_BACKWARD = JUMP_FORWARD
    JUMP_BACKWARD_NO_INTERRUPT = JUMP_FORWARD
    JUMP = JUMP_FORWARD
    JUMP_NO_INTERRUPT = JUMP_FORWARD

    def _pop_jump_if(self, ins, want: bool):
        v = self.pop()
        if self.tracer.truth(v) == want:
            self.jump(ins)

    def POP_JUMP_IF_FALSE(self, ins): self._pop_jump_if(ins, False)
    def POP_JUMP_IF_TRUE(self, ins): self._pop_jump_if(ins, True)
    POP_JUMP_FORWARD_IF_FALSE = POP_JUMP_IF_FALSE
    POP_JUMP_BACKWARD_IF_FALSE = POP_JUMP_IF_FALSE
    POP_JUMP_FORWARD_IF_TRUE = POP_JUMP_IF_TRUE
    POP_JUMP_BACKWARD_IF_TRUE = POP_JUMP_IF_TRUE

    def _is_none(self, v: Var) -> bool:
        return isinstance(v, ConstVar) and v.value is None

    def POP_JUMP_IF_NONE(self, ins):
        if self._is_none(self.pop()):
            self.jump(ins)

    def POP_JUMP_IF_NOT_NONE(self, ins):
        if not self._is_none(self.pop()):
            self.jump(ins)
    POP_JUMP_FORWARD_IF_NONE = POP_JUMP_IF_NONE
    POP_JUMP_BACKWARD_IF_NONE = POP_JUMP_IF_NONE
    POP_JUMP_FORWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE
    POP_JUMP_BACKWARD_IF_NOT_NONE = POP_JUMP_IF_NOT_NONE

    def JUMP_IF_FALSE_OR_POP(self, ins):
        if not self.tracer.truth(self.stack[-1]):
            self.jump(ins)
        else:
            self.pop()

    def JUMP_IF_TRUE_OR_POP(self, ins):
        if self.tracer.truth(self.stack[-1]):
            self.jump(ins)
        else:
            self.pop()

    def GET_ITER(self, ins):
        v = self.pop()
        if isinstance(v, IteratorVar):
            self.push(v)
        else:
            self.push(IteratorVar(self.tracer.iterate(v)))

    def FOR_ITER(self, ins):
        it = self.stack[-1]
        if not isinstance(it, IteratorVar):
            raise Unsupported(f"FOR_ITER over {it.describe()}")
        nxt = it.next()
        if nxt is None:
            self.pop()
            self.jump(ins)
            if PY312 and self.instructions[self.ip].opname == "END_FOR":
                self.ip += 1
        else:
            self.push(nxt)

    def END_FOR(self, ins):
        self.popn(2)

    def GET_LEN(self, ins):
        from .builtins import call_builtin
        self.push(call_builtin(self.tracer, len, [self.stack[-1]], {}))

    # -- calls -------------------------------------------------------------------------------------
    def KW_NAMES(self, ins):
        self.kw_names = ins.argval if isinstance(ins.argval, tuple) else \
            self.code.co_consts[ins.arg]

    def CALL(self, ins):
        argc = ins.arg
        args = self.popn(argc)
        a = self.pop()
        b = self.pop()
        if isinstance(b, NullVar):
            fn = a
        else:
            fn = b
            args = [a, *args]
        kw_names = self.kw_names
        self.kw_names = ()
        kwargs = {}
        if kw_names:
            n = len(kw_names)
            kwargs = dict(zip(kw_names, args[-n:]))
            args = args[:-n]
        self.push(self.call(fn, args, kwargs))

    def call(self, fn: Var, args: list[Var], kwargs: dict[str, Var]) -> Var:
        if getattr(fn, "value", None) is super and not args:
            return self._zero_arg_super()
        return self.tracer.call(fn, args, kwargs)

    def _zero_arg_super(self) -> Var:
        cls_cell = self.cells.get("__class__")
        if cls_cell is None or not self.code.co_varnames:
            raise Unsupported("super() without __class__ cell")
        cls = self.read_cell("__class__").as_const()
        first = self.code.co_varnames[0]
        obj = self.locals.get(first)
        if obj is None and first in self.cells:
            obj = self.read_cell(first)
        if obj is None:
            raise Unsupported("super(): first argument not found")
        if isinstance(obj, LazyVar):
            obj = self.read_local(first)
        return SuperVar(cls, obj)

    def CALL_FUNCTION_EX(self, ins):
        kwargs_var = self.pop() if ins.arg & 1 else None
        args_var = self.pop()
        fn = self.pop()
        if self.stack and isinstance(self.stack[-1], NullVar):
            self.pop()
        args = self.tracer.iterate(args_var)
        kwargs = {}
        if kwargs_var is not None:
            if isinstance(kwargs_var, DictVar):
                kwargs = dict(kwargs_var.items)
            elif isinstance(kwargs_var, DataclassVar) and _is_model_output(kwargs_var.cls):
                kwargs = {k: f for k, f in kwargs_var.fields.items()
                          if not (isinstance(f, ConstVar) and f.value is None)}
            else:
                raise Unsupported(f"**kwargs from {kwargs_var.describe()}")
        self.push(self.call(fn, args, kwargs))

    def MAKE_FUNCTION(self, ins):
        code_var = self.pop()
        code = code_var.as_const()
        if not PY312 and sys.version_info < (3, 11):  # pragma: no cover
            self.pop()
        closure = self.pop() if ins.arg & 0x08 else None
        if ins.arg & 0x04:
            self.pop()  # annotations
        kwdefaults = self.pop() if ins.arg & 0x02 else None
        defaults = self.pop() if ins.arg & 0x01 else None
        self.push(NestedFunctionVar(code, self.fn_globals, defaults, kwdefaults,
                                    tuple(closure.items) if closure else None,
                                    self.globals_source))

    # -- with blocks -------------------------------------------------------------------------------
    def BEFORE_WITH(self, ins):
        ctx = self.pop()
        from .builtins import enter_context
        exit_var, entered = enter_context(self.tracer, ctx)
        self.push(exit_var)
        self.push(entered)

    # -- imports -------------------------------------------------------------------------------------
    def IMPORT_NAME(self, ins):
        fromlist = self.pop().as_const()
        level = self.pop().as_const()
        mod = __import__(ins.argval, self.fn_globals, None, fromlist, level)
        self.push(self.tracer.wrap(mod, None))

    def IMPORT_FROM(self, ins):
        mod = self.stack[-1]
        self.push(self.tracer.getattr(mod, ins.argval))

    # -- exceptions (only reached when the program raises) ------------------------------------------
    def RAISE_VARARGS(self, ins):
        if ins.arg == 0:
            exc = self.tracer.handled_exc
            if exc is None:
                raise Unsupported("bare raise with no exception being handled")
            raise PyRaise(exc)
        cause = self.pop() if ins.arg == 2 else None
        exc = _exception_value(self.pop())
        if exc is None:
            raise Unsupported("the program raises an exception here (raise statement reached "
                              "while tracing)")
        if cause is not None:
            c = _exception_value(cause)
            if c is None and not (cause.is_const() and cause.as_const() is None):
                raise Unsupported("raise ... from a value that is not an exception")
            exc.__cause__ = c
        raise PyRaise(exc)

    def PUSH_EXC_INFO(self, ins):
        exc = self.pop()
        prev = self.tracer.handled_exc
        self.push(ConstVar(prev))
        self.tracer.handled_exc = exc.as_const()
        self.push(exc)

    def POP_EXCEPT(self, ins):
        self.tracer.handled_exc = self.pop().as_const()

    def CHECK_EXC_MATCH(self, ins):
        right = self.pop()
        left = self.stack[-1]
        try:
            self.push(ConstVar(isinstance(left.as_const(), right.as_const())))
        except TypeError as e:
            raise Unsupported(f"except clause with {right.describe()}: {e}")

    def RERAISE(self, ins):
        exc = self.pop()
        value = exc.as_const() if exc.is_const() else None
        if not isinstance(value, BaseException):
            raise Unsupported(f"re-raise of {exc.describe()}")
        raise PyRaise(value)

    def LOAD_ASSERTION_ERROR(self, ins):
        raise Unsupported("an assert fails while tracing")

    def SETUP_ANNOTATIONS(self, ins):
        raise Unsupported("annotations setup")


_STACK_SHUFFLES = {"STORE_FAST", "POP_TOP", "COPY", "SWAP", "LOAD_FAST", "LOAD_CONST",
                   "LOAD_GLOBAL", "PUSH_NULL", "NOP", "RESUME", "PRECALL", "KW_NAMES",
                   "LOAD_DEREF", "RETURN_VALUE"}


def _key(v: Var) -> Any:
    if isinstance(v, ConstVar):
        return v.value
    if isinstance(v, (BuiltinVar, ClassVar)):
        return v.value
    if v.is_const():
        return v.as_const()
    raise Unsupported(f"a dict key must be a Python constant, got {v.describe()}")


def _module_to(mv: NNModuleVar, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """``module.to(...)`` that changes nothing (its tensors already have that dtype and device)
    is the module itself; one that would convert them is not traced."""
    try:
        device, dtype, _, _ = torch._C._nn._parse_to(*[a.as_const() for a in args],
                                                     **{k: a.as_const() for k, a in kwargs.items()})
    except Exception as e:
        raise Unsupported(f"module.to() with non-constant arguments: {e}")
    for t in (*mv.value.parameters(), *mv.value.buffers()):
        if (device is not None and t.device != torch.device(device)) or (
                dtype is not None and (t.is_floating_point() or t.is_complex()) and
                t.dtype != dtype):
            raise Unsupported("module.to() that converts parameters inside a compiled region")
    return mv


#: Attributes of a function, other than those in its ``__dict__``, that user code may rebind
#: and a traced program may read as values.
_REBINDABLE_FN_ATTRS = frozenset({"__defaults__", "__kwdefaults__"})


#: In-place operators (``x += y`` and their dunder methods): the first operand is written.
_INPLACE_OPERATORS = frozenset(
    f"{p}{n}{q}" for n in ("iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow",
                           "iand", "ior", "ixor", "ilshift", "irshift", "imatmul")
    for p, q in (("", ""), ("__", "__")))


def _refuse_overlapping_write(target: Any, fargs: list[Any], fkw: dict[str, Any]) -> None:
    """An op that writes a tensor (an in-place method, ``x += y``, ``out=``) whose memory overlaps
    another tensor operand without being the same view, or whose own elements overlap (an
    ``expand``-ed tensor), runs eagerly: eager either raises ("unsupported operation: some
    elements of the input tensor and the written-to tensor refer to a single memory location")
    or computes element by element in memory order (``y[1:].add_(y[:-1])`` on a non-contiguous
    ``y`` reads values written by the same op). A graph reads every operand before any write
    (functionalized), which is neither. Views of one base that do not share an element
    (``boxes[:, 2].sub_(boxes[:, 0])``) stay in the graph."""
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    written = []
    if isinstance(name, str) and fargs and isinstance(fargs[0], torch.Tensor) and (
            name in _INPLACE_OPERATORS or name.endswith("_") and not name.startswith("_")):
        written.append(fargs[0])
    out = fkw.get("out")
    written += [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(t, torch.Tensor)]
    if not written:
        return
    operands = [t for a in [*fargs, *fkw.values()]
                for t in (a if isinstance(a, (tuple, list)) else (a,)) if isinstance(t, torch.Tensor)]
    for w in written:
        if self_overlapping(w):
            raise Unsupported(f"{name} writes a tensor whose elements share memory (an expanded "
                              "tensor): eager raises or writes element by element")
        for o in operands:
            if o is not w and torch._C._is_alias_of(w, o) and elements_meet(w, o):
                raise Unsupported(f"{name} writes a tensor that shares memory with another "
                                  "operand (partially overlapping views): eager raises or "
                                  "computes element by element",
                                  hint="clone() the operand that is read")


def _refuse_new_leaf(target: Any, result: Any, fargs: list[Any], fkw: dict[str, Any]) -> None:
    """A call that makes a new tensor that requires grad and has no history (``torch.zeros(3,
    requires_grad=True)``, ``t.requires_grad_()`` on a tensor made here) cannot be in a graph: in
    eager it is a leaf of autograd that collects its own ``.grad``, while a graph output has a
    history (or none, when no input requires grad). The frame runs eagerly there (a graph
    break). A call returning one of its own arguments (``x.contiguous()``
    of a leaf input) makes nothing new, nor does a view (``weight.T`` under ``no_grad`` is a
    leaf that requires grad in eager too: its base's)."""
    outs = result if isinstance(result, (tuple, list)) else (result,)
    for r in outs:
        if isinstance(r, torch.Tensor) and r.requires_grad and r.is_leaf and \
                not r._is_view() and not any(r is a for a in [*fargs, *fkw.values()]):
            name = target if isinstance(target, str) else getattr(target, "__name__", target)
            raise Unsupported(f"{name} creates a tensor that requires grad (a leaf of autograd, "
                              "which collects its own .grad) inside the compiled region",
                              hint="create it outside the compiled function and pass it in, "
                                   "or make it an nn.Parameter of the module")


def _python_original(fn: Any) -> types.FunctionType | None:
    """The Python function behind a TorchScript function (``torch.jit.script``) or an
    ``functools.lru_cache`` wrapper: what tracing inlines instead of calling the wrapper."""
    orig = None
    if isinstance(fn, torch.jit.ScriptFunction):
        orig = getattr(fn, "_torchdynamo_inline", None)
    elif isinstance(fn, functools._lru_cache_wrapper):  # type: ignore[attr-defined]
        orig = getattr(fn, "__wrapped__", None)
    return orig if isinstance(orig, types.FunctionType) else None


_FUNCTION_APPLY = torch.autograd.Function.apply.__func__
_APPLIERS: "weakref.WeakKeyDictionary[type, Callable[..., Any]]" = weakref.WeakKeyDictionary()


def _autograd_function_applier(cls: type) -> Callable[..., Any]:
    """``cls.apply`` as a plain function of the tensors (one per class: a stable graph target,
    named after the class in generated code)."""
    fn = _APPLIERS.get(cls)
    if fn is None:
        def fn(*args: Any, **kwargs: Any) -> Any:
            return cls.apply(*args, **kwargs)
        fn.__name__ = f"{cls.__name__}_apply"
        fn.__qualname__ = fn.__name__
        fn.__module__ = __name__
        _APPLIERS[cls] = fn
    return fn


_INSTR_CACHE: dict[types.CodeType, list[dis.Instruction]] = {}
_EXC_TABLES: dict[types.CodeType, list] = {}


def _exception_table(code: types.CodeType) -> list:
    table = _EXC_TABLES.get(code)
    if table is None:
        table = _EXC_TABLES[code] = (dis._parse_exception_table(code)  # type: ignore[attr-defined]
                                     if code.co_exceptiontable else [])
    return table


def _exception_value(v: Var) -> BaseException | None:
    """The exception a ``raise`` operand stands for: an instance, or a class called with no
    arguments; None when it is neither (or not known while tracing)."""
    if not v.is_const():
        return None
    value = v.as_const()
    if isinstance(value, type) and issubclass(value, BaseException):
        try:
            return value()
        except Exception:
            return None
    return value if isinstance(value, BaseException) else None


def _instructions(code: types.CodeType) -> list[dis.Instruction]:
    ins = _INSTR_CACHE.get(code)
    if ins is None:
        ins = _INSTR_CACHE[code] = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    return ins


_checkpoint_regions = [0]


def _is_checkpoint(f: Any) -> bool:
    """Is ``f`` ``torch.utils.checkpoint.checkpoint`` (or the function it wraps)?"""
    mod = sys.modules.get("torch.utils.checkpoint")
    if mod is None:
        return False
    ck = getattr(mod, "checkpoint", None)
    return ck is not None and (f is ck or f is getattr(ck, "__wrapped__", None))
