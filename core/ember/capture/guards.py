"""Guard expressions: one function per kind of guard.

A guard is a Python expression over the entry function's parameters (the compiled function's
own parameters plus ``___fn``, the function object being called) and its namespace; the entry
checks all of them before it runs a graph. Every function here returns such an expression; the
``ns`` argument puts an object into the entry's namespace and returns its name
(``OutputGraph.ns``).

The rule they follow: a guard must tell apart every two values that Python code can tell apart
where the captured program depends on the difference. ``0.0 == -0.0`` and ``nan != nan``, so a
float guard compares the sign of zeros and matches NaN by ``x != x``.
"""

from __future__ import annotations

import math
import types
from typing import Any, Callable

__all__ = ["const_guard", "state_guard", "function_state_guards", "not_in_dict_guard",
           "class_attr_guard",
           "FN"]

#: The entry's parameter holding the function object being called (functions made by one
#: factory share a code object, and so a cache; each call's guards read its own function).
FN = "___fn"

Ns = Callable[[Any, str], str]


def const_guard(source: str, value: Any, ns: Ns) -> str:
    """``source`` holds a value equal to ``value`` in every way Python code can observe."""
    t = type(value)
    if value is None or t is bool:
        return f"({source}) is {value!r}"
    if t is float:
        if value != value:
            return f"type({source}) is float and ({source}) != ({source})"
        if math.isinf(value):
            return f"type({source}) is float and ({source}) == {ns(value, 'inf')}"
        if value == 0.0:
            sign = math.copysign(1.0, value)
            return (f"type({source}) is float and ({source}) == 0.0 and "
                    f"{ns(math.copysign, 'copysign')}(1.0, {source}) == {sign!r}")
        return f"type({source}) is float and ({source}) == {value!r}"
    if t in (int, str, bytes):
        return f"type({source}) is {t.__name__} and ({source}) == {value!r}"
    raise TypeError(f"const_guard: not a simple constant: {t.__name__}")


def state_guard(expr: str, value: Any, ns: Ns) -> str:
    """``expr`` (a call reading global state) evaluates to ``value`` again."""
    import torch

    if isinstance(value, torch.dtype):
        return f"({expr}) is {ns(value, str(value))}"
    if isinstance(value, torch.device):
        return f"({expr}) == {ns(value, 'device')}"
    return const_guard(expr, value, ns)


def function_state_guards(fn: types.FunctionType, ns: Ns, *, uses_globals: bool) -> list[str]:
    """What the entry's own copy of ``fn``'s signature and namespace assume about the function
    being called (``___fn``): the same defaults and keyword defaults objects (the entry fills
    missing arguments from the ones it was built with) and, when the graph reads globals, the
    same globals dict (``CompiledFunction`` treats a call the entry cannot bind because defaults
    were added later as a miss). A function's ``__globals__`` and ``__closure__`` cannot be reassigned;
    closure cell *contents* are guarded where they are read."""
    code = fn.__code__
    out = []
    # No defaults: an entry without defaults cannot bind a call that needs new ones (a
    # TypeError before the entry runs, which the caller treats as a miss), so no guard.
    if fn.__defaults__ is not None:
        out.append(f"{FN}.__defaults__ is {ns(fn.__defaults__, 'defaults')}")
    if fn.__kwdefaults__ is not None:
        out.append(f"{FN}.__kwdefaults__ is {ns(fn.__kwdefaults__, 'kwdefaults')}")
    if uses_globals:
        out.append(f"{FN}.__globals__ is ___G")
    return out


def not_in_dict_guard(dict_ref: str, name: str) -> str:
    """An instance attribute ``name`` does not shadow what the class provides."""
    return f"{name!r} not in {dict_ref}"


def class_attr_guard(cls_ref: str, name: str, value_ref: str, through: str = "") -> str:
    """The class (through its MRO) still resolves ``name`` to the same object (``through``: an
    attribute of what it resolves to, for a classmethod, which binds anew on every read)."""
    read = f"{cls_ref}.{name}" if name.isidentifier() else f"getattr({cls_ref}, {name!r})"
    return f"{read}.{through} is {value_ref}" if through else f"{read} is {value_ref}"
