"""checkov's Kubernetes checks pass on every rendered scenario; each skip is justified where it is declared."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from support.chart_render import CHART, REPO, SCENARIOS, render, render_text, require_binary

CONFIG = CHART / ".checkov.yaml"
CHECKOV_VENV = REPO / ".venv" / "checkov" / "bin" / "checkov"  # its own virtualenv: its pins clash with vLLM's


def checkov() -> str:
    return str(CHECKOV_VENV) if CHECKOV_VENV.exists() else require_binary("checkov")


def scan(directory: Path) -> dict:
    proc = subprocess.run([checkov(), "--directory", str(directory), "--config-file", str(CONFIG), "--output", "json"],
                          check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    kubernetes, = [r for r in reports if r["check_type"] == "kubernetes"]
    return kubernetes


def annotated_skips(docs: list[dict]) -> set[str]:
    skips = set()
    for doc in docs:
        for key, value in (doc["metadata"].get("annotations") or {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, reason = value.partition("=")
                assert reason.strip(), f"{key} on {doc['kind']} skips {check} without a reason"
                skips.add(check)
    return skips


def test_rendered_chart_passes_checkov(tmp_path):
    helm = require_binary("helm")  # Helm 3 renders the same objects (test_render.py)
    for name, (values, api_versions) in SCENARIOS.items():
        (tmp_path / f"{name}.yaml").write_text(render_text(helm, values, api_versions))
    report = scan(tmp_path)
    summary = report["summary"]
    failed = [(c["check_id"], c["resource"]) for c in report["results"].get("failed_checks", [])]
    assert not failed, failed
    assert summary["parsing_errors"] == 0
    assert summary["passed"] > 100 and summary["resource_count"] >= 10 * len(SCENARIOS)
    configured = set(yaml.safe_load(CONFIG.read_text())["skip-check"])
    docs = [doc for name in SCENARIOS for doc in render(helm, *SCENARIOS[name])]
    skipped = {c["check_id"] for c in report["results"].get("skipped_checks", [])}
    assert skipped <= configured | annotated_skips(docs)


def test_every_configured_skip_has_its_reason():
    lines = CONFIG.read_text().splitlines()
    for index, line in enumerate(lines):
        if line.strip().startswith("- CKV"):
            assert lines[index - 1].strip().startswith("#"), f"{line.strip()} has no reason above it"


def test_checkov_catches_a_weakened_chart(tmp_path):
    # Without the NetworkPolicies, checkov must object: the scan above is not vacuous.
    helm = require_binary("helm")
    (tmp_path / "weak.yaml").write_text(render_text(helm, {"networkPolicy": {"enabled": False}}))
    failed = {c["check_id"] for c in scan(tmp_path)["results"].get("failed_checks", [])}
    assert "CKV2_K8S_6" in failed

