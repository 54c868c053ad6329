"""The chart's generated observability files, parsed, and the shared test helpers."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml
from spillway.observability import __main__ as generator

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHART_FILES = generator.CHART_FILES
RULE_FILES = sorted((CHART_FILES / generator.RULES_DIR).glob("*.yaml"))
DASHBOARD_FILES = sorted((CHART_FILES / generator.DASHBOARD_DIR).glob("*.json"))
ALERT_TESTS = HERE / "alerts_test.yaml"


def _shared_conftest():
    # tests/conftest.py under a name of its own (every test directory may have a `conftest`).
    spec = importlib.util.spec_from_file_location("spillway_tests_conftest", REPO / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


require_binary = _shared_conftest().require_binary


def load_boards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in DASHBOARD_FILES}


def load_rule_groups() -> list[dict]:
    groups = []
    for path in RULE_FILES:
        groups.extend(yaml.safe_load(path.read_text())["groups"])
    return groups


def dashboard_panels(board: dict) -> list[dict]:
    """Every panel of a dashboard, rows' nested panels included."""
    panels = []
    for panel in board["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def query_panels(board: dict) -> list[dict]:
    return [p for p in dashboard_panels(board) if p.get("targets")]


def recording_rules() -> list[dict]:
    return [rule for group in load_rule_groups() for rule in group["rules"] if "record" in rule]


def alerting_rules() -> list[dict]:
    return [rule for group in load_rule_groups() for rule in group["rules"] if "alert" in rule]
