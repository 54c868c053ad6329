"""The reliability suite: hostile and broken input, through the CLIs and the real operator."""
from __future__ import annotations

import pytest
from harness import container_args, modelserver, render


def pytest_terminal_summary(terminalreporter):
    """The fuzz test's count, also where pytest captures its output (make test)."""
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for key, value in getattr(report, "user_properties", []):
            if key == "summary":
                terminalreporter.write_line(str(value))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> list[str]:
    """The command line of a plain ModelServer, as rendered."""
    return container_args(render(tmp_path_factory.mktemp("base"), modelserver()))
