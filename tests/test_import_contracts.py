"""The layout's import contracts (pyproject.toml [tool.importlinter]) hold, and they bite when broken."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(*source_roots: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, source_roots))}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], check=False, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_contracts_are_kept():
    result = lint_imports(REPO / "operator", REPO / "connector")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def copy_packages(tmp_path: Path) -> tuple[Path, Path]:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    operator = shutil.copytree(REPO / "operator" / "spillway", tmp_path / "operator" / "spillway", ignore=ignore)
    connector = shutil.copytree(REPO / "connector" / "spillway_connector",
                                tmp_path / "connector" / "spillway_connector", ignore=ignore)
    return operator, connector


def test_an_io_import_in_the_core_breaks_a_contract(tmp_path):
    operator, connector = copy_packages(tmp_path)
    quantity = operator / "core" / "quantity.py"
    quantity.write_text(quantity.read_text() + "\nimport kubernetes  # noqa\n")
    result = lint_imports(operator.parent, connector.parent)
    assert result.returncode != 0 and "the core computes" in result.stdout and "BROKEN" in result.stdout


def test_a_shell_importing_another_breaks_a_contract(tmp_path):
    operator, connector = copy_packages(tmp_path)
    facts = operator / "controller" / "facts.py"
    facts.write_text(facts.read_text() + "\nfrom ..qualify import report  # noqa\n")
    result = lint_imports(operator.parent, connector.parent)
    assert result.returncode != 0 and "layers:" in result.stdout and "BROKEN" in result.stdout


def test_the_connector_importing_spillway_breaks_a_contract(tmp_path):
    operator, connector = copy_packages(tmp_path)
    names = connector / "names.py"
    names.write_text(names.read_text() + "\nfrom spillway.core import vllm_api  # noqa\n")
    result = lint_imports(operator.parent, connector.parent)
    assert result.returncode != 0 and "stands alone" in result.stdout and "BROKEN" in result.stdout
