"""Names a tenant writes that become API paths: what the HTTP client sends for each referenced kind, and the real
operator (`kopf run`, hub fetches on) refusing a name that is not a Kubernetes name, with a condition, before it
reads anything.

The attack: `configMapRef: {name: ../../victim/configmaps/private}` joined into
/api/v1/namespaces/<ns>/configmaps/<name> unquoted is resolved by the client to the victim's ConfigMap, read with
the operator's cluster-wide rights."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from spillway.adapters.kube import Kube, path
from spillway.controller.spec_checks import DNS1123_SUBDOMAIN, object_name
from spillway.core import k8s_names as names
from spillway.core.errors import InvalidSpec
from support.ms_api import Api
from support.ms_cluster import EmulatedCluster, Operator
from support.operator_fixtures import free_port

CRD = Path(__file__).resolve().parents[2] / "charts/spillway/crds/modelservers.spillway.dev.yaml"
VICTIM = "victim"
# kind (as the operator names it) -> the plural in the path, and a hostile name for it
KINDS = {"ConfigMap": "configmaps", "Secret": "secrets", names.PVC_PLURAL: names.PVC_PLURAL}
HOSTILE = ["../../victim/configmaps/private", "..%2F..%2Fvictim", "a/b", "a?watch=true", "a#b", "x/../../..", "a b"]
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory):
    """Hub fetches on: a hfTokenSecretRef is read (and its token sent to the hub) only then."""
    running = Operator(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "kopf.log",
                       {names.ENV_RETRY_SECONDS: "1", names.ENV_METRICS_PORT: str(free_port()),
                        names.ENV_ALLOW_HUB_FETCH: "true"}).start()
    yield running
    alive = running.alive()
    running.kill()
    assert alive, "the operator died during the tests:\n" + running.output()[-5000:]


def sent_paths(cluster: EmulatedCluster, method: str = "GET") -> list[str]:
    """The paths as they reached the server, percent-encoding kept."""
    return cluster.call(lambda: [r.url.raw_path for r in cluster.emulator if r.method == method])


@pytest.mark.parametrize("kind", KINDS)
def test_each_name_is_one_quoted_segment_on_the_wire(cluster, kind):
    client = Kube(cluster.client())
    before = len(sent_paths(cluster))
    for name in HOSTILE:
        assert client.get(path("v1", kind, "tenant", name)) is None
    sent = sent_paths(cluster)[before:]
    assert len(sent) == len(HOSTILE)
    for raw in sent:
        head, _, last = raw.rpartition("/")
        assert head == f"/api/v1/namespaces/tenant/{KINDS[kind]}", raw  # nothing walked out of the namespace
        assert "/" not in last and "?" not in last and "#" not in last, raw


@pytest.mark.parametrize("namespace, name", [("tenant", ".."), ("tenant", "."), ("..", "x")])
def test_a_segment_of_dots_is_refused_before_anything_is_sent(cluster, namespace, name):
    before = len(sent_paths(cluster))
    with pytest.raises(InvalidSpec, match="cannot name a Kubernetes object"):
        Kube(cluster.client()).get(path("v1", "Secret", namespace, name))
    assert len(sent_paths(cluster)) == before


@pytest.fixture(scope="module")
def victim(cluster) -> None:
    """What a tenant must not read: a model's config.json, a token and a claim in another namespace."""
    api = Api(cluster)
    api.core.create_namespaced_config_map(VICTIM, {"metadata": {"name": "private"},
                                                   "data": {"config.json": json.dumps(LLAMA)}})
    api.core.create_namespaced_secret(VICTIM, {"metadata": {"name": "private"},
                                               "data": {"token": base64.b64encode(b"hf_secret").decode()}})
    api.core.create_namespaced_persistent_volume_claim(VICTIM, {
        "metadata": {"name": "private"}, "spec": {"accessModes": ["ReadWriteMany"],
                                                  "resources": {"requests": {"storage": "7Ti"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "7Ti"}}})


def _attacks(target: str) -> dict[str, tuple[dict, str]]:
    """ModelServer name -> (spec, the field its condition names), each pointing `target` at the victim."""
    pvc = {"disk": {"enabled": True, "volume": {"persistentVolumeClaim": {"claimName": target, "capacity": "1Ti"}}}}
    return {
        "config-map": ({"model": "acme/odd", "modelConfig": {"configMapRef": {"name": target}}},
                       "spec.modelConfig.configMapRef.name"),
        "hf-token": ({"model": "acme/not-in-catalog", "hfTokenSecretRef": {"name": target}},
                     "spec.hfTokenSecretRef.name"),
        "api-key": ({"apiKeySecretRef": {"name": target}}, "spec.apiKeySecretRef.name"),
        "claim": ({"offload": pvc}, "spec.offload.disk.volume.persistentVolumeClaim.claimName"),
        "pull-secret": ({"imagePullSecrets": [{"name": target}]}, "spec.imagePullSecrets[].name"),
    }


@pytest.mark.parametrize("target", ["../../victim/configmaps/private", "../../victim/secrets/private",
                                    "../../victim/persistentvolumeclaims/private", "x" * 10_000])
def test_a_reference_that_is_no_kubernetes_name_is_a_condition_and_reads_nothing(cluster, victim, operator, target):
    api = Api(cluster)
    api.node("a")
    attacks = _attacks(target)
    for name, (spec, _) in attacks.items():
        api.modelserver(name, **spec)
    for name, (_, field) in attacks.items():
        planned = api.planned(name, status="False")
        assert planned["reason"] == "InvalidSpec", (name, planned)
        assert field in planned["message"] and "not the name of a" in planned["message"], (name, planned)
        assert len(planned["message"]) < 400, planned  # the 10 KB name is not echoed whole
    read = [p for p in sent_paths(cluster) if f"/namespaces/{VICTIM}/" in p or f"/namespaces/{api.namespace}/" in p
            and any(k in p for k in KINDS.values())]
    assert read == [], read  # neither the victim's objects nor a mangled path in the tenant's own namespace
    assert api.deployments() == []


def _name_schemas(node, trail=()):
    """(where, schema) of every referenced object's name field in the CRD's spec schema."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("name", "claimName", "storageClassName") and isinstance(value, dict) and value.get("type") == "string" \
                    and trail and trail[-1] == "properties" and "metadata" not in trail:
                yield ".".join(trail), value
            yield from _name_schemas(value, (*trail, key))


def test_the_crd_pattern_is_the_operators_rule():
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    found = {where: schema for where, schema in _name_schemas(spec)
             if not where.startswith(("properties.routing", "properties.env", "properties.resources"))}
    refs = [w for w in found if any(part in w for part in ("configMapRef", "hfTokenSecretRef", "apiKeySecretRef",
                                                           "imagePullSecrets", "persistentVolumeClaim", "ephemeral"))]
    assert len(refs) == 6, sorted(found)
    for where in refs:
        assert found[where].get("pattern") == DNS1123_SUBDOMAIN and found[where].get("maxLength") == 253, where


@pytest.mark.parametrize("name", ["x" * 253, "a.b-c.d", "0"])
def test_names_the_api_server_takes_are_taken(name):
    assert object_name(name, "f", "ConfigMap") == name


@pytest.mark.parametrize("name", ["x" * 254, "a\n", "a..b", "A", "a.", "-a", "\uff41", "%2e%2e", "a/b", "a\x00", ""])
def test_names_the_api_server_refuses_are_refused(name):
    with pytest.raises(InvalidSpec, match="is not the name of a ConfigMap"):
        object_name(name, "f", "ConfigMap")
