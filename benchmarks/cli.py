"""Command line: ``python -m benchmarks {run,probe,list}``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .measure import ROOT

DEFAULT_BACKENDS = "eager,ember-eager,ember-aot-eager,torch-eager,torch-aot-eager,torch-inductor"


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
    r.add_argument("--probe-timeout", type=float, default=600.0)
    r.add_argument("--no-overhead", action="store_true", help="skip the per-call overhead test")
    r.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks",
                   help="report directory (default docs/benchmarks)")
    r.add_argument("--quiet", action="store_true", help="no progress lines")

    pr = sub.add_parser("probe", help="(internal) time one first compiled step in this process")
    pr.add_argument("--model", required=True)
    pr.add_argument("--backend", required=True)
    pr.add_argument("--device", default="cpu")
    pr.add_argument("--mode", default="infer", choices=["infer", "train"])
    pr.add_argument("--size", default="small", choices=["small", "full"])
    pr.add_argument("--amp", action="store_true")

    sub.add_parser("list", help="list zoo models and backends")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.cmd == "list":
        from .backends import BACKEND_NAMES, availability
        from .zoo import ZOO

        for s in ZOO.values():
            extra = "" if s.default else " (not in the default set)"
            print(f"{s.name:18} {'/'.join(s.devices):9} {s.description}{extra}")
        print()
        for b in BACKEND_NAMES:
            print(f"{b:18} {availability(b) or 'available'}")
        return 0
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
                    compile_probes=args.compile_probes, probe_timeout=args.probe_timeout,
                    overhead=not args.no_overhead, quiet=args.quiet)
    rows, overhead = run(cfg)
    paths = write_reports(rows, overhead, cfg, args.out, argv)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0
