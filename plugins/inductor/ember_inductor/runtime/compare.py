"""Byte-wise comparison of CPU tensors for the per-call check that frozen inputs are unchanged:
core's :func:`ember._compare.same_contents` (shared with the onnxrt plugin), re-exported here."""

from __future__ import annotations

from ember._compare import same_contents

__all__ = ["same_contents"]
