"""Errors of ``ember.precompile`` (the call-time check error lives in runtime.py)."""

from __future__ import annotations

from ..exc import EmberError, GraphBreakError

__all__ = ["PrecompileError", "PrecompileGraphBreak"]


class PrecompileError(EmberError):
    """``ember.precompile`` cannot turn this function into an artifact; the message says why."""


class PrecompileGraphBreak(PrecompileError, GraphBreakError):
    """The function does not capture as one graph; ``.breaks`` lists each break (file:line)."""
