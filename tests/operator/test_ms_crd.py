"""The ModelServer CRD: names, printer columns, defaults that agree with the operator's, and its schema
(OpenAPI v3 via jsonschema, CEL rules via cel-python) accepting good resources and rejecting bad ones."""
from __future__ import annotations

import copy
import re

import celpy
import kubernetes_validate
import pytest
import yaml
from spillway.controller.facts import summarize_node
from spillway.controller.manifests import desired
from spillway.controller.spec import parse_spec
from spillway.core import k8s_names as names
from spillway.core.errors import SpillwayError
from support.crd_schema import REPO, admit, crd, rules, version_schema
from support.ms_examples import gpu_node, modelserver

EXAMPLE = REPO / "docs" / "examples" / "modelserver.yaml"


def test_names_match_k8s_names():
    doc = crd()
    assert doc["metadata"]["name"] == f"{names.PLURAL}.{names.GROUP}"
    spec = doc["spec"]
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"], spec["scope"]) == (
        names.GROUP, names.KIND, names.PLURAL, "Namespaced")
    assert names.SHORT_NAME in spec["names"]["shortNames"]
    version, = spec["versions"]
    assert version["name"] == names.VERSION and version["served"] and version["storage"]
    assert "status" in version["subresources"]


def _resolve(schema, json_path):
    node = schema
    for part in re.sub(r"\[[^\]]*\]", "", json_path).strip(".").split("."):
        if part == "metadata":
            return {"type": "object"}
        node = node["properties"][part] if "properties" in node else node["items"]["properties"][part]
    return node


def test_printer_columns_point_at_schema_fields_of_their_type():
    version, = crd()["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert {"Model", "TP", "Offload GiB", "Cached Tokens", "Ready", "Age"} <= set(columns)
    schema = version_schema()
    for column in columns.values():
        if column["type"] == "date":
            continue
        assert _resolve(schema, column["jsonPath"])["type"] == column["type"], column


def test_schema_defaults_agree_with_the_operator():
    bare = modelserver()
    defaulted, errors = admit(bare)
    assert errors == []
    assert defaulted["spec"]["offload"]["size"] == "auto"
    assert parse_spec(defaulted["spec"]) == parse_spec(bare["spec"])


def test_every_cel_rule_compiles():
    env = celpy.Environment()
    found = rules()
    assert len(found) >= 7
    for rule in found:
        env.compile(rule)


GOOD = {
    "example": yaml.safe_load(EXAMPLE.read_text()),
    "minimal": modelserver(),
    "fraction": modelserver(offload={"size": "0.5"}),
    "whole-share": modelserver(offload={"size": "1"}),
    "quantity": modelserver(offload={"size": "200Gi", "blockSize": 64}, blockSize=32),
    "no-offload": modelserver(offload={"enabled": False}),
    "inline-config": modelserver(model="acme/x", modelConfig={"inline": {"architectures": ["LlamaForCausalLM"],
                                                                         "num_hidden_layers": 2}}),
    "configmap": modelserver(modelConfig={"configMapRef": {"name": "cfg"}}),
    "extras": modelserver(resources={"requests": {"cpu": "8", "ephemeral-storage": "100Gi"}, "limits": {"cpu": 16}},
                          env=[{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"secretKeyRef": {}}}],
                          affinity={"nodeAffinity": {}}, tolerations=[{"operator": "Exists"}]),
}


@pytest.mark.parametrize("name", GOOD)
def test_good_resources_are_admitted(name):
    obj, errors = admit(GOOD[name])
    assert errors == []
    parse_spec(obj["spec"])  # and the operator reads them


BAD = {
    # name: (object, words in the API server's error, whether the operator's own checks also refuse it)
    "no-model": ({"spec": {}}, ["'model' is a required property"], True),
    "tp-zero": ({"spec": {"tensorParallelSize": 0}}, ["0 is less than the minimum of 1"], True),
    "tp-string": ({"spec": {"tensorParallelSize": "2"}}, ["'2' is not of type 'integer'"], True),
    "replicas-negative": ({"spec": {"replicas": -1}}, ["less than the minimum"], True),
    "eviction": ({"spec": {"offload": {"evictionPolicy": "fifo"}}}, ["'fifo' is not one of"], True),
    "layout": ({"spec": {"offload": {"layout": "rows"}}}, ["'rows' is not one of"], True),
    "size-word": ({"spec": {"offload": {"size": "lots"}}}, ["does not match"], True),
    "size-fraction": ({"spec": {"offload": {"size": "1.5"}}}, ["fractional offload size must be in (0, 1]"], True),
    "size-zero": ({"spec": {"offload": {"size": "0"}}}, ["set enabled: false instead"], True),
    "chunk": ({"spec": {"blockSize": 16, "offload": {"blockSize": 24}}}, ["multiple of blockSize"], True),
    "config-both": ({"spec": {"modelConfig": {"inline": {}, "configMapRef": {"name": "c"}}}}, ["exactly one"], True),
    "config-none": ({"spec": {"modelConfig": {}}}, ["exactly one"], True),
    "memory": ({"spec": {"resources": {"limits": {"memory": "1Ti"}}}}, ["planned by Spillway"], True),
    "gpus": ({"spec": {"resources": {"requests": {"nvidia.com/gpu": 2}}}}, ["planned by Spillway"], True),
    "quantity": ({"spec": {"resources": {"requests": {"cpu": "eight"}}}}, ["does not match"], False),
    "name": ({"metadata": {"name": "Llama_8B"}}, ["DNS label"], True),
    "typo": ({"spec": {"replica": 2}}, ["Additional properties are not allowed ('replica'"], False),
    "env-twice": ({"spec": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}}, ["duplicate"], True),
    "toleration": ({"spec": {"tolerations": [{"operator": "Maybe"}]}}, ["'Maybe' is not one of"], True),
    "dtype": ({"spec": {"kvCacheDtype": "int4"}}, ["'int4' is not one of"], True),
    "vllm-version": ({"spec": {"vllmVersion": "0.29.1"}}, ["does not match"], True),
}


def _merge(base, patch):
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict) and value:
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


@pytest.mark.parametrize("name", BAD)
def test_bad_resources_are_rejected(name):
    patch, words, operator_refuses = BAD[name]
    obj = _merge(modelserver(), patch)
    _, errors = admit(obj)
    assert errors, f"{name} was admitted"
    for word in words:
        assert any(word in e for e in errors), errors
    if operator_refuses:
        # What got past an older schema (or an emulator without validation) must not get past the operator.
        with pytest.raises(SpillwayError):
            desired(obj, [summarize_node(gpu_node("g"))])


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_the_crd_itself_validates_strictly(version):
    kubernetes_validate.validate(crd(), version, strict=True)
