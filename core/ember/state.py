"""Grad-mode and autocast state, in one module.

Capture, the backends step and AOT autograd all run user code (tracing executes its
``torch.no_grad()`` and ``torch.autocast`` switches), and graph breaks split ``with`` blocks
across the entry function and resume functions. Everything that reads, saves, restores or
re-enters that state is here:

* :func:`global_state` / :func:`set_global_state`: a snapshot of grad mode and the autocast
  state of every device, and putting it back (each compile stage starts from the caller's state);
* :class:`GradRestore`, :class:`AutocastExit`, :func:`enter_autocast`: the ``__exit__`` of a
  ``with`` block split by a graph break, and re-entering an autocast region in a resume function;
* :func:`settle_autocast`, :func:`autocast_nesting`: the entry's bookkeeping after a graph that
  leaves autocast regions opened before it.
"""

from __future__ import annotations

import torch

__all__ = ["DEVICES", "global_state", "set_global_state", "GradRestore", "AutocastExit",
           "restore_autocast", "autocast_nesting", "leave_nesting", "settle_autocast",
           "enter_autocast"]

#: The devices whose autocast state is saved and guarded.
DEVICES = ("cpu", "cuda")


def global_state() -> tuple:
    """(grad enabled, ((device, autocast enabled, autocast dtype), ...))."""
    return (torch.is_grad_enabled(),
            tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                  for d in DEVICES))


def set_global_state(state: tuple) -> None:
    grad, autocast = state
    torch._C._set_grad_enabled(grad)
    for d, enabled, dtype in autocast:
        torch.set_autocast_enabled(d, enabled)
        torch.set_autocast_dtype(d, dtype)


class GradRestore:
    """Stands for the ``__exit__`` of a grad-mode ``with`` block that a graph break split."""

    def __init__(self, prev: bool):
        self.prev = prev

    def __call__(self, *exc: object) -> bool:
        torch._C._set_grad_enabled(self.prev)
        return False


class AutocastExit:
    """The ``__exit__`` of an autocast region that a graph break split: restores the autocast
    state that was in force before the region (a plain value, so a resume function's trace can
    guard on it and replay it)."""

    def __init__(self, device_type: str, prev_enabled: bool, prev_dtype: torch.dtype):
        self.device_type = device_type
        self.prev_enabled = prev_enabled
        self.prev_dtype = prev_dtype

    def __call__(self, *exc: object) -> bool:
        restore_autocast(self.device_type, self.prev_enabled, self.prev_dtype)
        leave_nesting(1)
        return False


def restore_autocast(device_type: str, enabled: bool, dtype: torch.dtype) -> None:
    """Set autocast's state back (idempotent: the nesting count is the entry's business)."""
    torch.set_autocast_enabled(device_type, enabled)
    torch.set_autocast_dtype(device_type, dtype)


def autocast_nesting() -> int:
    n = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return n - 1


def leave_nesting(k: int) -> None:
    for _ in range(k):
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()


def settle_autocast(exits: tuple, nesting_before: int) -> None:
    """After a graph that left autocast regions opened before it: the state those exits restore
    and the nesting count one lower per exit, whether or not the backend ran the graph's
    Python-level state switches."""
    for device_type, enabled, dtype in exits:
        restore_autocast(device_type, enabled, dtype)
    target = nesting_before - len(exits)
    leave_nesting(max(0, autocast_nesting() - target))


def enter_autocast(device_type: str, dtype: torch.dtype, enabled: bool) -> AutocastExit:
    """Re-enters an autocast region that a graph break split; returns its exit."""
    prev = AutocastExit(device_type, torch.is_autocast_enabled(device_type),
                        torch.get_autocast_dtype(device_type))
    torch.set_autocast_enabled(device_type, enabled)
    torch.set_autocast_dtype(device_type, dtype)
    torch.autocast_increment_nesting()
    return prev
