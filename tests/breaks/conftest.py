from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from capture import _report

    if _report.TABLES.get("breaks oracle"):
        terminalreporter.write_sep("=", "breaks oracle")
        terminalreporter.write_line(_report.render("breaks oracle"))
