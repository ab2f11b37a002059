"""Every corpus program compiled with Ember (a counting in-process backend) equals eager: outputs,
inputs after the call (mutation), caller-visible state, gradients; no fallback and no graph break;
recompiles exactly where the corpus says (new shape, dtype, Python value, training flag, grad
mode) and nowhere else."""

from __future__ import annotations

import pytest

import ember
import ember.events

from ._harness import CountingBackend, LogTap, compare_records, run_program
from .corpus import PROGRAMS

NAMES = sorted(PROGRAMS)


def compile_and_run(prog, backend):  # noqa: ANN001, ANN201
    stats = ember.events.counters["stats"]

    def observe(i, call):  # noqa: ANN001, ANN202
        return {"recompiles": stats["recompiles"], "fallbacks": stats["fallbacks"],
                "graphs": len(backend.graphs)}
    return run_program(prog, wrap=lambda f: ember.compile(f, backend=backend), observe=observe)


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_capture_matches_eager(name: str) -> None:
    prog = PROGRAMS[name]
    expected = run_program(prog)
    ember.reset()
    backend = CountingBackend()
    with LogTap() as tap:
        got = compile_and_run(prog, backend)
    compare_records(got, expected)
    stats = ember.events.counters["stats"]
    if not prog.full:
        return
    assert stats["fallbacks"] == 0, f"{name} fell back to eager:\n{tap.text()}"
    breaks = sum(ember.events.counters["graph_breaks"].values())
    assert breaks == 0, (f"{name}: {breaks} graph break(s) in a program that must capture "
                         f"fully:\n{tap.text()}")
    assert got[0].extra["graphs"] >= 1, f"{name}: no graph captured on the first call\n{tap.text()}"
    prev = 0
    for i, (rec, call) in enumerate(zip(got, _calls(prog))):
        delta = rec.extra["recompiles"] - prev
        prev = rec.extra["recompiles"]
        if call.recompile is True:
            assert delta == 1, (f"{name}: call[{i}] must recompile exactly once, recompiled "
                                f"{delta} times\n{tap.text()}")
        elif call.recompile is False:
            assert delta == 0, (f"{name}: call[{i}] must not recompile, recompiled {delta} "
                                f"times\n{tap.text()}")


def _calls(prog):  # noqa: ANN001, ANN202
    from ._harness import build
    return build(prog).calls
