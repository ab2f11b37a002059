"""Figures and the table of differences from a sweep's results (``sweep.py --out FILE``).

    .venv/bin/python tests/opinfo/report.py /tmp/sweep.json              # markdown to stdout
    .venv/bin/python tests/opinfo/report.py /tmp/sweep.json --write-known  # tests/opinfo/known.json

known.json lists, per backend, the samples whose status is ``wrong`` or ``error`` (the CI test
expects exactly those to fail: strict xfails).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sweep  # noqa: E402

BAD = ("wrong", "error")


def _status(entry: object) -> tuple[str, str]:
    if isinstance(entry, list):
        return entry[0], entry[1]
    return str(entry), ""


def oracle_backend(b: str) -> str:
    """The torch.compile backend an Ember backend is judged against."""
    b = b.split(":", 1)[-1]
    return b if b in ("aot_eager", "inductor") else "aot_eager"


def summarize(results: dict, oracle: dict) -> str:
    backends = sorted({b for row in results.values() for b in row
                       if not b.startswith("torch:") and b != "sig"})
    lines = ["| backend | samples | right | wrong | fallback | error | random | torch.compile "
             "correct (backend) | Ember as compiled as torch.compile, of those | Ember correct "
             "(compiled or fallback), of those |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for b in backends:
        c = collections.Counter()
        o_right = e_right = e_ok = 0
        for key, row in results.items():
            if b not in row or row[b]["status"] == "skip":
                continue
            st = row[b]["status"]
            c[st] += 1
            o = oracle.get(key, {}).get(oracle_backend(b))
            os_ = _status(o)[0] if o is not None else None
            if os_ in ("right", "random", "fallback"):
                o_right += 1
                e_right += st in ("right", "random") or (st == "fallback" and os_ == "fallback")
                e_ok += st in ("right", "random", "fallback")
        n = sum(c.values())
        pct = lambda k: f"{k} ({100 * k / o_right:.1f}%)" if o_right else str(k)  # noqa: E731
        lines.append(f"| {b} | {n} | {c['right']} | {c['wrong']} | {c['fallback']} | "
                     f"{c['error']} | {c['random']} | {o_right} ({oracle_backend(b)}) | "
                     f"{pct(e_right)} | {pct(e_ok)} |")
    return "\n".join(lines)


def differences(results: dict, oracle: dict, statuses: tuple[str, ...]) -> str:
    lines = ["| sample | backend | status | torch.compile | reason |",
             "| --- | --- | --- | --- | --- |"]
    for key in sorted(results):
        for b, r in sorted(results[key].items()):
            if not isinstance(r, dict) or b.startswith("torch:"):
                continue
            o = _status(oracle.get(key, {}).get(oracle_backend(b), "?"))[0]
            # every bad sample, and every fallback where torch.compile compiled the sample
            if r["status"] not in statuses and not (r["status"] == "fallback"
                                                    and o in ("right", "random")):
                continue
            why = r["reason"].replace("|", "\\|").replace("\n", " ")[:220]
            lines.append(f"| `{key}` | {b} | {r['status']} | {o} | {why} |")
    return "\n".join(lines)


def fallback_reasons(results: dict) -> str:
    c: collections.Counter = collections.Counter()
    for row in results.values():
        for b, r in row.items():
            if isinstance(r, dict) and not b.startswith("torch:") and r["status"] == "fallback":
                c[(b, r["reason"][:150])] += 1
    lines = ["| backend | samples | reason (first) |", "| --- | ---: | --- |"]
    for (b, why), n in c.most_common(40):
        lines.append(f"| {b} | {n} | {why.replace('|', '/')} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--write-known", action="store_true")
    args = p.parse_args()
    data = json.loads(Path(args.results).read_text())
    results = data["results"]
    oracle = sweep.load_oracle()["results"]
    if args.write_known:
        known: dict = {}
        for key, row in results.items():
            for b, r in row.items():
                if isinstance(r, dict) and not b.startswith("torch:") and r["status"] in BAD:
                    known.setdefault(b, {})[key] = [r["status"], r["reason"][:300]]
        (HERE / "known.json").write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
        return 0
    print(summarize(results, oracle))
    print()
    print(differences(results, oracle, BAD))
    print()
    print(fallback_reasons(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
