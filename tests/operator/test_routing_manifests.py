"""spec.routing: what the operator renders in front of the replicas and on them, each object valid for
Kubernetes 1.30 and 1.37 (kubernetes-validate --strict), the InferencePool against the Gateway API Inference
Extension's schema (vendored in schemas/), and the bad inputs routing adds."""
from __future__ import annotations

import json
import sys

import kubernetes_validate
import pytest
import yaml
from spillway.commands.route import resolve_ips
from spillway.controller.facts import summarize_node
from spillway.controller.manifests import desired, selector
from spillway.controller.routing_objects import routing_warnings
from spillway.core import k8s_names as names
from spillway.core import routing
from spillway.core import vllm_api as api
from spillway.core.errors import InvalidSpec
from support.crd_schema import admit
from support.ms_examples import gpu_node, modelserver

KUBERNETES_VERSIONS = ("1.30", "1.37")


def render(mode: str, replicas: int = 3, dma: str | None = None, **spec):
    body = modelserver(replicas=replicas, routing={"mode": mode, **spec.pop("routing_extra", {})}, **spec)
    body["metadata"]["uid"] = "0b8f5f5e-0000-4000-8000-000000000000"
    return desired(body, [summarize_node(gpu_node("g", dma=dma))])


def kinds(result) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in result.objects}


def vllm_container(result) -> dict:
    deployment = kinds(result)[("Deployment", "llama")]
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_no_routing_changes_nothing():
    plain = desired(modelserver(replicas=3), [summarize_node(gpu_node("g"))])
    explicit = render(routing.MODE_NONE)
    assert [o["kind"] for o in plain.objects] == [o["kind"] for o in explicit.objects]
    assert api.FLAG_KV_EVENTS_CONFIG not in vllm_container(explicit)["args"]


def test_kv_aware_pods_publish_no_kv_events():
    """Its router records where it sent each prefix and reads no events: the pods keep their engine cores free
    of per-block events, and open no port for them."""
    container = vllm_container(render(routing.MODE_KV_AWARE))
    assert api.FLAG_KV_EVENTS_CONFIG not in container["args"]
    assert api.ENV_PYTHONHASHSEED not in {e["name"] for e in container.get("env", [])}
    assert names.PORT_NAME_KV_EVENTS not in {p["name"] for p in container["ports"]}


def test_llm_d_pods_publish_self_describing_kv_events():
    container = vllm_container(render(routing.MODE_LLM_D))
    args = container["args"]
    events = json.loads(args[args.index(api.FLAG_KV_EVENTS_CONFIG) + 1])
    events.pop(routing.KV_EVENTS_TOPIC_KEY, None)  # llm-d's topic: test_routing_llm_d.py
    assert events == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{routing.KV_EVENTS_PORT}"}
    transfer = json.loads(args[args.index(api.FLAG_KV_TRANSFER_CONFIG) + 1])
    assert transfer[api.KV_CONNECTOR_EXTRA_CONFIG_KEY][api.EXTRA_SELF_DESCRIBING_KV_EVENTS] is True
    assert {"name": api.ENV_PYTHONHASHSEED, "value": api.PYTHONHASHSEED_VALUE} in container["env"]
    assert {"name": names.PORT_NAME_KV_EVENTS, "containerPort": routing.KV_EVENTS_PORT,
            "protocol": "TCP"} in container["ports"]


def test_kv_aware_puts_the_router_behind_the_users_service():
    objects = kinds(render(routing.MODE_KV_AWARE))
    service = objects[("Service", "llama")]
    router = objects[("Deployment", "llama-router")]
    pod = router["spec"]["template"]
    assert service["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]
    assert all(pod["metadata"]["labels"][k] == v for k, v in service["spec"]["selector"].items())
    assert pod["metadata"]["labels"][names.LABEL_ROLE] == names.ROLE_ROUTER  # the NetworkPolicy admits it
    container, = pod["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["spillway", "route"]
    assert command[command.index("--replicas") + 1] == "llama-replicas.default.svc"
    assert command[command.index("--block-size") + 1] == "64"  # the planner's default block
    # The index remembers per pod what the planned pool holds
    assert int(command[command.index("--index-blocks") + 1]) == result_pool_blocks(render(routing.MODE_KV_AWARE))
    assert "env" not in container  # the router holds no secret: clients' tokens pass through to the pods
    assert container["readinessProbe"]["httpGet"]["path"] == routing.ROUTER_HEALTH_PATH
    assert "livenessProbe" not in container  # no replica ready must not restart the router in a loop
    assert {p["name"] for p in container["ports"]} == {names.PORT_NAME_HTTP, names.PORT_NAME_METRICS}
    assert container["resources"]["limits"]["memory"]
    assert pod["spec"]["automountServiceAccountToken"] is False  # DNS finds the replicas: no API access at all
    replicas = objects[("Service", "llama-replicas")]
    assert replicas["spec"]["clusterIP"] == "None" and replicas["spec"]["selector"] == selector("llama")
    assert {p["name"] for p in replicas["spec"]["ports"]} == {names.PORT_NAME_HTTP}
    assert not any(o["kind"] in ("ServiceAccount", "RoleBinding", "Role") for o in objects.values())
    policy = objects[("NetworkPolicy", "llama")]
    this_router = {"podSelector": {"matchLabels": {names.LABEL_ROLE: names.ROLE_ROUTER, names.LABEL_MODELSERVER: "llama"}}}
    assert this_router in policy["spec"]["ingress"][0]["from"]


def result_pool_blocks(result) -> int:
    return result.plan.pool.tokens // result.plan.layout.block_size


def test_host_tier_credit_weighs_llm_ds_cpu_tier_from_the_qualified_node_or_the_override():
    def credit(result):
        config = yaml.safe_load(kinds(result)[("ConfigMap", "llama-epp")]["data"]["config.yaml"])
        producer = next(p for p in config["plugins"] if p["type"] == "precise-prefix-cache-producer")
        tiers = producer["parameters"]["indexerConfig"]["kvCacheBackendConfigs"]
        return next(t["weight"] for t in tiers if t["name"] == routing.LLM_D_CPU_TIER)

    assert credit(render(routing.MODE_LLM_D)) == routing.LLM_D_CPU_TIER_WEIGHT  # unqualified node: the default
    fast, slow = render(routing.MODE_LLM_D, dma="50"), render(routing.MODE_LLM_D, dma="10")
    assert 0 < credit(slow) < credit(fast) <= routing.MAX_HOST_TIER_CREDIT
    assert credit(render(routing.MODE_LLM_D, dma="2")) == 0  # reloading slower than an H200 recomputes
    assert credit(render(routing.MODE_LLM_D, dma="50", routing_extra={"hostTierCredit": 0.3})) == 0.3


def test_host_tier_credit_arithmetic():
    assert routing.host_tier_credit(1_000_000, 40_000) == 0.95  # capped: a reload is never free
    assert routing.host_tier_credit(400_000, 40_000) == 0.9
    assert routing.host_tier_credit(30_000, 40_000) == 0.0  # reloading slower than recomputing saves nothing
    # The anchor model scales to itself; a model with 4x the weights per token prefills 4x slower.
    assert routing.recompute_tokens_per_s(routing.ANCHOR_CONFIG, 1) == routing.ANCHOR_RECOMPUTE_TOKENS_PER_S
    wide = {**routing.ANCHOR_CONFIG, "num_hidden_layers": 128}
    assert routing.recompute_tokens_per_s(wide, 1) == pytest.approx(routing.ANCHOR_RECOMPUTE_TOKENS_PER_S / 4)
    assert routing.recompute_tokens_per_s({}, 1) is None


def test_llm_d_renders_an_inference_pool_and_the_endpoint_picker_config():
    """The formats themselves are checked against upstream's in test_routing_llm_d.py."""
    result = render(routing.MODE_LLM_D)
    objects = kinds(result)
    pool = objects[(names.INFERENCEPOOL_KIND, "llama")]
    assert pool["spec"]["selector"]["matchLabels"] == selector("llama")
    assert pool["spec"]["targetPorts"] == [{"number": api.SERVER_PORT}]
    assert objects[("Service", "llama")]["spec"]["selector"] == selector("llama")  # no router of ours
    config = yaml.safe_load(objects[("ConfigMap", "llama-epp")]["data"]["config.yaml"])
    assert config["kind"] == "EndpointPickerConfig"


@pytest.mark.parametrize("mode", [routing.MODE_KV_AWARE, routing.MODE_LLM_D])
def test_routed_objects_validate_strictly(mode):
    for obj in render(mode).objects:
        if obj["kind"] == names.INFERENCEPOOL_KIND:
            continue  # not a built-in kind: checked against its own schema above
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(("routing_spec", "extra", "message"), [
    ({"mode": "llm-d"}, {"extraArgs": ["--kv-events-config", "{}"]}, "routing.mode llm-d writes"),
    ({"mode": "kv-aware"}, {"extraArgs": ['--kv-events-config={"endpoint": "tcp://*:8000"}']}, "the pod's HTTP port"),
    ({"mode": "none"}, {"extraArgs": ['--kv-events-config={"endpoint": "tcp://*:8000"}']}, "the pod's HTTP port"),
    ({"mode": "kv-aware", "hostTierCredit": 0.5}, {}, "weighs llm-d's CPU tier"),
    ({"mode": "none", "router": {"replicas": 2}}, {}, "configures the kv-aware router"),
    ({"mode": "kv-aware", "router": {"replicas": 0}}, {}, "router.replicas"),
    ({"mode": "llm-d", "hostTierCredit": 1.5}, {}, "hostTierCredit"),
    ({"mode": "round-robin"}, {}, "routing.mode must be one of"),
    ({"mode": "kv-aware", "speed": 1}, {}, "speed"),
    ({"mode": "llm-d"}, {"env": [{"name": "PYTHONHASHSEED", "value": "7"}]}, "PYTHONHASHSEED"),
    ({"mode": "kv-aware", "router": {"resources": {"limits": {"memory": "256Mi"}}}}, {}, "below the router's least"),
])
def test_bad_routing_input_is_refused(routing_spec, extra, message):
    with pytest.raises(InvalidSpec, match=message):
        desired(modelserver(replicas=2, routing=routing_spec, **extra), [summarize_node(gpu_node("g"))])


def test_one_replica_gets_a_warning():
    assert routing_warnings(render(routing.MODE_KV_AWARE, replicas=1).spec)
    assert not routing_warnings(render(routing.MODE_KV_AWARE, replicas=2).spec)


# -- spillway route: how the router pod finds the replicas ------------------------------------------------------------------

def test_replicas_are_found_by_dns():
    assert "127.0.0.1" in resolve_ips("localhost")
    assert resolve_ips("no-replica-is-ready.invalid") == []  # a headless Service without endpoints


def test_spillway_render_shows_the_router_and_the_pods(tmp_path):
    """`spillway render` of a 3-replica kv-aware ModelServer: the router Deployment and Service in front, the
    replicas' headless Service, and vLLM pods behind them."""
    import subprocess

    path = tmp_path / "ms.yaml"
    path.write_text(yaml.safe_dump(modelserver(replicas=3, routing={"mode": "kv-aware"})))
    done = subprocess.run([sys.executable, "-m", "spillway.cli", "render", "-f", str(path), "--node-memory", "2Ti",
                           "--gpus-per-node", "8"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}
    assert {("Deployment", "llama"), ("Deployment", "llama-router"), ("Service", "llama"),
            ("Service", "llama-replicas")} <= set(docs)
    assert docs[("Service", "llama")]["spec"]["selector"][names.LABEL_COMPONENT] == names.COMPONENT_ROUTER
    assert docs[("Deployment", "llama")]["spec"]["replicas"] == 3


# -- the CRD: schema and CEL at the API server -------------------------------------------------------------------

@pytest.mark.parametrize(("routing_spec", "error"), [
    ({"mode": "kv-aware", "router": {"replicas": 2, "resources": {"requests": {"cpu": "1"}}}}, None),
    ({"mode": "llm-d", "hostTierCredit": 0.9}, None),
    ({"mode": "kv-aware", "hostTierCredit": 0.5}, "hostTierCredit weighs llm-d's CPU tier"),
    ({"router": {"replicas": 2}}, "router configures the kv-aware router"),
    ({"mode": "llm-d", "hostTierCredit": 2}, "hostTierCredit"),
    ({"mode": "random"}, "routing.mode"),
    ({"mode": "kv-aware", "router": {"replicas": 0}}, "router.replicas"),
])
def test_the_crd_admits_good_routing_and_refuses_bad(routing_spec, error):
    obj, errors = admit(modelserver(replicas=2, routing=routing_spec))
    if error is None:
        assert errors == []
        assert obj["spec"]["routing"]["mode"] == routing_spec["mode"]
    else:
        assert any(error in e for e in errors), errors


def test_the_crd_defaults_routing_to_none():
    obj, errors = admit(modelserver())
    assert errors == [] and obj["spec"]["routing"] == {"mode": routing.MODE_NONE}


def test_the_routers_memory_is_rendered_from_its_record_budget():
    """The router records at most --index-bytes, and its memory request and limit are that budget plus its
    process and the bodies it may hold: an index that outgrew the limit was OOM-killed and came back empty."""
    from spillway.controller import routing_objects as O
    from spillway.core import affinity
    from spillway.core.quantity import parse_bytes

    router = kinds(render(routing.MODE_KV_AWARE))[("Deployment", "llama-router")]
    container, = router["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    budget = int(command[command.index("--index-bytes") + 1])
    blocks = int(command[command.index("--index-blocks") + 1])
    assert routing.ROUTER_MIN_INDEX_BYTES <= budget <= routing.ROUTER_MAX_INDEX_BYTES
    assert budget == min(routing.ROUTER_MAX_INDEX_BYTES, max(routing.ROUTER_MIN_INDEX_BYTES,
                                                             3 * blocks * affinity.INDEX_ENTRY_BYTES))
    resources = container["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert parse_bytes(resources["limits"]["memory"]) >= O.router_memory_bytes(budget)
    # A memory limit of the user's own: the record gets what it leaves.
    objects = kinds(render(routing.MODE_KV_AWARE, routing_extra={"router": {"resources": {"limits": {"memory": "600Mi"}}}}))
    container, = objects[("Deployment", "llama-router")]["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == "600Mi"
    budget = int(container["command"][container["command"].index("--index-bytes") + 1])
    assert O.router_memory_bytes(budget) <= 600 << 20


def test_router_pods_are_told_how_many_share_the_traffic():
    def command(**router):
        extra = {"routing_extra": {"router": router}} if router else {}
        deployment = kinds(render(routing.MODE_KV_AWARE, **extra))[("Deployment", "llama-router")]
        return deployment["spec"]["template"]["spec"]["containers"][0]["command"]

    assert "--router-pods" not in command()
    three = command(replicas=3)
    assert three[three.index("--router-pods") + 1] == "3"
