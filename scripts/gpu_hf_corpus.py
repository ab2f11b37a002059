"""The Hugging Face corpus (tests/hf/models.py) through a backend on a GPU, eval and train, each
compared with eager by the accuracy rule (float64 past the tolerance), fallbacks counted
(issue 20: "the model corpus through inductor on the H200, eval and train: 0 wrong, no fallback").

    EMBER_HF_DEVICE=cuda python3 scripts/gpu_hf_corpus.py --backend inductor --budget 240 [names]

Prints one markdown row per (model, mode) and a summary line; stops starting new models when the
budget (seconds) is spent, and says how many it did not reach."""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--budget", type=float, default=240.0)
    ap.add_argument("--modes", default="eval,train")
    ap.add_argument("--shard", default="", help="k/n: every n-th model starting at k")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    os.environ.setdefault("EMBER_HF_DEVICE", "cuda")
    warnings.filterwarnings("ignore")
    from tests.hf import harness, models

    names = a.names or list(models.SPECS)
    if a.shard:
        k, n = (int(x) for x in a.shard.split("/"))
        names = names[k::n]
    t_end = time.time() + a.budget
    counts = {"pass": 0, "wrong": 0, "fallback": 0, "error": 0}
    full: list[str] = []  # every fallback's whole reason, printed after the table
    done = 0
    print(f"| model | mode | graphs | fallbacks | result | s |  (device {harness.DEVICE}, "
          f"backend {a.backend})")
    print("| --- | --- | ---: | ---: | --- | ---: |")
    for name in names:
        for mode in a.modes.split(","):
            if time.time() > t_end:
                break
            t0 = time.perf_counter()
            try:
                r = harness.run_ember(name, mode, a.backend)
                if r.error:
                    kind, verdict = "error", r.error
                elif r.fallbacks:
                    kind, verdict = "fallback", "; ".join(r.fallback_reasons)[:160]
                    full += [f"{name} {mode}: {why}" for why in r.fallback_reasons]
                elif r.accuracy.startswith("pass"):
                    kind, verdict = "pass", r.accuracy
                else:
                    kind, verdict = "wrong", r.accuracy
                graphs, fb = r.graphs, r.fallbacks
            except Exception as e:  # noqa: BLE001 - a row; the sweep goes on
                kind, verdict, graphs, fb = "error", f"crash {type(e).__name__}: {e}"[:160], "-", "-"
            counts[kind] += 1
            done += 1
            print(f"| {name} | {mode} | {graphs} | {fb} | {verdict} | "
                  f"{time.perf_counter() - t0:.1f} |", flush=True)
    for line in full:
        print("FALLBACK", line)
    total = len(names) * len(a.modes.split(","))
    print(f"SUMMARY {counts} ran {done} of {total} (model, mode) pairs")
    return 0 if counts["wrong"] == counts["error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
