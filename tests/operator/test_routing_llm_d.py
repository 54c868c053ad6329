"""llm-d mode against upstream's own formats: the InferencePool admitted by the released v1 CRDs of Gateway API
Inference Extension (v1.0.0, the first v1 release, and v1.6.0, vendored in schemas/ with their provenance; strict
field validation, defaults and CEL rules as the API server applies them), and the endpoint-picker config decoded
as llm-d-router v0.10.0 decodes it (schemas/llm-d-router-v0.10.0-epp-config.schema.json, transcribed from its Go
structs: unknown fields fail), its references resolved, and its KV-event topic filter matched against what the
rendered vLLM pods publish, over a real ZMQ socket."""
from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
import zmq
from spillway.controller.facts import summarize_node
from spillway.controller.manifests import desired, labels
from spillway.core import k8s_names as names
from spillway.core import routing
from spillway.core import vllm_api as api
from support.crd_schema import admit
from support.ms_examples import gpu_node, modelserver

SCHEMAS = Path(__file__).parent / "schemas"
GIE_RELEASES = ("v1.0.0", "v1.6.0")
EPP_SCHEMA = json.loads((SCHEMAS / "llm-d-router-v0.10.0-epp-config.schema.json").read_text())


def pool_schema(release: str) -> dict:
    crd = yaml.safe_load((SCHEMAS / f"gie-{release}-inferencepools.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == names.INFERENCEPOOL_VERSION)
    assert crd["spec"]["group"] == names.INFERENCEPOOL_GROUP and crd["spec"]["names"]["kind"] == names.INFERENCEPOOL_KIND
    return version["schema"]["openAPIV3Schema"]


def render(replicas: int = 3, **spec):
    body = modelserver(replicas=replicas, routing={"mode": routing.MODE_LLM_D}, **spec)
    body["metadata"]["uid"] = "0b8f5f5e-0000-4000-8000-000000000000"
    return desired(body, [summarize_node(gpu_node("g"))])


def objects(result) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in result.objects}


class _StrictLoader(yaml.SafeLoader):
    """A duplicate key is an error, as in the Kubernetes codec llm-d-router decodes its file with."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        if len(keys) != len(set(keys)):
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key in {keys}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def decode_epp_config(text: str) -> dict:
    """What llm-d-router's loader refuses, refused: unknown or misspelt fields at any depth, unknown plugin
    types, references to plugins that are not declared (a plugin's name defaults to its type)."""
    config = yaml.load(text, Loader=_StrictLoader)
    jsonschema.validate(config, EPP_SCHEMA)
    declared = [p.get("name", p["type"]) for p in config["plugins"]]
    assert len(declared) == len(set(declared)), f"plugin names repeat: {declared}"
    types = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    refs = [r["pluginRef"] for profile in config["schedulingProfiles"] for r in profile["plugins"]]
    for source in (config.get("dataLayer") or {}).get("sources", []):
        refs += [source["pluginRef"], *(e["pluginRef"] for e in source.get("extractors", []))]
    for plugin in config["plugins"]:
        producer = (plugin.get("parameters") or {}).get("prefixMatchInfoProducerName")
        if producer is not None:
            refs.append(producer)
            assert types.get(producer) in routing.LLM_D_PRODUCER_PLUGINS.values(), producer
    missing = sorted(set(refs) - set(declared))
    assert not missing, f"references to undeclared plugins: {missing}"
    return config


@pytest.mark.parametrize("release", GIE_RELEASES)
def test_the_inference_pool_is_admitted_by_each_released_v1_crd(release):
    pool = objects(render())[(names.INFERENCEPOOL_KIND, "llama")]
    admitted, errors = admit(pool, pool_schema(release))
    assert errors == []
    ref = admitted["spec"]["endpointPickerRef"]
    assert ref == {"name": "llama-epp", "kind": "Service", "group": "", "port": {"number": routing.EPP_PORT},
                   "failureMode": "FailOpen"}


@pytest.mark.parametrize("release", GIE_RELEASES)
def test_the_pre_v1_extension_ref_is_refused(release):
    """The field of the unreleased main-dev schema, `extensionRef.portNumber`, fails strict validation."""
    pool = objects(render())[(names.INFERENCEPOOL_KIND, "llama")]
    ref = pool["spec"].pop("endpointPickerRef")
    pool["spec"]["extensionRef"] = {"name": ref["name"], "portNumber": ref["port"]["number"]}
    _, errors = admit(pool, pool_schema(release))
    assert any("extensionRef" in e for e in errors), errors


def test_a_service_picker_without_a_port_breaks_the_crds_cel_rule():
    pool = objects(render())[(names.INFERENCEPOOL_KIND, "llama")]
    del pool["spec"]["endpointPickerRef"]["port"]
    _, errors = admit(pool, pool_schema("v1.6.0"))
    assert any("port is required" in e for e in errors), errors


def test_the_endpoint_picker_config_decodes_strictly_with_every_stage():
    result = render()
    text = objects(result)[("ConfigMap", "llama-epp")]["data"]["config.yaml"]
    config = decode_epp_config(text)
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    types = [p["type"] for p in config["plugins"]]
    for stage in ("token-producer", "precise-prefix-cache-producer", "prefix-cache-scorer", "queue-scorer",
                  "kv-cache-utilization-scorer", "max-score-picker", "single-profile-handler"):
        assert stage in types
    profile = {p["pluginRef"]: p.get("weight") for p in config["schedulingProfiles"][0]["plugins"]}
    assert profile["prefix-cache-scorer"] > profile["queue-scorer"] > 0 and "max-score-picker" in profile
    assert [s["pluginRef"] for s in config["dataLayer"]["sources"]] == ["metrics-data-source",
                                                                        "endpoint-notification-source"]


def test_the_precise_index_weights_both_tiers_and_holds_the_planned_pools():
    result = render(replicas=3)
    config = decode_epp_config(objects(result)[("ConfigMap", "llama-epp")]["data"]["config.yaml"])
    producer = next(p for p in config["plugins"] if p["type"] == "precise-prefix-cache-producer")["parameters"]
    tiers = {b["name"]: b["weight"] for b in producer["indexerConfig"]["kvCacheBackendConfigs"]}
    assert tiers == {"gpu": 1.0, "cpu": routing.LLM_D_CPU_TIER_WEIGHT}
    pool_blocks = result.plan.pool.tokens // result.plan.layout.block_size
    assert producer["indexerConfig"]["kvBlockIndexConfig"]["inMemoryConfig"] == {"size": 3 * pool_blocks,
                                                                                 "podCacheSize": 6}
    assert producer["tokenProcessorConfig"]["blockSizeTokens"] == result.plan.layout.block_size


def test_pod_discovery_selects_the_vllm_pods():
    result = render()
    config = decode_epp_config(objects(result)[("ConfigMap", "llama-epp")]["data"]["config.yaml"])
    discovery = next(p for p in config["plugins"]
                     if p["type"] == "precise-prefix-cache-producer")["parameters"]["kvEventsConfig"]
    assert discovery["discoverPods"] is True
    wanted = dict(kv.split("=", 1) for kv in discovery["podDiscoveryConfig"]["podLabelSelector"].split(","))
    pod_labels = objects(result)[("Deployment", "llama")]["spec"]["template"]["metadata"]["labels"]
    assert wanted.items() <= pod_labels.items() and wanted
    assert not wanted.items() <= labels("other").items()  # another ModelServer's pods are not taken
    assert discovery["podDiscoveryConfig"]["socketPort"] == routing.KV_EVENTS_PORT
    assert discovery["podDiscoveryConfig"]["podNamespace"] == "default"


def _pod_events_config(result) -> tuple[dict, list[dict]]:
    container = objects(result)[("Deployment", "llama")]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    return json.loads(args[args.index(api.FLAG_KV_EVENTS_CONFIG) + 1]), container["env"]


def test_the_topic_filter_receives_what_the_pods_publish():
    """vLLM's ZMQ publisher sends (topic, seq, payload) frames (vllm/distributed/kv_events.py
    ZmqEventPublisher); llm-d subscribes with its topicFilter and parses the topic into pod and model
    (llm-d-kv-cache engineadapter parseTopic). Kubernetes expands $(SPILLWAY_POD_IP) in the args."""
    result = render()
    events, env = _pod_events_config(result)
    assert {"name": routing.ENV_POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in env
    topic = events[routing.KV_EVENTS_TOPIC_KEY].replace(f"$({routing.ENV_POD_IP})", "10.1.2.3")
    config = decode_epp_config(objects(result)[("ConfigMap", "llama-epp")]["data"]["config.yaml"])
    topic_filter = next(p for p in config["plugins"]
                        if p["type"] == "precise-prefix-cache-producer")["parameters"]["kvEventsConfig"]["topicFilter"]
    context = zmq.Context()
    pub, sub = context.socket(zmq.PUB), context.socket(zmq.SUB)
    try:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub.setsockopt(zmq.SUBSCRIBE, topic_filter.encode())
        sub.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(0.3)  # a SUB socket drops what was published before it joined
        for seq in range(10):
            pub.send_multipart((topic.encode(), seq.to_bytes(8, "big"), b"batch"))
        received = []
        while sub.poll(1000):
            received.append(sub.recv_multipart())
    finally:
        pub.close(0)
        sub.close(0)
        context.term()
    assert len(received) == 10
    parts = received[0][0].decode().split("@")
    assert parts == ["kv", f"10.1.2.3:{api.SERVER_PORT}", result.spec.served_model_name or result.spec.model]


@pytest.mark.parametrize(("path", "value"), [
    (("indexerConfig", "backendConfigs"), [{"name": "cpu", "weight": 0.8}]),  # kvCacheBackendConfigs
    (("kvEventsConfig", "podDiscoveryConfig", "port"), 5557),  # socketPort
    (("tokenProcessorConfig", "blocksize"), 64),
])
def test_a_misspelt_parameter_fails_like_llm_d_router(path, value):
    result = render()
    config = yaml.safe_load(objects(result)[("ConfigMap", "llama-epp")]["data"]["config.yaml"])
    node = next(p for p in config["plugins"] if p["type"] == "precise-prefix-cache-producer")["parameters"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        decode_epp_config(yaml.safe_dump(config))


def test_the_old_form_of_the_config_fails():
    """The parameters as first rendered: the approximate producer's fields on the scorer, the deprecated
    precise scorer with a misnamed backend list, and the pre-llm-d.ai apiVersion."""
    old = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
           "plugins": [{"type": "prefix-cache-scorer", "parameters": {"autoTune": False, "blockSize": 64,
                                                                      "lruCapacityPerServer": 1000}}],
           "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "prefix-cache-scorer"}]}]}
    with pytest.raises(jsonschema.ValidationError):
        decode_epp_config(yaml.safe_dump(old))
    old["apiVersion"] = "llm-d.ai/v1alpha1"
    with pytest.raises(jsonschema.ValidationError, match="autoTune"):
        decode_epp_config(yaml.safe_dump(old))
    old["plugins"] = [{"type": "precise-prefix-cache-scorer", "parameters": {}}]
    with pytest.raises(jsonschema.ValidationError):
        decode_epp_config(yaml.safe_dump(old))


def test_an_undeclared_reference_fails():
    config = yaml.safe_load(objects(render())[("ConfigMap", "llama-epp")]["data"]["config.yaml"])
    config["schedulingProfiles"][0]["plugins"].append({"pluginRef": "load-aware-scorer", "weight": 1.0})
    with pytest.raises(AssertionError, match="load-aware-scorer"):
        decode_epp_config(yaml.safe_dump(config))


# -- the plan's capacity and block size, for a dense model and for hybrids ---------------------------------------------

HYBRID = "nvidia/Nemotron-H-8B-Base-8K"  # Mamba layers: vLLM enlarges the block past --block-size


def _producer(result) -> dict:
    config = decode_epp_config(objects(result)[("ConfigMap", "llama-epp")]["data"]["config.yaml"])
    scorer = next(p for p in config["plugins"] if p["type"] == "prefix-cache-scorer")["parameters"]
    return next(p for p in config["plugins"] if p["type"] == scorer["prefixMatchInfoProducerName"])["parameters"]


@pytest.mark.parametrize("model", [None, HYBRID, "Qwen/Qwen3-Next-80B-A3B-Instruct"])
def test_the_precise_producer_carries_the_plans_block_and_capacity(model):
    result = render(replicas=3, **({"model": model} if model else {}))
    block = result.plan.layout.kv_block_size
    if model:
        assert block > result.plan.layout.block_size  # a hybrid: 64 asked, vLLM's block larger
    else:
        assert block == result.plan.layout.block_size
    producer = _producer(result)
    assert producer["tokenProcessorConfig"]["blockSizeTokens"] == block
    assert producer["indexerConfig"]["kvBlockIndexConfig"]["inMemoryConfig"]["size"] == \
        3 * (result.plan.pool.tokens // block)
    assert producer["speculativeIndexing"] is True


@pytest.mark.parametrize("model", [None, HYBRID])
def test_the_approximate_producer_carries_the_plans_block_and_capacity_and_needs_no_events(model):
    body = modelserver(replicas=3, routing={"mode": routing.MODE_LLM_D, "producer": "approximate"},
                       **({"model": model} if model else {}))
    body["metadata"]["uid"] = "0b8f5f5e-0000-4000-8000-000000000000"
    result = desired(body, [summarize_node(gpu_node("g"))])
    block = result.plan.layout.kv_block_size
    assert _producer(result) == {"blockSizeTokens": block, "autoTune": False,
                                 "lruCapacityPerServer": result.plan.pool.tokens // block}
    rendered = objects(result)
    container = rendered[("Deployment", "llama")]["spec"]["template"]["spec"]["containers"][0]
    assert api.FLAG_KV_EVENTS_CONFIG not in container["args"]  # nothing reads events: none published
    ports = [p for rule in rendered[("NetworkPolicy", "llama")]["spec"]["ingress"] for p in rule.get("ports", [])]
    assert routing.KV_EVENTS_PORT not in [p["port"] for p in ports]
    config = decode_epp_config(rendered[("ConfigMap", "llama-epp")]["data"]["config.yaml"])
    assert "endpoint-notification-source" not in [p["type"] for p in config["plugins"]]


def test_the_producer_is_llm_ds_only():
    from spillway.core.errors import InvalidSpec
    with pytest.raises(InvalidSpec, match="producer chooses llm-d"):
        desired(modelserver(replicas=2, routing={"mode": "kv-aware", "producer": "approximate"}),
                [summarize_node(gpu_node("g"))])
    with pytest.raises(InvalidSpec, match="producer must be one of"):
        desired(modelserver(replicas=2, routing={"mode": "llm-d", "producer": "exact"}),
                [summarize_node(gpu_node("g"))])
