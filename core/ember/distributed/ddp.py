"""DistributedDataParallel under Ember.

Two things make a DDP model train well when compiled:

* **DDP's bookkeeping stays Python.** ``DistributedDataParallel.forward`` prepares the reducer
  (``_pre_forward``), runs the wrapped module, and registers the outputs for the backward
  (``_post_forward``: unused-parameter search, ``_DDPSink`` for ``static_graph``). None of it is
  tensor math, and capturing it would bake one iteration's bookkeeping into a graph.
  ``ember.compile(ddp)`` therefore runs ``ddp.forward`` as Python and compiles only the inner
  module's forward: while the DDP forward runs, the inner module's ``forward`` is routed to the
  compiled one (:class:`ember.distributed.routing.RoutedCall`). ``DDP(ember.compile(model))`` needs nothing: DDP calls the
  compiled module.
* **The graph is split at gradient-bucket boundaries** (:func:`maybe_split`). One compiled
  graph is one autograd node: every parameter's gradient appears when its whole backward ends,
  so DDP's all-reduces could only start then. A graph compiled while a DDP forward is active
  (``DistributedDataParallel._get_active_ddp_module()``) is cut into pieces holding about
  ``bucket_cap_mb`` of parameters each, counted from the end of the graph (the backward runs
  the graph in reverse, as DDP fills its buckets); each piece is compiled on its own, so a
  bucket's gradients are ready, and its all-reduce starts, while earlier pieces' backward
  still runs.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Callable, Sequence

import torch

from .. import events

__all__ = ["is_ddp", "active_ddp", "maybe_split", "bucket_partition"]

log = logging.getLogger("ember.distributed")

_tls = threading.local()


def _ddp_class() -> Any:
    mod = sys.modules.get("torch.nn.parallel.distributed")
    return getattr(mod, "DistributedDataParallel", None) if mod is not None else None


def is_ddp(obj: Any) -> bool:
    """Is ``obj`` a ``torch.nn.parallel.DistributedDataParallel``?"""
    cls = _ddp_class()
    return cls is not None and isinstance(obj, cls)


def active_ddp() -> Any:
    """The DDP module whose forward is running now (None outside a DDP forward)."""
    cls = _ddp_class()
    if cls is None:
        return None
    get = getattr(cls, "_get_active_ddp_module", None)
    return get() if get is not None else getattr(cls, "_active_ddp_module", None)


# ---------------------------------------------------------------------------------------------
# The bucket split (DDPOptimizer)
# ---------------------------------------------------------------------------------------------

def _caps(ddp: Any) -> tuple[int, int]:
    """(bucket bytes cap, first bucket bytes cap) of ``ddp``, as its reducer uses them."""
    cap = int(getattr(ddp, "bucket_bytes_cap", 25 * 1024 * 1024))
    cfg = getattr(ddp, "_bucket_config", None)
    first = getattr(cfg, "first_bucket_bytes_cap", None)
    if first is None:
        import torch.distributed as dist
        first = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", cap)
    return cap, min(int(first), cap)


def _ignored(ddp: Any) -> set[int]:
    """ids of the parameters DDP was told to ignore (``_set_params_and_buffers_to_ignore_for_model``)."""
    names = getattr(ddp, "parameters_to_ignore", None) or ()
    out: set[int] = set()
    for name in names:
        try:
            out.add(id(ddp.module.get_parameter(name)))
        except Exception:
            pass
    return out


def bucket_partition(gm: torch.fx.GraphModule, param_bytes: dict[str, tuple[int, int]],
                     cap: int, first_cap: int) -> list[list[torch.fx.Node]]:
    """Assign the graph's compute nodes to buckets, walking it backwards as the backward runs:
    a bucket closes once it holds ``cap`` bytes of parameters (``first_cap`` for the first
    one, the graph's last layers) and one of its nodes feeds something outside it. Returns the
    buckets in program order. ``param_bytes``: placeholder name -> (id of the parameter, bytes)
    for the parameters that get gradients reduced by DDP."""
    buckets: list[list[torch.fx.Node]] = [[]]
    sizes = [0]
    seen: set[int] = set()

    def feeds_out(nodes: list[torch.fx.Node]) -> bool:
        members = set(nodes)
        return any(u.op == "output" or u not in members for n in nodes for u in n.users)

    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        limit = first_cap if len(buckets) == 1 else cap
        if sizes[0] >= limit and feeds_out(buckets[0]):
            buckets.insert(0, [])
            sizes.insert(0, 0)
        for a in node.all_input_nodes:
            if a.op == "placeholder" and a.name in param_bytes:
                pid, nbytes = param_bytes[a.name]
                if pid not in seen:
                    seen.add(pid)
                    sizes[0] += nbytes
        buckets[0].append(node)
    if len(buckets) > 1 and sizes[0] == 0:
        # a preamble without parameters: no gradient of its own, merge it into the next piece
        buckets[1].extend(buckets[0])
        del buckets[0], sizes[0]
    return [list(reversed(b)) for b in buckets]


class _Piece(torch.nn.Module):
    """A compiled piece, callable from the split graph's ``call_module`` nodes."""

    def __init__(self, fn: Callable[..., Any], name: str):
        super().__init__()
        self.fn = fn
        self.piece = name

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def _example(meta: Any) -> Any:
    if not isinstance(meta, torch.Tensor):
        return meta
    t = torch.empty_strided(tuple(meta.shape), tuple(meta.stride()), dtype=meta.dtype,
                            device=meta.device).zero_()
    return t.requires_grad_(meta.requires_grad) if t.is_floating_point() or t.is_complex() else t


def _has_example_values(gm: torch.fx.GraphModule) -> bool:
    return all("example_value" in n.meta for n in gm.graph.nodes
               if n.op in ("call_function", "call_method"))


def _propagate(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], graph_id: str) -> bool:
    """Give every node a fake ``meta["example_value"]`` (a graph rebuilt from the persisted
    capture store has none): what the pieces' example inputs are made from."""
    from torch._subclasses import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fakes = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                 for v in example_inputs]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    except Exception as e:  # the graph then compiles whole: correct, without the overlap
        log.info("ember: cannot propagate example values through graph %s (%s: %s); compiled "
                 "whole", graph_id, type(e).__name__, e)
        return False
    for n in gm.graph.nodes:
        if "example_value" not in n.meta and "val" in n.meta:
            n.meta["example_value"] = n.meta["val"]
    return True


def maybe_split(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], inputs: Sequence[Any],
                graph_id: str, compile_piece: Callable[..., Callable[..., Any]],
                fake_mode: Any = None) -> Callable[..., Any] | None:
    """Inside a DDP forward: split ``gm`` at gradient-bucket boundaries and compile each piece
    with ``compile_piece(piece_gm, example_inputs, inputs=..., graph_id=...)``. Returns the
    stitched callable, or None when the graph stays whole (no DDP forward active, one bucket,
    gradients off, dynamic shapes)."""
    if getattr(_tls, "splitting", False):
        return None
    ddp = active_ddp()
    if ddp is None or not torch.is_grad_enabled():
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if fake_mode is not None:
        log.info("ember: graph %s is compiled whole inside DDP: the bucket split does not "
                 "handle symbolic sizes yet", graph_id)
        return None
    if len(placeholders) != len(example_inputs):
        return None
    ignored = _ignored(ddp)
    param_bytes: dict[str, tuple[int, int]] = {}
    for i, (n, v) in enumerate(zip(placeholders, example_inputs)):
        kind = getattr(inputs[i], "kind", "user") if i < len(inputs) else "user"
        if (kind == "parameter" and isinstance(v, torch.Tensor) and v.requires_grad
                and id(v) not in ignored):
            param_bytes[n.name] = (id(v), v.numel() * v.element_size())
    if not param_bytes:
        return None
    cap, first_cap = _caps(ddp)
    buckets = bucket_partition(gm, param_bytes, cap, first_cap)
    if len(buckets) < 2:
        return None
    part = {n: i for i, b in enumerate(buckets) for n in b}
    if not _has_example_values(gm) and not _propagate(gm, example_inputs, graph_id):
        return None
    from torch.fx.passes.split_module import split_module

    split = split_module(gm, None, lambda n: part[n], keep_original_order=True)
    orig = {n.name: n for n in gm.graph.nodes}
    info_of = {n.name: inputs[i] for i, n in enumerate(placeholders) if i < len(inputs)}
    value_of = {n.name: v for n, v in zip(placeholders, example_inputs)}
    from ..context import InputInfo

    n_pieces = 0
    _tls.splitting = True
    try:
        for node in list(split.graph.nodes):
            if node.op != "call_module":
                continue
            sub = getattr(split, node.target)
            ex: list[Any] = []
            infos: list[Any] = []
            for p in sub.graph.nodes:
                if p.op != "placeholder":
                    continue
                name = p.target if isinstance(p.target, str) else p.name
                if name in value_of:
                    ex.append(value_of[name])
                    infos.append(info_of.get(name, InputInfo("user", name, False)))
                    p.meta.setdefault("example_value", orig[name].meta.get("example_value"))
                else:
                    src = orig.get(name)
                    meta = src.meta.get("example_value") if src is not None else \
                        p.meta.get("example_value")
                    if meta is None:
                        log.info("ember: no example value for %s in graph %s; compiled whole",
                                 name, graph_id)
                        return None
                    p.meta["example_value"] = meta
                    ex.append(_example(meta))
                    infos.append(InputInfo("user", name, False))
            fn = compile_piece(sub, ex, inputs=infos, graph_id=f"{graph_id}.bucket{n_pieces}")
            setattr(split, node.target, _Piece(fn, str(node.target)))
            n_pieces += 1
    finally:
        _tls.splitting = False
    split.recompile()
    events.counters["ddp"]["split_graphs"] += 1
    events.counters["ddp"]["pieces"] += n_pieces
    log.info("ember: graph %s split into %d pieces at DDP bucket boundaries "
             "(bucket_cap %d bytes, first bucket %d bytes)", graph_id, n_pieces, cap, first_cap)
    events.emit("ddp_split", graph=graph_id, pieces=n_pieces, bucket_bytes_cap=cap)
    return split
