"""The model bundled with Ember, and the demo that compiles it (``python -m ember demo``).

The demo compiles :class:`DemoModel` (a small pre-norm transformer: attention written out by
hand, a GELU MLP, LayerNorms, residuals) with each requested backend, then prints how close the
results are to eager PyTorch and the median time per call of both, measured alternately in the
same process.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Sequence

import torch
from torch import nn

from .hookspecs import hookimpl

__all__ = ["DemoModel", "make_model", "example_input", "run_demo", "DEFAULT_BACKENDS",
           "FALLBACK_BACKENDS"]

#: Backends the demo runs when none are named: the default backend of ``ember.compile``.
DEFAULT_BACKENDS = ("inductor",)
#: Run instead when no default backend is installed or implemented in this build.
FALLBACK_BACKENDS = ("eager", "aot_eager")


class Block(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class DemoModel(nn.Module):
    """A two-block pre-norm transformer over ``(batch, seq, d)`` inputs."""

    def __init__(self, d: int = 128, heads: int = 4, hidden: int = 512, layers: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d, heads, hidden) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x)


def make_model(seed: int = 0) -> DemoModel:
    torch.manual_seed(seed)
    return DemoModel().eval()


def example_input(batch: int = 8, seq: int = 64, d: int = 128, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, d, generator=g)


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


class _Observer:
    """An in-process ember_compile_event observer: the demo reports fallbacks with reasons."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    @hookimpl
    def ember_compile_event(self, event: Any) -> None:
        self.events.append(event)


def run_demo(backends: Sequence[str] | None = None, iters: int = 50, warmup: int = 5,
             tolerance: float = 1e-4) -> int:
    """Compile the bundled model with each backend, print correctness and speed; returns an
    exit status: 0 when every backend compiled at least one graph and matched eager."""
    import ember
    from . import events
    from .plugins import plugin_manager

    installed = ember.list_backends(exclude_tags=())
    fallback: list[str] = []
    if backends is None:
        backends = [b for b in DEFAULT_BACKENDS if b in installed]
        fallback = [b for b in FALLBACK_BACKENDS if b in installed]
        if not backends:
            backends, fallback = fallback, []
        if not backends:
            print(f"none of {DEFAULT_BACKENDS + FALLBACK_BACKENDS} is installed (installed: "
                  f"{installed}); pip install ./plugins/inductor")
            return 1
    backends = list(backends)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, x = make_model(), example_input()
    with torch.no_grad():
        ref = model(x)
    print(f"Ember {ember.__version__} demo: DemoModel (2 transformer blocks, d=128) on input "
          f"{tuple(x.shape)}, inference, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'backend':<12} {'graphs':>6} {'max abs diff':>13} {'eager ms':>9} {'ember ms':>9} "
          f"{'speedup':>8} {'1st call s':>10}")
    observer = _Observer()
    plugin_manager().register(observer, name="ember-demo-observer")
    status = 0
    notes: list[str] = []
    ran: list[str] = []
    try:
        while backends:
            name = backends.pop(0)
            ember.reset()
            observer.events.clear()
            compiled = ember.compile(model, backend=name)
            try:
                with torch.no_grad():
                    t0 = time.perf_counter()
                    out = compiled(x)
                    first = time.perf_counter() - t0
                    for _ in range(warmup):
                        compiled(x)
                        model(x)
                    te, tc = [], []
                    for _ in range(iters):  # alternate, so drift hits both sides alike
                        t0 = time.perf_counter()
                        model(x)
                        te.append(time.perf_counter() - t0)
                        t0 = time.perf_counter()
                        compiled(x)
                        tc.append(time.perf_counter() - t0)
            except ember.NotImplementedYet as e:
                if fallback:  # the default backend is declared but not built yet: say so
                    print(f"{name:<12} not implemented yet in this build; running "
                          f"{', '.join(fallback)} instead")
                    notes.append(f"{name}: {str(e).splitlines()[0]}")
                    backends, fallback = fallback, []
                    continue
                print(f"{name:<12} error: {type(e).__name__}: {e}")
                status = 1
                continue
            except ember.EmberError as e:
                print(f"{name:<12} error: {type(e).__name__}: {e}")
                status = 1
                continue
            ran.append(name)
            graphs = events.counters["events"]["backend_compiled"]
            diff = (out - ref).abs().max().item()
            e_ms, c_ms = _median_ms(te), _median_ms(tc)
            print(f"{name:<12} {graphs:>6} {diff:>13.3g} {e_ms:>9.3f} {c_ms:>9.3f} "
                  f"{e_ms / c_ms:>7.2f}x {first:>10.2f}")
            if not diff <= tolerance:
                status = 1
                notes.append(f"{name}: results differ from eager by {diff:.3g} (> {tolerance})")
            if graphs == 0:
                status = 1
                reasons = sorted({str(ev.data.get("reason")) for ev in observer.events
                                  if ev.kind == "fallback"})
                notes.append(f"{name}: Ember compiled no graph and ran the model eagerly"
                             + (f" ({'; '.join(reasons)})" if reasons else ""))
    finally:
        plugin_manager().unregister(name="ember-demo-observer")
        ember.reset()
    for n in notes:
        print("NOTE:", n)
    if "inductor" in ran:
        try:  # the plugin's cache; the core does not depend on the plugin being installed
            from ember_inductor.runtime.cache import cache_dir

            print(f"inductor's compiled kernels are cached under {cache_dir()} (`python -m "
                  "ember cache info`); the next run of the demo starts warm")
        except ImportError:
            pass
    if status == 0:
        print("OK: every backend matched eager within", tolerance)
    return status
