"""System tools the tests need.

`require_binary` skips a test on a developer machine that lacks a tool, but fails it under CI (CI=true),
where .ci/run must have installed it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"


def require_binary(name: str) -> str:
    path = shutil.which(name) or (str(VENV_BIN / name) if (VENV_BIN / name).exists() else None)
    if path:
        return path
    message = f"{name} is not installed (make setup / .ci/run install it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
