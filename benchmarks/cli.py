"""Command line: ``python -m benchmarks {run,demo,probe,list,render}``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .measure import ROOT

#: ember-inductor sits right before torch-inductor, so the tables show the two side by side.
DEFAULT_BACKENDS = ("eager,ember-eager,ember-aot-eager,torch-eager,torch-aot-eager,"
                    "ember-inductor,torch-inductor")


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="benchmark models x backends and write the reports")
    r.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    r.add_argument("--mode", default="infer", choices=["infer", "train"])
    r.add_argument("--backends", default=DEFAULT_BACKENDS, type=_csv,
                   help="comma-separated: eager, ember-<name>, torch-<name> "
                        f"(default {DEFAULT_BACKENDS})")
    r.add_argument("--models", type=_csv, default=None,
                   help="comma-separated zoo names (default: every model for the device; "
                        "`python -m benchmarks list` shows them)")
    r.add_argument("--corpus", default="zoo", choices=["zoo", "wide", "all"],
                   help="which models run when --models is not given: the zoo's default set "
                        "(default), the wide performance corpus (benchmarks/corpus.py), or both; "
                        "a corpus other than the zoo names the report (cpu-infer-wide)")
    r.add_argument("--tag", default="",
                   help="appended to the report's name (e.g. --tag inductor: cpu-infer-inductor)")
    r.add_argument("--iters", type=int, default=None,
                   help="interleaved timing iterations per model (default 30 cpu, 100 cuda)")
    r.add_argument("--warmup", type=int, default=None, help="warm-up calls per backend")
    r.add_argument("--max-seconds", type=float, default=None,
                   help="timing budget per model in seconds (default 20 cpu, 60 cuda)")
    r.add_argument("--amp", action="store_true", help="bf16 autocast (cuda)")
    r.add_argument("--size", choices=["small", "full"], default=None,
                   help="model sizes (default: small on cpu, full on cuda)")
    r.add_argument("--compile-probes", default="cold,warm",
                   help="cold,warm | cold | none: fresh-process compile measurements")
    r.add_argument("--probe-backends", type=_csv, default=None,
                   help="run the compile probes only for these backends (default: all compiled)")
    r.add_argument("--probe-timeout", type=float, default=600.0)
    r.add_argument("--deadline", type=float, default=None,
                   help="seconds after which no new model or probe starts (the rest is reported "
                        "as skipped), so a run under a wall-clock limit still writes its report")
    r.add_argument("--no-overhead", action="store_true", help="skip the per-call overhead test")
    r.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks",
                   help="report directory (default docs/benchmarks)")
    r.add_argument("--append", action="store_true",
                   help="merge into an existing report of the same device/mode (replacing the "
                        "model x backend pairs measured now) instead of overwriting it")
    r.add_argument("--quiet", action="store_true", help="no progress lines")

    pr = sub.add_parser("probe", help="(internal) time one first compiled step in this process")
    pr.add_argument("--model", required=True)
    pr.add_argument("--backend", required=True)
    pr.add_argument("--device", default="cpu")
    pr.add_argument("--mode", default="infer", choices=["infer", "train"])
    pr.add_argument("--size", default="small", choices=["small", "full"])
    pr.add_argument("--amp", action="store_true")

    sub.add_parser("list", help="list zoo models and backends")

    dm = sub.add_parser("demo", help="Ember's bundled model: eager vs Ember's inductor vs "
                                     "torch.compile's inductor (speed, accuracy, cold and warm "
                                     "compile in fresh processes)")
    dm.add_argument("--iters", type=int, default=200, help="interleaved timing iterations")
    dm.add_argument("--max-seconds", type=float, default=20.0, help="timing budget")
    dm.add_argument("--no-probes", action="store_true",
                    help="skip the fresh-process cold/warm compile measurements")

    dd = sub.add_parser("ddp", help="DDP training step on gloo ranks: eager vs Ember vs "
                                     "torch.compile, step time and all-reduce/backward overlap")
    dd.add_argument("--world", type=int, default=2)
    dd.add_argument("--model", default="mlp", choices=["mlp", "gpt2"])
    dd.add_argument("--iters", type=int, default=30)
    dd.add_argument("--bucket-cap-mb", type=float, default=4.0)
    dd.add_argument("--out", type=Path, default=None, help="write ddp-<model>.{md,json} here")

    sm = sub.add_parser("summary", help="one markdown table per Ember build from an inference "
                                        "and a training report: speedups beside torch.compile's, "
                                        "ratios, geometric means, models below a floor")
    sm.add_argument("infer", type=Path, help="inference result, e.g. docs/benchmarks/cpu-infer-wide.json")
    sm.add_argument("train", type=Path, nargs="?", default=None, help="training result")
    sm.add_argument("--peer", default="torch-inductor")
    sm.add_argument("--floor", type=float, default=0.95)

    rd = sub.add_parser("render", help="re-render reports (md, csv, png, docs/benchmarks.md "
                                       "section) from saved {stem}.json files")
    rd.add_argument("json", nargs="+", type=Path,
                    help="a saved result, e.g. docs/benchmarks/cuda-infer-bf16.json")
    rd.add_argument("--out", type=Path, default=None,
                    help="report directory (default: the JSON file's directory)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.cmd == "list":
        from .backends import BACKEND_NAMES, availability
        from .zoo import ZOO

        for s in ZOO.values():
            extra = (" (wide corpus: --corpus wide)" if s.corpus == "wide" else ""
                     if s.default else " (not in the default set)")
            print(f"{s.name:18} {'/'.join(s.devices):9} {s.description}{extra}")
        print()
        for b in BACKEND_NAMES:
            print(f"{b:18} {availability(b) or 'available'}")
        return 0
    if args.cmd == "summary":
        from .summary import summarize

        print(summarize(args.infer, args.train, peer=args.peer, floor=args.floor), end="")
        return 0
    if args.cmd == "render":
        import json

        from .report import render

        for path in args.json:
            for kind, p in render(json.loads(path.read_text()), args.out or path.parent).items():
                print(f"{kind}: {p}")
        return 0
    if args.cmd == "ddp":
        from .ddp import main as ddp_main

        return ddp_main(world=args.world, model=args.model, iters=args.iters,
                        cap_mb=args.bucket_cap_mb, out=args.out)
    if args.cmd == "demo":
        from .demo import demo

        return demo(iters=args.iters, max_seconds=args.max_seconds, probes=not args.no_probes)
    if args.cmd == "probe":
        from .runner import probe_json

        print(probe_json(model=args.model, backend=args.backend, device=args.device,
                         mode=args.mode, size=args.size, amp=args.amp), flush=True)
        return 0
    from .report import write_reports
    from .runner import RunConfig, run

    cfg = RunConfig(device=args.device, mode=args.mode, backends=args.backends,
                    models=args.models, iters=args.iters, warmup=args.warmup,
                    max_seconds=args.max_seconds, amp=args.amp, size=args.size,
                    compile_probes=args.compile_probes, probe_backends=args.probe_backends,
                    probe_timeout=args.probe_timeout, deadline_s=args.deadline,
                    overhead=not args.no_overhead, quiet=args.quiet, corpus=args.corpus,
                    tag=args.tag)
    rows, overhead = run(cfg)
    paths = write_reports(rows, overhead, cfg, args.out, argv, append=args.append)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0
