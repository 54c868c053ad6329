"""promtool on the chart's rule files: syntax, and the alert unit tests in alerts_test.yaml."""
from __future__ import annotations

import subprocess

import pytest
import yaml
from obs_files import ALERT_TESTS, RULE_FILES, require_binary
from spillway.observability import __main__ as generator


def promtool(*args: str) -> subprocess.CompletedProcess:
    command = [require_binary("promtool"), *args]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)


def test_there_are_rule_files():
    assert {path.name for path in RULE_FILES} == {generator.RECORDING_FILE, generator.ALERTS_FILE}


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path):
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_alert_unit_tests():
    result = promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_unit_tests_catch_a_changed_threshold(tmp_path):
    """The unit tests bind the thresholds: alerts generated with a lower DMA floor fail them."""
    assert generator.main(["--out", str(tmp_path), "--dma-floor-gbps", "1.5"]) == 0
    rules_dir = tmp_path / generator.RULES_DIR
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    tests["rule_files"] = [str(rules_dir / generator.RECORDING_FILE), str(rules_dir / generator.ALERTS_FILE)]
    copy = tmp_path / ALERT_TESTS.name
    copy.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", str(copy))
    assert result.returncode != 0
    assert "SpillwayDMAThroughputLow" in result.stdout + result.stderr
