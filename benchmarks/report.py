"""Reports: a markdown table, a CSV and a PNG plot per (device, mode), plus the index page."""

from __future__ import annotations

import contextlib
import csv
import json
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

__all__ = ["CSV_COLUMNS", "OVERHEAD_COLUMNS", "machine_info", "write_reports", "geomean",
           "merge_rows", "build_result", "merge_results", "render"]

CSV_COLUMNS = [f.name for f in dataclasses.fields(Row)]
OVERHEAD_COLUMNS = ["backend", "us_per_call", "overhead_us", "note"]
_MD_COLUMNS = [("model", "model"), ("backend", "backend"), ("status", "status"),
               ("accuracy", "accuracy"), ("median_ms", "median ms"), ("speedup", "speedup"),
               ("cold_compile_s", "cold compile s"), ("warm_compile_s", "warm compile s"),
               ("first_call_s", "first call s"), ("graphs", "graphs"),
               ("graph_breaks", "breaks"), ("peak_mem_mb", "peak MiB"), ("aot_s", "AOT s")]


def merge_rows(old: list[Row], new: list[Row]) -> list[Row]:
    """``old`` with every (model, backend) present in ``new`` replaced; new pairs added. Rows
    stay grouped by model (first appearance), backends within a model in ``BACKEND_NAMES``
    order (others after them, as they came), so an appended ember-inductor row lands next to
    torch-inductor rather than at the end of the table."""
    from .backends import BACKEND_NAMES

    fresh = {(r.model, r.backend): r for r in new}
    merged = [fresh.pop((r.model, r.backend), r) for r in old]
    merged += [r for r in new if (r.model, r.backend) in fresh]
    models = list(dict.fromkeys(r.model for r in merged))
    rank = {b: i for i, b in enumerate(BACKEND_NAMES)}
    return sorted(merged, key=lambda r: (models.index(r.model),
                                         rank.get(r.backend, len(rank))))


_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
              "amx_tile", "asimd", "sve")


def _isa() -> str:
    """The vector instruction sets that matter to generated code (from /proc/cpuinfo) and what
    gcc's ``-march=native`` resolves to (the target kernels are built for)."""
    import subprocess

    flags: set[str] = set()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
                    break
    have = [f for f in _ISA_FLAGS if f in flags]
    march = ""
    with contextlib.suppress(Exception):
        out = subprocess.run(["g++", "-march=native", "-Q", "--help=target"], capture_output=True,
                             text=True, timeout=30).stdout
        march = next((ln.split()[-1] for ln in out.splitlines()
                      if ln.strip().startswith("-march=")), "")
    return " ".join(have) + (f" (gcc -march=native: {march})" if march else "")


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
    info["isa"] = _isa()
    with contextlib.suppress(OSError):  # other work on the machine skews timings: say how much
        info["load average at end (1/5/15 min)"] = " / ".join(f"{x:.1f}" for x in os.getloadavg())
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


def _markdown(res: dict[str, Any], rows: list[Row]) -> str:
    c, info, stem = res["config"], res["machine"], res["stem"]
    lines = [f"# Benchmark results: {c['device']}, {c['mode']}"
             + (" (bf16 autocast)" if c["amp"] else ""), "",
             *[f"* command: `{cmd}`" for cmd in res["commands"]],
             *[f"* {k}: {v}" for k, v in info.items()],
             f"* sizes: {c['size']}; timing: median of up to {c['iters']} interleaved iterations "
             f"after {c['warmup']} warm-up calls (budget {c['max_seconds']:.0f} s per model)",
             "", f"![speedups and compile times]({stem}.png)", "",
             "| " + " | ".join(h for _, h in _MD_COLUMNS) + " |",
             "|" + "---|" * len(_MD_COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(k, getattr(r, k)) for k, _ in _MD_COLUMNS) + " |")
    lines += ["", "Geometric-mean speedup over eager (models where the backend ran and passed):", ""]
    for b in dict.fromkeys(r.backend for r in rows):
        g = geomean([r.speedup for r in rows
                     if r.backend == b and r.speedup and r.accuracy.startswith("pass")])
        lines.append(f"* {b}: {'—' if g is None else f'{g:.2f}×'}")
    overhead = res["overhead"]
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
        lines += ["", "Notes:", ""] + [f"* {m} · {b}: {_fmt('note', n)}" for m, b, n in notes]
    lines += ["", "Columns: *accuracy* is PyTorch's rule against an fp64 reference "
              "(benchmarks/accuracy.py); *median ms* is one step (inference: no_grad forward; "
              "training: forward + loss + backward); *speedup* is eager median / backend median; "
              "*cold/warm compile s* are the first compiled step minus one eager step, in a fresh "
              "process with empty / reused compiler caches (no warm probe for torch-eager and "
              "torch-aot-eager: they have no on-disk cache); *first call s* is the first step in "
              "the benchmark process; *graphs*/*breaks* are counted by each compiler; *peak MiB* "
              "is the memory one step adds (CPU: peak RSS delta, rough; CUDA: "
              "max_memory_allocated); *AOT s* is Ember's reported AOT-autograd time. "
              "See [../benchmarks.md](../benchmarks.md).", ""]
    return "\n".join(lines)


def _plot(rows: list[Row], title: str, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install matplotlib): no plot"
    models = list(dict.fromkeys(r.model for r in rows))
    backends = list(dict.fromkeys(r.backend for r in rows))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 1.4 * len(models)), 8))
    width = 0.8 / max(len(backends), 1)
    by = {(r.model, r.backend): r for r in rows}
    for i, b in enumerate(backends):
        xs = [m_i + (i - (len(backends) - 1) / 2) * width for m_i in range(len(models))]
        sp = [getattr(by.get((m, b)), "speedup", None) or 0.0 for m in models]
        cc = [getattr(by.get((m, b)), "cold_compile_s", None) or 0.0 for m in models]
        style = {"color": f"C{i % 10}", "hatch": "//" if b.startswith("ember-") else None,
                 "edgecolor": "white"}
        ax1.bar(xs, sp, width, label=b, **style)
        if b != "eager":  # same colour per backend in both panels
            ax2.bar(xs, cc, width, label=b, **style)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, rotation=20)
        ax.legend(fontsize=7, ncol=3)
        ax.grid(axis="y", alpha=0.3)
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_ylabel("speedup over eager (×)")
    ax1.set_title(f"{title}: speedup over eager (higher is better)")
    ax2.set_ylabel("cold compile s")
    ax2.set_title("cold compile seconds, fresh process, empty caches (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def _update_index(index: Path, out_dir: Path, res: dict[str, Any], md: str) -> None:
    """Replace the section between ``<!-- results:{stem} -->`` markers in docs/benchmarks.md (if
    the page has them) with the command, machine, date and a copy of the tables."""
    if not index.exists():
        return
    text = index.read_text()
    stem, info = res["stem"], res["machine"]
    begin, end = f"<!-- results:{stem} -->", f"<!-- /results:{stem} -->"
    if begin not in text or end not in text:
        return
    rel = os.path.relpath(out_dir, index.parent)
    table = md[md.index("| model"):md.index("\nColumns:")].rstrip()
    body = "\n".join([
        begin, "",
        *[f"Command: `{cmd}`" + "\n" for cmd in res["commands"]],
        f"Machine: {info['cpu']}" + (f"; ISA {info['isa']}" if info.get("isa") else "")
        + f"; torch {info['torch']}; Python {info['python']}"
        + (f"; GPU {info['gpu']}" if "gpu" in info else "")
        + "".join(f"; {k} {info[k]}" for k in ("load average at start (1/5/15 min)",
                                                "load average at end (1/5/15 min)") if k in info)
        + f". Date: {info['date']}.", "",
        f"Full report: [{stem}.md]({rel}/{stem}.md) · CSV: [{stem}.csv]({rel}/{stem}.csv) · "
        f"plot: [{stem}.png]({rel}/{stem}.png)", "",
        f"![{stem}]({rel}/{stem}.png)", "",
        table, "", end])
    text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: body, text, flags=re.S)
    index.write_text(text)


def build_result(rows: list[Row], overhead: dict[str, dict[str, Any]], cfg: RunConfig,
                 argv: list[str] | None = None) -> dict[str, Any]:
    """Everything a report is rendered from (saved as ``{stem}.json`` beside it)."""
    stem = f"{cfg.device.split(':')[0]}-{cfg.mode}" + ("-bf16" if cfg.amp else "")
    corpus = getattr(cfg, "corpus", "zoo")
    stem += "" if corpus == "zoo" else f"-{corpus}"
    stem += f"-{cfg.tag}" if getattr(cfg, "tag", "") else ""
    command = "python -m benchmarks " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    info = machine_info(cfg.device)
    if cfg.load_at_start:
        info["load average at start (1/5/15 min)"] = cfg.load_at_start
    return {"stem": stem, "config": dataclasses.asdict(cfg), "machine": info,
            "commands": [command], "rows": [dataclasses.asdict(r) for r in rows],
            "overhead": overhead}


def merge_results(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` on top of ``old``: (model, backend) pairs measured again are replaced, the others
    kept; commands accumulate; the overhead table is the newest non-empty one."""
    rows = merge_rows([Row(**r) for r in old["rows"]], [Row(**r) for r in new["rows"]])
    out = dict(new)
    out["rows"] = [dataclasses.asdict(r) for r in rows]
    out["commands"] = list(dict.fromkeys(old.get("commands", []) + new["commands"]))
    out["overhead"] = new["overhead"] or old.get("overhead", {})
    return out


def render(res: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``{stem}.{json,csv,md,png}`` and ``{stem}-overhead.csv`` under ``out_dir`` and refresh
    the matching section of ``out_dir/../benchmarks.md`` when that page has its markers."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = res["stem"]
    rows = [Row(**r) for r in res["rows"]]
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md",
             "csv": out_dir / f"{stem}.csv", "overhead_csv": out_dir / f"{stem}-overhead.csv",
             "png": out_dir / f"{stem}.png"}
    paths["json"].write_text(json.dumps(res, indent=1) + "\n")
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(dataclasses.asdict(r))
    with open(paths["overhead_csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=OVERHEAD_COLUMNS)
        w.writeheader()
        for b, o in res["overhead"].items():
            w.writerow({"backend": b, **o})
    md = _markdown(res, rows)
    c = res["config"]
    why = _plot(rows, f"{c['device']} {c['mode']}" + (" bf16" if c["amp"] else ""), paths["png"])
    if why:
        md += f"\n(no plot: {why})\n"
        paths.pop("png")
    paths["md"].write_text(md)
    _update_index(out_dir.parent / "benchmarks.md", out_dir, res, md)
    return paths


def write_reports(rows: list[Row], overhead: dict[str, dict[str, Any]], cfg: RunConfig,
                  out_dir: Path, argv: list[str] | None = None,
                  append: bool = False) -> dict[str, Path]:
    """Render this run's reports; with ``append``, merged into an existing ``{stem}.json`` (so a
    long run can be split into several commands, e.g. one per model group on the GPU machine)."""
    res = build_result(rows, overhead, cfg, argv)
    old_path = out_dir / f"{res['stem']}.json"
    if append and old_path.exists():
        res = merge_results(json.loads(old_path.read_text()), res)
    return render(res, out_dir)
