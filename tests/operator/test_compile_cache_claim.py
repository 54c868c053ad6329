"""spec.compileCache: vLLM's compile cache carried between pods on a claim the replicas share.

Rendered: the claim is mounted beside the pod's own cache root (an emptyDir, which vLLM keeps using), the entrypoint
is told this pod's directory on the claim (the same key as the cache root's) and the URL that says the server is up,
Triton's cache goes below the root, a preStop hook publishes once more, and the pod's fsGroup makes the claim
writable by the image's user. Through the real operator (`kopf run`) against
the kmock API emulator: a missing claim is a condition until it is created, a claim no replica may write or that only
one pod may mount is refused, and another image than Spillway's is refused, since only its entrypoint copies.
"""
from __future__ import annotations

import json
import os

import kubernetes_validate
import pytest
from spillway.controller.spec import parse_spec
from spillway.core import k8s_names as names
from spillway.core import vllm_api as api
from spillway.core.errors import InvalidSpec
from support.crd_schema import admit
from support.ms_api import Api
from support.ms_cluster import eventually
from support.ms_examples import gpu_node, modelserver, rendered_deployment

CLAIM = "vllm-compile-cache"
KUBERNETES_VERSIONS = ("1.30", "1.37")


def pod_of(**spec) -> dict:
    return rendered_deployment(**spec)["spec"]["template"]["spec"]


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


def test_the_claim_is_mounted_and_the_entrypoint_told_this_pods_directory_on_it():
    pod = pod_of(compileCache={"claimName": CLAIM})
    volume = next(v for v in pod["volumes"] if v["name"] == names.VOLUME_COMPILE_CACHE)
    assert volume == {"name": names.VOLUME_COMPILE_CACHE, "persistentVolumeClaim": {"claimName": CLAIM}}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    env = env_of(pod)
    shared, root = env[api.ENV_COMPILE_CACHE_DIR], env[api.ENV_CACHE_ROOT]
    # vLLM keeps its own emptyDir; the claim's directory carries the same key
    assert os.path.dirname(root) == mounts[names.VOLUME_VLLM_CACHE]
    assert os.path.dirname(shared) == mounts[names.VOLUME_COMPILE_CACHE] == names.COMPILE_CACHE_MOUNT
    assert os.path.basename(shared) == os.path.basename(root)
    assert env[api.ENV_COMPILE_CACHE_READY_URL] == f"http://127.0.0.1:{api.SERVER_PORT}{api.HEALTH_PATH}"
    # what Triton builds lands below the cache root, so a snapshot carries it
    assert env[api.ENV_TRITON_CACHE_DIR].startswith(f"{root}/")
    # and once more as the pod stops: what the server wrote while serving
    assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == [
        "python3", names.COMPILE_CACHE_COPIER, "publish", shared, root,
        "--after-ready", env[api.ENV_COMPILE_CACHE_READY_URL], "--wait-s", "0"]
    probe = pod["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["path"] == api.HEALTH_PATH, "the publisher waits for what the kubelet's probes ask"
    assert pod["securityContext"]["fsGroup"] == names.VLLM_IMAGE_UID
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(json.loads(json.dumps(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod})), version, strict=True)


def test_without_a_claim_nothing_is_mounted_or_told():
    pod = pod_of()
    assert names.VOLUME_COMPILE_CACHE not in {v["name"] for v in pod["volumes"]}
    assert not {api.ENV_COMPILE_CACHE_DIR, api.ENV_COMPILE_CACHE_READY_URL} & set(env_of(pod))
    assert "fsGroup" not in pod["securityContext"] and "lifecycle" not in pod["containers"][0]


@pytest.mark.parametrize("spec", [{}, {"compileCache": {"claimName": CLAIM}}, {"image": "vllm/vllm-openai:v0.34.0"}])
def test_tritons_kernels_stay_below_the_cache_root_in_every_pod(spec):
    # a restarted container finds what its compiling start built (bench/compile-cache: the first start over loaded
    # graphs otherwise builds Triton's kernels again)
    pod = pod_of(**spec)
    env = env_of(pod)
    root = env[api.ENV_CACHE_ROOT]
    assert env[api.ENV_TRITON_CACHE_DIR] == f"{root}/{api.TRITON_CACHE_BELOW_ROOT}"
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert os.path.dirname(root) in mounts


def test_each_model_and_release_gets_its_own_directory_on_a_shared_claim():
    def shared(**spec) -> str:
        return env_of(pod_of(compileCache={"claimName": CLAIM}, **spec))[api.ENV_COMPILE_CACHE_DIR]

    base = shared()
    assert len({base, shared(model="Qwen/Qwen3-8B"), shared(vllmVersion="0.33.0"), shared(revision="r2")}) == 4
    assert shared(replicas=4) == base


@pytest.mark.parametrize(("cache", "image", "words"), [
    ({"claimName": CLAIM}, "vllm/vllm-openai:v0.34.0", ["needs Spillway's vLLM image", "vllm/vllm-openai:v0.34.0"]),
    ({}, None, ["spec.compileCache.claimName is required"]),
    ({"claimName": "Not_A_Name"}, None, ["spec.compileCache.claimName"]),
    ({"claimName": CLAIM, "size": "10Gi"}, None, ["size"]),
    ("cache", None, ["spec.compileCache must be an object"]),
])
def test_a_bad_compile_cache_is_refused_by_name(cache, image, words):
    body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "compileCache": cache, **({"image": image} if image else {})}
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(body)
    for word in words:
        assert word in str(caught.value), caught.value


def test_the_spec_may_not_set_the_entrypoints_variables():
    for name in (api.ENV_COMPILE_CACHE_DIR, api.ENV_COMPILE_CACHE_READY_URL, api.ENV_TRITON_CACHE_DIR):
        with pytest.raises(InvalidSpec, match=name):
            parse_spec({"model": "m", "env": [{"name": name, "value": "/elsewhere"}]})


@pytest.mark.parametrize(("cache", "admitted"), [
    ({"claimName": CLAIM}, True),
    ({}, False),
    ({"claimName": ""}, False),
    ({"claimName": "UPPER"}, False),
])
def test_the_crd_admits_what_the_operator_accepts(cache, admitted):
    assert (admit(modelserver(compileCache=cache))[1] == []) == admitted


# -- through the operator ----------------------------------------------------------------------------------------

def node(api_: Api) -> None:
    api_.core.create_node(gpu_node(f"{api_.pool}-a", "2Ti", 8, labels={"pool": api_.pool}))


def claim(api_: Api, modes: tuple[str, ...] = ("ReadWriteMany",)) -> None:
    api_.core.create_namespaced_persistent_volume_claim(api_.namespace, {
        "metadata": {"name": CLAIM},
        "spec": {"accessModes": list(modes), "resources": {"requests": {"storage": "20Gi"}}}})


def test_a_missing_claim_is_a_condition_until_it_is_created(api):
    node(api)
    api.modelserver(replicas=2, compileCache={"claimName": CLAIM})
    api.planned(status="False", reason="CompileCacheClaimNotFound")
    message = api.condition("Planned")["message"]
    for words in (f"spec.compileCache.claimName {CLAIM}", f"no PersistentVolumeClaim {CLAIM}", "Pending"):
        assert words in message, message
    assert api.deployments() == []
    assert ("Warning", "CompileCacheClaimNotFound") in {(t, r) for t, r, _ in eventually(api.events)}

    claim(api)  # nothing watches claims: the operator's retry finds it
    api.planned(status="True", timeout=60)
    pod = eventually(api.deployment)["spec"]["template"]["spec"]
    assert {"name": names.VOLUME_COMPILE_CACHE, "persistentVolumeClaim": {"claimName": CLAIM}} in pod["volumes"]


@pytest.mark.parametrize(("modes", "replicas", "words"), [
    (("ReadOnlyMany",), 1, ["is ReadOnlyMany", "publishes snapshots of its compile cache there"]),
    (("ReadWriteOncePod",), 2, ["ReadWriteOncePod: one pod may mount it", "all 2 replicas"]),
])
def test_a_claim_the_replicas_cannot_share_or_write_is_a_condition(api, modes, replicas, words):
    node(api)
    claim(api, modes)
    api.modelserver(replicas=replicas, compileCache={"claimName": CLAIM})
    api.planned(status="False", reason="InvalidSpec")
    message = api.condition("Planned")["message"]
    for word in words:
        assert word in message, message
    assert api.deployments() == []
