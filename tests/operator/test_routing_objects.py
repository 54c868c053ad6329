"""What routing adds stays valid and closed whatever the ModelServer: names within 63 characters for any
name, a NetworkPolicy on the router with the vLLM pods then admitting only it, the router image given by the
operator (never read from the renderer's environment), and no import circle between the renderers."""
from __future__ import annotations

import ast
from pathlib import Path

import kubernetes_validate
import pytest
from spillway.controller.facts import summarize_node
from spillway.controller.manifests import desired
from spillway.controller.objects import MAX_NAME, derived_name
from spillway.controller.routing_objects import routing_object_keys
from spillway.core import k8s_names as names
from spillway.core import routing
from spillway.core import vllm_api as api
from support.ms_examples import gpu_node, modelserver

CONTROLLER = Path(__file__).resolve().parents[2] / "operator" / "spillway" / "controller"
LONG = "m" + "x" * 61 + "z"  # 63 characters, the longest ModelServer name


def render(mode: str, name: str = "llama", **spec):
    body = modelserver(name=name, replicas=3, routing={"mode": mode}, **spec)
    body["metadata"]["uid"] = "0b8f5f5e-0000-4000-8000-000000000000"
    return desired(body, [summarize_node(gpu_node("g"))], router_image="registry.example/router:1")


def kinds(result) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in result.objects}


@pytest.mark.parametrize("name", ["a" * 60, LONG, "llama"])
@pytest.mark.parametrize("mode", [routing.MODE_KV_AWARE, routing.MODE_LLM_D])
def test_every_object_name_is_a_dns_label(mode, name):
    result = render(mode, name=name)
    for obj in result.objects:
        assert len(obj["metadata"]["name"]) <= MAX_NAME, obj["metadata"]["name"]
        if obj["kind"] != names.INFERENCEPOOL_KIND:  # not a built-in kind: test_routing_llm_d.py
            kubernetes_validate.validate(obj, "1.37", strict=True)
    pruned = {(kind, n) for _, kind, n in routing_object_keys(name)}
    added = {(o["kind"], o["metadata"]["name"]) for o in result.objects} - {(k, name) for k, _ in kinds(result)}
    assert added <= pruned  # what a routed mode adds is what pruning looks for, by the same names


def test_long_names_stay_distinct_and_readable():
    a, b = derived_name(LONG, "replicas"), derived_name(LONG[:-1] + "y", "replicas")
    assert a != b and a.startswith("mxxx") and a.endswith("-replicas") and len(a) == MAX_NAME
    assert derived_name("llama", "router") == "llama-router"  # short names keep the plain form
    cut_at_a_dash = derived_name("a" * 48 + "-" * 14 + "b", "epp")  # the cut falls inside the dashes
    assert "--" not in cut_at_a_dash and cut_at_a_dash.startswith("a" * 48 + "-")


def test_the_router_has_a_network_policy_and_the_pods_admit_only_it():
    objects = kinds(render(routing.MODE_KV_AWARE, networkPolicy={"namespaceSelector": {"matchLabels": {"team": "a"}}}))
    router = objects[("NetworkPolicy", "llama-router")]
    assert router["spec"]["podSelector"]["matchLabels"] == \
        objects[("Deployment", "llama-router")]["spec"]["selector"]["matchLabels"]
    api_rule, metrics_rule = router["spec"]["ingress"]
    assert api_rule["ports"] == [{"port": routing.ROUTER_PORT, "protocol": "TCP"}]
    assert {"namespaceSelector": {"matchLabels": {"team": "a"}}} in api_rule["from"]  # the clients, now the router's
    assert metrics_rule["ports"] == [{"port": routing.ROUTER_METRICS_PORT, "protocol": "TCP"}]
    pods = objects[("NetworkPolicy", "llama")]
    peers = [peer for rule in pods["spec"]["ingress"] for peer in rule["from"]]
    assert not any("namespaceSelector" in p and "podSelector" not in p for p in peers)  # no client namespace
    routers = [p for p in peers if names.LABEL_ROLE in p.get("podSelector", {}).get("matchLabels", {})]
    assert routers and all(p["podSelector"]["matchLabels"][names.LABEL_MODELSERVER] == "llama" for p in routers)
    # kv-aware pods publish no KV events, so no port but the API's is open to anyone
    assert [r["ports"] for r in pods["spec"]["ingress"]] == [[{"port": api.SERVER_PORT, "protocol": "TCP"}]]


def test_no_network_policy_when_the_spec_turns_them_off():
    objects = kinds(render(routing.MODE_KV_AWARE, networkPolicy={"enabled": False}))
    assert not any(kind == "NetworkPolicy" for kind, _ in objects)


def test_the_router_image_is_the_operators_unless_the_spec_names_one():
    container = kinds(render(routing.MODE_KV_AWARE))[("Deployment", "llama-router")]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/router:1"
    body = modelserver(replicas=2, routing={"mode": routing.MODE_KV_AWARE, "router": {"image": "mine:2"}})
    result = desired(body, [summarize_node(gpu_node("g"))], router_image="registry.example/router:1")
    assert kinds(result)[("Deployment", "llama-router")]["spec"]["template"]["spec"]["containers"][0]["image"] == "mine:2"


def _imports(module: str) -> tuple[set[str], bool]:
    """(the controller modules it imports, whether any import sits inside a function)."""
    tree = ast.parse((CONTROLLER / f"{module}.py").read_text())
    found, nested = set(), False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.add(node.module or "")
            nested |= node not in tree.body
    return found, nested


def test_the_renderers_import_no_circle():
    manifests, manifests_nested = _imports("manifests")
    routing_objects, routing_nested = _imports("routing_objects")
    assert "manifests" not in routing_objects and "objects" in routing_objects and "objects" in manifests
    assert not manifests_nested and not routing_nested


def test_the_renderer_reads_no_environment():
    tree = ast.parse((CONTROLLER / "routing_objects.py").read_text())
    assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(a.name == "os" for a in n.names)
                   for n in ast.walk(tree))
