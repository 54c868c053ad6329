"""System tools the tests need, and the one rule for what a test does when something is missing.

`skip_or_fail` skips a test on a developer machine that lacks a tool, vLLM or a vLLM source tree, but fails
it under CI (CI=true), where .ci/run must have installed it: CI never passes by skipping.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"


def skip_or_fail(message: str, *, allow_module_level: bool = False) -> NoReturn:
    """Skip locally, fail under CI (CI=true)."""
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=allow_module_level)


def require_binary(name: str) -> str:
    path = shutil.which(name) or (str(VENV_BIN / name) if (VENV_BIN / name).exists() else None)
    if path:
        return path
    skip_or_fail(f"{name} is not installed (make setup / .ci/run install it)")
