from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from capture import _report

    for name in sorted(_report.TABLES):
        terminalreporter.write_sep("=", name)
        terminalreporter.write_line(_report.render(name))
