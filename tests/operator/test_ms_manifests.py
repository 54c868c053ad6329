"""The objects the operator applies: planned numbers in the Deployment, smallest-node planning,
and every object valid for Kubernetes 1.30 and 1.37 (kubernetes-validate --strict; the PodMonitor
against the Prometheus Operator's own schema)."""
from __future__ import annotations

import json

import kubernetes_validate
import pytest
from cloudcoil.models.prometheus_operator.v1 import PodMonitor
from spillway.adapters.model_config import resolve_geometry
from spillway.controller.facts import summarize_node
from spillway.controller.manifests import desired
from spillway.controller.status import status_plan
from spillway.core import k8s_names as names
from spillway.core import vllm_api as api
from spillway.core.errors import InvalidSpec, PoolDoesNotFit
from spillway.core.planner import NodeFacts, plan
from spillway.core.quantity import parse_bytes
from support.ms_examples import LLAMA_8B, gpu_node, modelserver

KUBERNETES_VERSIONS = ("1.30", "1.37")


def nodes(*bodies):
    return [summarize_node(b) for b in bodies]


def by_kind(result):
    return {o["kind"]: o for o in result.objects}


def test_deployment_carries_the_plan():
    body = modelserver(replicas=3, hfTokenSecretRef={"name": "hf"}, extraArgs=["--max-model-len=8192"],
                       resources={"requests": {"cpu": "4"}}, env=[{"name": "EXTRA", "value": "1"}])
    body["metadata"]["uid"] = "u-1"
    result = desired(body, nodes(gpu_node("g", "1Ti", 8)))
    expected = plan(resolve_geometry(LLAMA_8B), result.spec.request, NodeFacts(2**40, 8, "g"))
    deployment, service = by_kind(result)["Deployment"], by_kind(result)["Service"]
    pod = deployment["spec"]["template"]["spec"]
    container, = pod["containers"]
    # Our image's entrypoint runs (stale pool cleanup, then `vllm serve`): no command overrides it.
    assert "command" not in container and container["args"][0] == LLAMA_8B
    assert container["args"][1:1 + len(expected.args)] == expected.args
    assert "--max-model-len=8192" == container["args"][-1]
    config = json.loads(container["args"][container["args"].index(api.FLAG_KV_TRANSFER_CONFIG) + 1])
    assert config["kv_connector_extra_config"][api.EXTRA_CPU_BYTES] == expected.pool.bytes
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert parse_bytes(limits["memory"]) == parse_bytes(requests["memory"]) == expected.pod.memory_limit_bytes
    assert limits[names.GPU_RESOURCE] == "1" and requests["cpu"] == "4"
    shm, *writable = pod["volumes"]  # then /tmp and the image user's home for the read-only root
    assert shm["emptyDir"]["medium"] == "Memory"
    assert parse_bytes(shm["emptyDir"]["sizeLimit"]) == expected.pod.shm_bytes
    assert container["volumeMounts"][0] == {"name": shm["name"], "mountPath": api.SHM_DIR}
    assert [v["name"] for v in writable] == [m["name"] for m in container["volumeMounts"][1:]]
    env = {e["name"]: e for e in container["env"]}
    assert env[api.ENV_KV_CACHE_LAYOUT]["value"] == api.CONTIGUOUS_LAYOUT
    assert env[api.ENV_HF_TOKEN]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert env["EXTRA"]["value"] == "1"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": api.HEALTH_PATH, "port": names.PORT_NAME_HTTP}
    startup = container["startupProbe"]
    assert 0 <= startup["periodSeconds"] * startup["failureThreshold"] - expected.pod.startup_seconds < 10
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    for obj in result.objects:
        assert obj["metadata"]["ownerReferences"] == [{"apiVersion": names.API_VERSION, "kind": names.KIND,
                                                       "name": "llama", "uid": "u-1", "controller": True,
                                                       "blockOwnerDeletion": True}]
    status = status_plan(result)
    assert status["offloadBytes"] == expected.pool.bytes and status["cachedTokens"] == expected.pool.tokens
    assert status["cpuBlocks"] == expected.pool.blocks and status["blockBytes"] == expected.layout.block_bytes
    assert parse_bytes(status["memoryLimit"]) == expected.pod.memory_limit_bytes


def test_plans_for_the_smallest_eligible_node():
    pool = nodes(gpu_node("big", "2Ti", 8), gpu_node("small", "768Gi", 8), gpu_node("four", "1Ti", 4, dma="48"))
    result = desired(modelserver(), pool)
    assert result.node.name == "small"
    limits = {n.name: plan(resolve_geometry(LLAMA_8B), result.spec.request, n.facts()).pod
              .memory_limit_bytes for n in pool}
    assert result.plan.pod.memory_limit_bytes == min(limits.values())
    assert "smallest of 3 eligible nodes" in result.summary()


def test_a_pool_that_fits_no_node_names_the_node_with_the_smallest_share():
    # Under 80 GiB the node reserve is its 4 GiB floor, so memory per GPU misorders these two: "one" has 33 GiB
    # for its one replica and "two" 32 per replica, yet the shares are 29 and 30 GiB. The error names "one".
    pool = nodes(gpu_node("one", "33Gi", 1), gpu_node("two", "64Gi", 2))
    shares = {n.name: plan(resolve_geometry(LLAMA_8B), desired(modelserver(), pool).spec.request, n.facts()).node
              .share_bytes for n in pool}
    assert shares["one"] < shares["two"]
    with pytest.raises(PoolDoesNotFit) as err:
        desired(modelserver(offload={"size": "40Gi"}), pool)
    assert "node one" in str(err.value) and "two" not in str(err.value), err.value


def _args(result):
    return by_kind(result)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_api_servers_follow_the_nodes_cpu_and_the_fewest_eligible_node():
    # 8 GPUs, 8 replicas per node: 16 cores each is the measured best of 4 API servers.
    result = desired(modelserver(), nodes(gpu_node("g", "2Ti", 8, cpu="127500m")))
    args = _args(result)
    assert args[args.index(api.FLAG_API_SERVER_COUNT) + 1] == "4" and result.plan.engine.api_servers == 4
    assert api.FLAG_API_SERVER_COUNT not in _args(desired(modelserver(), nodes(gpu_node("g", cpu="lots"))))
    # The pod may land on any eligible node: the one with 8 cores per replica sets 2, though its memory is larger.
    mixed = desired(modelserver(), nodes(gpu_node("small", "1Ti", 8, cpu="128"), gpu_node("big", "2Ti", 8, cpu="64")))
    args = _args(mixed)
    assert mixed.node.name == "small"
    assert args[args.index(api.FLAG_API_SERVER_COUNT) + 1] == "2" and args.count(api.FLAG_API_SERVER_COUNT) == 1
    assert "big" in mixed.plan.engine.why
    # The pool stays as "small" alone would get it (it must fit "big" too); the pod gives back the memory of the
    # 2 API servers it does not run, 1 GiB each.
    alone = plan(resolve_geometry(LLAMA_8B), mixed.spec.request, mixed.node.facts())
    assert alone.engine.api_servers == 4 and mixed.plan.pool == alone.pool
    assert alone.pod.memory_limit_bytes - mixed.plan.pod.memory_limit_bytes == 2 * 2**30
    assert alone.pod.process_reserve_bytes - mixed.plan.pod.process_reserve_bytes == 2 * 2**30
    assert mixed.plan.pod.memory_request_bytes == mixed.plan.pod.memory_limit_bytes
    limit = by_kind(mixed)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert parse_bytes(limit) == mixed.plan.pod.memory_limit_bytes
    assert api.FLAG_API_SERVER_COUNT not in _args(desired(modelserver(), nodes(gpu_node("a", cpu="128"),
                                                                               gpu_node("b"))))


def test_explicit_size_must_fit_every_eligible_node():
    pool = nodes(gpu_node("big", "2Ti", 8), gpu_node("small", "512Gi", 8))
    assert desired(modelserver(offload={"size": "20Gi"}), pool).plan.pool.bytes <= 20 * 2**30
    with pytest.raises(PoolDoesNotFit, match="node small"):
        desired(modelserver(offload={"size": "200Gi"}), pool)


def test_disabled_offload_and_pod_monitor():
    result = desired(modelserver(offload={"enabled": False}), nodes(gpu_node("g")), pod_monitor=True)
    container = by_kind(result)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert api.FLAG_KV_TRANSFER_CONFIG not in container["args"]
    assert status_plan(result)["offloadBytes"] == 0 and status_plan(result)["cachedTokens"] == 0
    monitor = by_kind(result)[names.PODMONITOR_KIND]
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": names.PORT_NAME_HTTP, "path": api.METRICS_PATH}]
    assert monitor["spec"]["selector"]["matchLabels"] == by_kind(result)["Service"]["spec"]["selector"]


def test_engine_env_follows_the_images_vllm_version():
    def env_of(**spec):
        container = by_kind(desired(modelserver(**spec), nodes(gpu_node("g"))))["Deployment"]
        return {e["name"]: e.get("value") for e in container["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert env_of()[api.ENV_KV_CACHE_LAYOUT] == api.CONTIGUOUS_LAYOUT
    old = env_of(image="registry.example/vllm:0.26.0", vllmVersion="0.26.0")
    assert old[api.ENV_USE_V2_MODEL_RUNNER] == "0" and api.ENV_KV_CACHE_LAYOUT not in old
    with pytest.raises(InvalidSpec, match="operator writes"):
        env_of(env=[{"name": api.ENV_USE_V2_MODEL_RUNNER, "value": "1"}])


def test_name_must_be_a_dns_label():
    with pytest.raises(InvalidSpec, match="DNS label"):
        desired(modelserver(name="Llama_8B"), nodes(gpu_node("g")))


def test_applied_hash_changes_with_content_only():
    pool = nodes(gpu_node("g"))
    first, again = desired(modelserver(), pool), desired(modelserver(), pool)
    changed = desired(modelserver(replicas=2), pool)
    hash_of = lambda r: r.objects[0]["metadata"]["annotations"][names.ANNOTATION_APPLIED_HASH]
    assert hash_of(first) == hash_of(again) != hash_of(changed)


VALIDATED = [
    modelserver(),
    modelserver(tensorParallelSize=2, replicas=2, nodeSelector={"pool": "h200"}, imagePullPolicy="IfNotPresent",
                imagePullSecrets=[{"name": "regcred"}], tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}],
                affinity={"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}},
                env=[{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                hfTokenSecretRef={"name": "hf", "key": "HF_TOKEN"}, revision="main", servedModelName="llama",
                offload={"size": "0.5", "evictionPolicy": "arc", "blockSize": 64}),
    modelserver(offload={"enabled": False}),
]


@pytest.mark.parametrize("body", VALIDATED, ids=["defaults", "everything", "no-offload"])
def test_rendered_objects_validate_strictly(body):
    body = json.loads(json.dumps(body))
    body["metadata"]["uid"] = "0b8f5f5e-0000-4000-8000-000000000000"
    result = desired(body, nodes(gpu_node("g", labels={"pool": "h200"})), pod_monitor=True)
    for obj in result.objects:
        if obj["kind"] == names.PODMONITOR_KIND:
            # Strict: the model keeps every field (an unknown one would be dropped and break the equality).
            parsed = PodMonitor.model_validate(obj)
            assert parsed.model_dump(by_alias=True, exclude_none=True, mode="json") == obj
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_catches_a_misspelt_field():
    obj = by_kind(desired(modelserver(), nodes(gpu_node("g"))))["Deployment"]
    obj["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("layout, expected", [("contiguous", api.CONTIGUOUS_LAYOUT),
                                              ("default", names.VLLM_IMAGE_LAYOUT_BACKEND_CHOICE)])
def test_our_image_gets_the_planned_layout_whatever_its_entrypoint_presets(layout, expected):
    result = desired(modelserver(offload={"size": "auto", "layout": layout}), nodes(gpu_node("g", "1Ti", 8)))
    container, = by_kind(result)["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env[api.ENV_KV_CACHE_LAYOUT] == expected


def test_another_image_is_started_as_vllm_serve_with_only_the_planned_env():
    result = desired(modelserver(image="vllm/vllm-openai:v0.33.0", offload={"size": "auto", "layout": "default"}),
                     nodes(gpu_node("g", "1Ti", 8)))
    container, = by_kind(result)["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == list(api.SERVE_COMMAND)
    assert api.ENV_KV_CACHE_LAYOUT not in {e["name"] for e in container["env"]}
