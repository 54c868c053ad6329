"""helm lint --strict passes with Helm 4 and Helm 3, for the defaults and for every scenario's values."""
from __future__ import annotations

import subprocess

import pytest
import yaml
from support.chart_render import CHART, SCENARIOS


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint_strict(helm, scenario, tmp_path):
    values, _ = SCENARIOS[scenario]
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    command = [helm, "lint", "--strict", str(CHART), "--values", str(values_file)]
    proc = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout


def test_helm_lint_strict_fails_on_a_bad_value(helm):
    proc = subprocess.run([helm, "lint", "--strict", str(CHART), "--set", "operator.logFormat=xml"],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "logFormat" in proc.stdout + proc.stderr
