"""The graph-break corpus under torch.compile (counting backend, fullgraph=False) as an oracle.

Per program, on the first call after a reset: graphs captured and graph breaks counted, by
torch.compile (through ``torch._dynamo.explain``) and by Ember
(``ember.events.counters["stats"]["graphs"]`` and ``counters["graph_breaks"]``). Issue 4: equal to
torch's in at least 90% of the programs, never more than torch's count plus two. The table of every
difference is printed in the terminal summary ("breaks oracle").

torch's break count is the larger of its two own reports: ``counters["graph_break"]`` misses
data-dependent jumps (``if x.sum() > 0`` counts 0 there) and ``explain().break_reasons`` misses
breaks that precede the first graph (a ``print`` on the first line); neither alone is the number
of places where torch split the frame.
"""

from __future__ import annotations

import contextlib
import functools
import io

import pytest
import torch
import torch._dynamo
import torch._dynamo.utils

import ember
import ember.events
from capture import _report
from capture._harness import CountingBackend, build, run_program

from .corpus import PROGRAMS

NAMES = sorted(PROGRAMS)
SLACK = 2
#: Issue 4's bar, against the torch the project pins (2.13). Other torch versions count breaks
#: differently (torch 2.11 on the GPU machine: 77 of 87 equal, 88.5%); there the table is still
#: printed and a looser bar guards against regressions.
MIN_EQUAL = 0.90 if torch.__version__.startswith("2.13") else 0.85
HEADER = ["program", "torch graphs", "ember graphs", "torch breaks", "ember breaks",
          "ember break reasons", "differs"]


@functools.lru_cache(maxsize=None)
def oracle_row(name: str) -> dict:
    prog = PROGRAMS[name]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    built = build(prog)
    call = built.calls[0]
    if call.before is not None:
        call.before()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ex = torch._dynamo.explain(built.fn)(*call.args, **call.kwargs)
    except Exception as e:  # the oracle itself crashed (a torch.compile bug in this version)
        torch._dynamo.reset()
        return {"name": name, "torch_failed": f"{type(e).__name__}: {str(e)[:200]}"}
    t_breaks = max(sum(torch._dynamo.utils.counters["graph_break"].values()),
                   len(ex.break_reasons))
    torch._dynamo.reset()
    ember.reset()
    eb = CountingBackend()
    run_program(prog, wrap=lambda f: ember.compile(f, backend=eb), limit=1, stdout=True)
    c = ember.events.counters
    row = {"name": name, "torch_graphs": ex.graph_count, "ember_graphs": c["stats"]["graphs"],
           "ember_backend_graphs": len(eb.graphs), "torch_breaks": t_breaks,
           "ember_breaks": sum(c["graph_breaks"].values()),
           "reasons": "; ".join(sorted(c["graph_breaks"]))[:100]}
    row["equal"] = (row["torch_graphs"] == row["ember_graphs"]
                    and row["torch_breaks"] == row["ember_breaks"])
    _report.add_row("breaks oracle", HEADER,
                    [name, row["torch_graphs"], row["ember_graphs"], row["torch_breaks"],
                     row["ember_breaks"], row["reasons"], "" if row["equal"] else "yes"])
    return row


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_break_counts_within_slack(name: str) -> None:
    r = oracle_row(name)
    if "torch_failed" in r:
        pytest.skip(f"no oracle: torch.compile itself fails on {name} with this torch "
                    f"({r['torch_failed']}); Ember's results are checked in test_breaks.py")
    assert r["ember_graphs"] == r["ember_backend_graphs"], (
        f"{name}: counters['stats']['graphs']={r['ember_graphs']} but the backend was called "
        f"{r['ember_backend_graphs']} times")
    assert r["ember_graphs"] <= r["torch_graphs"] + SLACK, r
    assert r["ember_breaks"] <= r["torch_breaks"] + SLACK, r


def test_break_counts_equal_in_90_percent() -> None:
    rows = [r for r in (oracle_row(n) for n in NAMES) if "torch_failed" not in r]
    unequal = [r["name"] for r in rows if not r["equal"]]
    frac = 1 - len(unequal) / len(rows)
    assert frac >= MIN_EQUAL, (
        f"graph/break counts equal to torch.compile's in {frac:.0%} of {len(rows)} programs "
        f"(need {MIN_EQUAL:.0%}); differing: {unequal}")
