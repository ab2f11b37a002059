"""Compare OpInfo sweep results (tests/opinfo/sweep.py --out files, e.g. the shards of a CUDA run):
counts per backend, every wrong sample, and the samples torch.compile gets right that Ember does
not (issue 20: "0 wrong results, and at least as many samples right as torch.compile's inductor").

    python3 scripts/opinfo_compare.py sweep_ember_*.json sweep_torch_*.json
"""

from __future__ import annotations

import collections
import json
import sys


def main(paths: list[str]) -> int:
    rows: dict[str, dict] = {}
    reached = {}
    for p in paths:
        d = json.load(open(p))
        reached[p] = (d.get("ops_reached"), d.get("ops"))
        for key, row in d["results"].items():
            rows.setdefault(key, {}).update({b: r for b, r in row.items() if b != "sig"})
    backends = sorted({b for r in rows.values() for b in r})
    print("files:", {p.rsplit("/", 1)[-1]: v for p, v in reached.items()})
    for b in backends:
        c = collections.Counter(r[b]["status"] for r in rows.values() if b in r)
        print(f"{b}: {dict(c)} ({sum(c.values())} samples)")
    ember = [b for b in backends if not b.startswith("torch:")]
    torch_b = [b for b in backends if b.startswith("torch:")]
    for e in ember:
        for t in torch_b:
            both = [k for k, r in rows.items() if e in r and t in r]
            er = sum(r[e]["status"] in ("right", "random") for k in both for r in [rows[k]])
            tr = sum(r[t]["status"] in ("right", "random") for k in both for r in [rows[k]])
            print(f"on the {len(both)} samples both ran: {e} right {er}, {t} right {tr}")
            worse = [k for k in both if rows[k][t]["status"] in ("right", "random")
                     and rows[k][e]["status"] not in ("right", "random")]
            for k in sorted(worse):
                print(f"  torch right, {e} {rows[k][e]['status']}: {k}: {rows[k][e]['reason'][:200]}")
        for k, r in sorted(rows.items()):
            if e in r and r[e]["status"] in ("wrong", "error"):
                print(f"  {e} {r[e]['status']}: {k}: {r[e]['reason'][:240]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
