"""Fixtures for the chart tests: each Helm major the chart supports."""
from __future__ import annotations

import pytest
from support.chart_render import HELMS, require_binary


@pytest.fixture(params=HELMS)
def helm(request) -> str:
    """Path of `helm` (Helm 4) or `helm3` (Helm 3); skipped locally / failed under CI when missing."""
    return require_binary(request.param)
