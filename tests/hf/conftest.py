from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from hf.test_corpus import _REPORT

    if not _REPORT:
        return
    head = ("model", "mode", "backend", "graphs", "torch graphs", "breaks", "torch breaks",
            "result")
    rows = [head, *sorted(_REPORT)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    terminalreporter.write_sep("=", "Hugging Face corpus: Ember vs torch.compile")
    for r in rows:
        terminalreporter.write_line("  ".join(c.ljust(w) for c, w in zip(r, widths)))
