"""The chart's generated observability files, parsed, and the shared test helpers."""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from spillway.observability import __main__ as generator
from support.tools import require_binary  # noqa: F401 - re-exported for the tests here

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHART_FILES = generator.CHART_FILES
RULE_FILES = sorted((CHART_FILES / generator.RULES_DIR).glob("*.yaml"))
DASHBOARD_FILES = sorted((CHART_FILES / generator.DASHBOARD_DIR).glob("*.json"))
ALERT_TESTS = HERE / "alerts_test.yaml"




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
