"""Reports: a markdown table, a CSV and a PNG plot per (device, mode), plus the index page."""

from __future__ import annotations

import csv
import dataclasses
import datetime
import math
import os
import platform
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import torch

from .runner import Row, RunConfig

__all__ = ["CSV_COLUMNS", "OVERHEAD_COLUMNS", "machine_info", "write_reports", "geomean"]

CSV_COLUMNS = [f.name for f in dataclasses.fields(Row)]
OVERHEAD_COLUMNS = ["backend", "us_per_call", "overhead_us", "note"]
_MD_COLUMNS = [("model", "model"), ("backend", "backend"), ("status", "status"),
               ("accuracy", "accuracy"), ("median_ms", "median ms"), ("speedup", "speedup"),
               ("cold_compile_s", "cold compile s"), ("warm_compile_s", "warm compile s"),
               ("first_call_s", "first call s"), ("graphs", "graphs"),
               ("graph_breaks", "breaks"), ("peak_mem_mb", "peak MiB"), ("aot_s", "AOT s")]


def machine_info(device: str) -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "cpu": f"{cpu}, {os.cpu_count()} cores (torch threads {torch.get_num_threads()})",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }
    try:
        import ember

        info["ember"] = getattr(ember, "__version__", "?")
    except ImportError:
        info["ember"] = "not installed"
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _fmt(key: str, v: Any) -> str:
    if v is None:
        return "—"
    if key == "status":
        return str(v).split(":", 1)[0]  # the reason is listed under Notes
    if isinstance(v, float):
        if key == "speedup":
            return f"{v:.2f}×"
        if key in ("median_ms", "first_call_s", "cold_compile_s", "warm_compile_s", "aot_s"):
            return f"{v:.3g}" if v < 100 else f"{v:.0f}"
        return f"{v:.1f}"
    return str(v).replace("|", "\\|")


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _markdown(rows: list[Row], overhead: dict[str, dict[str, Any]], cfg: RunConfig,
              info: dict[str, str], command: str, stem: str) -> str:
    lines = [f"# Benchmark results: {cfg.device}, {cfg.mode}"
             + (" (bf16 autocast)" if cfg.amp else ""), "",
             f"* command: `{command}`",
             *[f"* {k}: {v}" for k, v in info.items()],
             f"* sizes: {cfg.size}; timing: median of up to {cfg.iters} interleaved iterations "
             f"after {cfg.warmup} warm-up calls (budget {cfg.max_seconds:.0f} s per model)",
             "", f"![speedups and compile times]({stem}.png)", "",
             "| " + " | ".join(h for _, h in _MD_COLUMNS) + " |",
             "|" + "---|" * len(_MD_COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(k, getattr(r, k)) for k, _ in _MD_COLUMNS) + " |")
    lines += ["", "Geometric-mean speedup over eager (models where the backend ran and passed):", ""]
    for b in cfg.backends:
        g = geomean([r.speedup for r in rows
                     if r.backend == b and r.speedup and r.accuracy.startswith("pass")])
        lines.append(f"* {b}: {'—' if g is None else f'{g:.2f}×'}")
    if overhead:
        lines += ["", "Per-call overhead (`x + 1` on 4 elements):", "",
                  "| backend | µs per call | overhead over eager µs | note |", "|---|---|---|---|"]
        for b, o in overhead.items():
            us, ov = o.get("us_per_call"), o.get("overhead_us")
            lines.append(f"| {b} | {'—' if us is None else f'{us:.1f}'} | "
                         f"{'—' if ov is None else f'{ov:+.1f}'} | {_fmt('note', o.get('note'))} |")
    notes = [(r.model, r.backend, "; ".join(x for x in (r.status if ":" in r.status else "", r.note)
                                            if x)) for r in rows]
    notes = [n for n in notes if n[2]]
    if notes:
        lines += ["", "Notes:", ""] + [f"* {m} · {b}: {n}" for m, b, n in notes]
    lines += ["", "Columns: *accuracy* is PyTorch's rule against an fp64 reference "
              "(benchmarks/accuracy.py); *median ms* is one step (inference: no_grad forward; "
              "training: forward + loss + backward); *speedup* is eager median / backend median; "
              "*cold/warm compile s* are the first compiled step minus one eager step, in a fresh "
              "process with empty / reused compiler caches; *first call s* is the first step in "
              "the benchmark process; *graphs*/*breaks* are counted by each compiler; *peak MiB* "
              "is the memory one step adds (CPU: peak RSS delta, rough; CUDA: "
              "max_memory_allocated); *AOT s* is Ember's reported AOT-autograd time.", ""]
    return "\n".join(lines)


def _plot(rows: list[Row], cfg: RunConfig, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install matplotlib): no plot"
    models = list(dict.fromkeys(r.model for r in rows))
    backends = [b for b in cfg.backends]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 1.4 * len(models)), 8))
    width = 0.8 / max(len(backends), 1)
    by = {(r.model, r.backend): r for r in rows}
    for i, b in enumerate(backends):
        xs = [m_i + (i - (len(backends) - 1) / 2) * width for m_i in range(len(models))]
        sp = [getattr(by.get((m, b)), "speedup", None) or 0.0 for m in models]
        cc = [getattr(by.get((m, b)), "cold_compile_s", None) or 0.0 for m in models]
        ax1.bar(xs, sp, width, label=b)
        if b != "eager":
            ax2.bar(xs, cc, width, label=b)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, rotation=20)
        ax.legend(fontsize=7, ncol=3)
        ax.grid(axis="y", alpha=0.3)
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_ylabel("speedup over eager (×)")
    ax1.set_title(f"{cfg.device} {cfg.mode}: speedup over eager (higher is better)")
    ax2.set_ylabel("cold compile s")
    ax2.set_title("cold compile seconds, fresh process, empty caches (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def _update_index(index: Path, out_dir: Path, stem: str, cfg: RunConfig, info: dict[str, str],
                  command: str, md_table: str) -> None:
    """Replace the section between ``<!-- results:{stem} -->`` markers in docs/benchmarks.md (if
    the page has them) with the command, machine, date and a copy of the table."""
    if not index.exists():
        return
    text = index.read_text()
    begin, end = f"<!-- results:{stem} -->", f"<!-- /results:{stem} -->"
    if begin not in text or end not in text:
        return
    rel = os.path.relpath(out_dir, index.parent)
    body = "\n".join([
        begin, "",
        f"Command: `{command}`", "",
        f"Machine: {info['cpu']}; torch {info['torch']}; Python {info['python']}"
        + (f"; GPU {info['gpu']}" if "gpu" in info else "") + f". Date: {info['date']}.", "",
        f"Full report: [{stem}.md]({rel}/{stem}.md) · CSV: [{stem}.csv]({rel}/{stem}.csv) · "
        f"plot: [{stem}.png]({rel}/{stem}.png)", "",
        md_table, "", end])
    text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: body, text, flags=re.S)
    index.write_text(text)


def write_reports(rows: list[Row], overhead: dict[str, dict[str, Any]], cfg: RunConfig,
                  out_dir: Path, argv: list[str] | None = None) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{cfg.device.split(':')[0]}-{cfg.mode}" + ("-bf16" if cfg.amp else "")
    command = "python -m benchmarks " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    info = machine_info(cfg.device)
    paths = {"md": out_dir / f"{stem}.md", "csv": out_dir / f"{stem}.csv",
             "overhead_csv": out_dir / f"{stem}-overhead.csv", "png": out_dir / f"{stem}.png"}
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(dataclasses.asdict(r))
    with open(paths["overhead_csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=OVERHEAD_COLUMNS)
        w.writeheader()
        for b, o in overhead.items():
            w.writerow({"backend": b, **o})
    md = _markdown(rows, overhead, cfg, info, command, stem)
    why = _plot(rows, cfg, paths["png"])
    if why:
        md += f"\n(no plot: {why})\n"
        paths.pop("png")
    paths["md"].write_text(md)
    table_start = md.index("| model")
    table = md[table_start:md.index("\nColumns:")].rstrip()
    _update_index(out_dir.parent / "benchmarks.md", out_dir, stem, cfg, info, command, table)
    return paths
