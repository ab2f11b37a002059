"""``ember.compile`` of a module whose wrappers' bookkeeping must stay Python: DDP and FSDP2.

``DistributedDataParallel.forward`` (reducer preparation, unused-parameter search, ``_DDPSink``)
and FSDP2's forward hooks (all-gather before a block, reshard after it, the backward hooks they
register) are not tensor math: capturing them would bake one iteration's bookkeeping into a
graph. They run as Python, around compiled code, as they do under torch.compile:

* ``ember.compile(DDP(model))``: ``ddp(*args)`` runs as Python, and the wrapped module's
  ``forward`` is compiled.
* ``ember.compile(model)`` where ``model`` or modules under it were ``fully_shard``-ed: the
  call goes through ``nn.Module.__call__`` (FSDP's hooks as Python), the root's ``forward`` is
  compiled, and a call to a sharded submodule inside it is a graph break: the submodule's hooks
  run as Python and its own ``forward`` is compiled (one graph per block class, shared by the
  instances after the first, as a frame hook would compile them).

The routing is an instance attribute ``forward`` on each of those modules, set when the call
starts and removed when it returns: ``nn.Module.__call__`` and DDP's ``self.module.forward``
find it, and nothing is left on the modules between calls. Calls from several threads into
one compiled model at once are not supported (as DDP's and FSDP's own state is not).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch

from .ddp import is_ddp

__all__ = ["RoutedCall", "routed_compile", "fsdp_modules"]


def _fsdp_class() -> Any:
    mod = sys.modules.get("torch.distributed.fsdp")
    return getattr(mod, "FSDPModule", None) if mod is not None else None


def fsdp_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules under ``model`` (itself included) that ``fully_shard`` manages."""
    cls = _fsdp_class()
    if cls is None:
        return []
    return [m for m in model.modules() if isinstance(m, cls)]


class RoutedCall:
    """Calls ``root(*args)`` through ``nn.Module.__call__`` with ``module.forward`` answered by
    the compiled forward for each ``(module, compiled)`` of ``routes`` during the call."""

    def __init__(self, root: torch.nn.Module, routes: list[tuple[torch.nn.Module, Any]]):
        self.root = root
        self.routes = routes
        self._depth = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._depth:
            return self.root(*args, **kwargs)
        set_here = []
        for m, fn in self.routes:
            d = m.__dict__
            if "forward" not in d:  # a forward the user set on the instance is left alone
                d["forward"] = fn
                set_here.append((d, fn))
        self._depth += 1
        try:
            return self.root(*args, **kwargs)
        finally:
            self._depth -= 1
            for d, fn in set_here:
                if d.get("forward") is fn:
                    del d["forward"]

    @property
    def compiled(self) -> list[Any]:
        """The compiled forwards (CompiledFunction), root's first."""
        return [fn for _, fn in self.routes]


def _compiled_forward(m: torch.nn.Module, backend: Any, options: dict[str, Any],
                      fullgraph: bool, dynamic: bool | None, own_cache: bool) -> Any:
    from ..capture.frame import CodeCache, CompiledFunction

    cf = CompiledFunction(type(m).forward, backend, options, fullgraph=fullgraph, bound_self=m,
                          dynamic=dynamic)
    # Called as ``m.forward`` from inside Module.__call__ (the module's hooks already ran as
    # Python): a plain function of ``self``, not the root-module entry (which would take the
    # routing attribute for "a forward set on the instance" and go through __call__ again).
    cf._root_module = False
    if own_cache:  # the model compiled by itself: entries of its own, as ember.compile(mod)
        cf.cache = CodeCache(cf.cache.code)
    return cf


def routed_compile(model: torch.nn.Module, backend: Any, options: dict[str, Any],
                   fullgraph: bool, dynamic: bool | None) -> Callable[..., Any] | None:
    """The call ``ember.compile(model)`` wraps when ``model`` is a DDP module or holds
    ``fully_shard``-ed modules; None for any other module (compiled as usual)."""
    if is_ddp(model):
        inner = model.module
        return RoutedCall(model, [(inner, _compiled_forward(inner, backend, options, fullgraph,
                                                            dynamic, own_cache=True))])
    sharded = fsdp_modules(model)
    if not sharded:
        return None
    routes = [(model, _compiled_forward(model, backend, options, fullgraph, dynamic, True))]
    # Submodules: the instances of one class share their entries (the first instance is
    # specialized, a second makes ``self`` generic: two graphs per class, not one per block).
    routes += [(m, _compiled_forward(m, backend, options, fullgraph, dynamic, own_cache=False))
               for m in sharded if m is not model]
    return RoutedCall(model, routes)
