"""Every graph-break program compiled with Ember equals eager: outputs, inputs after the call,
caller-visible side effects (lists, dicts, attributes, globals, logged messages) and printed output,
call by call, so each side effect happens exactly once and in program order."""

from __future__ import annotations

import pytest

import ember
import ember.events
from capture._harness import CountingBackend, LogTap, compare_records, run_program

from .corpus import PROGRAMS

NAMES = sorted(PROGRAMS)


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_breaks_match_eager(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    prog = PROGRAMS[name]
    capsys.readouterr()

    def observe(i, call):  # noqa: ANN001, ANN202
        return {"stdout": capsys.readouterr().out}
    expected = run_program(prog, observe=observe)
    ember.reset()
    backend = CountingBackend()
    with LogTap() as tap:
        got = run_program(prog, wrap=lambda f: ember.compile(f, backend=backend),
                          observe=observe)
    compare_records(got, expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.extra["stdout"] == e.extra["stdout"], (
            f"{name}: call[{i}] printed {g.extra['stdout']!r}, eager printed "
            f"{e.extra['stdout']!r}\n{tap.text()}")
