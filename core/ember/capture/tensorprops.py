"""Tensor properties the tensor guard does not cover, read by the traced program.

The guard on a tensor argument checks its type, dtype, device, shape, strides and
``requires_grad``: everything a graph's computation depends on. A program can also read, as a
Python value, what those leave open: whether the tensor is a leaf, has a ``grad_fn``, is a view
(``_base``, ``_is_view()``), its storage offset, its conjugate/negative bits, its version
counter, ``retains_grad``, whether it is an inference tensor. Such a read is answered from the
real argument and guarded (the entry re-reads the property), so a later call with a tensor that
differs only there recompiles. A tensor made inside the graph that is a view of an argument
inherits some of these (its storage offset, its conjugate bit): the argument's property is
guarded then. The guards cost nothing for programs that never read these properties.
"""

from __future__ import annotations

from typing import Any

import torch

from ..exc import Unsupported

__all__ = ["ATTRS", "METHODS", "read"]

#: attributes and methods (called without arguments) answered here
ATTRS = {"is_leaf", "grad_fn", "_base", "retains_grad", "_version"}
METHODS = {"_is_view", "storage_offset", "is_conj", "is_neg", "is_inference"}


def _value(t: torch.Tensor, name: str) -> Any:
    v = getattr(t, name)
    return v() if name in METHODS else v


def _guard(tr: Any, src: Any, real: torch.Tensor, name: str) -> Any:
    """Guard property ``name`` of the argument ``src`` (``real`` now); returns its value."""
    from .guards import const_guard

    out = tr.out
    expr = f"{out.fetch.get(src, f'({src})')}.{name}{'()' if name in METHODS else ''}"
    value = _value(real, name)
    if name in ("grad_fn", "_base"):  # objects: what a program can test is whether there is one
        out.guards.add(f"({expr} is None) is {value is None}")
        return value
    out.guards.add(const_guard(expr, value, out.ns))
    return value


def read(tr: Any, t: Any, name: str) -> Any:
    """The Var for property ``name`` of the TensorVar ``t`` (a method's result, for METHODS),
    or None to let the interpreter read it from the FakeTensor as before (after the guards)."""
    out = tr.out
    tensors = [(var, src, real) for var, src, real in out.inputs
               if isinstance(real, torch.Tensor)]
    for var, src, real in tensors:
        if var is t:
            value = _guard(tr, src, real, name)
            if name in ("grad_fn", "_base"):
                if value is None:
                    return tr.wrap(None, None)
                if name == "grad_fn":
                    raise Unsupported("reading the grad_fn of a tensor argument")
                return None  # a view: _base is traced as before
            return tr.wrap(value, None)
    if name in ("_version", "retains_grad"):
        raise Unsupported(f"Tensor.{name} of a tensor made inside the compiled region")
    # a tensor made by the graph: a view of an argument inherits its offset, bits, base
    for var, src, real in tensors:
        fake = getattr(var, "fake", None)
        if isinstance(fake, torch.Tensor) and torch._C._is_alias_of(t.fake, fake):
            for inherited in ("storage_offset", "is_conj", "is_neg", "_is_view", "is_inference"):
                _guard(tr, src, real, inherited)
    return None
