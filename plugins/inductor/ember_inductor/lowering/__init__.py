"""ATen op -> IR. Importing this package registers every lowering in ``LOWERINGS``."""

from . import indexing, pointwise, pooling, reductions, views  # noqa: F401  (registration side effects)
from .graph import GraphLowering
from .registry import LOWERINGS, Unsupported

__all__ = ["GraphLowering", "LOWERINGS", "Unsupported"]
