"""The runner: every model x backend in one process, then cold/warm compile probes."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import json
import os
import shutil
import statistics
import time
from typing import Any, Callable

import torch

from . import zoo
from .accuracy import compare, default_tolerance
from .backends import CompileStats, availability, make_compiled, reset_all
from .measure import (Progress, compile_probe, new_cache_dir, peak_memory_mb, per_call_overhead,
                      sync_fn, time_interleaved)

__all__ = ["RunConfig", "Row", "run", "probe", "FALLBACK", "RUNNABLE"]

#: Status of an Ember row whose compile fell back to running eagerly (still timed and probed).
FALLBACK = "eager fallback"
RUNNABLE = ("ok", FALLBACK)


@dataclasses.dataclass
class RunConfig:
    device: str = "cpu"
    mode: str = "infer"
    backends: list[str] = dataclasses.field(default_factory=lambda: ["eager", "ember-eager"])
    models: list[str] | None = None
    iters: int | None = None
    warmup: int | None = None
    max_seconds: float | None = None  # timing budget per model
    amp: bool = False  # bf16 autocast (CUDA)
    size: str | None = None  # "small" (CPU default) or "full" (CUDA default)
    compile_probes: str = "cold,warm"  # "cold,warm", "cold" or "none"
    probe_backends: list[str] | None = None  # None: every compiled backend
    probe_timeout: float = 600.0
    deadline_s: float | None = None  # stop starting new work after this many seconds
    overhead: bool = True
    quiet: bool = False
    corpus: str = "zoo"  # default model selection: "zoo", "wide" (benchmarks/corpus.py), "all"
    tag: str = ""  # appended to the report's name (cpu-infer-<tag>)
    load_at_start: str = ""  # filled in by run(): other work on the machine skews timings

    def resolve(self) -> "RunConfig":
        cuda = self.device.startswith("cuda")
        if cuda and not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device visible to torch")
        self.size = self.size or ("full" if cuda else "small")
        self.iters = self.iters or (100 if cuda else 20)
        self.warmup = self.warmup if self.warmup is not None else (10 if cuda else 2)
        self.max_seconds = self.max_seconds or (30.0 if cuda else 10.0)
        self.models = self.models or zoo.default_models("cuda" if cuda else "cpu", self.corpus)
        if "eager" not in self.backends:  # the baseline of every speedup and accuracy check
            self.backends = ["eager"] + self.backends
        if self.amp and not cuda:
            raise SystemExit("--amp (bf16 autocast) is for --device cuda")
        return self


@dataclasses.dataclass
class Row:
    model: str
    backend: str
    status: str = "ok"
    accuracy: str = "n/a"
    median_ms: float | None = None
    speedup: float | None = None
    cold_compile_s: float | None = None
    warm_compile_s: float | None = None
    first_call_s: float | None = None
    graphs: int | None = None
    graph_breaks: int | None = None
    peak_mem_mb: float | None = None
    aot_s: float | None = None
    iters: int = 0
    batch_size: int | None = None
    note: str = ""

    def add_note(self, text: str) -> None:
        self.note = f"{self.note}; {text}" if self.note else text


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def _to(obj: Any, dtype: torch.dtype) -> Any:
    if isinstance(obj, torch.Tensor) and obj.is_floating_point():
        return obj.to(dtype)
    if isinstance(obj, tuple):
        return tuple(_to(o, dtype) for o in obj)
    return obj


def _detach(xs: list[Any]) -> list[Any]:
    # Results stay on their device: comparing large outputs there is much faster than on the host.
    return [x.detach() if isinstance(x, torch.Tensor) else x for x in xs]


def make_step(mode: str, fn: Callable[..., Any], inputs: tuple[Any, ...], device: str,
              amp: bool) -> Callable[[], Any]:
    """The inference step (no_grad forward) or the training step (forward, scalar loss,
    backward; no optimizer), optionally under bf16 autocast."""
    def ctx() -> Any:
        if amp:
            return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)
        return contextlib.nullcontext()

    if mode == "infer":
        def step() -> Any:
            with torch.no_grad(), ctx():
                return fn(*inputs)
    else:
        def step() -> Any:
            with ctx():
                loss = zoo.reduce_to_loss(fn(*inputs))
            loss.backward()
            return loss
    return step


def _clear_grads(module: torch.nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def _status_of(e: BaseException) -> str:
    with contextlib.suppress(ImportError):
        import ember

        if isinstance(e, ember.NotImplementedYet):
            return f"not available: {_short(e)}"
    return f"failed: {_short(e)}"


def _run_model(name: str, cfg: RunConfig, avail: dict[str, str | None],
               progress: Progress) -> list[Row]:
    spec = zoo.get_spec(name)
    dev_kind = "cuda" if cfg.device.startswith("cuda") else "cpu"
    rows = {b: Row(name, b, batch_size=spec.batch.get(cfg.size)) for b in cfg.backends}
    skip = None
    if dev_kind not in spec.devices:
        skip = f"skipped: runs on {'/'.join(spec.devices)} only"
    elif spec.missing():
        skip = f"skipped: {', '.join(spec.missing())} not installed"
    if skip:
        for r in rows.values():
            r.status = skip
        progress(f"{name}: {skip}")
        return list(rows.values())

    reset_all()
    sync = sync_fn(cfg.device)
    progress(f"{name}: building ({spec.description})")
    base, inputs = spec.build(cfg.device, cfg.size)
    base.train(cfg.mode == "train")
    tol = default_tolerance(cfg.mode, cfg.amp)

    # fp64 reference: a float64 copy run eagerly, without autocast.
    ref64: list[Any] | None = None
    try:
        m64 = copy.deepcopy(base).double()
        ref64 = _detach(zoo.step_result(
            cfg.mode, m64, make_step(cfg.mode, m64, _to(inputs, torch.float64), cfg.device,
                                     False)()))
        del m64
    except Exception as e:
        progress(f"{name}: fp64 reference failed ({_short(e)}); accuracy vs eager fp32 only")

    modules: dict[str, torch.nn.Module] = {}
    steps: dict[str, Callable[[], Any]] = {}
    fp32: list[Any] | None = None
    out: Any = None
    for b in cfg.backends:  # eager first: resolve() puts it there
        row = rows[b]
        if avail[b] is not None:
            row.status = avail[b]  # type: ignore[assignment]
            continue
        module = copy.deepcopy(base)
        stats = CompileStats(b)
        try:
            fn = make_compiled(b, module)
            step = make_step(cfg.mode, fn, inputs, cfg.device, cfg.amp)
            stats.start()
            sync()
            t0 = time.perf_counter()
            out = step()
            sync()
            row.first_call_s = time.perf_counter() - t0
            stats.stop()
        except Exception as e:
            row.status = _status_of(e)
            progress(f"{name} · {b}: {row.status}")
            continue
        row.graphs, row.graph_breaks, row.aot_s = stats.graphs, stats.breaks, stats.aot_s
        for n in stats.notes:
            row.add_note(n)
        if stats.fell_back:
            row.status = FALLBACK
        res = _detach(zoo.step_result(cfg.mode, module, out))
        if b == "eager":
            fp32 = res
        if fp32 is not None:
            acc = compare(res, fp32, ref64 if ref64 is not None else fp32, tol)
            row.accuracy = acc.how
        progress(f"{name} · {b}: {row.status}, first call {row.first_call_s:.3g} s, "
                 f"accuracy {row.accuracy}"
                 + (f", graphs {row.graphs}, breaks {row.graph_breaks}"
                    if row.graphs is not None else "")
                 + (f" [{row.note}]" if row.note else ""))
        modules[b], steps[b] = module, step
    del out

    def before(b: str) -> None:
        if cfg.mode == "train":
            _clear_grads(modules[b])

    for b, step in list(steps.items()):  # warm-up, then one call measuring peak memory
        try:
            for _ in range(cfg.warmup or 0):
                before(b)
                step()
            before(b)
            rows[b].peak_mem_mb = peak_memory_mb(step, cfg.device)
        except Exception as e:
            rows[b].status = f"failed: {_short(e)}"
            steps.pop(b)
    progress(f"{name}: timing {len(steps)} backends, up to {cfg.iters} interleaved iterations "
             f"(budget {cfg.max_seconds:.0f} s)")
    gc.collect()
    times = time_interleaved(steps, cfg.device, cfg.iters or 1, cfg.max_seconds or 1.0, before)
    eager_ms = None
    if times.get("eager"):
        eager_ms = statistics.median(times["eager"]) * 1e3
    for b, ts in times.items():
        rows[b].median_ms = statistics.median(ts) * 1e3
        rows[b].iters = len(ts)
        if eager_ms:
            rows[b].speedup = eager_ms / rows[b].median_ms
    progress(f"{name}: " + ", ".join(
        f"{b} {rows[b].median_ms:.2f} ms"
        + (f" (peak {rows[b].peak_mem_mb:.0f} MiB)" if rows[b].peak_mem_mb is not None else "")
        for b in times))
    del modules, steps, base, inputs
    reset_all()
    gc.collect()
    if cfg.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return list(rows.values())


#: torch.compile backends with no on-disk cache: a warm start is a cold start, so the warm probe
#: is not run for them (it would only repeat the cold figure).
NO_DISK_CACHE = ("torch-eager", "torch-aot-eager")


def _run_probes(rows: list[Row], cfg: RunConfig, progress: Progress, t_start: float) -> None:
    kinds = [k for k in cfg.compile_probes.split(",") if k in ("cold", "warm")]
    for r in rows:
        if r.backend == "eager" or r.status not in RUNNABLE:
            continue
        if not kinds or (cfg.probe_backends is not None and r.backend not in cfg.probe_backends):
            r.add_note("compile probes not run")
            continue
        if cfg.deadline_s is not None and time.perf_counter() - t_start > cfg.deadline_s:
            r.add_note("compile probes not run (--deadline reached)")
            continue
        cache = new_cache_dir()
        try:
            for kind in kinds:
                if kind == "warm" and r.backend in NO_DISK_CACHE:
                    continue  # said once under the table
                ans = compile_probe(r.model, r.backend, cfg.device, cfg.mode, cfg.size or "small",
                                    cfg.amp, cache, cfg.probe_timeout)
                if "error" in ans:
                    r.add_note(f"{kind} compile probe: {ans['error']}")
                    progress(f"{r.model} · {r.backend}: {kind} compile probe: {ans['error']}")
                    break
                setattr(r, f"{kind}_compile_s", ans["compile_s"])
                if kind == "warm" and r.backend.startswith("ember-") and breakdown(ans):
                    r.add_note(f"warm compile: {breakdown(ans)}")
                if kind == "warm" and ans.get("cache_builds"):
                    r.add_note(f"warm probe built {ans['cache_builds']} kernel librar(ies): "
                               "a cache miss on a warm start")
                if ans.get("note") and ans["note"] not in r.note:
                    r.add_note(f"{kind} probe: {ans['note']}")
                progress(f"{r.model} · {r.backend}: {kind} compile {ans['compile_s']:.2f} s")
        finally:
            shutil.rmtree(cache, ignore_errors=True)


def run(cfg: RunConfig) -> tuple[list[Row], dict[str, dict[str, Any]]]:
    """Run the whole benchmark; returns the table rows and the per-call overhead table."""
    cfg.resolve()
    with contextlib.suppress(OSError):
        cfg.load_at_start = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    progress = Progress(cfg.quiet)
    progress(f"device {cfg.device} ({cfg.size} sizes), mode {cfg.mode}, models "
             f"{', '.join(cfg.models or [])}, backends {', '.join(cfg.backends)}")
    avail = {b: availability(b) for b in cfg.backends}
    for b, why in avail.items():
        if why:
            progress(f"{b}: {why}")
    if any(b.startswith("ember") for b in cfg.backends):
        # Ember's guard extension is built once per machine and torch (scripts/setup.sh does
        # it): built now if missing, not in the background while the timings run
        from ember.capture import tensor_check

        if tensor_check.extension(wait=300) is None:
            progress(f"ember guards: Python tensor check ({tensor_check.state()})")
    t_start = time.perf_counter()
    rows: list[Row] = []
    for name in cfg.models or []:
        if cfg.deadline_s is not None and time.perf_counter() - t_start > cfg.deadline_s:
            progress(f"{name}: skipped (--deadline {cfg.deadline_s:.0f} s reached)")
            rows += [Row(name, b, status="skipped: --deadline reached") for b in cfg.backends]
            continue
        try:
            rows += _run_model(name, cfg, avail, progress)
        except Exception as e:  # a model that cannot even be built: every row says why
            progress(f"{name}: failed: {_short(e)}")
            rows += [Row(name, b, status=f"failed: {_short(e)}") for b in cfg.backends]
    overhead: dict[str, dict[str, Any]] = {}
    if cfg.overhead:
        progress("per-call overhead (x + 1 on 4 elements)")
        usable = [b for b in cfg.backends if avail[b] is None]
        overhead = per_call_overhead(usable, cfg.device)
        for b in cfg.backends:
            overhead.setdefault(b, {"us_per_call": None, "overhead_us": None,
                                    "note": avail[b] or ""})
    _run_probes(rows, cfg, progress, t_start)
    progress("done")
    return rows, overhead


def probe(model: str, backend: str, device: str, mode: str, size: str, amp: bool) -> dict[str, Any]:
    """Body of ``python -m benchmarks probe``: in this fresh process, time an eager step (after
    two warm-ups) and then the first compiled step; compile seconds = first compiled step minus
    the eager step (imports and model building are not counted)."""
    spec = zoo.get_spec(model)
    base, inputs = spec.build(device, size)
    base.train(mode == "train")
    sync = sync_fn(device)
    module = copy.deepcopy(base)
    eager_step = make_step(mode, base, inputs, device, amp)
    for _ in range(2):
        _clear_grads(base)
        eager_step()
    sync()
    _clear_grads(base)
    t0 = time.perf_counter()
    eager_step()
    sync()
    eager_s = time.perf_counter() - t0
    stats = CompileStats(backend)
    stats.start()
    t0 = time.perf_counter()
    step = make_step(mode, make_compiled(backend, module), inputs, device, amp)
    step()
    sync()
    first = time.perf_counter() - t0
    stats.stop()
    ans = {"compile_s": max(first - eager_s, 0.0), "first_call_s": first, "eager_s": eager_s,
           "graphs": stats.graphs, "graph_breaks": stats.breaks,
           "note": "; ".join(stats.notes), "capture_s": stats.capture_s,
           "aot_s": stats.aot_s, "backend_s": stats.backend_s}
    ans.update(_ember_cache_counters())
    return ans


def breakdown(ans: dict[str, Any]) -> str:
    """Where an Ember probe's compile seconds went (from Ember's timing events): capture (in a
    fresh process this includes creating the first FakeTensorMode, which imports torch._dynamo:
    seconds), AOT autograd, the backend after AOT, and the rest (the first run, guards)."""
    if ans.get("capture_s") is None or ans.get("backend_s") is None:
        return ""
    cap, be, aot = ans["capture_s"], ans["backend_s"], ans.get("aot_s") or 0.0
    rest = ans["compile_s"] - cap - be
    return (f"capture {cap:.2f} s, AOT {aot:.2f} s, backend {be - aot:.2f} s, "
            f"rest {max(rest, 0.0):.2f} s")


def _ember_cache_counters() -> dict[str, int]:
    """Kernel builds and on-disk hits of Ember's inductor cache in this process (a warm probe
    should build nothing); empty when the plugin was not used."""
    import sys

    mod = sys.modules.get("ember_inductor.runtime.cache")
    if mod is None:
        return {}
    return {"cache_builds": mod.counters["builds"], "cache_disk_hits": mod.counters["disk_hits"]}


def probe_json(**kw: Any) -> str:
    try:
        return json.dumps(probe(**kw))
    except Exception as e:
        return json.dumps({"error": _short(e)})
