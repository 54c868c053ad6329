"""docs/chart.md's table of the operator's rights is the chart's: every rule the chart grants the operator is
a row with the same verbs, and every row is granted (rendered with every option that adds a right)."""
from __future__ import annotations

import re

from support.chart_render import REPO, render

DOC = REPO / "docs" / "chart.md"
# hubFetch with watched namespaces grants Secret reads: the widest set of rules the chart renders.
WIDEST = {"operator": {"hubFetch": {"enabled": True}, "watchNamespaces": ["team-a"]}}


def _granted(helm: str) -> dict[str, set[str]]:
    """resource[.group] -> verbs, over the operator's Roles and ClusterRoles."""
    granted: dict[str, set[str]] = {}
    for doc in render(helm, WIDEST):
        if doc["kind"] not in ("Role", "ClusterRole") or "operator" not in doc["metadata"]["name"]:
            continue
        for rule in doc.get("rules") or []:
            for group in rule.get("apiGroups") or [""]:
                for resource in rule["resources"]:
                    granted.setdefault(f"{resource}.{group}" if group else resource, set()).update(rule["verbs"])
    return granted


def _documented() -> dict[str, set[str]]:
    text = DOC.read_text()
    table = text[text.index("| Resource | Verbs | Used for |"):].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        resource_cell, verbs_cell = (cell.strip() for cell in line.strip("|").split("|")[:2])
        resource, = re.findall(r"`([^`]+)`", resource_cell)[:1]
        rows[resource] = {verb.strip() for verb in verbs_cell.split(",")}
    return rows


def test_the_rbac_table_lists_exactly_the_rights_the_chart_grants(helm):
    granted, documented = _granted(helm), _documented()
    assert granted, "no operator Role or ClusterRole rendered"
    assert documented == granted, {
        "granted, not in docs/chart.md": {r: sorted(v) for r, v in granted.items() if documented.get(r) != v},
        "in docs/chart.md, not granted": {r: sorted(v) for r, v in documented.items() if granted.get(r) != v},
    }
