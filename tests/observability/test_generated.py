"""The committed dashboards and rule files: well-formed, and naming only known metrics.

That they are current is tests/test_generated_files.py's to check, with every other generated file.
"""
from __future__ import annotations

import re

import pytest
import yaml
from obs_files import (
    ALERT_TESTS,
    DASHBOARD_FILES,
    REPO,
    alerting_rules,
    dashboard_panels,
    load_boards,
    query_panels,
    recording_rules,
)
from spillway.core import k8s_names, routing
from spillway.core.vllm_api import Metric, TieringMetric
from spillway.observability import __main__ as generator
from spillway.observability import alerts, dashboards, recording
from spillway_connector import names as connector

# Series names as they appear in PromQL: vLLM's, the connector's, ours, cAdvisor's, kube-state-metrics'.
SERIES = re.compile(r"\b(?:vllm:|spillway:|spillway_pod:|spillway_node_|spillway_router_|kube_|container_)"
                    r"[A-Za-z0-9_:]*")
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


def known_series() -> set[str]:
    bare = {value for key, value in vars(Metric).items() if key.isupper()}
    bare |= {value for key, value in vars(TieringMetric).items() if key.isupper() and value.startswith("vllm:")}
    bare |= set(connector.ALL)
    bare |= {k8s_names.METRIC_NODE_QUALIFIED_DMA_GBPS, alerts.CONTAINER_WORKING_SET, alerts.CONTAINER_LIMITS,
             alerts.POD_INFO}
    bare |= {value for key, value in vars(routing).items() if key.startswith("ROUTER_METRIC_") and value != routing.ROUTER_METRIC_PREFIX}
    exported = {name + suffix for name in bare for suffix in SUFFIXES}
    return exported | {rule.record for rule in recording.rules()}


def test_config_flags_reach_the_alerts(tmp_path):
    pattern = "https://runbooks.example/spillway#{anchor}"
    assert generator.main(["--out", str(tmp_path), "--dma-floor-gbps", "7.5", "--runbook-url-pattern", pattern]) == 0
    text = (tmp_path / generator.RULES_DIR / generator.ALERTS_FILE).read_text()
    assert "< 7.5" in text and "below 7.5 GB/s" in text
    assert "runbook_url: https://runbooks.example/spillway#spillwaydmathroughputlow" in text


def test_every_row_opens_with_a_description():
    for name, board in load_boards().items():
        panels = board["panels"]
        rows = [i for i, p in enumerate(panels) if p["type"] == "row"]
        assert rows, name
        for i in rows:
            following = panels[i + 1]
            assert following["type"] == "text" and len(following["options"]["content"]) > 80, panels[i]["title"]


def test_every_query_panel_is_described_and_filtered():
    for name, board in load_boards().items():
        variables = {v["name"] for v in board["templating"]["list"]}
        assert {dashboards.NAMESPACE_VAR, dashboards.MODEL_VAR, dashboards.POD_VAR, dashboards.DATASOURCE_VAR} <= variables
        for panel in query_panels(board):
            assert panel.get("description"), (name, panel["title"])
            assert isinstance(panel.get("options"), dict), (name, panel["title"])  # Grafana chokes on null
            assert panel["datasource"]["uid"] == f"${{{dashboards.DATASOURCE_VAR}}}"
            for target in panel["targets"]:
                for matcher in dashboards.FILTER:
                    assert matcher in target["expr"], (panel["title"], target["expr"])


def test_panel_ids_are_unique_and_fit_the_grid():
    for name, board in load_boards().items():
        ids = [p["id"] for p in dashboard_panels(board)]
        assert len(ids) == len(set(ids)), name
        for panel in dashboard_panels(board):
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel.get("title")


def test_product_questions_have_panels():
    """Per pod: bytes each way, DMA p50/p99/mean, hit rate, preemptions vs reloads, pool, TTFT, throughput."""
    board = load_boards()[DASHBOARD_FILES[0].name]
    exprs = " ".join(t["expr"] for p in query_panels(board) for t in p["targets"])
    for record in (recording.OFFLOAD_BYTES_RATE, recording.DMA_GBPS_MEAN, recording.DMA_GBPS_P50,
                   recording.DMA_GBPS_P99, recording.HIT_RATIO, recording.PREEMPTIONS_RATE,
                   recording.PREEMPTED_RELOADS_RATE, recording.ALLOCATION_FAILURES_RATE, recording.TTFT_P99,
                   recording.GENERATION_TOKENS_RATE, Metric.OFFLOAD_CONFIG_INFO, Metric.OFFLOAD_CPU_USAGE):
        assert record in exprs, record


def test_the_router_row_reads_every_router_series_per_vllm_pod():
    """The kv-aware router's requests by decision, matched / prompt blocks, in flight and upstream errors, each
    named by the vLLM pod its worker URL points at (so the model and pod variables select them)."""
    board = load_boards()[DASHBOARD_FILES[0].name]
    panels = dashboard_panels(board)
    row = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Router")
    router_panels = [p for p in panels[row + 1:] if p.get("targets")][:4]
    exprs = " ".join(t["expr"] for p in router_panels for t in p["targets"])
    for metric in (routing.ROUTER_METRIC_REQUESTS, routing.ROUTER_METRIC_MATCHED_BLOCKS,
                   routing.ROUTER_METRIC_PROMPT_BLOCKS, routing.ROUTER_METRIC_IN_FLIGHT,
                   routing.ROUTER_METRIC_UPSTREAM_ERRORS):
        assert metric in exprs, metric
    for panel in router_panels:
        for target in panel["targets"]:
            assert "group_left (pod, model_name)" in target["expr"] and "{{pod}}" in target["legendFormat"]


@pytest.mark.parametrize("source", ["dashboards", "rules", "alert tests"])
def test_expressions_name_only_known_series(source):
    known = known_series()
    if source == "dashboards":
        texts = [t["expr"] for b in load_boards().values() for p in query_panels(b) for t in p["targets"]]
        texts += [v.get("query", "") for b in load_boards().values() for v in b["templating"]["list"]]
    elif source == "rules":
        texts = [r["expr"] for r in recording_rules() + alerting_rules()]
    else:
        texts = [ALERT_TESTS.read_text()]
    used = {name for text in texts for name in SERIES.findall(text)}
    assert used and used <= known, sorted(used - known)


def test_dashboards_read_only_recorded_series_that_exist():
    recorded = {rule["record"] for rule in recording_rules()}
    for board in load_boards().values():
        for panel in query_panels(board):
            for target in panel["targets"]:
                for name in re.findall(r"\bspillway_pod:[A-Za-z0-9_:]+", target["expr"]):
                    assert name in recorded, (panel["title"], name)


def test_alerts_carry_summary_description_runbook_and_severity():
    rules = alerting_rules()
    assert {r["alert"] for r in rules} == {a.name for a in alerts.alerts()}
    for rule in rules:
        assert set(rule["annotations"]) == {"summary", "description", "runbook", "runbook_url"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["for"]


def github_anchors(markdown: str) -> set[str]:
    """The fragment GitHub links each heading with: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_runbook_url_opens_the_alerts_section_in_the_docs():
    metrics_doc = REPO / "docs" / "metrics.md"
    anchors = github_anchors(metrics_doc.read_text())
    for rule in alerting_rules():
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page.endswith("/docs/metrics.md"), url
        assert anchor in anchors, f"{rule['alert']}: {url} has no section '#{anchor}' in docs/metrics.md"


def test_every_alert_has_firing_and_quiet_unit_tests():
    """alerts_test.yaml: each alert fires for some pod and stays quiet for another of the same test."""
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    for alert in alerts.alerts():
        fired, quiet = False, False
        for test in tests:
            cases = [c for c in test.get("alert_rule_test", []) if c["alertname"] == alert.name]
            if not cases:
                continue
            pods = {m.group(1) for s in test["input_series"] for m in [re.search(r'pod="([^"]+)"', s["series"])] if m}
            firing = {a["exp_labels"]["pod"] for c in cases for a in c.get("exp_alerts") or []}
            fired |= bool(firing)
            quiet |= bool(pods - firing) or any(not c.get("exp_alerts") for c in cases)
        assert fired and quiet, alert.name


def test_docs_describe_every_series_alert_and_row():
    docs = (REPO / "docs" / "metrics.md").read_text()
    texts = [t["expr"] for b in load_boards().values() for p in query_panels(b) for t in p["targets"]]
    texts += [r["expr"] for r in recording_rules() + alerting_rules()]
    used = {name.removesuffix("_bucket") for text in texts for name in SERIES.findall(text)}
    names = used | {rule.record for rule in recording.rules()} | {a.name for a in alerts.alerts()}
    names |= {p["title"] for b in load_boards().values() for p in dashboard_panels(b) if p["type"] == "row"}
    missing = sorted(name for name in names if name not in docs)
    assert not missing, f"docs/metrics.md does not mention {missing}"


def test_dashboards_round_trip_through_grafana_models():
    """grafana-foundation-sdk's Dashboard model reads the committed JSON and writes it back unchanged, once the
    keys Grafana's schema lacks (which the SDK adds back with their defaults) are dropped again."""
    import json

    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    for name, board in load_boards().items():
        written = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
        assert dashboards.schema_keys_only(written) == board, name
