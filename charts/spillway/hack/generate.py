#!/usr/bin/env python3
"""Write the parts of the chart that derive from other files (tests/chart fails when they are stale).

1. values.schema.json, definitions.modelServerSpec: the ModelServer CRD's spec schema
   (crds/modelservers.spillway.dev.yaml), made strict: the API server silently prunes unknown fields,
   so `helm install` refuses a misspelled field in `models:` instead.
2. docs/chart.md, the values table: every key of values.schema.json with its type, its default from
   values.yaml and its description.

    python charts/spillway/hack/generate.py          # rewrite both
    python charts/spillway/hack/generate.py --check  # exit 1 when either is stale
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1]
REPO = CHART.parents[1]
SCHEMA = CHART / "values.schema.json"
VALUES = CHART / "values.yaml"
CRD = CHART / "crds" / "modelservers.spillway.dev.yaml"
DOCS = REPO / "docs" / "chart.md"
TABLE_START, TABLE_END = "<!-- values table: start -->", "<!-- values table: end -->"
CRD_VERSION = "v1alpha1"


# -- 1. the ModelServer spec schema ----------------------------------------------------------------------

def strict_schema(node: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI v3 structural schema as JSON Schema (draft 7) that also refuses unknown keys."""
    node = dict(node)
    open_object = node.pop("x-kubernetes-preserve-unknown-fields", False)
    int_or_string = node.pop("x-kubernetes-int-or-string", False)
    for key in [k for k in node if k.startswith("x-kubernetes-")] + ["format"]:
        node.pop(key, None)  # CEL rules and OpenAPI formats are the API server's to enforce
    if node.pop("nullable", False) and "type" in node:
        node["type"] = [node["type"], "null"]
    if int_or_string and "anyOf" not in node:
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node:
        node["properties"] = {name: strict_schema(sub) for name, sub in node["properties"].items()}
        if not open_object:
            node.setdefault("additionalProperties", False)
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = strict_schema(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        node["items"] = strict_schema(node["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            node[key] = [strict_schema(sub) for sub in node[key]]
    return node


def modelserver_spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    version, = [v for v in crd["spec"]["versions"] if v["name"] == CRD_VERSION]
    return strict_schema(version["schema"]["openAPIV3Schema"]["properties"]["spec"])


def values_schema_text() -> str:
    schema = json.loads(SCHEMA.read_text())
    schema["definitions"]["modelServerSpec"] = modelserver_spec_schema()
    return json.dumps(schema, indent=2) + "\n"


# -- 2. the values table ---------------------------------------------------------------------------------

def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = schema
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def value_rows(schema: dict[str, Any], node: dict[str, Any], values: Any, prefix: str = "") -> list[tuple]:
    """(key, type, default, description) for every documented leaf under node."""
    rows = []
    for name, sub in node.get("properties", {}).items():
        sub = resolve(schema, sub)
        key = f"{prefix}{name}"
        default = values.get(name) if isinstance(values, dict) else None
        if name == "global":
            continue
        children = [resolve(schema, child) for child in sub.get("properties", {}).values()]
        if sub.get("type") == "object" and children and all(child.get("description") for child in children):
            rows += value_rows(schema, sub, default or {}, key + ".")
        else:
            kind = sub.get("type", "object")
            kind = " or ".join(kind) if isinstance(kind, list) else kind
            rows.append((key, kind, json.dumps(default, separators=(", ", ": ")), sub.get("description", "")))
    return rows


def table_text() -> str:
    schema = json.loads(values_schema_text())
    values = yaml.safe_load(VALUES.read_text())
    lines = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for key, kind, default, description in value_rows(schema, schema, values):
        cells = [f"`{key}`", kind, f"`{default}`", description.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def docs_text() -> str:
    text = DOCS.read_text()
    head, found, rest = text.partition(TABLE_START)
    _, found_end, tail = rest.partition(TABLE_END)
    if not (found and found_end):
        sys.exit(f"{DOCS.relative_to(REPO)} lacks the markers {TABLE_START} ... {TABLE_END}")
    return f"{head}{TABLE_START}\n{table_text()}\n{TABLE_END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="report stale files instead of writing them")
    args = parser.parse_args()
    stale = []
    # The schema first: the table is read from the schema as written.
    for path, render in ((SCHEMA, values_schema_text), (DOCS, docs_text)):
        text = render()
        if path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        names = ", ".join(str(p.relative_to(REPO)) for p in stale)
        print(f"stale: {names}; run python {Path(__file__).relative_to(REPO)}", file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
