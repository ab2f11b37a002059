"""Methods of Python containers (and of constants) over symbolic values, with mutation tracking:
a container that came from outside the frame and is mutated is replayed after the graph runs."""

from __future__ import annotations

from typing import Any

import torch

from ..exc import Unsupported
from .builtins import _hashable, _mark_mutated, contains, is_same
from .variables import ConstVar, DictVar, ListVar, PyRaise, SetVar, TensorVar, TupleVar, Var


def set_add(s: SetVar, item: Var) -> None:
    # Tensors hash by identity, so a set of tensors is a set of distinct tensor objects.
    for x in s.items:
        if (x.is_const() and item.is_const() and x.as_const() == item.as_const()) or \
                is_same(x, item):
            return
    s.items.append(item)
    if s.shadow is not None:  # the same insertion into the real set that mirrors it
        if not isinstance(item, ConstVar):
            s.shadow = None
            return
        try:
            s.shadow.add(item.value)
        except TypeError:  # unhashable
            s.shadow = None


def _real_set(v: Var) -> Any:
    """The real set or frozenset behind ``v`` (a constant, a set read from outside, a set
    mirrored while tracing), or None."""
    if isinstance(v, ConstVar) and type(v.value) in (set, frozenset):
        return v.value
    if isinstance(v, SetVar):
        if v.real is not None and not v.mutated:
            return v.real
        if v._shadow_in_sync():
            return v.shadow
    return None


def set_update(tr: Any, s: SetVar, v: Var) -> None:
    """``s |= v`` as Python does it (SET_UPDATE, ``set(v)``, ``set.update``): a real set into
    an empty one is a copy of its table (``set_merge``), whose order the program's iteration
    then follows; the mirror is updated the same way."""
    items = list(tr.iterate(v))
    real = _real_set(v) if s.shadow is not None and not s.items else None
    if real is None or not all(isinstance(it, ConstVar) for it in items):
        for it in items:
            set_add(s, it)
        return
    s.items = items  # iterated in the mirror's order (SetVar.ordered)
    s.shadow.update(real)


def delitem(tr: Any, obj: Var, idx: Var) -> None:
    if isinstance(obj, ListVar):
        del obj.items[idx.as_const()]
    elif isinstance(obj, DictVar):
        del obj.items[_hashable(idx)]
    else:
        raise Unsupported(f"del on {obj.describe()}")
    _mark_mutated(tr, obj)


def call_container_method(tr: Any, obj: Var, name: str, args: list[Var],
                          kwargs: dict[str, Var]) -> Var:
    if isinstance(obj, ListVar):
        return _list_method(tr, obj, name, args, kwargs)
    if isinstance(obj, DictVar):
        return _dict_method(tr, obj, name, args, kwargs)
    if isinstance(obj, SetVar):
        return _set_method(tr, obj, name, args, kwargs)
    if isinstance(obj, TupleVar):
        if name == "index":
            for i, x in enumerate(obj.items):
                if x.is_const() and x.as_const() == args[0].as_const():
                    return ConstVar(i)
            raise Unsupported("tuple.index: value not found")
        if name == "count":
            return ConstVar(sum(1 for x in obj.items if x.is_const() and
                                x.as_const() == args[0].as_const()))
        if name in ("numel",) and obj.cls is torch.Size:
            n = 1
            for x in obj.items:
                n *= x.as_const()
            return ConstVar(n)
        if name == "_asdict" and hasattr(obj.cls, "_fields"):
            return DictVar(dict(zip(obj.cls._fields, obj.items)))
        if name == "_replace" and hasattr(obj.cls, "_fields"):
            items = list(obj.items)
            for k, v in kwargs.items():
                items[obj.cls._fields.index(k)] = v
            return TupleVar(items, cls=obj.cls)
        if obj.is_const():
            return _const_method(tr, obj.as_const(), name, args, kwargs)
        raise Unsupported(f"tuple.{name}")
    if isinstance(obj, ConstVar):
        return _const_method(tr, obj.value, name, args, kwargs)
    raise Unsupported(f"method {name} of {obj.describe()}")


def _const_method(tr: Any, value: Any, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if name == "format" or name == "join" or all(a.is_const() for a in args) and all(
            a.is_const() for a in kwargs.values()):
        if name == "join" and args and not args[0].is_const():
            items = tr.iterate(args[0])
            return ConstVar(value.join(i.as_const() for i in items))
        if any(isinstance(a, TensorVar) for a in args):
            raise Unsupported(f"{type(value).__name__}.{name} of a tensor needs its value")
        cargs = [a.as_const() for a in args]
        ckw = {k: a.as_const() for k, a in kwargs.items()}
        if isinstance(value, (list, dict, set)):
            raise Unsupported(f"mutating method {name} on a constant container")
        try:
            return tr.const_result(getattr(value, name)(*cargs, **ckw))
        except Exception as e:
            raise Unsupported(f"{type(value).__name__}.{name}() raised {type(e).__name__}: {e}")
    raise Unsupported(f"{type(value).__name__}.{name} with non-constant arguments")


def _list_method(tr: Any, obj: ListVar, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
    items = obj.items
    if name == "append":
        items.append(args[0])
    elif name == "extend":
        items.extend(tr.iterate(args[0]))
    elif name == "insert":
        items.insert(args[0].as_const(), args[1])
    elif name == "pop":
        v = items.pop(args[0].as_const() if args else -1)
        _mark_mutated(tr, obj)
        return v
    elif name == "remove":
        for i, x in enumerate(items):
            if is_same(x, args[0]) or (x.is_const() and args[0].is_const() and
                                       x.as_const() == args[0].as_const()):
                del items[i]
                break
        else:
            raise Unsupported("list.remove: value not found")
    elif name == "clear":
        items.clear()
    elif name == "reverse":
        items.reverse()
    elif name == "sort":
        if not all(x.is_const() for x in items):
            raise Unsupported("list.sort of non-constants")
        key = kwargs.get("key")
        if key is not None and not (isinstance(key, ConstVar) and key.value is None):
            raise Unsupported("list.sort(key=...)")
        rev = kwargs.get("reverse", ConstVar(False)).as_const()
        items.sort(key=lambda v: v.as_const(), reverse=rev)
    elif name == "copy":
        return ListVar(list(items))
    elif name == "index":
        for i, x in enumerate(items):
            if is_same(x, args[0]) or (x.is_const() and args[0].is_const() and
                                       x.as_const() == args[0].as_const()):
                return ConstVar(i)
        raise Unsupported("list.index: value not found")
    elif name == "count":
        return ConstVar(sum(1 for x in items if x.is_const() and args[0].is_const() and
                            x.as_const() == args[0].as_const()))
    elif name == "__contains__":
        return ConstVar(contains(tr, obj, args[0]))
    elif name == "__len__":
        return ConstVar(len(items))
    elif name == "__getitem__":
        from .builtins import getitem
        return getitem(tr, obj, args[0])
    else:
        raise Unsupported(f"list.{name}")
    _mark_mutated(tr, obj)
    return ConstVar(None)


def _dict_method(tr: Any, obj: DictVar, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
    items = obj.items
    if name == "get":
        k = _hashable(args[0])
        if k in items:
            return items[k]
        return args[1] if len(args) > 1 else ConstVar(None)
    if name == "keys":
        return ListVar([ConstVar(k) for k in items])
    if name == "values":
        return ListVar(list(items.values()))
    if name == "items":
        return ListVar([TupleVar([ConstVar(k), v]) for k, v in items.items()])
    if name == "copy":
        return DictVar(dict(items), cls=obj.cls)
    if name == "__contains__":
        return ConstVar(_hashable(args[0]) in items)
    if name == "__getitem__":
        return items[_hashable(args[0])]
    if name == "__len__":
        return ConstVar(len(items))
    if name == "pop":
        k = _hashable(args[0])
        if k in items:
            v = items.pop(k)
        elif len(args) > 1:
            return args[1]
        else:
            raise PyRaise(KeyError(k), f"dict.pop: key {k!r} missing (KeyError)")
    elif name == "setdefault":
        k = _hashable(args[0])
        if k in items:
            return items[k]
        v = items[k] = args[1] if len(args) > 1 else ConstVar(None)
    elif name == "update":
        if args:
            src = args[0]
            if isinstance(src, DictVar):
                items.update(src.items)
            else:
                for pair in tr.iterate(src):
                    k, val = tr.iterate(pair)
                    items[_hashable(k)] = val
        items.update(kwargs)
        v = ConstVar(None)
    elif name == "clear":
        items.clear()
        v = ConstVar(None)
    elif name == "__setitem__":
        items[_hashable(args[0])] = args[1]
        v = ConstVar(None)
    elif name == "move_to_end":
        k = _hashable(args[0])
        last = (args[1] if len(args) > 1 else kwargs.get("last", ConstVar(True))).as_const()
        v = items.pop(k)
        if last:
            items[k] = v
        else:
            obj.items = {k: v, **items}
        v = ConstVar(None)
    elif name == "popitem":
        k, v = items.popitem()
        v = TupleVar([ConstVar(k), v])
    else:
        raise Unsupported(f"dict.{name}")
    _mark_mutated(tr, obj)
    return v


def _set_method(tr: Any, obj: SetVar, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
    if name == "add":
        set_add(obj, args[0])
    elif name == "update":
        for a in args:
            set_update(tr, obj, a)
    elif name == "discard" or name == "remove":
        before = len(obj.items)
        obj.items = [x for x in obj.items if not (x.is_const() and args[0].is_const() and
                                                   x.as_const() == args[0].as_const())]
        if obj.shadow is not None:
            if isinstance(args[0], ConstVar):
                obj.shadow.discard(args[0].value)
            else:
                obj.shadow = None
        if name == "remove" and len(obj.items) == before:
            if not args[0].is_const():
                raise Unsupported("set.remove of a non-constant")
            raise PyRaise(KeyError(args[0].as_const()), "set.remove: KeyError")
    elif name == "__contains__":
        return ConstVar(contains(tr, obj, args[0]))
    elif name in ("union", "intersection", "difference", "issubset", "issuperset",
                  "symmetric_difference", "isdisjoint", "copy"):
        if not obj.is_const() or not all(a.is_const() for a in args):
            raise Unsupported(f"set.{name} of non-constants")
        return tr.wrap(getattr(obj.as_const(), name)(*[a.as_const() for a in args]), None)
    else:
        raise Unsupported(f"set.{name}")
    _mark_mutated(tr, obj)
    return ConstVar(None)

