"""Check the corpora themselves: deterministic under eager, and torch.compile agrees with eager.

    python -m capture.validate_corpus [capture|breaks] [name-substring]   (from tests/)
"""

from __future__ import annotations

import sys
import traceback

import torch

from ._harness import CountingBackend, compare_records, run_program


def main() -> int:
    which = sys.argv[1] if len(sys.argv) > 1 else "capture"
    pat = sys.argv[2] if len(sys.argv) > 2 else ""
    if which == "capture":
        from .corpus import PROGRAMS
    else:
        sys.path.insert(0, ".")
        from breaks.corpus import PROGRAMS  # type: ignore
    bad = 0
    for name, prog in PROGRAMS.items():
        if pat not in name:
            continue
        try:
            ref = run_program(prog, stdout=True)
            ref2 = run_program(prog, stdout=True)
            compare_records(ref2, ref)
            assert [r.extra for r in ref] == [r.extra for r in ref2]
        except Exception:
            bad += 1
            print(f"EAGER  {name}: {traceback.format_exc(limit=3)}")
            continue
        try:
            torch._dynamo.reset()
            be = CountingBackend()
            got = run_program(prog, wrap=lambda f: torch.compile(f, backend=be, dynamic=False),
                              observe=lambda i, c: {"graphs": len(be.graphs)}, stdout=True)
            compare_records(got, ref)
            so = [r.extra["stdout"] for r in got]
            assert so == [r.extra["stdout"] for r in ref], f"stdout {so}"
            gb = sum(torch._dynamo.utils.counters["graph_break"].values())
            first = got[0].extra["graphs"]
            print(f"ok     {name}: first={first} {be.node_counts()[:first]} "
                  f"graphs={len(be.graphs)} nodes={be.node_counts()} breaks={gb}")
        except Exception as e:
            bad += 1
            print(f"TORCH  {name}: {type(e).__name__}: {str(e)[:300]}")
    print("bad:", bad)
    return 0


if __name__ == "__main__":
    sys.exit(main())
