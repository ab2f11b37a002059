"""Semantics of builtins, operators, subscripts and context managers over symbolic values."""

from __future__ import annotations

import abc
import dataclasses
import copy
import enum
import inspect
import operator
import types
from typing import Any, Sequence

import torch

from ..exc import Unsupported
from . import rules
from .sources import GetItem, ModuleChild, Param
from .variables import (AutocastVar, BoundMethodVar, BuiltinVar, ClassVar, ConstVar,
                        ContainerMethodVar, DataclassVar, DictVar, ExitVar, FunctionVar,
                        GradModeVar, IteratorVar, ListVar, NestedFunctionVar,
                        NNModuleVar, ObjectVar, PyModuleVar, PyRaise, SetVar, SuperVar,
                        TensorMethodVar, TensorVar, TupleVar, Var)


def _consts(args: list[Var], kwargs: dict[str, Var]) -> tuple[list[Any], dict[str, Any]] | None:
    if all(a.is_const() for a in args) and all(a.is_const() for a in kwargs.values()):
        return [a.as_const() for a in args], {k: a.as_const() for k, a in kwargs.items()}
    return None


def _has_tensor(vs: list[Var]) -> bool:
    return any(isinstance(v, TensorVar) for v in vs)




def _state_query(tr: Any, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    """A torch call reading global state: its value now, guarded to stay the same."""
    from .guards import state_guard

    c = _consts(args, kwargs)
    if c is None or not all(type(a) in (str, int, bool, type(None))
                            for a in [*c[0], *c[1].values()]):
        raise Unsupported(f"torch.{fn.__name__} with non-constant arguments")
    value = fn(*c[0], **c[1])
    out = tr.out
    call = ", ".join([repr(a) for a in c[0]] + [f"{k}={v!r}" for k, v in c[1].items()])
    out.guards.add(state_guard(f"{out.ns(fn, fn.__name__)}({call})", value, out.ns))
    return ConstVar(value)


def call_builtin(tr: Any, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    # --- answers that are known while tracing ---------------------------------------------------
    if fn in rules.COMPILING_TRUE or getattr(fn, "__name__", "") in rules.COMPILING_TRUE_NAMES \
            and isinstance(fn, types.FunctionType):
        return ConstVar(True)
    if fn is torch.is_grad_enabled:
        return ConstVar(torch.is_grad_enabled())
    if fn is torch.get_default_dtype:
        return ConstVar(torch.get_default_dtype())
    if fn is torch.is_autocast_enabled:
        c = _consts(args, kwargs)
        return ConstVar(torch.is_autocast_enabled(*c[0]) if c else torch.is_autocast_enabled())
    if fn in rules.CONST_RESULTS:
        return ConstVar(rules.CONST_RESULTS[fn])
    if fn in rules.STATE_QUERIES:
        return _state_query(tr, fn, args, kwargs)
    if getattr(fn, "__self__", None) is dict and getattr(fn, "__name__", "") == "fromkeys" \
            and args and not kwargs:
        fill = args[1] if len(args) > 1 else ConstVar(None)
        return DictVar({_hashable(k): fill for k in tr.iterate(args[0])})
    if fn is torch._C._set_grad_enabled:
        _set_grad(tr, bool(args[0].as_const()))
        return ConstVar(None)
    # --- context managers ---------------------------------------------------------------------------
    if fn in rules.GRAD_MODE_CLASSES:
        return GradModeVar(rules.GRAD_MODE_CLASSES[fn])
    if fn is torch.set_grad_enabled:
        mode = args[0].as_const() if args else kwargs["mode"].as_const()
        prev = torch.is_grad_enabled()
        _set_grad(tr, bool(mode))
        v = GradModeVar(bool(mode))
        v.prev = prev  # type: ignore[attr-defined]
        return v
    if fn is torch.inference_mode:
        mode = args[0].as_const() if args else kwargs.get("mode", ConstVar(True)).as_const()
        if mode:
            raise Unsupported("torch.inference_mode inside a compiled region",
                              hint="call the compiled function under inference_mode instead")
        return GradModeVar(torch.is_grad_enabled())
    if fn in rules.AUTOCAST_CLASSES:
        c = _consts(args, kwargs)
        if c is None:
            raise Unsupported("autocast with non-constant arguments")
        a, k = c
        if fn is torch.cpu.amp.autocast:
            device = "cpu"
            dtype = k.get("dtype", a[1] if len(a) > 1 else torch.bfloat16)
            enabled = k.get("enabled", a[0] if a else True)
        else:
            device = k.get("device_type", a[0] if a else None)
            dtype = k.get("dtype", a[1] if len(a) > 1 else None)
            enabled = k.get("enabled", a[2] if len(a) > 2 else True)
        if dtype is None:
            dtype = torch.get_autocast_dtype(device)
        return AutocastVar(device, dtype, bool(enabled))
    # --- functions marked by the user -------------------------------------------------------------
    from .frame import is_allowed_in_graph, is_disabled
    if is_disabled(fn):
        raise Unsupported(f"{getattr(fn, '__qualname__', fn)} is marked ember.disable")
    if is_allowed_in_graph(fn):
        return tr.call_torch_function(fn, args, kwargs)
    # --- torch --------------------------------------------------------------------------------------
    if fn is torch.Size:
        items = tr.iterate(args[0]) if args else []
        return TupleVar(items, cls=torch.Size)
    if isinstance(fn, type) and issubclass(fn, torch.Tensor) and fn is not torch.nn.Parameter:
        raise Unsupported(f"constructing {fn.__name__} directly")
    tm = rules.is_tensor_method(fn)
    if tm and args and isinstance(args[0], TensorVar):
        return tr.call_tensor_method(args[0], tm, args[1:], kwargs)
    if rules.is_torch_op(fn):
        if fn in (torch.manual_seed, torch.seed, torch.set_default_dtype,
                  torch.set_grad_enabled, torch.use_deterministic_algorithms):
            raise Unsupported(f"torch.{fn.__name__} changes global state")
        return tr.call_torch_function(fn, args, kwargs)
    if fn in (torch.device, torch.dtype) or isinstance(fn, (torch.dtype,)):
        c = _consts(args, kwargs)
        if c is not None:
            return ConstVar(fn(*c[0], **c[1]))
    # --- introspection: evaluated on the real objects --------------------------------------------
    if getattr(fn, "__module__", None) == "inspect":
        real_args = [real_value(a) for a in args]
        real_kw = {k: real_value(a) for k, a in kwargs.items()}
        return tr.wrap(fn(*real_args, **real_kw), None)
    # --- unbound methods of builtin types called on symbolic containers/constants -------------------
    if isinstance(fn, types.MethodDescriptorType) and args and fn.__objclass__ in (
            list, dict, set, tuple, str, int, float, bytes, frozenset):
        first = args[0]
        owner = fn.__objclass__
        if (isinstance(first, (ListVar, DictVar, SetVar, TupleVar)) and
                issubclass(first.python_type(), owner)) or (
                isinstance(first, ConstVar) and isinstance(first.value, owner)):
            from .containers import call_container_method
            return call_container_method(tr, first, fn.__name__, args[1:], kwargs)
    # --- read-only methods of builtin containers, called on a real object (dict subclasses...) ----
    if isinstance(fn, types.MethodDescriptorType) and fn.__name__ in _READONLY_METHODS and \
            args and isinstance(args[0], ObjectVar) and isinstance(args[0].value, fn.__objclass__):
        c = _consts(args[1:], kwargs)
        if c is not None and not c[1]:
            return read_through(tr, args[0], fn.__objclass__, fn.__name__, c[0])
    # --- Python builtins ------------------------------------------------------------------------------
    handler = _BUILTIN_HANDLERS.get(fn)
    if handler is not None:
        res = handler(tr, args, kwargs)
        if res is not NotImplemented:
            return res
    if fn is print:
        raise Unsupported("print() inside a compiled region", hint="Ember splits the graph "
                          "here; move the print out of the hot path to keep one graph")
    if fn is super:
        if len(args) == 2:
            return SuperVar(args[0].as_const(), args[1])
        raise Unsupported("super() with unusual arguments")
    # --- classes -----------------------------------------------------------------------------------
    if isinstance(fn, type):
        return construct(tr, fn, args, kwargs)
    # --- pure functions on constants ----------------------------------------------------------------
    if rules.is_pure_const_callable(fn) or getattr(fn, "__module__", None) in ("math",):
        c = _consts(args, kwargs)
        if c is not None:
            try:
                from .symbolic import call_on_consts  # symbolic ints: specialized if needed
                return tr.const_result(call_on_consts(fn, c[0], c[1]))
            except Exception as e:
                raise Unsupported(f"{getattr(fn, '__name__', fn)}() raised {type(e).__name__}: {e}")
        if _has_tensor(args) and getattr(fn, "__module__", None) == "math":
            raise Unsupported(f"math.{fn.__name__} on a tensor needs its value")
        if fn in (operator.getitem,):
            return getitem(tr, args[0], args[1])
        if getattr(fn, "__module__", "") in ("_operator", "operator") and _has_tensor(args):
            return tr.call_torch_function(fn, args, kwargs)
        if len(args) == 2 and fn in rules.BINARY_OPS.values() or fn in rules.COMPARE_OPS.values():
            return binary_op(tr, fn, args[0], args[1])
    if isinstance(fn, types.FunctionType):
        return tr.call(FunctionVar(fn), args, kwargs)
    if isinstance(fn, functools_partial()):
        inner = tr.wrap(fn.func, None)
        pargs = [tr.wrap(a, None) for a in fn.args]
        pkw = {k: tr.wrap(v, None) for k, v in fn.keywords.items()}
        return tr.call(inner, [*pargs, *args], {**pkw, **kwargs})
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    mod = getattr(fn, "__module__", None)
    raise Unsupported(f"call to {mod + '.' if mod else ''}{name} is not supported inside a "
                      "compiled region (a C function or library Ember does not trace)",
                      hint="wrap it with ember.allow_in_graph if it only does tensor ops, or "
                      "move it out of the compiled function")


_READONLY_METHODS = {"get", "keys", "values", "items", "__getitem__", "__contains__", "__len__",
                     "index", "count"}

#: read-only methods whose result is a view of the container: read as a list of it
_VIEW_METHODS = {"keys", "values", "items"}


def _arg_text(tr: Any, value: Any) -> str:
    """A constant argument as guard code: its repr where that reads back as itself, else a
    namespace name."""
    if value is None or type(value) in (bool, int, str) or (
            type(value) is float and value == value and abs(value) != float("inf")):
        return repr(value)
    return tr.out.ns(value, type(value).__name__)


def builtin_owner(value: Any, name: str) -> type | None:
    """The builtin class whose ``name`` an object of ``value``'s type runs (``dict`` for a
    subclass of dict that does not define it), or None where a Python class defines it."""
    for klass in type(value).__mro__:
        if name in klass.__dict__:
            return klass if klass.__module__ == "builtins" else None
    return None


def read_through(tr: Any, obj: ObjectVar, owner: type, name: str, args: Sequence[Any]) -> Var:
    """``owner.name(obj, *args)``, a read-only method of a builtin container run on a real
    object (a dict subclass's ``super().get(key)``, ``key in registry``, ``len(proxy)``),
    evaluated now. Where the object has a source its result is read through one that calls the
    method again, so the guards pin what was read (the entry for ``{'a': 2.0}`` must not replay
    once the entry says ``{'a': 5.0}``); the views ``keys``/``values``/``items`` are read as lists."""
    from .sources import MethodRead, NamespaceRef

    view = name in _VIEW_METHODS
    value = getattr(owner, name)(obj.value, *args)
    if obj.source is None or isinstance(obj.source, NamespaceRef):
        # an object made while tracing, or one the capture holds as a constant of the traced
        # program (an introspection result: ``inspect.signature(f).parameters``)
        return tr.wrap(value, None)

    src = MethodRead(obj.source, tr.out.ns(owner, owner.__name__), name,
                     tuple(_arg_text(tr, a) for a in args), view)
    return tr.wrap(list(value) if view else value, src)


def copy_var(tr: Any, v: Var, deep: bool) -> Var:
    """copy.copy / copy.deepcopy of containers of tensors and constants."""
    if isinstance(v, TensorVar):
        return tr.call_tensor_method(v, "clone", [], {}) if deep else v
    if isinstance(v, ConstVar):
        return v
    if isinstance(v, ListVar):
        return ListVar([copy_var(tr, i, deep) if deep else i for i in v.items])
    if isinstance(v, TupleVar):
        return TupleVar([copy_var(tr, i, deep) if deep else i for i in v.items], cls=v.cls)
    if isinstance(v, DictVar):
        return DictVar({k: copy_var(tr, i, deep) if deep else i for k, i in v.items.items()},
                       cls=v.cls)
    if isinstance(v, ObjectVar) and _guard_plain_state(tr, v):
        # A configuration-like object (no tensors, modules or callables in its state): copied
        # for real while tracing; the guard pins the state the copy was made from.
        new = copy.deepcopy(v.value) if deep else copy.copy(v.value)
        tr.owned_objects.add(id(new))
        return tr.wrap(new, None)
    raise Unsupported(f"copy of {v.describe()}")


def _guard_plain_state(tr: Any, v: ObjectVar) -> bool:
    """Guard the whole state of a plain-data object (``__dict__`` equal to a snapshot); False
    (nothing guarded) when it is not plain data, has pending stores or does not compare equal
    to its own copy."""
    value = v.value
    if id(value) in tr.pending_attrs or not _plain_state(value, 6):
        return False
    from .output import instance_dict

    try:
        state = instance_dict(value)
    except (AttributeError, TypeError):
        return False
    snapshot = copy.deepcopy(state)
    if type(state) is not dict or snapshot != state:
        return False
    if v.source is not None:
        # one snapshot per source and state: twelve layers reading one config share a guard
        key = str(v.source)
        prev = tr.out.state_snapshots.get(key)
        if prev is None or prev != snapshot:
            tr.out.state_snapshots[key] = prev = snapshot
        tr.out.guards.add(f"___vars({v.source}) == {tr.out.ns(prev, 'state')}")
    return True


def fold_config_method(tr: Any, f: types.FunctionType, args: list[Var],
                       kwargs: dict[str, Var]) -> Var | None:
    """A method of a configuration object (a class named ``...Config`` holding only plain data,
    e.g. a Hugging Face ``PretrainedConfig``) called with constant arguments is evaluated while
    tracing, under a guard on the object's whole state; None when that does not apply. Such
    methods copy and rebuild the configuration (``get_text_config``), which is cheap to run and
    expensive to trace."""
    if not args or not isinstance(args[0], ObjectVar):
        return None
    obj = args[0]
    value = obj.value
    if not type(value).__name__.endswith("Config") or \
            not all(a.is_const() for a in args[1:]) or \
            not all(a.is_const() for a in kwargs.values()):
        return None
    if not _plain_state(value, 6):
        return None
    before = copy.deepcopy(value.__dict__)
    try:
        result = f(value, *[a.as_const() for a in args[1:]],
                   **{k: a.as_const() for k, a in kwargs.items()})
    except Exception:
        return None
    if value.__dict__ != before:  # it changed the object: not a pure read
        value.__dict__.clear()
        value.__dict__.update(before)
        return None
    if result is not value and not _plain_state(result, 6):
        return None
    if not _guard_plain_state(tr, obj):
        return None
    return obj if result is value else tr.wrap(result, None)


def _plain_state(value: Any, depth: int) -> bool:
    """Is ``value`` plain data: constants, containers of them, objects whose ``__dict__`` is?"""
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.dtype,
                                           torch.device, type)):
        return True
    if depth == 0 or isinstance(value, (torch.Tensor, torch.nn.Module)) or \
            isinstance(value, (types.FunctionType, types.MethodType)):
        return False
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain_state(x, depth - 1) for x in value)
    if isinstance(value, dict):
        return all(_plain_state(k, depth - 1) and _plain_state(x, depth - 1)
                   for k, x in value.items())
    d = getattr(value, "__dict__", None)
    return isinstance(d, dict) and type(value).__module__ != "builtins" and \
        _plain_state(d, depth - 1)


def real_value(v: Var) -> Any:
    """The real Python object behind a Var, for introspection that does not touch tensors."""
    if isinstance(v, BoundMethodVar):
        return types.MethodType(real_value(v.fn), real_value(v.self_var))
    if isinstance(v, (ConstVar, FunctionVar, BuiltinVar, ClassVar, NNModuleVar, ObjectVar,
                      PyModuleVar)):
        return v.value
    if v.is_const():
        return v.as_const()
    raise Unsupported(f"{v.describe()} has no real value while tracing")


def functools_partial() -> type:
    import functools
    return functools.partial


def _set_grad(tr: Any, mode: bool) -> None:
    torch._C._set_grad_enabled(mode)
    tr.out.create_node("call_function", torch._C._set_grad_enabled, (mode,), {})


def construct(tr: Any, cls: type, args: list[Var], kwargs: dict[str, Var]) -> Var:
    import collections
    import functools
    import itertools
    if cls in (list, tuple, set, frozenset, dict):
        return _BUILTIN_HANDLERS[cls](tr, args, kwargs)
    if cls in (torch.finfo, torch.iinfo):
        c = _consts(args, kwargs)
        if c is not None:
            return ConstVar(cls(*c[0], **c[1]))
    if cls is types.SimpleNamespace:
        obj = DataclassVar(cls, dict(kwargs))
        obj.plain = True  # type: ignore[attr-defined]
        return obj
    if cls in (collections.OrderedDict, collections.defaultdict):
        factory = None
        if cls is collections.defaultdict:
            factory = args[0] if args else None
            args = args[1:]
        d = _dict(tr, args, kwargs)
        d.cls = cls  # type: ignore[attr-defined]
        d.default_factory = factory  # type: ignore[attr-defined]
        return d
    if cls is functools.partial:
        from .variables import PartialVar
        return PartialVar(args[0], list(args[1:]), dict(kwargs))
    if cls is itertools.repeat:
        if len(args) < 2 and "times" not in kwargs:
            raise Unsupported("itertools.repeat without a count")
        n = (args[1] if len(args) > 1 else kwargs["times"]).as_const()
        return IteratorVar([args[0]] * n)
    if cls is itertools.count:
        from .variables import CountVar
        c = _consts(args, kwargs)
        if c is None:
            raise Unsupported("itertools.count of non-constants")
        a, k = c
        return CountVar(k.get("start", a[0] if a else 0), k.get("step", a[1] if len(a) > 1 else 1))
    if cls is itertools.chain:
        return IteratorVar([i for a in args for i in tr.iterate(a)])
    if cls is itertools.islice:
        bounds = slice(*[a.as_const() for a in args[1:]])
        src = args[0] if isinstance(args[0], IteratorVar) else IteratorVar(tr.iterate(args[0]))
        start, stop, step = bounds.start or 0, bounds.stop, bounds.step or 1
        if stop is None:
            return IteratorVar(src.rest()[start::step])
        taken = []
        for i in range(stop):
            v = src.next()
            if v is None:
                break
            if i >= start and (i - start) % step == 0:
                taken.append(v)
        return IteratorVar(taken)
    if issubclass(cls, torch.nn.Module):
        # A module without parameters or buffers (an activation looked up per layer) made from
        # constants is the same every call: built once while tracing, a constant of the graph.
        c = _consts(args, kwargs)
        if c is not None:
            try:
                m = cls(*c[0], **c[1])
            except Exception as e:
                raise Unsupported(f"creating the module {cls.__name__} raised {e!r}")
            if not any(True for _ in m.parameters()) and not any(True for _ in m.buffers()):
                return tr.wrap(m, None)
        raise Unsupported(f"creating the module {cls.__name__} inside a compiled region",
                          hint="create modules in __init__, not in forward")
    if issubclass(cls, enum.Enum):
        c = _consts(args, kwargs)
        if c:
            return ConstVar(cls(*c[0], **c[1]))
    if issubclass(cls, BaseException):
        c = _consts(args, kwargs)
        if c is not None and (cls.__module__ == "builtins" or
                              cls.__init__ is BaseException.__init__):
            return ConstVar(cls(*c[0], **c[1]))  # raised and caught while tracing
        raise Unsupported(f"constructing exception {cls.__name__}")
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):  # namedtuple
        fields = cls._fields
        vals = list(args)
        defaults = getattr(cls, "_field_defaults", {})
        for f in fields[len(vals):]:
            if f in kwargs:
                vals.append(kwargs[f])
            elif f in defaults:
                vals.append(tr.wrap(defaults[f], None))
            else:
                raise Unsupported(f"{cls.__name__}() missing field {f!r}")
        return TupleVar(vals, cls=cls)
    if cls.__module__ in ("builtins",):
        c = _consts(args, kwargs)
        if c is not None:
            try:
                return tr.const_result(cls(*c[0], **c[1]))
            except Exception as e:
                raise Unsupported(f"{cls.__name__}() raised {type(e).__name__}: {e}")
        raise Unsupported(f"{cls.__name__}() of non-constant arguments")
    if dataclasses.is_dataclass(cls):
        flds = [f for f in dataclasses.fields(cls) if f.init]
        values: dict[str, Var] = {}
        for f, a in zip(flds, args):
            values[f.name] = a
        for f in flds[len(args):]:
            if f.name in kwargs:
                values[f.name] = kwargs[f.name]
            elif f.default is not dataclasses.MISSING:
                values[f.name] = tr.wrap(f.default, None)
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                values[f.name] = tr.wrap(f.default_factory(), None)  # type: ignore[misc]
            else:
                raise Unsupported(f"{cls.__name__}() missing field {f.name!r}")
        post = getattr(cls, "__post_init__", None)
        if post is not None and not _is_model_output(cls):
            raise Unsupported(f"dataclass {cls.__name__} with __post_init__")
        return DataclassVar(cls, values)
    init = inspect.getattr_static(cls, "__init__", None)
    new = inspect.getattr_static(cls, "__new__", None)
    if isinstance(init, types.FunctionType) and new is object.__new__ and \
            "__slots__" not in cls.__dict__ and type(cls) in (type, abc.ABCMeta):
        obj = DataclassVar(cls, {})
        obj.plain = True  # type: ignore[attr-defined]
        tr.call(FunctionVar(init), [obj, *args], kwargs)
        return obj
    raise Unsupported(f"constructing {cls.__qualname__} inside a compiled region")


def _is_model_output(cls: type) -> bool:
    return any(c.__name__ == "ModelOutput" for c in getattr(cls, "__mro__", ()))


# -----------------------------------------------------------------------------------------------
# Operators
# -----------------------------------------------------------------------------------------------

def binary_op(tr: Any, op: Any, a: Var, b: Var) -> Var:
    if isinstance(a, IdVar) or isinstance(b, IdVar):
        if op in (operator.eq, operator.ne) and isinstance(a, IdVar) and isinstance(b, IdVar):
            same = a.tensor.node is b.tensor.node
            return ConstVar(same if op is operator.eq else not same)
        raise Unsupported("arithmetic on id() of a tensor")
    if isinstance(a, TensorVar) or isinstance(b, TensorVar):
        if op in rules.INPLACE_TO_OUT and not isinstance(a, TensorVar):
            op = rules.INPLACE_TO_OUT[op]
        for v in (a, b):
            if not isinstance(v, (TensorVar, ConstVar)) and not (
                    isinstance(v, (TupleVar, ListVar)) and v.is_const()):
                raise Unsupported(f"{op.__name__} between a tensor and {v.describe()}")
        return tr.call_torch_function(op, [a, b], {})
    if a.is_const() and b.is_const() and not isinstance(a, (ListVar, DictVar, SetVar)) and \
            not isinstance(b, (ListVar, DictVar, SetVar)):
        try:
            return tr.const_result(op(a.as_const(), b.as_const())) if not isinstance(
                a, TupleVar) or op not in (operator.add, operator.mul, operator.iadd,
                                           operator.imul) else _seq_op(tr, op, a, b)
        except Exception as e:
            raise Unsupported(f"{op.__name__} raised {type(e).__name__}: {e}")
    if op in (operator.eq, operator.ne):
        if isinstance(a, (TupleVar, ListVar)) and isinstance(b, (TupleVar, ListVar)):
            if len(a.items) != len(b.items) or type(a) is not type(b):
                return ConstVar(op is operator.ne)
            res = all(_truth(tr, binary_op(tr, operator.eq, x, y))
                      for x, y in zip(a.items, b.items))
            return ConstVar(res if op is operator.eq else not res)
        if isinstance(a, (NNModuleVar, ObjectVar, ClassVar, FunctionVar, BuiltinVar)) or \
                isinstance(b, (NNModuleVar, ObjectVar, ClassVar, FunctionVar, BuiltinVar)):
            r = is_same(a, b)
            return ConstVar(r if op is operator.eq else not r)
        if isinstance(a, ConstVar) != isinstance(b, ConstVar):
            for v in (a, b):  # the answer depends on the constant's type: guard it
                if isinstance(v, ConstVar):
                    v.value  # noqa: B018 - reading installs the pending guard
            return ConstVar(op is operator.ne)
    if isinstance(a, (TupleVar, ListVar)) or isinstance(b, (TupleVar, ListVar)):
        return _seq_op(tr, op, a, b)
    if isinstance(a, DictVar) and isinstance(b, DictVar) and op in (operator.or_, operator.ior):
        if op is operator.ior:
            a.items.update(b.items)
            _mark_mutated(tr, a)
            return a
        return DictVar({**a.items, **b.items})
    if isinstance(a, SetVar) and isinstance(b, SetVar) and a.is_const() and b.is_const():
        return tr.wrap(op(a.as_const(), b.as_const()), None)
    raise Unsupported(f"operator {op.__name__} on {a.describe()} and {b.describe()}")


def _truth(tr: Any, v: Var) -> bool:
    return tr.truth(v)


def _mark_mutated(tr: Any, v: Var) -> None:
    if getattr(v, "source", None) is not None and not getattr(v, "mutated", False):
        v.mutated = True  # type: ignore[attr-defined]
        tr.out.mutated_containers.append(v)


def _seq_op(tr: Any, op: Any, a: Var, b: Var) -> Var:
    if op in (operator.add, operator.iadd) and isinstance(a, (TupleVar, ListVar)):
        items_b = tr.iterate(b)
        if op is operator.iadd and isinstance(a, ListVar):
            a.items.extend(items_b)
            _mark_mutated(tr, a)
            return a
        if isinstance(a, TupleVar):
            if not isinstance(b, TupleVar):
                raise Unsupported("tuple + non-tuple")
            cls = a.cls if a.cls is torch.Size else tuple
            return TupleVar(a.items + items_b, cls=cls)
        if not isinstance(b, ListVar):
            raise Unsupported("list + non-list")
        return ListVar(a.items + items_b)
    if op in (operator.mul, operator.imul):
        seq, n = (a, b) if isinstance(a, (TupleVar, ListVar)) else (b, a)
        k = n.as_const()
        if isinstance(seq, TupleVar):
            return TupleVar(seq.items * k)
        if op is operator.imul and seq is a:
            a.items[:] = a.items * k
            _mark_mutated(tr, a)
            return a
        return ListVar(seq.items * k)
    if op in (operator.lt, operator.le, operator.gt, operator.ge) and a.is_const() and b.is_const():
        return ConstVar(op(a.as_const(), b.as_const()))
    raise Unsupported(f"operator {op.__name__} on sequences")


def is_same(a: Var, b: Var) -> bool:
    if a is b:
        return True
    for v in (a, b):  # identity depends on what the constant is: guard it
        if isinstance(v, ConstVar):
            v.value  # noqa: B018 - reading installs the pending guard
    if isinstance(a, ConstVar) and isinstance(b, ConstVar):
        return a.value is b.value
    if isinstance(a, TensorVar) and isinstance(b, TensorVar):
        return a.node is b.node
    for x, y in ((a, b), (b, a)):
        if isinstance(x, ConstVar) and x.value is None:
            return False
    if hasattr(a, "value") and hasattr(b, "value") and not isinstance(a, (ConstVar,)):
        return a.value is b.value  # type: ignore[attr-defined]
    if isinstance(a, ClassVar) or isinstance(b, ClassVar):
        return getattr(a, "value", a) is getattr(b, "value", b)
    if type(a) is not type(b):
        return False
    return False


def contains(tr: Any, container: Var, item: Var) -> bool:
    if isinstance(container, DictVar):
        return _hashable(item) in container.items
    if isinstance(container, DataclassVar):
        return _hashable(item) in container.fields and not (
            isinstance(container.fields[_hashable(item)], ConstVar) and
            container.fields[_hashable(item)].value is None)
    if isinstance(container, SetVar) and isinstance(item, TensorVar):
        return any(is_same(x, item) for x in container.items)
    if isinstance(container, (ListVar, TupleVar, SetVar)):
        if isinstance(item, TensorVar):
            raise Unsupported("`in` with a tensor compares values")
        for x in container.items:
            if isinstance(x, TensorVar):
                raise Unsupported("`in` on a container of tensors compares values")
            if x.is_const() and item.is_const() and x.as_const() == item.as_const():
                return True
            if is_same(x, item):
                return True
        return False
    if isinstance(container, ConstVar) and item.is_const():
        return item.as_const() in container.value
    if isinstance(container, NNModuleVar) and isinstance(container.value, torch.nn.ModuleDict):
        key = item.as_const()
        r = key in container.value._modules
        if container.source is not None:
            ref = tr.out.stable_ref(container.value, container.source)
            tr.out.guards.add(f"({key!r} in {ref}._modules) is {r}")
        return r
    if isinstance(container, ObjectVar) and item.is_const():
        owner = builtin_owner(container.value, "__contains__")
        if owner is None:
            ci = inspect.getattr_static(container.python_type(), "__contains__", None)
            if isinstance(ci, types.FunctionType):  # a Python __contains__: traced
                r = tr.call(FunctionVar(ci), [container, item], {})
                if r.is_const():
                    return bool(r.as_const())
            raise Unsupported(f"`in` on {container.describe()}")
        return bool(read_through(tr, container, owner, "__contains__",
                                 [item.as_const()]).as_const())
    raise Unsupported(f"`in` on {container.describe()}")


def _hashable(v: Var) -> Any:
    if isinstance(v, ConstVar):
        return v.value
    if v.is_const():
        return v.as_const()
    raise Unsupported(f"unhashable key {v.describe()}")


# -----------------------------------------------------------------------------------------------
# Subscripts
# -----------------------------------------------------------------------------------------------



def getitem(tr: Any, obj: Var, idx: Var) -> Var:
    if isinstance(obj, TensorVar):
        if isinstance(idx, TupleVar):
            for it in idx.items:
                if not isinstance(it, (ConstVar, TensorVar, ListVar, TupleVar)):
                    raise Unsupported(f"tensor index with {it.describe()}")
        return tr.graph_call("call_function", operator.getitem, [obj, idx], {}, operator.getitem)
    if isinstance(idx, TensorVar):
        raise Unsupported(f"indexing {obj.describe()} with a tensor")
    if isinstance(obj, (TupleVar, ListVar)):
        i = idx.as_const()
        try:
            res = obj.items[i]
        except (IndexError, TypeError) as e:
            raise PyRaise(e, f"index {i!r} on a sequence of {len(obj.items)}: {e}")
        if isinstance(i, slice):
            if isinstance(obj, TupleVar):
                return TupleVar(res, cls=obj.cls if obj.cls in (tuple, torch.Size) else tuple)
            return ListVar(res)
        return res
    if isinstance(obj, DictVar):
        k = _hashable(idx)
        if k not in obj.items:
            factory = getattr(obj, "default_factory", None)
            if factory is None:
                raise PyRaise(KeyError(k), f"key {k!r} not in dict (KeyError)")
            obj.items[k] = tr.call(factory, [], {})
            _mark_mutated(tr, obj)
        return obj.items[k]
    if isinstance(obj, ConstVar):
        try:
            return tr.const_result(obj.value[idx.as_const()])
        except (KeyError, IndexError) as e:
            raise PyRaise(e, f"subscript raised {type(e).__name__}: {e}")
        except Exception as e:
            raise Unsupported(f"subscript raised {type(e).__name__}: {e}")
    if isinstance(obj, NNModuleVar):
        m = obj.value
        key = idx.as_const()
        if isinstance(m, torch.nn.ModuleDict):
            return tr.wrap(m._modules[key], ModuleChild(obj.source, key))
        if isinstance(m, (torch.nn.Sequential, torch.nn.ModuleList)):
            keys = list(m._modules.keys())
            tr.guard_registry(obj, "_modules")  # a position means something only in this list
            if isinstance(key, slice):
                # A real slice (a new Sequential/ModuleList sharing the children), guarded on
                # the children it holds.
                for k in keys[key]:
                    tr.out.guards.add(f"{ModuleChild(obj.source, k)} is "
                                      f"{tr.out.ns(m._modules[k], type(m._modules[k]).__name__)}")
                return tr.wrap(m[key], None)
            k = keys[key]
            return tr.wrap(m._modules[k], ModuleChild(obj.source, k))
        if isinstance(m, torch.nn.ParameterList):
            keys = list(m._parameters.keys())
            k = keys[key]
            return tr.wrap(m._parameters[k], Param(obj.source, k))
        if isinstance(m, torch.nn.ParameterDict):
            return tr.wrap(m._parameters[key], Param(obj.source, key))
        gi = inspect.getattr_static(type(m), "__getitem__", None)
        if isinstance(gi, types.FunctionType):
            return tr.call(FunctionVar(gi), [obj, idx], {})
    if isinstance(obj, DataclassVar):
        if _is_model_output(obj.cls):
            key = idx.as_const()
            present = [(k, v) for k, v in obj.fields.items()
                       if not (isinstance(v, ConstVar) and v.value is None)]
            if isinstance(key, str):
                return obj.fields[key]
            if isinstance(key, slice):
                return TupleVar([v for _, v in present][key])
            return present[key][1]
        gi = inspect.getattr_static(obj.cls, "__getitem__", None)
        if isinstance(gi, types.FunctionType):
            return tr.call(FunctionVar(gi), [obj, idx], {})
    if isinstance(obj, ObjectVar):
        gi = inspect.getattr_static(type(obj.value), "__getitem__", None)
        if isinstance(gi, types.FunctionType):
            return tr.call(FunctionVar(gi), [obj, idx], {})
        if idx.is_const() and obj.source is not None:
            key = idx.as_const()
            try:
                val = obj.value[key]
            except Exception as e:
                raise Unsupported(f"subscript raised {type(e).__name__}: {e}")
            return tr.wrap(val, GetItem(obj.source, key, paren=False))
    if isinstance(obj, ClassVar):
        # typing generics: List[int] etc.
        return tr.wrap(obj.value[idx.as_const()], None)
    raise Unsupported(f"subscript of {obj.describe()}")


def setitem(tr: Any, obj: Var, idx: Var, value: Var) -> None:
    if isinstance(obj, TensorVar):
        tr.graph_call("call_function", operator.setitem, [obj, idx, value], {}, operator.setitem)
        return
    if isinstance(obj, ListVar):
        i = idx.as_const()
        if isinstance(i, slice):
            obj.items[i] = tr.iterate(value)
        else:
            obj.items[i] = value
        _mark_mutated(tr, obj)
        return
    if isinstance(obj, DictVar):
        obj.items[_hashable(idx)] = value
        _mark_mutated(tr, obj)
        return
    if isinstance(obj, DataclassVar):
        obj.fields[_hashable(idx)] = value
        return
    raise Unsupported(f"item assignment on {obj.describe()}")


# -----------------------------------------------------------------------------------------------
# Context managers
# -----------------------------------------------------------------------------------------------

def enter_context(tr: Any, ctx: Var) -> tuple[Var, Var]:
    if isinstance(ctx, GradModeVar):
        prev = getattr(ctx, "prev", torch.is_grad_enabled())
        if torch.is_grad_enabled() != ctx.enabled:
            _set_grad(tr, ctx.enabled)

        def restore() -> None:
            if torch.is_grad_enabled() != prev:
                _set_grad(tr, prev)
        ev = ExitVar(ctx, restore)
        ev.prev_mode = prev  # type: ignore[attr-defined]
        return ev, ConstVar(None)
    if isinstance(ctx, AutocastVar):
        # While tracing only the state fake tensors see is switched (no nesting count, no
        # cast cache); the graph enters and exits the real autocast at run time.
        dev = ctx.device_type
        prev = (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        torch.set_autocast_enabled(dev, ctx.enabled)
        torch.set_autocast_dtype(dev, ctx.dtype)
        node = tr.out.create_node("call_function", torch.amp.autocast_mode._enter_autocast,
                                  (dev, ctx.dtype, ctx.enabled, None), {})

        def restore() -> None:
            torch.set_autocast_enabled(dev, prev[0])
            torch.set_autocast_dtype(dev, prev[1])
            tr.out.create_node("call_function", torch.amp.autocast_mode._exit_autocast,
                               (node,), {})
        return ExitVar(ctx, restore), ConstVar(None)
    import contextlib
    if isinstance(ctx, DataclassVar) and ctx.cls is contextlib._GeneratorContextManager:
        from .variables import GeneratorVar
        gen = ctx.fields.get("gen")
        if isinstance(gen, GeneratorVar):
            entered = gen.next()
            if entered is None:
                raise Unsupported("generator didn't yield (contextmanager)")

            def finish() -> None:
                if gen.next() is not None:
                    raise Unsupported("generator didn't stop (contextmanager)")
            return ExitVar(ctx, finish), entered
    if isinstance(ctx, (ObjectVar, DataclassVar)):
        cls = ctx.python_type()
        enter = inspect.getattr_static(cls, "__enter__", None)
        exit_ = inspect.getattr_static(cls, "__exit__", None)
        if isinstance(enter, types.FunctionType) and isinstance(exit_, types.FunctionType):
            entered = tr.call(FunctionVar(enter), [ctx], {})
            return BoundMethodVar(FunctionVar(exit_), ctx), entered
    raise Unsupported(f"`with` on {ctx.describe()}")


# -----------------------------------------------------------------------------------------------
# Builtin functions over symbolic values
# -----------------------------------------------------------------------------------------------

def _len(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    (v,) = args
    if isinstance(v, TensorVar):
        if v.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return tr.const_result(v.fake.shape[0])
    if isinstance(v, (TupleVar, ListVar, SetVar, DictVar)):
        return ConstVar(len(v.items))
    if isinstance(v, NNModuleVar):
        n = module_len(tr, v)
        if n is None:
            raise Unsupported(f"len() of {v.describe()}")
        return n if isinstance(n, Var) else ConstVar(n)
    if isinstance(v, ConstVar):
        return ConstVar(len(v.value))
    if isinstance(v, DataclassVar) and _is_model_output(v.cls):
        return ConstVar(len(tr.iterate(v)))
    if isinstance(v, (ObjectVar, DataclassVar)):
        ln = inspect.getattr_static(v.python_type(), "__len__", None)
        if isinstance(ln, types.FunctionType):
            return tr.call(FunctionVar(ln), [v], {})
        owner = builtin_owner(v.value, "__len__") if isinstance(v, ObjectVar) else None
        if owner is not None:  # a C-level __len__ (mappingproxy, a dict subclass...)
            return read_through(tr, v, owner, "__len__", ())
    raise Unsupported(f"len() of {v.describe()}")


#: containers whose ``len`` is the size of one registry
_REGISTRY_OF_LEN = ((torch.nn.ModuleDict, "_modules"), (torch.nn.Sequential, "_modules"),
                    (torch.nn.ModuleList, "_modules"), (torch.nn.ParameterList, "_parameters"),
                    (torch.nn.ParameterDict, "_parameters"))


def module_len(tr: Any, v: NNModuleVar) -> Any:
    """``len`` of a module (guarded on what it counts): an int, a Var when the class defines
    ``__len__`` in Python (traced), or None when the module has no ``__len__``."""
    m = v.value
    ln = inspect.getattr_static(type(m), "__len__", None)
    if ln is None:
        return None
    for cls, registry in _REGISTRY_OF_LEN:
        if isinstance(m, cls) and ln is inspect.getattr_static(cls, "__len__", None):
            tr.guard_registry(v, registry)
            return len(getattr(m, registry))
    if isinstance(ln, types.FunctionType):
        n = tr.call(FunctionVar(ln), [v], {})
        return n.as_const() if isinstance(n, ConstVar) else n
    raise Unsupported(f"len() of {v.describe()} (a C-level __len__)")


def _isinstance(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    obj, cls = args
    c = cls.as_const() if not isinstance(cls, TupleVar) else tuple(
        i.as_const() for i in cls.items)
    if isinstance(obj, TensorVar):
        t = obj.cls
        if t is torch.nn.Parameter or obj.is_param and isinstance(obj, TensorVar):
            t = obj.cls
        return ConstVar(issubclass(t, c))
    if isinstance(obj, ConstVar):
        from .symbolic import python_type  # a symbolic int is an int
        return ConstVar(issubclass(python_type(obj.value), c))
    if isinstance(obj, (GradModeVar, AutocastVar)):
        return ConstVar(False)
    t = obj.python_type()
    return ConstVar(issubclass(t, c))


def _getattr(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    obj, name = args[0], args[1].as_const()
    if len(args) == 3:
        try:
            return tr.getattr(obj, name)
        except Unsupported:
            if _hasattr_static(obj, name) is False:
                if isinstance(obj, (ObjectVar, NNModuleVar)) and obj.source is not None:
                    tr.out.guards.add(f"not hasattr({obj.source}, {name!r})")
                return args[2]
            raise
    return tr.getattr(obj, name)


def _hasattr_static(obj: Var, name: str) -> bool | None:
    if isinstance(obj, TensorVar):
        return hasattr(torch.Tensor, name) or name in rules.TENSOR_META_ATTRS
    if isinstance(obj, DataclassVar):
        return name in obj.fields or hasattr(obj.cls, name)
    if isinstance(obj, (NNModuleVar, ObjectVar, PyModuleVar, ClassVar, ConstVar, FunctionVar,
                        BuiltinVar)):
        return hasattr(obj.value, name)  # type: ignore[attr-defined]
    if isinstance(obj, (TupleVar, ListVar, DictVar, SetVar)):
        return hasattr(obj.python_type(), name)
    return None


def _hasattr(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    obj, name = args[0], args[1].as_const()
    if isinstance(obj, (ObjectVar, NNModuleVar)) and name in tr.pending_attrs.get(
            id(obj.value), {}):
        return ConstVar(True)
    r = _hasattr_static(obj, name)
    if r is None:
        raise Unsupported(f"hasattr on {obj.describe()}")
    if isinstance(obj, (ObjectVar, NNModuleVar)) and obj.source is not None:
        tr.out.guards.add(f"hasattr({obj.source}, {name!r}) is {r}")
    return ConstVar(r)


def _range(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return ConstVar(range(*[a.as_const() for a in args]))


def _enumerate(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    start = args[1].as_const() if len(args) > 1 else kwargs.get("start", ConstVar(0)).as_const()
    items = tr.iterate(args[0])
    return IteratorVar([TupleVar([ConstVar(i + start), v]) for i, v in enumerate(items)])


def _zip(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if kwargs.get("strict") and kwargs["strict"].as_const():
        lists = [tr.iterate(a) for a in args]
        if len({len(x) for x in lists}) > 1:
            raise Unsupported("zip(strict=True) with unequal lengths")
    lists = [tr.iterate(a) for a in args]
    return IteratorVar([TupleVar(list(t)) for t in zip(*lists)])


def _reversed(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return IteratorVar(list(reversed(tr.iterate(args[0]))))


def _list(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    return ListVar(tr.iterate(args[0]) if args else [])


def _tuple(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if args and isinstance(args[0], TupleVar) and args[0].cls is tuple:
        return args[0]
    return TupleVar(tr.iterate(args[0]) if args else [])


def _set(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    from .containers import set_update
    s = SetVar([])
    if args:
        set_update(tr, s, args[0])
    return s


def _frozenset(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    s = _set(tr, args, kwargs)
    s.cls = frozenset  # type: ignore[attr-defined]
    return s


def _dict(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    d: dict[Any, Var] = {}
    if args:
        src = args[0]
        if isinstance(src, DictVar):
            d.update(src.items)
        elif isinstance(src, DataclassVar) and _is_model_output(src.cls):
            d.update({k: v for k, v in src.fields.items()
                      if not (isinstance(v, ConstVar) and v.value is None)})
        else:
            for pair in tr.iterate(src):
                k, v = tr.iterate(pair)
                d[_hashable(k)] = v
    d.update(kwargs)
    return DictVar(d)


def _minmax(fn: Any) -> Any:
    def handler(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
        items = args if len(args) > 1 else tr.iterate(args[0])
        if kwargs:
            key = kwargs.get("key")
            if key is not None and not (isinstance(key, ConstVar) and key.value is None):
                keys = [tr.call(key, [i], {}).as_const() for i in items]
                if not items:
                    if "default" in kwargs:
                        return kwargs["default"]
                    raise Unsupported(f"{fn.__name__}() of an empty sequence")
                best = fn(range(len(items)), key=lambda j: keys[j])
                return items[best]
            c = _consts(items, {})
            if c is None:
                raise Unsupported(f"{fn.__name__}() with key= over non-constants")
            return tr.const_result(fn(c[0], **{k: v.as_const() for k, v in kwargs.items()}))
        if any(isinstance(i, TensorVar) for i in items):
            if len(items) == 2:
                target = torch.maximum if fn is max else torch.minimum
                # Python's max(a, b) on tensors compares values: a data-dependent branch.
                raise Unsupported(f"{fn.__name__}() of tensors needs their values "
                                  f"(use {target.__name__})")
            raise Unsupported(f"{fn.__name__}() of tensors")
        return tr.const_result(fn(i.as_const() for i in items))
    return handler


def _sum(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    items = tr.iterate(args[0])
    start = args[1] if len(args) > 1 else kwargs.get("start", ConstVar(0))
    acc = start
    for it in items:
        acc = binary_op(tr, operator.add, acc, it)
    return acc


def _all_any(fn: Any) -> Any:
    def handler(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
        items = tr.iterate(args[0])
        vals = [tr.truth(i) for i in items]
        return ConstVar(fn(vals))
    return handler


def _abs(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    (v,) = args
    if isinstance(v, TensorVar):
        return tr.call_torch_function(torch.abs, [v], {})
    return ConstVar(abs(v.as_const()))


def _scalar_cast(fn: Any) -> Any:
    def handler(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
        if args and isinstance(args[0], TensorVar):
            raise Unsupported(f"{fn.__name__}() of a tensor needs its value (a graph break)",
                              hint="keep it as a tensor")
        c = _consts(args, kwargs)
        if c is None:
            raise Unsupported(f"{fn.__name__}() of {args[0].describe()}")
        return tr.const_result(fn(*c[0], **c[1]))
    return handler


def _bool(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if not args:
        return ConstVar(False)
    return ConstVar(tr.truth(args[0]))


def _iter(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    (v,) = args
    return v if isinstance(v, IteratorVar) else IteratorVar(tr.iterate(v))


def _next(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    it = args[0]
    if not isinstance(it, IteratorVar):
        it = IteratorVar(tr.iterate(it))
    v = it.next()
    if v is None:
        if len(args) > 1:
            return args[1]
        raise PyRaise(StopIteration(), "next() on an exhausted iterator (StopIteration)")
    return v


def _map(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    fn = args[0]
    lists = [tr.iterate(a) for a in args[1:]]
    return IteratorVar([tr.call(fn, list(t), {}) for t in zip(*lists)])


def _filter(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    fn, seq = args
    out = []
    for it in tr.iterate(seq):
        keep = tr.truth(it) if isinstance(fn, ConstVar) and fn.value is None else tr.truth(
            tr.call(fn, [it], {}))
        if keep:
            out.append(it)
    return IteratorVar(out)


def _sorted(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    items = tr.iterate(args[0])
    key = kwargs.get("key")
    if key is not None and not (isinstance(key, ConstVar) and key.value is None):
        keys = [tr.call(key, [i], {}).as_const() for i in items]
        rev = kwargs.get("reverse", ConstVar(False)).as_const()
        order = sorted(range(len(items)), key=lambda j: keys[j], reverse=rev)
        return ListVar([items[j] for j in order])
    c = _consts(items, kwargs)
    if c is None:
        raise Unsupported("sorted() of non-constants")
    return ListVar([tr.const_result(x) for x in sorted(c[0], **c[1])])


def _type(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if len(args) != 1:
        raise Unsupported("type() with 3 arguments")
    v = args[0]
    if isinstance(v, ConstVar):
        return ClassVar(v.python_type(), None)  # a symbolic int is an int
    return ClassVar(v.python_type(), None)


def _callable(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    v = args[0]
    if isinstance(v, (FunctionVar, NestedFunctionVar, BoundMethodVar, BuiltinVar, ClassVar,
                      TensorMethodVar, ContainerMethodVar, NNModuleVar)):
        return ConstVar(True)
    if isinstance(v, (TensorVar, TupleVar, ListVar, DictVar, SetVar)):
        return ConstVar(False)
    if isinstance(v, (ConstVar, ObjectVar)):
        return ConstVar(callable(v.value))
    return ConstVar(callable(v.python_type()))


class IdVar(Var):
    """id() of a tensor: only comparable with another id() (identity of graph values, which
    the aliasing guard on tensor arguments keeps stable across calls)."""

    def __init__(self, tensor: TensorVar):
        self.tensor = tensor

    def python_type(self) -> type:
        return int


def _id(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    v = args[0]
    if isinstance(v, TensorVar):
        return IdVar(v)
    if isinstance(v, (NNModuleVar, ObjectVar, ClassVar, FunctionVar)):
        return ConstVar(id(v.value))
    raise Unsupported(f"id() of {v.describe()}")


def _issubclass(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    c = _consts(args, kwargs)
    if c is None:
        raise Unsupported("issubclass of non-constants")
    return ConstVar(issubclass(*c[0]))


def _setattr(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    tr.setattr(args[0], args[1].as_const(), args[2])
    return ConstVar(None)


def _divmod_round(fn: Any) -> Any:
    def handler(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
        if _has_tensor(args):
            if fn is round:
                return tr.call_torch_function(torch.round, args, kwargs)
            raise Unsupported(f"{fn.__name__} of tensors")
        c = _consts(args, kwargs)
        if c is None:
            raise Unsupported(f"{fn.__name__} of non-constants")
        from .symbolic import call_on_consts  # symbolic ints: specialized if fn needs values
        return tr.const_result(call_on_consts(fn, c[0], c[1]))
    return handler


def _str(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if args and isinstance(args[0], TensorVar):
        raise Unsupported("str() of a tensor needs its value")
    c = _consts(args, kwargs)
    if c is None:
        if args and isinstance(args[0], (NNModuleVar, ObjectVar, ClassVar)):
            return ConstVar(str(args[0].value))
        raise Unsupported(f"str() of {args[0].describe()}")
    from .symbolic import concrete  # the text of a symbolic int needs its value
    return ConstVar(str(*[concrete(a) for a in c[0]], **c[1]))




def _vars(tr: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    (v,) = args
    if isinstance(v, DataclassVar):
        return DictVar(dict(v.fields))
    raise Unsupported(f"vars() of {v.describe()}")


_BUILTIN_HANDLERS: dict[Any, Any] = {
    vars: _vars,
    len: _len, isinstance: _isinstance, getattr: _getattr, hasattr: _hasattr, range: _range,
    enumerate: _enumerate, zip: _zip, reversed: _reversed, list: _list, tuple: _tuple,
    set: _set, frozenset: _frozenset, dict: _dict, min: _minmax(min), max: _minmax(max),
    sum: _sum, all: _all_any(all), any: _all_any(any), abs: _abs, int: _scalar_cast(int),
    float: _scalar_cast(float), bool: _bool, iter: _iter, next: _next, map: _map,
    filter: _filter, sorted: _sorted, type: _type, callable: _callable, id: _id,
    issubclass: _issubclass, setattr: _setattr, round: _divmod_round(round),
    divmod: _divmod_round(divmod), pow: _divmod_round(pow), str: _str, repr: _str,
}



def fold_numpy(fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var | None:
    """A numpy ufunc or function (not ``numpy.random``) of constants, evaluated while tracing
    (``np.log(float(self.max_scale))`` in a positional embedding): its scalar result is a
    constant, as torch.compile folds it. Float64, int64 and bool results become the Python
    scalars of the same value and arithmetic; anything else (arrays, float32) is None: the call
    stays a graph break."""
    import sys

    np = sys.modules.get("numpy")
    module = getattr(fn, "__module__", None) or ""
    if np is None or isinstance(fn, type) or not (isinstance(fn, np.ufunc) or (
            module.startswith("numpy") and not module.startswith("numpy.random"))):
        return None
    if not all(a.is_const() for a in args) or not all(a.is_const() for a in kwargs.values()):
        return None
    try:
        r = fn(*[a.as_const() for a in args], **{k: a.as_const() for k, a in kwargs.items()})
    except Exception:  # noqa: BLE001 - left to run (and raise) as Python, at a break
        return None
    if isinstance(r, (np.float64, np.int64, np.bool_)):
        return ConstVar(r.item())
    if type(r) in (int, float, bool):
        return ConstVar(r)
    return None
