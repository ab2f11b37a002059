"""Guards that keep a graph which mutates an input from seeing that input aliased.

A graph compiled through AOT autograd is functionalized: an in-place op on an input becomes a
new value copied back into the input after the graph ran, and every other input is read as it
was when the call began. That is eager's answer only when the mutated input shares memory with
no other input: ``f(x, x[:2])`` with ``x.add_(1)`` inside must see the update through the view.
Distinct tensor objects (the identity guard on arguments) may still share a storage (a view, an
argument that is ``p.data`` of a parameter the graph reads).

So, for a graph that mutates an input, the entry checks that no user input shares a storage
with a mutated input. The cheap form reads one reference count per user input: a tensor whose
storage has no other tensor on it (the common case: a fresh batch) cannot alias anything. A
user input that shares its storage with some tensor at capture time gets the exact check
instead (its storage against the mutated inputs' storages). A capture whose inputs really alias
a mutated input runs eagerly.

Not checked (a cost on every call of every training step): two different parameter or buffer
objects of the modules sharing one storage while the graph mutates one of them.
"""

from __future__ import annotations

from typing import Any

import torch

from ..exc import Unsupported

__all__ = ["storage_uses", "storages_apart", "mutated_input_guards", "HELPERS"]

_use_count = torch._C._storage_Use_Count

#: What :func:`storage_uses` returns for a tensor that is alone on its storage (the tensor, and
#: the storage object made to read the count).
ALONE = 2


def storage_uses(t: torch.Tensor) -> int:
    """How many references hold ``t``'s storage (tensors sharing it, plus the one made here)."""
    return _use_count(t.untyped_storage()._cdata)


def _ptr(t: torch.Tensor) -> int:
    s = t.untyped_storage()
    return s.data_ptr() if s.nbytes() else 0


def storages_apart(these: tuple, others: tuple) -> bool:
    """No tensor of ``these`` shares its storage with a tensor of ``others`` (empty storages
    hold no memory and never alias)."""
    mine = {_ptr(t) for t in these}
    mine.discard(0)
    return not any(_ptr(t) in mine for t in others)


HELPERS = {"___storage_uses": storage_uses, "___storages_apart": storages_apart}


def _mutated(var: Any) -> bool:
    fake = getattr(var, "fake", None)
    if not isinstance(fake, torch.Tensor):
        return False
    try:
        return fake._version > 0
    except Exception:  # an inference tensor has no version counter: assume mutated
        return True


def mutated_input_guards(out: Any) -> list[str]:
    """The guards a capture whose graph mutates inputs needs (see the module docstring); raises
    Unsupported when a mutated input shares memory with another input now."""
    inputs = [(var, src, value) for var, src, value in out.inputs
              if isinstance(value, torch.Tensor)]
    mutated = [(var, src, value) for var, src, value in inputs if _mutated(var)]
    if not mutated:
        return []
    user = set(map(str, out.arg_tensor_sources))
    ref = lambda src: str(out.fetch.get(src, f"({src})"))  # noqa: E731
    guards = []
    for var, src, value in inputs:
        is_user = str(src) in user
        is_mutated = any(var is m for m, _, _ in mutated)
        if not is_user:
            continue  # parameters and buffers: see the module docstring
        # who this user input must not share memory with
        against = [(s, v) for vv, s, v in (inputs if is_mutated else mutated) if vv is not var]
        if not against:
            continue
        if not storages_apart((value,), tuple(v for _, v in against)):
            raise Unsupported(f"the graph mutates an input that shares memory with another "
                              f"input ({src}); this runs eagerly")
        if storage_uses(value) == ALONE:
            guards.append(f"___storage_uses({ref(src)}) == {ALONE}")
        else:
            others = ", ".join(ref(s) for s, _ in against)
            guards.append(f"___storages_apart(({ref(src)},), ({others},))")
    return guards
