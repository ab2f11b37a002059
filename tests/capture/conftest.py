from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from capture import _report

    if _report.TABLES.get("capture oracle"):
        terminalreporter.write_sep("=", "capture oracle")
        terminalreporter.write_line(_report.render("capture oracle"))
