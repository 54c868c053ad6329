"""values.schema.json refuses bad values: `helm template` fails, with Helm 4 and Helm 3, and says where."""
from __future__ import annotations

import json

import pytest
import yaml
from support.chart_render import CHART, REPO, model, render, render_failure

BAD_VALUES = {
    "unknown top-level key": ({"replicas": 2}, "replicas"),
    "unknown operator key": ({"operator": {"replicas": 2}}, "replicas"),
    "unknown nested key": ({"monitoring": {"dashboards": {"folder": "x"}}}, "folder"),
    "wrong type": ({"operator": {"verbose": "yes"}}, "verbose"),
    "wrong type for a list": ({"operator": {"watchNamespaces": "team-a"}}, "watchNamespaces"),
    "bad namespace name": ({"operator": {"watchNamespaces": ["Team_A"]}}, "watchNamespaces"),
    "repeated namespace": ({"operator": {"watchNamespaces": ["a", "a"]}}, "watchNamespaces"),
    "bad enum": ({"operator": {"logFormat": "xml"}}, "logFormat"),
    "bad pull policy": ({"operator": {"image": {"pullPolicy": "Sometimes"}}}, "pullPolicy"),
    "bad digest": ({"operator": {"image": {"digest": "latest"}}}, "digest"),
    "privileged port": ({"operator": {"healthPort": 80}}, "healthPort"),
    "bad interval": ({"monitoring": {"interval": "often"}}, "interval"),
    "non-string label": ({"monitoring": {"labels": {"release": 1}}}, "release"),
    "bad toleration": ({"operator": {"tolerations": [{"key": "a", "effect": "Sometimes"}]}}, "effect"),
    "model without spec": ({"models": [{"name": "a"}]}, "spec"),
    "model name not a DNS label": ({"models": [model("Llama_8B")]}, "name"),
    "model spec without a model": ({"models": [{"name": "a", "spec": {"replicas": 1}}]}, "model"),
    "misspelled model spec field": ({"models": [model("a", tensorParalelSize=2)]}, "tensorParalelSize"),
    "model spec field of the wrong type": ({"models": [model("a", replicas="two")]}, "replicas"),
    "bad offload size": ({"models": [model("a", offload={"size": "lots"})]}, "size"),
    "unknown offload field": ({"models": [model("a", offload={"sise": "auto"})]}, "sise"),
    "bad test timeout": ({"tests": {"timeoutSeconds": 0}}, "timeoutSeconds"),
}

# Refused by the templates (what a schema cannot express).
BAD_COMBINATIONS = {
    "model listed twice": ({"models": [model("a"), model("a")]}, "listed twice"),
    "model outside the watched namespaces": (
        {"operator": {"watchNamespaces": ["team-a"]}, "models": [model("a", "team-b")]}, "watchNamespaces"),
    "model in the release namespace, which is not watched": (
        {"operator": {"watchNamespaces": ["team-a"]}, "models": [model("a")]}, "watchNamespaces"),
    "existing service account without a name": ({"serviceAccount": {"create": False}}, "serviceAccount.name"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_schema_refuses(helm, case):
    values, where = BAD_VALUES[case]
    assert where in render_failure(helm, values)


@pytest.mark.parametrize("case", sorted(BAD_COMBINATIONS))
def test_templates_refuse(helm, case):
    values, message = BAD_COMBINATIONS[case]
    assert message in render_failure(helm, values)


def test_schema_accepts_the_documented_example_modelserver(helm):
    example = yaml.safe_load((REPO / "docs" / "examples" / "modelserver.yaml").read_text())
    docs = render(helm, {"models": [{"name": example["metadata"]["name"], "spec": example["spec"]}]})
    assert any(doc["kind"] == "ModelServer" and doc["spec"] == example["spec"] for doc in docs)


def test_defaults_satisfy_the_schema_and_every_key_is_described():
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, schema)

    def resolved(node: dict) -> dict:
        return schema["definitions"]["image"] if node.get("$ref") == "#/definitions/image" else node

    def walk(node: dict, value: object, key: str) -> None:
        children = node.get("properties", {})
        # Like the values table: an object whose keys are all described is documented key by key.
        if isinstance(value, dict) and children and all(resolved(c).get("description") for c in children.values()):
            for name, sub in value.items():
                assert name in children, f"{key}{name} is not in values.schema.json"
                walk(resolved(children[name]), sub, f"{key}{name}.")
        else:
            assert node.get("description"), f"{key.rstrip('.')} has no description in values.schema.json"

    walk(schema, values, "")


def test_values_table_documents_every_value():
    text = (REPO / "docs" / "chart.md").read_text()
    table = text.split("<!-- values table: start -->")[1].split("<!-- values table: end -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert rows
    for row in rows:
        assert row.split(" | ")[-1].rstrip(" |"), f"no description: {row}"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for top in values:
        assert f"| `{top}" in table, f"{top} is not in docs/chart.md"
