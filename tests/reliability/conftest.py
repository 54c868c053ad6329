"""The reliability suite: hostile and broken input, through the CLIs and the real operator."""
from __future__ import annotations


def pytest_terminal_summary(terminalreporter):
    """The fuzz test's count, also where pytest captures its output (make test)."""
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for key, value in getattr(report, "user_properties", []):
            if key == "summary":
                terminalreporter.write_line(str(value))
