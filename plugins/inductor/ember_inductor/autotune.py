"""``mode="max-autotune"``: where a graph has alternatives, time them once and remember the winner.

Today's alternatives are the matmul library's ways of running a linear layer whose weight is
frozen (an inference graph's parameter, see :mod:`ember_inductor.freezing`):

* ``addmm``: ATen's ``addmm(b, x, W.t())`` on the transposed view, as eager runs it;
* ``transposed``: the same on a copy of ``W.t()`` made contiguous once;
* ``mkl_packed``: ``mkl._mkl_linear`` on a weight packed once for MKL's sgemm at this batch size
  (float32, where torch was built with MKL);
* ``onednn``: oneDNN's ``mkldnn._linear_pointwise`` on the weight as it is (float32, where torch
  was built with oneDNN; also what ``patterns.fuse_linears`` picks between in every mode).

Each is timed on the example sizes (random activations, the real weight): interleaved rounds after
a warm-up, the best round of each. The choice is stored in Ember's on-disk cache
(``runtime.cache`` text entries, namespace ``"autotune"``), keyed by the shapes, strides and
dtypes, the candidates, the torch version and the CPU, so the next compile of the same layer
anywhere on this machine reuses it without timing. ``mode="reduce-overhead"`` (CUDA graphs on
the GPU) changes nothing on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from typing import Any, Callable, Sequence

import torch
import torch.fx

__all__ = ["choose", "tune_linears", "counters"]

log = logging.getLogger("ember.inductor.autotune")

aten = torch.ops.aten

#: ``timed``: choices decided by timing; ``cached``: choices read from the on-disk cache
counters: Counter[str] = Counter()

_REPEAT = 7


def _machine() -> str:
    try:
        from ember.precompile.runtime import cpu_flags

        flags = cpu_flags()
    except Exception:  # pragma: no cover - informational part of the key only
        flags = ""
    return f"{torch.__version__}|{torch.get_num_threads()}|{flags}"


def _time_all(candidates: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Seconds per call of each candidate: two warm-up calls each, then ``_REPEAT`` rounds that
    call every candidate once in turn, the best round of each. Interleaved rounds and the
    minimum: on a machine shared with other work, a burst of load then slows every candidate
    alike instead of the one that happened to run during it. A candidate that raises is
    left out."""
    live: dict[str, Callable[[], Any]] = {}
    for name, fn in candidates.items():
        try:
            fn()
            fn()
            live[name] = fn
        except Exception as e:  # a candidate that fails here is never chosen
            log.debug("autotune: candidate %s failed: %s", name, e)
    best = {name: float("inf") for name in live}
    for _ in range(_REPEAT):
        for name, fn in live.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def choose(kind: str, signature: Any, candidates: dict[str, Callable[[], Any]]) -> str:
    """The fastest of ``candidates`` (name -> a call to time) for ``signature`` (anything with a
    stable repr: shapes, strides, dtypes), from the on-disk cache when it has the answer."""
    from .runtime.cache import get_text, put_text

    key = hashlib.sha256(repr((kind, signature, sorted(candidates), _machine())).encode()
                         ).hexdigest()
    text = get_text("autotune", key)
    if text is not None:
        try:
            choice = json.loads(text)["choice"]
        except (ValueError, KeyError, TypeError):
            choice = None
        if choice in candidates:
            counters["cached"] += 1
            return choice
    times = _time_all(candidates)
    if not times:
        return next(iter(candidates))
    choice = min(times, key=times.__getitem__)
    counters["timed"] += 1
    put_text("autotune", key, json.dumps({"kind": kind, "signature": repr(signature),
                                          "choice": choice, "seconds": times}))
    log.debug("autotune %s %s: %s (%s)", kind, signature, choice,
              ", ".join(f"{k} {v * 1e6:.0f}us" for k, v in times.items()))
    return choice


def _random_like(meta: torch.Tensor) -> torch.Tensor:
    t = torch.empty_strided(tuple(meta.shape), tuple(meta.stride()), dtype=meta.dtype)
    return t.normal_() if meta.dtype.is_floating_point else t.zero_()


def _weight_of(wt: Any, values: dict[torch.fx.Node, torch.Tensor]) -> torch.fx.Node | None:
    """``W`` when ``wt`` is ``W.t()`` / ``W.permute(1, 0)`` of a 2-D frozen input."""
    if not isinstance(wt, torch.fx.Node) or wt.op != "call_function":
        return None
    if wt.target is aten.t.default or (wt.target is aten.permute.default
                                       and list(wt.args[1]) == [1, 0]):
        w = wt.args[0]
        if isinstance(w, torch.fx.Node) and w in values and values[w].dim() == 2:
            return w
    return None


def tune_linears(gm: torch.fx.GraphModule, const: set[torch.fx.Node],
                 frozen: set[torch.fx.Node], example_inputs: Sequence[Any]) -> int:
    """Rewrite each ``addmm(b, x, W.t())`` / ``mm(x, W.t())`` over a frozen weight into the
    fastest alternative; the new weight computations are parameter-only, so freezing folds them.
    Returns how many were rewritten."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = {n: example_inputs[i] for i, n in enumerate(placeholders)
              if n in frozen and isinstance(example_inputs[i], torch.Tensor)}
    g = gm.graph
    changed = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node.target not in (aten.addmm.default, aten.mm.default):
            continue
        if node.target is aten.addmm.default:
            if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
                continue
            b, x, wt = node.args[:3]
            if len(node.args) > 3:
                continue
            if not isinstance(b, torch.fx.Node) or b not in values or values[b].dim() != 1:
                continue
        else:
            b = None
            x, wt = node.args
        w = _weight_of(wt, values)
        if w is None or not isinstance(x, torch.fx.Node):
            continue
        xm, ym = x.meta.get("val"), node.meta.get("val")
        W = values[w]
        B = values[b] if b is not None else None
        if not isinstance(xm, torch.Tensor) or not isinstance(ym, torch.Tensor) \
                or xm.dim() != 2 or W.dtype != xm.dtype or isinstance(xm.shape[0], torch.SymInt):
            continue
        X = _random_like(xm)
        batch = int(xm.shape[0])
        Wt = W.t().contiguous()
        cands: dict[str, Callable[[], Any]] = {}
        if B is not None:
            cands["addmm"] = lambda: torch.addmm(B, X, W.t())
            cands["transposed"] = lambda: torch.addmm(B, X, Wt)
        else:
            cands["addmm"] = lambda: torch.mm(X, W.t())
            cands["transposed"] = lambda: torch.mm(X, Wt)
        packed = None
        if (W.dtype == torch.float32 and torch.backends.mkl.is_available()
                and X.is_contiguous()):
            try:
                packed = torch.ops.mkl._mkl_reorder_linear_weight(W, batch)
                cands["mkl_packed"] = lambda: torch.ops.mkl._mkl_linear(X, packed, W, B, batch)
            except Exception:  # pragma: no cover - MKL builds without packing
                packed = None
        from .patterns import linear_op

        # oneDNN reads a bias as contiguous whatever its strides
        onednn = (linear_op() if W.dtype == torch.float32
                  and (B is None or B.is_contiguous()) else None)
        if onednn is not None:
            cands["onednn"] = lambda: onednn(X, W, B, "none", [], "")
        sig = ("linear", tuple(xm.shape), tuple(xm.stride()), tuple(W.shape), tuple(W.stride()),
               str(W.dtype), B is not None)
        choice = choose("linear", sig, cands)
        if choice == "addmm":
            node.meta["ember_linear"] = "aten"  # chosen over oneDNN: patterns.py keeps it
            continue
        if choice == "onednn":
            with g.inserting_before(node):
                new = g.call_function(onednn, (x, w, b, "none", [], ""))
            new.meta["val"] = ym
            node.replace_all_uses_with(new)
            g.erase_node(node)
            changed += 1
            continue
        with g.inserting_before(node):
            if choice == "transposed":
                wc = g.call_function(aten.clone.default, (wt,),
                                     {"memory_format": torch.contiguous_format})
                wc.meta["val"] = _fake_like(ym, Wt)
                args = (b, x, wc) if b is not None else (x, wc)
                new = g.call_function(node.target, args)
            else:
                pk = g.call_function(torch.ops.mkl._mkl_reorder_linear_weight.default,
                                     (w, batch))
                pk.meta["val"] = _fake_like(ym, packed)
                new = g.call_function(torch.ops.mkl._mkl_linear.default, (x, pk, w, b, batch))
        new.meta["val"] = ym
        node.replace_all_uses_with(new)
        g.erase_node(node)
        changed += 1
    if changed:
        g.eliminate_dead_code()
        gm.recompile()
    return changed


def _fake_like(ref: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """A fake tensor with ``real``'s metadata, in ``ref``'s fake mode (when it has one)."""
    mode = getattr(ref, "fake_mode", None)
    if mode is None:
        return real
    return mode.from_tensor(real)
