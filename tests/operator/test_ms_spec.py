"""ModelServer spec -> checked settings: defaults, and one clear InvalidSpec per kind of mistake."""
from __future__ import annotations

import pytest
from spillway.controller.facts import summarize_node, synthetic_node
from spillway.controller.manifests import desired
from spillway.controller.spec import parse_spec
from spillway.core import k8s_names as names
from spillway.core import vllm_api as api
from spillway.core.errors import InvalidSpec
from spillway.core.options import Connector, EvictionPolicy, Layout
from support.ms_examples import LLAMA_8B, modelserver


def test_a_spec_naming_only_a_model_takes_the_defaults():
    spec = parse_spec({"model": LLAMA_8B})
    request = spec.request
    assert request.tensor_parallel_size == 1 and spec.replicas == 1 and request.replicas_per_node is None
    assert request.block_size is None  # none asked: the plan takes the model's (planner.block_size_for)
    assert spec.image == names.DEFAULT_VLLM_IMAGE
    assert request.offload.enabled and request.offload.size == "auto"
    offload = request.offload
    assert (offload.eviction_policy, offload.layout, offload.connector) == (
        EvictionPolicy.LRU, Layout.CONTIGUOUS, Connector.SPILLWAY)


def test_full_spec_maps_onto_the_serving_request():
    spec = parse_spec({
        "model": LLAMA_8B, "tensorParallelSize": 2, "replicasPerNode": 2, "blockSize": 32, "kvCacheDtype": "fp8",
        "offload": {"size": "200Gi", "evictionPolicy": "arc", "layout": "default", "blockSize": 64,
                    "connector": "native"},
        "modelConfig": {"configMapRef": {"name": "cfg"}}, "hfTokenSecretRef": {"name": "hf"},
    })
    request = spec.request
    assert (request.tensor_parallel_size, request.block_size, request.kv_cache_dtype, request.replicas_per_node) == (
        2, 32, "fp8", 2)
    assert request.offload.size == "200Gi" and request.offload.offload_block_size == 64
    assert request.offload.eviction_policy == "arc" and request.offload.connector == "native"
    assert spec.model_config.config_map.key == "config.json"
    assert spec.hf_token_secret.key == "token"


@pytest.mark.parametrize("spec, words", [
    (None, ["spec.model"]),
    (["model"], ["spec must be an object"]),
    ({}, ["spec.model"]),
    ({"model": "  "}, ["spec.model"]),
    ({"model": LLAMA_8B, "tensorParallelSize": "2"}, ["tensorParallelSize", "integer", "'2'"]),
    ({"model": LLAMA_8B, "tensorParallelSize": 0}, ["tensorParallelSize", ">= 1", "0"]),
    ({"model": LLAMA_8B, "replicas": -1}, ["replicas", ">= 0"]),
    ({"model": LLAMA_8B, "replicas": True}, ["replicas", "integer"]),
    ({"model": LLAMA_8B, "offload": {"evictionPolicy": "fifo"}}, ["evictionPolicy", "lru, arc", "fifo"]),
    ({"model": LLAMA_8B, "offload": {"enabled": "yes"}}, ["offload.enabled", "true or false"]),
    ({"model": LLAMA_8B, "offload": {"size": ["1"]}}, ["offload.size"]),
    ({"model": LLAMA_8B, "kvCacheDtype": "int4"}, ["kvCacheDtype", "int4"]),
    ({"model": LLAMA_8B, "modelConfig": {}}, ["exactly one of inline"]),
    ({"model": LLAMA_8B, "modelConfig": {"inline": {}, "configMapRef": {"name": "x"}}}, ["exactly one"]),
    ({"model": LLAMA_8B, "modelConfig": {"configMapRef": {}}}, ["configMapRef.name is required"]),
    ({"model": LLAMA_8B, "resources": {"limits": {"memory": "10Gi"}}}, ["resources.limits sets memory"]),
    ({"model": LLAMA_8B, "resources": {"requests": {names.GPU_RESOURCE: 1}}}, [names.GPU_RESOURCE]),
    ({"model": LLAMA_8B, "resources": {"claims": []}}, ["requests and limits only"]),
    ({"model": LLAMA_8B, "extraArgs": [f"{api.FLAG_KV_TRANSFER_CONFIG}={{}}"]}, [api.FLAG_KV_TRANSFER_CONFIG]),
    ({"model": LLAMA_8B, "extraArgs": [api.FLAG_TENSOR_PARALLEL_SIZE_SHORT, "4"]},
     [api.FLAG_TENSOR_PARALLEL_SIZE_SHORT]),
    ({"model": LLAMA_8B, "extraArgs": [3]}, ["extraArgs must be strings"]),
    ({"model": LLAMA_8B, "env": [{"name": api.ENV_KV_CACHE_LAYOUT, "value": "x"}]}, [api.ENV_KV_CACHE_LAYOUT]),
    ({"model": LLAMA_8B, "hfTokenSecretRef": {"name": "s"}, "env": [{"name": api.ENV_HF_TOKEN, "value": "x"}]},
     [api.ENV_HF_TOKEN]),
    ({"model": LLAMA_8B, "env": [{"name": "A"}, {"name": "A"}]}, ["sets A twice"]),
    ({"model": LLAMA_8B, "nodeSelector": {"gpu": True}}, ["nodeSelector.gpu"]),
    ({"model": LLAMA_8B, "tolerations": [{"operator": "Maybe"}]}, ["Equal or Exists"]),
    ({"model": LLAMA_8B, "affinity": []}, ["spec.affinity must be an object"]),
])
def test_bad_specs_name_the_field_and_value(spec, words):
    with pytest.raises(InvalidSpec) as raised:
        parse_spec(spec)
    assert raised.value.reason == "InvalidSpec"
    for word in words:
        assert word in str(raised.value)


@pytest.mark.parametrize("field", ["model", "revision", "servedModelName"])
def test_flag_shaped_command_line_values_are_invalid_spec(field):
    spec = {"model": LLAMA_8B, field: "--cpu-offload-gb=900"}
    with pytest.raises(InvalidSpec, match=f"spec.{field} .* flag"):
        parse_spec(spec)


def test_max_model_len_in_extra_args_is_planned_for():
    """A sliding-window model holds fewer prefix tokens per chunk at a shorter request length (groups.py)."""
    nodes = [summarize_node(synthetic_node("2Ti", 8))]
    default, short = (desired(modelserver(model="google/gemma-3-12b-it", extraArgs=extra), nodes).plan.pool
                      for extra in ([], ["--max-model-len", "8K"]))
    assert parse_spec({"model": LLAMA_8B, "extraArgs": ["--max_model_len=8K"]}).max_model_len == 8192
    assert short.bytes == default.bytes and short.tokens < default.tokens
