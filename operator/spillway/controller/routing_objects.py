"""spec.routing -> the objects in front of the replicas, and what routing changes on the vLLM pods.

kv-aware: the Service <name> (the user's endpoint) selects a router Deployment <name>-router. Its pods run
`spillway route` (prefix affinity, core/affinity.py), which resolves the headless Service <name>-replicas (DNS
answers with the ready vLLM pods' IPs: no Kubernetes API access, so no RBAC and no service account token) and
remembers up to the planned pool's blocks per pod.
llm-d: an InferencePool selecting the vLLM pods and a ConfigMap with the endpoint picker's configuration for
llm-d-router, which the user's Gateway runs; the Service <name> keeps pointing at the pods.
llm-d: every vLLM pod publishes KV events (ZMQ, port kv-events) with self-describing CPU-medium stores and a
fixed PYTHONHASHSEED, which llm-d's indexer reads; kv-aware's router reads none, so its pods publish none.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from ..core import affinity, routing
from ..core import k8s_names as names
from ..core import vllm_api as api
from ..core.planner import Plan
from ..core.quantity import parse_bytes, to_quantity
from .autoscaling import autoscaler_keys
from .hardening import PROMETHEUS_NAME
from .objects import derived_name, metadata, selector, with_hash
from .spec import ModelServerSpec

ROUTER_REQUESTS = {"cpu": "500m"}  # memory: router_memory_bytes, request = limit
EPP_CONFIG_KEY = "config.yaml"


def router_name(name: str) -> str:
    """The router's Deployment and its NetworkPolicy."""
    return derived_name(name, names.COMPONENT_ROUTER)


def router_labels(name: str) -> dict[str, str]:
    return {names.LABEL_NAME: names.APP_NAME, names.LABEL_INSTANCE: name, names.LABEL_COMPONENT: names.COMPONENT_ROUTER,
            names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_MODELSERVER: name,
            names.LABEL_ROLE: names.ROLE_ROUTER}  # the vLLM pods' NetworkPolicy admits this role


def router_selector(name: str) -> dict[str, str]:
    return {names.LABEL_MODELSERVER: name, names.LABEL_COMPONENT: names.COMPONENT_ROUTER}


def replicas_service_name(name: str) -> str:
    return derived_name(name, "replicas")


def epp_config_name(name: str) -> str:
    """The endpoint picker's ConfigMap, and the name its Service must have (the InferencePool points there)."""
    return derived_name(name, "epp")


def routing_object_keys(name: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every object a routed mode or spec.autoscaling adds (the ones pruned when
    nothing wants them)."""
    return [("apps/v1", "Deployment", router_name(name)), ("v1", "Service", replicas_service_name(name)),
            ("networking.k8s.io/v1", "NetworkPolicy", router_name(name)),
            (f"{names.INFERENCEPOOL_GROUP}/{names.INFERENCEPOOL_VERSION}", names.INFERENCEPOOL_KIND, name),
            ("v1", "ConfigMap", epp_config_name(name)),
            *autoscaler_keys(name)]


def host_tier_credit(spec: ModelServerSpec, result: Plan) -> float | None:
    """What a CPU-pool hit saves against a GPU hit: the override, else reload (the qualified node) against recompute
    (the model); None when unknown. llm-d weighs its index's CPU tier by it (kv-aware's own router does not tell
    the tiers apart); the status shows it."""
    if spec.routing.host_tier_credit is not None:
        return spec.routing.host_tier_credit
    recompute = routing.recompute_tokens_per_s(result.layout.geometry.config, spec.request.tensor_parallel_size)
    if result.transfer is None or recompute is None:
        return None
    return routing.host_tier_credit(result.transfer.reload_tokens_per_s, recompute)


# -- the vLLM pods ----------------------------------------------------------------------------------------

def _with_self_describing_events(args: list[str]) -> list[str]:
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg == api.FLAG_KV_TRANSFER_CONFIG:
            config = json.loads(out[i + 1])
            config.setdefault(api.KV_CONNECTOR_EXTRA_CONFIG_KEY, {})[api.EXTRA_SELF_DESCRIBING_KV_EVENTS] = True
            out[i + 1] = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return out


def publish_events(deployment: dict[str, Any]) -> dict[str, Any]:
    """The vLLM Deployment with every pod publishing KV events."""
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == names.CONTAINER_VLLM)
    container["args"] = _with_self_describing_events(container["args"]) + [api.FLAG_KV_EVENTS_CONFIG,
                                                                           routing.kv_events_flag_value()]
    container["env"] = [*container.get("env", []), {"name": api.ENV_PYTHONHASHSEED, "value": api.PYTHONHASHSEED_VALUE}]
    container["ports"] = [*container.get("ports", []), {"name": names.PORT_NAME_KV_EVENTS,
                                                        "containerPort": routing.KV_EVENTS_PORT, "protocol": "TCP"}]
    return deployment


# -- kv-aware -----------------------------------------------------------------------------------------------

def _router_probe(path: str, period: int, failures: int) -> dict[str, Any]:
    # The metrics port, which serves /health too: the API port closes connections beyond its cap as they
    # open, and a flood of clients there would fail the probe and take the router out of its Service.
    return {"httpGet": {"path": path, "port": names.PORT_NAME_METRICS}, "periodSeconds": period,
            "timeoutSeconds": 3, "failureThreshold": failures}


def pool_blocks(spec: ModelServerSpec, result: Plan) -> int:
    return (result.pool.tokens // result.layout.block_size) if result.pool is not None else 0


def router_index_bytes(spec: ModelServerSpec, index_blocks: int) -> int:
    """The router's record budget: every replica's planned blocks (the default without a pool) at
    INDEX_ENTRY_BYTES each, within the router's bounds; within a memory limit the user set, what it leaves."""
    blocks = index_blocks if index_blocks > 0 else routing.DEFAULT_INDEX_BLOCKS
    want = max(1, spec.replicas) * blocks * affinity.INDEX_ENTRY_BYTES
    budget = min(routing.ROUTER_MAX_INDEX_BYTES, max(routing.ROUTER_MIN_INDEX_BYTES, want))
    limit = spec.routing.router_resources.get("limits", {}).get("memory")
    if limit is not None:
        budget = min(budget, parse_bytes(limit) - routing.ROUTER_BASE_BYTES - routing.ROUTER_BODY_BUDGET_BYTES)
    return budget


def router_memory_bytes(index_bytes: int) -> int:
    """What the router may hold: its process, the request bodies it holds at once, and its record."""
    return routing.ROUTER_BASE_BYTES + routing.ROUTER_BODY_BUDGET_BYTES + index_bytes


def router_command(body: Mapping[str, Any], spec: ModelServerSpec, index_blocks: int, block_size: int) -> list[str]:
    """`spillway route` over the replicas, recording per pod what its pool holds (the default without a pool),
    all pods' records within the memory budget the pod's limit is rendered from; `block_size`: the plan's
    --block-size (the one asked, or the model's where none was)."""
    name = body["metadata"]["name"]
    namespace = body["metadata"].get("namespace") or "default"
    args = ["spillway", "route", "--replicas", f"{replicas_service_name(name)}.{namespace}.svc",
            "--block-size", str(block_size)]
    if index_blocks > 0:
        args += ["--index-blocks", str(index_blocks)]
    args += ["--index-bytes", str(router_index_bytes(spec, index_blocks))]
    if spec.routing.router_replicas > 1:
        args += ["--router-pods", str(spec.routing.router_replicas)]
    return args


def router_objects(body: Mapping[str, Any], spec: ModelServerSpec, index_blocks: int,
                   image: str, block_size: int) -> list[dict[str, Any]]:
    """The headless Service over the replicas and the router's Deployment; `image` is the router image when
    spec.routing.router.image names none (the operator's setting)."""
    name = body["metadata"]["name"]
    rname, rlabels = router_name(name), router_labels(name)
    resources = spec.routing.router_resources
    memory = to_quantity(router_memory_bytes(router_index_bytes(spec, index_blocks)), "Mi")

    # Headless: DNS answers with each ready pod's IP (not-ready pods are left out), which the router needs.
    replicas = {"apiVersion": "v1", "kind": "Service",
                "metadata": metadata(body, replicas_service_name(name)),
                "spec": {"clusterIP": "None", "selector": selector(name), "ports": [
                    {"name": names.PORT_NAME_HTTP, "port": api.SERVER_PORT, "targetPort": names.PORT_NAME_HTTP,
                     "protocol": "TCP"}]}}
    container = {
        "name": names.CONTAINER_ROUTER,
        "image": spec.routing.router_image or image,
        "command": router_command(body, spec, index_blocks, block_size),
        "ports": [{"name": names.PORT_NAME_HTTP, "containerPort": routing.ROUTER_PORT, "protocol": "TCP"},
                  {"name": names.PORT_NAME_METRICS, "containerPort": routing.ROUTER_METRICS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {**ROUTER_REQUESTS, "memory": memory, **resources.get("requests", {})},
                      "limits": {"memory": memory, **resources.get("limits", {})}},
        # Readiness only: with no ready vLLM pod /health answers 503, and a liveness probe would restart the
        # pod in a loop for what is the replicas' state.
        "readinessProbe": _router_probe(routing.ROUTER_HEALTH_PATH, 5, 2),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(body, rname, rlabels),
        "spec": {
            "replicas": spec.routing.router_replicas,
            "selector": {"matchLabels": router_selector(name)},
            "template": {"metadata": {"labels": rlabels}, "spec": {
                "automountServiceAccountToken": False, "containers": [container], "enableServiceLinks": False,
                "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}}},
        },
    }
    return [replicas, deployment]


def _port(port: int) -> dict[str, Any]:
    return {"port": port, "protocol": "TCP"}


def _this_router(name: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {names.LABEL_ROLE: names.ROLE_ROUTER, names.LABEL_MODELSERVER: name}}}


def _prometheus() -> dict[str, Any]:
    return {"namespaceSelector": {}, "podSelector": {"matchLabels": {names.LABEL_NAME: PROMETHEUS_NAME}}}


def router_network_policy(body: Mapping[str, Any], spec: ModelServerSpec) -> dict[str, Any]:
    """The router pods take what the vLLM pods took before routing: this ModelServer's load-test Jobs and the
    namespaces spec.networkPolicy names on the API port, Prometheus on the metrics port."""
    name = body["metadata"]["name"]
    clients: list[dict[str, Any]] = [{"podSelector": {"matchLabels": {
        names.LABEL_COMPONENT: names.COMPONENT_LOADTEST, names.LABEL_MODELSERVER: name}}}]
    if spec.client_namespaces is not None:
        clients.append({"namespaceSelector": dict(spec.client_namespaces)})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata(body, router_name(name), router_labels(name)),
            "spec": {"podSelector": {"matchLabels": router_selector(name)}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": clients, "ports": [_port(routing.ROUTER_PORT)]},
                                 {"from": [_prometheus()], "ports": [_port(routing.ROUTER_METRICS_PORT)]}]}}


def only_the_router(policy: dict[str, Any], name: str) -> dict[str, Any]:
    """kv-aware: the vLLM pods' NetworkPolicy admits this ModelServer's router, its load-test Jobs (they read
    each replica's /metrics) and Prometheus; clients reach the pods through the router, whose own policy admits
    them."""
    loadtest = {"podSelector": {"matchLabels": {names.LABEL_COMPONENT: names.COMPONENT_LOADTEST,
                                                names.LABEL_MODELSERVER: name}}}
    policy["spec"]["ingress"] = [
        {"from": [_this_router(name), loadtest, _prometheus()], "ports": [_port(api.SERVER_PORT)]}]
    return policy


def admit_router_to_events(policy: dict[str, Any]) -> dict[str, Any]:
    """llm-d: the vLLM pods' NetworkPolicy also admits the endpoint picker (labelled spillway.dev/role: router)
    to the KV event port."""
    picker = {"podSelector": {"matchLabels": {names.LABEL_ROLE: names.ROLE_ROUTER}}}
    policy["spec"]["ingress"].append({"from": [picker], "ports": [_port(routing.KV_EVENTS_PORT)]})
    return policy


def route_service(service: dict[str, Any], name: str) -> dict[str, Any]:
    """The user's Service <name>, in front of the router instead of the pods."""
    service["spec"]["selector"] = router_selector(name)
    return service


# -- llm-d ------------------------------------------------------------------------------------------------------

def served_model(spec: ModelServerSpec) -> str:
    return spec.served_model_name or spec.model


def _pod_identity() -> str:
    """The pod part of each pod's KV event topic: its own address:port, as llm-d names the endpoint."""
    return f"$({routing.ENV_POD_IP}):{api.SERVER_PORT}"


def llm_d_block_tokens(spec: ModelServerSpec, result: Plan) -> int:
    """The tokens per block llm-d must hash by: vLLM's own KV block, which for a hybrid (Mamba or linear
    attention layers) is enlarged past --block-size (576 tokens for Qwen3-Next, 1088 for Nemotron-H at 64):
    a block of another size names no block the pods store."""
    return result.layout.kv_block_size


def llm_d_pod_blocks(spec: ModelServerSpec, result: Plan) -> int:
    """One pod's planned CPU capacity in llm-d's blocks (of llm_d_block_tokens): the pool receives every block
    the pod computes, so what it holds bounds what the pod can serve from cache."""
    return (result.pool.tokens // llm_d_block_tokens(spec, result)) if result.pool is not None else 0


def epp_config(body: Mapping[str, Any], spec: ModelServerSpec, result: Plan) -> dict[str, Any]:
    """llm-d-router v0.10.0's EndpointPickerConfig: the prompt tokenized by the pods' own vLLM (/render), a
    prefix producer, scored with the queue and KV-utilisation scorers, the highest score picked.

    precise: the index fed by every pod's KV events (GPU and CPU tiers weighted) and, with speculative indexing,
    by llm-d's own picks until the events confirm them (a prompt that arrives while its prefix's first prompt
    is still computing follows it); it holds the planned pools' blocks.
    approximate: no events; llm-d records where it sent each prompt's blocks, an LRU per pod of the planned
    pool's blocks (autoTune off: autoTune would size it from the GPU's blocks alone)."""
    name = body["metadata"]["name"]
    namespace = (body.get("metadata") or {}).get("namespace") or "default"
    block = llm_d_block_tokens(spec, result)
    blocks = llm_d_pod_blocks(spec, result)
    producer_type = routing.LLM_D_PRODUCER_PLUGINS[spec.routing.producer]
    precise = spec.routing.producer == routing.PRODUCER_PRECISE
    plugins: list[dict[str, Any]] = [
        {"type": "token-producer", "parameters": {
            "modelName": served_model(spec),
            "vllm": {"url": f"http://{name}.{namespace}.svc:{api.SERVER_PORT}"}}},
        *([{"type": "endpoint-notification-source"}] if precise else []),
        {"type": "metrics-data-source"},
        {"type": "core-metrics-extractor"},
        {"type": "single-profile-handler"},
    ]
    if precise:
        keys, entries = routing.llm_d_index_capacity(spec.replicas, blocks)
        credit = host_tier_credit(spec, result)
        index: dict[str, Any] = {"enableMetrics": True}
        if keys > 0 and blocks:
            index["inMemoryConfig"] = {"size": keys, "podCacheSize": entries}
        selector_text = ",".join(f"{k}={v}" for k, v in sorted(selector(name).items()))
        plugins.append({"type": producer_type, "parameters": {
            "tokenProcessorConfig": {"blockSizeTokens": block, "hashSeed": api.PYTHONHASHSEED_VALUE},
            "indexerConfig": {
                "kvBlockIndexConfig": index,
                "kvCacheBackendConfigs": [{"name": routing.LLM_D_GPU_TIER, "weight": 1.0},
                                          {"name": routing.LLM_D_CPU_TIER,
                                           "weight": routing.LLM_D_CPU_TIER_WEIGHT if credit is None else credit}]},
            "kvEventsConfig": {
                "topicFilter": routing.LLM_D_TOPIC_FILTER, "engineType": "vllm", "discoverPods": True,
                "podDiscoveryConfig": {"podLabelSelector": selector_text, "podNamespace": namespace,
                                       "socketPort": routing.KV_EVENTS_PORT}},
            "speculativeIndexing": True,
        }})
    else:
        parameters: dict[str, Any] = {"blockSizeTokens": block, "autoTune": False}
        if blocks:
            parameters["lruCapacityPerServer"] = blocks
        plugins.append({"type": producer_type, "parameters": parameters})
    plugins += [
        {"type": "prefix-cache-scorer", "parameters": {"prefixMatchInfoProducerName": producer_type}},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "queue-scorer"},
        {"type": "max-score-picker"},
    ]
    profile = [{"pluginRef": "prefix-cache-scorer", "weight": 2.0},
               {"pluginRef": "kv-cache-utilization-scorer", "weight": 1.0},
               {"pluginRef": "queue-scorer", "weight": 1.0},
               {"pluginRef": "max-score-picker"}]
    sources = [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}]
    if precise:
        sources.append({"pluginRef": "endpoint-notification-source", "extractors": [{"pluginRef": producer_type}]})
    return {"apiVersion": routing.EPP_CONFIG_API_VERSION, "kind": "EndpointPickerConfig", "plugins": plugins,
            "dataLayer": {"sources": sources}, "schedulingProfiles": [{"name": "default", "plugins": profile}]}


def publish_llm_d_topic(deployment: dict[str, Any], spec: ModelServerSpec) -> dict[str, Any]:
    """llm-d mode's vLLM pods: events under a topic llm-d's subscriber takes (kv@<address:port>@<model>)."""
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == names.CONTAINER_VLLM)
    args = container["args"]
    at = args.index(api.FLAG_KV_EVENTS_CONFIG)
    args[at + 1] = routing.kv_events_flag_value(topic=routing.llm_d_topic(_pod_identity(), served_model(spec)))
    container["env"] = [{"name": routing.ENV_POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        *container.get("env", [])]
    return deployment


def llm_d_objects(body: Mapping[str, Any], spec: ModelServerSpec, result: Plan) -> list[dict[str, Any]]:
    name = body["metadata"]["name"]
    pool = {
        "apiVersion": f"{names.INFERENCEPOOL_GROUP}/{names.INFERENCEPOOL_VERSION}", "kind": names.INFERENCEPOOL_KIND,
        "metadata": metadata(body),
        "spec": {"selector": {"matchLabels": selector(name)}, "targetPorts": [{"number": api.SERVER_PORT}],
                 "endpointPickerRef": {"name": epp_config_name(name), "port": {"number": routing.EPP_PORT},
                                       "failureMode": "FailOpen"}},
    }
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(body, epp_config_name(name)),
              "data": {EPP_CONFIG_KEY: yaml.safe_dump(epp_config(body, spec, result), sort_keys=False)}}
    return [pool, config]


# -- all of it ----------------------------------------------------------------------------------------------

def routed(body: Mapping[str, Any], spec: ModelServerSpec, result: Plan, objects: list[dict[str, Any]],
           router_image: str = names.DEFAULT_ROUTER_IMAGE) -> list[dict[str, Any]]:
    """The objects of an unrouted ModelServer, changed and extended for spec.routing."""
    mode = spec.routing.mode
    if mode == routing.MODE_NONE:
        return objects
    name = body["metadata"]["name"]
    out = []
    for obj in objects:
        if obj["kind"] == "Deployment" and spec.routing.publishes_events:
            obj = with_hash(publish_llm_d_topic(publish_events(obj), spec))
        elif obj["kind"] == "Service" and mode == routing.MODE_KV_AWARE:
            obj = with_hash(route_service(obj, name))
        elif obj["kind"] == "NetworkPolicy":
            if mode == routing.MODE_KV_AWARE:
                obj = with_hash(only_the_router(obj, name))
            elif spec.routing.publishes_events:
                obj = with_hash(admit_router_to_events(obj))
        out.append(obj)
    if mode == routing.MODE_KV_AWARE:
        out += [with_hash(o) for o in router_objects(body, spec, pool_blocks(spec, result), router_image,
                                                    result.layout.block_size)]
        if spec.network_policy:
            out.append(with_hash(router_network_policy(body, spec)))
    else:
        out += [with_hash(o) for o in llm_d_objects(body, spec, result)]
    return out


def routing_warnings(spec: ModelServerSpec) -> list[str]:
    if spec.routing.enabled and spec.replicas <= 1:
        return [(f"routing.mode {spec.routing.mode} with {spec.replicas} replica: there is no other replica to "
                "route to (it only adds a hop); scale out or set routing.mode none")]
    return []
