"""Choices decided by timing the candidates on this machine, once, and remembered on disk.

Where the fastest way to run something depends on the CPU (its vendor, ISA, cache sizes, the
BLAS libraries torch was built with, the thread count), Ember does not follow a rule tuned on one
machine: the first compile times the candidates on the real sizes and stores the winner in the
on-disk cache (``runtime.cache`` text entries, namespace ``"autotune"``), keyed by what was
decided (kind and signature: shapes, strides, dtypes), the candidates' names and the machine
(:func:`machine`: CPU model name, a hash of its ISA flags, torch's thread count, torch's version).
Every later compile of the same decision on this machine -- a warm start in a new process too --
reads it and times nothing (``counters["cached"]``; ``counters["timed"]`` counts timings).

Decisions made this way:

* the library of each float32 linear layer (``patterns.fuse_linears``: ATen's ``addmm``/``mm``,
  i.e. MKL's sgemm, against oneDNN's ``mkldnn._linear_pointwise``), on every graph;
* for a frozen linear layer of an inference graph (:func:`tune_linears`, run by
  :mod:`ember_inductor.freezing`): ``addmm`` on the transposed weight as eager runs it, a
  pre-transposed contiguous weight (``transposed``), MKL's pre-packed weight (``mkl_packed``,
  ``mkl._mkl_linear``) and oneDNN (``onednn``);
* channels-last or not for the convolutions of an inference graph (``layout.py``);
* the OpenMP parallel threshold of generated loops (``calibrate.py``, once per machine).

Timing (:func:`_time_all`): one warm-up call of each candidate, then rounds that call every
candidate once in turn (interleaved, so a burst of load from other work slows all of them
alike); the fastest round of each is compared (:func:`_time_all` says why not the median).
The number of rounds adapts to the candidates' cost (3 to 7, about :data:`DECISION_SECONDS`
per decision), and a compile spends at most :data:`COMPILE_SECONDS` timing in all (:func:`session`): past it, the remaining decisions take
their default (what eager runs) without timing and without caching, so a cold compile stays
bounded. Options force a choice instead (``onednn_linear``, ``layout_opt``,
``parallel_min_work``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx

__all__ = ["choose", "tune_linears", "counters", "machine", "machine_key", "session",
           "lookup", "random_like"]

log = logging.getLogger("ember.inductor.autotune")

aten = torch.ops.aten

#: ``timed``: choices decided by timing; ``cached``: choices read from the on-disk cache;
#: ``over_budget``: decisions left to their default because the compile's timing budget was spent
counters: Counter[str] = Counter()

#: rounds of interleaved calls per decision (fewer when the candidates are slow)
_REPEAT = 7
_MIN_REPEAT = 3
#: seconds of timing one decision aims at (the round count adapts to the candidates' cost)
DECISION_SECONDS = 0.15
#: seconds of timing one compile may spend in all (see :func:`session`)
COMPILE_SECONDS = 1.5
#: On the CPU, how much faster than the default (the caller's choice without timing: what eager
#: runs, for the libraries) another candidate must be to replace it. A few rounds on a shared
#: machine resolve differences of several percent at best, and a kernel timed alone (operands
#: hot, a fresh output) is not the kernel inside the graph (operands from the previous kernel,
#: outputs into reused buffers): on the demo model (AMD EPYC, 2 cores) oneDNN won two linear
#: layers by 2.5-3% alone and lost the model 5% inside it (on an Intel Xeon, forcing ATen's
#: addmm closed the same gap). A change of library has to win clearly to be taken.
CPU_MARGIN = 0.10
#: what decides a choice besides its timings (part of every cache key: a new rule decides again)
_RULE = ("margin", CPU_MARGIN)


@functools.lru_cache(maxsize=None)
def _cpu() -> tuple[str, str]:
    """(CPU model name, sha256 of its sorted ISA flags) from /proc/cpuinfo."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "cpu model")):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        from ember.precompile.runtime import cpu_flags

        flags = cpu_flags()
    except Exception:  # pragma: no cover - the model name still separates machines
        flags = ""
    import platform

    return model or platform.processor() or platform.machine(), \
        hashlib.sha256(flags.encode()).hexdigest()[:16]


def machine() -> dict[str, Any]:
    """What a timed choice depends on besides its own signature: the CPU's model name, a hash
    of its ISA flags, torch's intra-op thread count (read now: it may change) and torch's
    version (its kernels)."""
    model, isa = _cpu()
    return {"cpu": model, "isa": isa, "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def machine_key() -> str:
    return repr(sorted(machine().items()))


# -- the budget of one compile ---------------------------------------------------------------

_local = threading.local()


@contextlib.contextmanager
def session(seconds: float | None = None) -> Iterator[None]:
    """Bound the timing done inside (one graph's compile) to ``seconds`` (default
    :data:`COMPILE_SECONDS`); nested sessions share the outermost one's budget."""
    if getattr(_local, "left", None) is not None:
        yield
        return
    _local.left = COMPILE_SECONDS if seconds is None else seconds
    try:
        yield
    finally:
        _local.left = None


def _budget_left() -> float | None:
    return getattr(_local, "left", None)


def _spend(seconds: float) -> None:
    if getattr(_local, "left", None) is not None:
        _local.left -= seconds


def _time_all(candidates: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Seconds per call of each candidate: one warm-up call each (which also sizes the number
    of rounds), then rounds that call every candidate once in turn; the fastest round of each.
    A candidate that raises is left out.

    The minimum, not the median: other work on the machine only ever adds time, in bursts, and
    with the few rounds a compile can afford, a median measures the bursts. On this project's
    2-core machine under a load of 10, the median of 3 rounds put the same ``[1024, 256] x
    [256, 768]`` product at 36 ms through ``addmm`` and 2 ms through oneDNN, where the two
    differ by less than 2x when the machine is quiet."""
    live: dict[str, Callable[[], Any]] = {}
    first = 0.0
    for name, fn in candidates.items():
        try:
            t = time.perf_counter()
            fn()
            first += time.perf_counter() - t
            live[name] = fn
        except Exception as e:  # a candidate that fails here is never chosen
            log.debug("autotune: candidate %s failed: %s", name, e)
    rounds = _REPEAT if first <= 0 else int(DECISION_SECONDS / first)
    rounds = max(_MIN_REPEAT, min(_REPEAT, rounds))
    times: dict[str, list[float]] = {name: [] for name in live}
    for _ in range(rounds):
        for name, fn in live.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: min(ts) for name, ts in times.items()}


def _time_all_cuda(candidates: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """:func:`_time_all` for GPU work: each call timed with CUDA events on the current stream
    (the device, not the host's launch), one warm-up call each, then interleaved rounds; the
    fastest round of each."""
    live: dict[str, Callable[[], Any]] = {}
    for name, fn in candidates.items():
        try:
            fn()
            live[name] = fn
        except Exception as e:  # a candidate that fails here is never chosen
            log.debug("autotune: candidate %s failed: %s", name, e)
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in live}
    for _ in range(_REPEAT):
        for name, fn in live.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b) / 1e3)
    return {name: min(ts) for name, ts in times.items()}


def _key(kind: str, signature: Any, names: Sequence[str], machine_id: str | None = None) -> str:
    return hashlib.sha256(repr((kind, signature, sorted(names), machine_id or machine_key(),
                                _RULE)).encode()).hexdigest()


def lookup(kind: str, signature: Any, names: Sequence[str],
           machine_id: str | None = None) -> str | None:
    """The cached choice among ``names`` for ``signature`` on this machine (``machine_id``: the
    key of what decides it, default :func:`machine_key`), or None."""
    from .runtime.cache import get_text

    text = get_text("autotune", _key(kind, signature, names, machine_id))
    if text is None:
        return None
    try:
        choice = json.loads(text)["choice"]
    except (ValueError, KeyError, TypeError):
        return None
    return choice if choice in names else None


def choose(kind: str, signature: Any, candidates: dict[str, Callable[[], Any]],
           default: str | None = None, device: str = "cpu", machine_id: str | None = None
           ) -> str:
    """The fastest of ``candidates`` (name -> a call to time) for ``signature`` (anything with a
    stable repr: shapes, strides, dtypes), from the on-disk cache when it has the answer.
    ``default`` (else the first candidate) is returned untimed when this compile's timing
    budget is spent; on the CPU it is kept unless another candidate is faster by
    :data:`CPU_MARGIN`. ``device="cuda"``: timed with CUDA events; ``machine_id``: the key of what
    decides the choice there (the GPU's: runtime/triton.py ``machine_key``), default the
    CPU's (:func:`machine_key`)."""
    from .runtime.cache import put_text

    names = list(candidates)
    cached = lookup(kind, signature, names, machine_id)
    if cached is not None:
        counters["cached"] += 1
        return cached
    fallback = default if default in candidates else names[0]
    left = _budget_left()
    if left is not None and left <= 0:
        counters["over_budget"] += 1
        log.debug("autotune %s %s: timing budget spent, %s untimed", kind, signature, fallback)
        return fallback
    t0 = time.perf_counter()
    times = _time_all_cuda(candidates) if device == "cuda" else _time_all(candidates)
    _spend(time.perf_counter() - t0)
    if not times:
        return fallback
    choice = min(times, key=times.__getitem__)
    if device != "cuda" and default in times and choice != default and \
            times[choice] > times[default] * (1 - CPU_MARGIN):
        choice = default  # within the noise of a CPU timing: keep the default
    counters["timed"] += 1
    put_text("autotune", _key(kind, signature, names, machine_id),
             json.dumps({"kind": kind, "signature": repr(signature), "choice": choice,
                         "seconds": times, "machine": machine_id or machine()}))
    log.debug("autotune %s %s: %s (%s)", kind, signature, choice,
              ", ".join(f"{k} {v * 1e6:.0f}us" for k, v in times.items()))
    return choice


def random_like(meta: torch.Tensor) -> torch.Tensor:
    """A real tensor of ``meta``'s geometry (sizes, strides, dtype, device): random normal
    values, zeros for integers."""
    t = torch.empty_strided(tuple(meta.shape), tuple(meta.stride()), dtype=meta.dtype,
                            device=meta.device)
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


def _time_linear(sig: Any, names: list[str], xm: torch.Tensor, W: torch.Tensor,
                 B: torch.Tensor | None, batch: int, onednn: Any, check: str) -> str:
    """Time the variants of one frozen linear layer. A variant that derives a constant from
    the weight (``transposed``, ``mkl_packed``) makes the weight a watched input of the frozen
    graph: with ``check="content"`` (freezing's default) every call then compares its bytes
    with a snapshot (freezing.FrozenCall), and that comparison is timed as part of the variant
    (a batch-1 MLP whose 64 MiB of weights were pre-transposed ran 1.6x slower than eager for
    it)."""
    from .runtime.compare import same_contents

    X = random_like(xm)
    Wt = W.t().contiguous()
    snap = W.clone() if check == "content" else None

    def watched(fn: Callable[[], Any]) -> Callable[[], Any]:
        if snap is None:
            return fn

        def call() -> Any:
            same_contents(W, snap)
            return fn()
        return call

    cands: dict[str, Callable[[], Any]] = {}
    if B is not None:
        cands["addmm"] = lambda: torch.addmm(B, X, W.t())
        cands["transposed"] = watched(lambda: torch.addmm(B, X, Wt))
    else:
        cands["addmm"] = lambda: torch.mm(X, W.t())
        cands["transposed"] = watched(lambda: torch.mm(X, Wt))
    if "mkl_packed" in names:
        try:
            packed = torch.ops.mkl._mkl_reorder_linear_weight(W, batch)
            cands["mkl_packed"] = watched(
                lambda: torch.ops.mkl._mkl_linear(X, packed, W, B, batch))
        except Exception:  # pragma: no cover - MKL builds without packing
            pass
    if "onednn" in names:
        cands["onednn"] = lambda: onednn(X, W, B, "none", [], "")
    if list(cands) != names:  # a candidate could not even be built: time what can run
        return choose("linear", sig + ("partial",), cands, default="addmm")
    return choose("linear", sig, cands, default="addmm")


def tune_linears(gm: torch.fx.GraphModule, const: set[torch.fx.Node],
                 frozen: set[torch.fx.Node], example_inputs: Sequence[Any],
                 forced: str | None = None, check: str = "content") -> int:
    """Rewrite each ``addmm(b, x, W.t())`` / ``mm(x, W.t())`` over a frozen weight into the
    fastest alternative (or into ``forced``, one of the candidates' names, where it is one);
    the new weight computations are parameter-only, so freezing folds them. Returns how many
    were rewritten."""
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
        batch = int(xm.shape[0])
        sig = ("linear", tuple(xm.shape), tuple(xm.stride()), tuple(W.shape), tuple(W.stride()),
               str(W.dtype), B is not None, check)
        names = ["addmm", "transposed"]
        mkl_ok = (W.dtype == torch.float32 and torch.backends.mkl.is_available()
                  and xm.is_contiguous())
        if mkl_ok:
            names.append("mkl_packed")
        from .patterns import linear_op

        # oneDNN reads a bias as contiguous whatever its strides
        onednn = (linear_op() if W.dtype == torch.float32
                  and (B is None or B.is_contiguous()) else None)
        if onednn is not None:
            names.append("onednn")
        if forced in names:
            choice = forced
        else:
            # a warm start reads the choice without building (packing) any candidate
            choice = lookup("linear", sig, names)
            if choice is not None:
                counters["cached"] += 1
            else:
                choice = _time_linear(sig, names, xm, W, B, batch, onednn, check)
        packed = None
        if choice == "mkl_packed":
            packed = torch.ops.mkl._mkl_reorder_linear_weight(W, batch)
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
                wc.meta["val"] = _fake_like(ym, W.t().contiguous())
                args = (b, x, wc) if b is not None else (x, wc)
                new = g.call_function(node.target, args)
                new.meta["ember_linear"] = "aten"  # decided: patterns.py keeps it
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
