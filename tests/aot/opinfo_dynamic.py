"""OpInfo sweep through capture + AOT autograd with symbolic shapes (a diagnostic, not a test).

    .venv/bin/python tests/aot/opinfo_dynamic.py 0/3    # shard 0 of 3 (1 sample per op)

Each op's first sample is compiled with ``ember.compile(fn, backend="aot_eager", dynamic=True)``
and judged against eager by tests/opinfo/sweep.py (outputs and input gradients). Prints the
samples that are not right and the totals. 2026-12-03, torch 2.13 CPU, all three shards:
587 right, 0 wrong, 0 error, 85 fallback (capture graph breaks), 5 skip.
"""

import collections
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "opinfo"))
sys.path.insert(0, str(ROOT / "tests"))
import ember  # noqa: E402
import sweep  # noqa: E402
from sweep import _eager_reference, cases_for, run_ember, selected_ops  # noqa: E402


def make_compiled(case, backend):  # noqa: ANN001, ANN201
    return ember.compile(case.make_fn(), backend=backend, dynamic=True)


sweep.make_compiled = make_compiled


def main() -> None:
    k, n = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "0/1").split("/"))
    ops = selected_ops(None)[k::n]
    tot = collections.Counter()
    t0 = time.time()
    for op in ops:
        try:
            cases = list(cases_for(op, 1))
        except Exception:  # noqa: BLE001 - not ours
            continue
        for case in cases:
            try:
                ref = _eager_reference(case)
            except Exception:  # noqa: BLE001 - not ours
                continue
            r = run_ember(case, "aot_eager", ref, time_limit=60)
            tot[r.status] += 1
            if r.status in ("wrong", "error", "fallback"):
                print(r.status, case.key, r.reason[:300].replace("\n", " "), flush=True)
    print(dict(tot), f"{time.time()-t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
