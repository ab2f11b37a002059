"""ATen op -> IR. Importing this package registers every lowering in ``LOWERINGS``."""

# registration side effects
from . import indexing, pointwise, pooling, random, reductions, views  # noqa: F401
from .graph import GraphLowering
from .registry import LOWERINGS, Unsupported

__all__ = ["GraphLowering", "LOWERINGS", "Unsupported"]
