"""Every rendered object is valid for the oldest and newest Kubernetes the chart supports.

Built-in kinds (and the CustomResourceDefinition itself) go through kubernetes-validate in strict mode
(unknown fields are errors). ModelServers are checked against the chart's own CRD schema. The Prometheus
Operator's kinds (PodMonitor, PrometheusRule) have no schema here: they are skipped explicitly.
"""
from __future__ import annotations

import functools
import json

import jsonschema
import kubernetes_validate
import pytest
from spillway.core import k8s_names
from support.chart_render import KUBE_NEWEST, KUBE_OLDEST, SCENARIOS, crd_documents, modelserver_crd, render_scenario

# Custom resources of the Prometheus Operator: not in kubernetes-validate's schemas, and this
# repository does not carry the operator's CRDs; their shape is asserted in test_render.py.
SKIPPED_KINDS = {"PodMonitor", "PrometheusRule"}


def served_schema(crd: dict) -> dict:
    version, = [v for v in crd["spec"]["versions"] if v["name"] == k8s_names.VERSION and v["served"]]
    return version["schema"]["openAPIV3Schema"]


def validate_modelserver(doc: dict) -> None:
    schema = served_schema(modelserver_crd())
    # The API server fills metadata itself; the CRD schema describes spec (and status).
    jsonschema.validate({key: value for key, value in doc.items() if key != "metadata"},
                        {**schema, "properties": {k: v for k, v in schema["properties"].items() if k != "metadata"}})


@functools.cache
def kubernetes_error(doc_json: str, kube_version: str) -> str | None:
    # Cached by content: Helm 3 and Helm 4 render identical objects, each is validated once per version.
    try:
        kubernetes_validate.validate(json.loads(doc_json), kube_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("kube_version", [KUBE_OLDEST, KUBE_NEWEST])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_objects_are_valid(helm, scenario, kube_version):
    checked = set()
    for doc in render_scenario(helm, scenario):
        kind = doc["kind"]
        if kind in SKIPPED_KINDS:
            continue
        if kind == k8s_names.KIND:
            validate_modelserver(doc)
        else:
            error = kubernetes_error(json.dumps(doc, sort_keys=True), kube_version)
            assert error is None, f"{kind} {doc['metadata']['name']} is invalid for Kubernetes {kube_version}: {error}"
        checked.add(kind)
    assert {"Deployment", "Service", "ServiceAccount", "CustomResourceDefinition"} <= checked


def test_chart_carries_the_modelserver_crd():
    crd = modelserver_crd()
    assert crd["spec"]["group"] == k8s_names.GROUP
    assert crd["spec"]["names"]["plural"] == k8s_names.PLURAL
    assert k8s_names.SHORT_NAME in crd["spec"]["names"].get("shortNames", [])
    assert all(doc.get("kind") == "CustomResourceDefinition" for doc in crd_documents())


def test_crd_schema_refuses_a_modelserver_without_a_model():
    # Guards the check above: the schema really constrains spec.
    with pytest.raises(jsonschema.ValidationError):
        validate_modelserver({"apiVersion": k8s_names.API_VERSION, "kind": k8s_names.KIND, "spec": {"replicas": 1}})
