"""The backends the runner compares, and how each one counts its graphs.

* ``eager``: the model itself (plain PyTorch), the baseline of every speedup;
* ``ember-X``: ``ember.compile(model, backend="X")`` (X = eager, aot-eager, inductor, ...; dashes
  become underscores, so ``ember-aot-eager`` is Ember's ``aot_eager``);
* ``torch-X``: ``torch.compile(model, backend="X")`` with torch's names (``eager``, ``aot_eager``,
  ``inductor``, ``cudagraphs``) — the peer, used only here, never in product code;
* ``...@MODE``: the same with ``mode=MODE`` (``ember-inductor@reduce-overhead``,
  ``torch-inductor@reduce-overhead``; ``ember-aot-eager@reduce-overhead`` records aot_eager's
  graphs into CUDA graphs);
* ``ember-inductor+ISA``: Ember's inductor with its C++ built for a lower instruction set
  (``options={"cpu_isa": ISA}``, e.g. ``ember-inductor+x86-64-v3`` for the AVX2 build on an
  AVX-512 machine), timed beside the native build in the same run.

A backend that is not installed or cannot compile is reported, never raised: ``availability``
returns a reason string, and the runner turns exceptions into "failed: ..." rows.
"""

from __future__ import annotations

import collections
import contextlib
import time
from typing import Any, Callable

import torch

__all__ = ["BACKEND_NAMES", "availability", "make_compiled", "CompileStats", "reset_all"]

#: Also the order of rows within a model when reports are merged: each Ember backend sits
#: right before the torch.compile backend it re-creates is compared with, inductor last.
#: ``ember-onnxrt`` (inference only, ONNX Runtime) has no torch.compile peer (torch removed its
#: ``onnxrt`` backend): run it with ``--mode infer``.
BACKEND_NAMES = ("eager", "ember-eager", "ember-aot-eager", "torch-eager", "torch-aot-eager",
                 "ember-onnxrt", "ember-cudagraphs", "torch-cudagraphs",
                 "ember-aot-eager@reduce-overhead", "ember-inductor", "ember-inductor+x86-64-v3",
                 "torch-inductor",
                 "ember-inductor@reduce-overhead", "torch-inductor@reduce-overhead")


def _family(name: str) -> tuple[str, str]:
    name, plus, _ = name.partition("@")[0].partition("+")
    if plus and not name.startswith("ember-"):
        raise SystemExit(f"{name!r}: a +ISA suffix is an Ember inductor option (cpu_isa)")
    if name == "eager":
        return "eager", ""
    fam, _, inner = name.partition("-")
    if fam not in ("ember", "torch") or not inner:
        raise SystemExit(f"unknown backend {name!r}: use eager, ember-<name> or torch-<name>")
    return fam, inner.replace("-", "_")


def availability(name: str) -> str | None:
    """``None`` when ``name`` can be tried here, else the reason (shown in the table)."""
    fam, inner = _family(name)
    if fam == "eager":
        return None
    if fam == "torch":
        try:
            import torch._dynamo as dynamo  # binds only `dynamo`: `torch` stays the global

            if inner not in dynamo.list_backends(exclude_tags=()):
                return f"not available: torch has no backend {inner!r}"
        except Exception as e:  # pragma: no cover - depends on the torch build
            return f"not available: {type(e).__name__}: {e}"
        return None
    try:
        import ember
    except ImportError as e:
        return f"not installed: {e}"
    try:
        be = ember.get_backend(inner)
    except Exception as e:  # BackendNotFound / BackendLoadError
        return f"not installed: {type(e).__name__}: {str(e).splitlines()[0]}"
    if be.devices == ("cuda",) and not torch.cuda.is_available():
        return f"not available: backend {inner!r} needs CUDA"
    # A declared-but-unimplemented backend says so as soon as it is asked to compile anything;
    # probe it on a one-node graph so its row reads "not available" instead of timing a fallback.
    try:
        gm = torch.fx.symbolic_trace(_Probe())
        be.compile(gm, [torch.ones(2)])
    except (ember.NotImplementedYet, getattr(ember, "DeviceUnavailable", ())) as e:
        return f"not available: {str(e).splitlines()[0]}"
    except Exception:
        pass  # any other complaint about the probe graph: let the real model decide
    return None


class _Probe(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def _mode(name: str) -> str | None:
    return name.partition("@")[2] or None


def _isa(name: str) -> str | None:
    """The ``+ISA`` suffix of an Ember backend name (``ember-inductor+x86-64-v3``), if any."""
    return name.partition("@")[0].partition("+")[2] or None


def make_compiled(name: str, fn: Any) -> Any:
    """Wrap ``fn`` (a module or function) for backend ``name``; compilation itself is lazy."""
    fam, inner = _family(name)
    mode = _mode(name)
    if fam == "eager":
        return fn
    if fam == "ember":
        import ember

        isa = _isa(name)
        options = {"cpu_isa": isa} if isa else None
        return ember.compile(fn, backend=inner, mode=mode, options=options)
    if mode is not None:
        return torch.compile(fn, backend=inner, mode=mode)
    return torch.compile(fn, backend=inner)


def reset_all() -> None:
    """Forget compiled code of both compilers (between models)."""
    with contextlib.suppress(Exception):
        import ember

        ember.reset()
    with contextlib.suppress(Exception):
        import torch._dynamo as dynamo

        dynamo.reset()


_events: list[Any] = []
_registered = False


def ember_events() -> list[Any]:
    """All Ember compile events seen since the first call; the first call registers a pluggy
    plugin implementing ``ember_compile_event`` on Ember's plugin manager."""
    global _registered
    if not _registered:
        _registered = True
        try:
            from ember.hookspecs import hookimpl
            from ember.plugins import plugin_manager

            class EventRecorder:
                @hookimpl
                def ember_compile_event(self, event: Any) -> None:
                    _events.append(event)

            plugin_manager().register(EventRecorder(), name="ember-benchmarks-recorder")
        except Exception:  # Ember missing or too old: no events, numbers read "n/a"
            pass
    return _events


class CompileStats:
    """Graphs, graph breaks, fallbacks and AOT seconds one backend produced between ``start()``
    and ``stop()`` (deltas of the global counters, so other backends' counts do not leak in)."""

    def __init__(self, name: str):
        self.fam, self.inner = _family(name)
        self.graphs: int | None = None
        self.breaks: int | None = None
        self.aot_s: float | None = None
        self.capture_s: float | None = None  # Ember: bytecode capture, summed over graphs
        self.backend_s: float | None = None  # Ember: backend compile (AOT included for aten)
        self.notes: list[str] = []
        self.fell_back = False

    def _snapshot(self) -> tuple[int, int, int]:
        if self.fam == "ember":
            from ember import events

            c = events.counters
            return (c["stats"]["graphs"], sum(c["graph_breaks"].values()),
                    c["stats"]["fallbacks"])
        if self.fam == "torch":
            from torch._dynamo.utils import counters

            return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()), 0
        return 0, 0, 0

    def _ort(self) -> tuple[int, int] | None:
        """ember-onnxrt: (ops run by ONNX Runtime, ops) over the graphs compiled so far."""
        if self.fam != "ember" or self.inner != "onnxrt":
            return None
        try:
            from ember_onnxrt.backend import counters
        except ImportError:
            return None
        return counters["ort_ops"], counters["total_ops"]

    def start(self) -> None:
        self._ort0 = self._ort()
        self._before = self._snapshot()
        self._ev0 = len(ember_events()) if self.fam == "ember" else 0

    def stop(self) -> None:
        after = self._snapshot()
        if self.fam == "eager":
            return
        self.graphs = after[0] - self._before[0]
        self.breaks = after[1] - self._before[1]
        if self.fam != "ember":
            return
        ort = self._ort()
        if ort is not None and self._ort0 is not None:
            done, total = ort[0] - self._ort0[0], ort[1] - self._ort0[1]
            self.notes.append(f"ops in ONNX Runtime: {done}/{total}")
        new = ember_events()[self._ev0:]
        aot = [e.data for e in new if e.kind == "timing" and e.data.get("stage") == "aot"]
        if aot:
            self.aot_s = sum(float(d.get("seconds", d.get("duration", 0.0)) or 0.0) for d in aot)
        cap = [e.data for e in new if e.kind == "timing" and e.data.get("stage") == "capture"]
        if cap:
            self.capture_s = sum(float(d.get("seconds") or 0.0) for d in cap)
        be = [e.data for e in new if e.kind == "backend_compiled"]
        if be:
            self.backend_s = sum(float(d.get("seconds") or 0.0) for d in be)
        fallbacks = [e.data for e in new if e.kind == "fallback"]
        if after[2] - self._before[2] or fallbacks:
            self.fell_back = True
            reasons = collections.Counter(str(d.get("reason", "?")).splitlines()[0][:120]
                                          for d in fallbacks)
            why = "; ".join(reasons) or "reason not reported"
            self.notes.append(f"fell back to eager ({after[2] - self._before[2]}x): {why}")


def timed_first_call(step: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = step()
    sync()
    return out, time.perf_counter() - t0
