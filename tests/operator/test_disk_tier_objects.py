"""spec.offload.disk through the CRD, the spec parser and `spillway render`: the volume, the pod's ephemeral
storage and vLLM's tiering spec; bad input as one line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from spillway.adapters.model_config import resolve_geometry
from spillway.controller.facts import nodes_fingerprint, summarize_node
from spillway.controller.manifests import desired
from spillway.controller.spec import parse_spec
from spillway.core import disk_tier as dt
from spillway.core.errors import InvalidSpec, SpillwayError
from spillway.core.planner import plan
from spillway.core.quantity import parse_bytes
from support.crd_schema import admit
from support.ms_examples import LLAMA_8B, gpu_node, modelserver


def disk_node(name: str = "gpu-a", ephemeral: str | None = "28Ti") -> dict:
    node = gpu_node(name, "2Ti", 8)
    if ephemeral is not None:
        node["status"]["allocatable"]["ephemeral-storage"] = ephemeral
    return node


def render(tmp_path, body: dict, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "ms.yaml"
    path.write_text(yaml.safe_dump(body))
    return subprocess.run([sys.executable, "-m", "spillway.cli", "render", "-f", str(path), "--node-memory", "2Ti",
                           "--gpus-per-node", "8", *args], capture_output=True, text=True, timeout=120, check=False)


def pod(objects) -> dict:
    return next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]


def test_render_shows_the_volume_the_ephemeral_storage_and_the_tiering_spec(tmp_path):
    body = modelserver(offload={"disk": {"enabled": True}})
    done = render(tmp_path, body, "--node-ephemeral-storage", "28Ti")
    assert done.returncode == 0, done.stderr
    spec = pod(yaml.safe_load_all(done.stdout))
    container = spec["containers"][0]
    volume = next(v for v in spec["volumes"] if v["name"] == dt.VOLUME_NAME)
    assert volume == {"name": dt.VOLUME_NAME, "emptyDir": {"sizeLimit": "3322676Mi"}}
    assert {"name": dt.VOLUME_NAME, "mountPath": dt.MOUNT_PATH} in container["volumeMounts"]
    resources = container["resources"]
    assert resources["requests"]["ephemeral-storage"] == resources["limits"]["ephemeral-storage"] == "3486516Mi"
    config = json.loads(container["args"][container["args"].index("--kv-transfer-config") + 1])
    extra = config["kv_connector_extra_config"]
    assert extra["spec_name"] == "SpillwayTieringOffloadingSpec"  # vLLM's, with the connector's probes
    assert extra["secondary_tiers"][0]["root_dir"] == dt.MOUNT_PATH
    assert 0 < extra["spillway_disk_tier_bytes"] < 3322676 * 2**20  # the bound stays inside the sizeLimit
    assert {"name": "PYTHONHASHSEED", "value": "0"} in container["env"]
    # the operator renders the same from a Node that reports its ephemeral storage
    operator = desired(body, [summarize_node(disk_node())]).objects
    assert pod(json.loads(json.dumps(operator))) == spec


def test_named_volumes_render_as_themselves(tmp_path):
    cases = {
        "hostPath": ({"path": "/mnt/nvme/kv", "capacity": "8Ti"},
                     {"hostPath": {"path": "/mnt/nvme/kv", "type": "DirectoryOrCreate"}}),
        "persistentVolumeClaim": ({"claimName": "kv-shared", "capacity": "10Ti"},
                                  {"persistentVolumeClaim": {"claimName": "kv-shared"}}),
        "ephemeral": ({"storageClassName": "local-nvme", "capacity": "8Ti"},
                      {"ephemeral": {"volumeClaimTemplate": {"spec": {
                          "accessModes": ["ReadWriteOnce"], "storageClassName": "local-nvme",
                          "resources": {"requests": {"storage": "1048576Mi"}}}}}}),
    }
    for kind, (given, rendered) in cases.items():
        body = modelserver(offload={"disk": {"enabled": True, "volume": {kind: given}}})
        assert admit(body)[1] == [], kind
        spec = pod(desired(body, [summarize_node(disk_node(ephemeral=None))]).objects)
        assert next(v for v in spec["volumes"] if v["name"] == dt.VOLUME_NAME) == {"name": dt.VOLUME_NAME, **rendered}
        assert "ephemeral-storage" not in spec["containers"][0]["resources"]["requests"], kind


@pytest.mark.parametrize(("disk", "where"), [
    ({"enabled": "yes"}, "enabled"),
    ({"size": "1.5"}, "size"),
    ({"size": "lots"}, "size"),
    ({"volume": {"emptyDir": {}, "hostPath": {"path": "/x"}}}, "volume"),
    ({"volume": {"hostPath": {"path": "relative"}}}, "path"),
    ({"volume": {"persistentVolumeClaim": {}}}, "claimName"),
    ({"spare": 1}, "spare"),
])
def test_the_schema_and_the_operator_both_refuse_bad_disk_fields(disk, where):
    body = modelserver(offload={"disk": {"enabled": True, **disk}})
    errors = admit(body)[1]
    assert errors and any(where in e for e in errors), errors
    with pytest.raises(SpillwayError) as error:
        desired(body, [summarize_node(disk_node())])
    assert len(str(error.value).splitlines()) == 1


def test_what_only_the_node_or_the_release_can_refuse_is_a_condition_reason():
    with pytest.raises(dt.DiskTierDoesNotFit, match="reports no allocatable ephemeral-storage") as error:
        desired(modelserver(offload={"disk": {"enabled": True}}), [summarize_node(disk_node(ephemeral=None))])
    assert error.value.reason == "DiskTierDoesNotFit"
    with pytest.raises(dt.DiskTierDoesNotFit, match="exceeds the replica's share"):
        desired(modelserver(offload={"disk": {"enabled": True, "size": "5Ti"}}), [summarize_node(disk_node())])
    with pytest.raises(InvalidSpec, match="vLLM 0.32 or newer"):
        desired(modelserver(vllmVersion="0.26.0", offload={"disk": {"enabled": True}}), [summarize_node(disk_node())])
    with pytest.raises(InvalidSpec, match="Spillway plans it"):
        parse_spec(modelserver(offload={"disk": {"enabled": True}},
                               resources={"limits": {"ephemeral-storage": "1Ti"}})["spec"])


def test_off_by_default_and_the_facts_read_ephemeral_storage():
    assert parse_spec(modelserver()["spec"]).request.offload.disk.enabled is False
    summary = summarize_node(disk_node())
    assert summary.ephemeral_storage == 28 * 2**40 and summary.facts().ephemeral_storage == 28 * 2**40
    bare = summarize_node(disk_node(ephemeral=None))
    assert nodes_fingerprint([summary]) != nodes_fingerprint([bare])
    assert summarize_node(disk_node(ephemeral="plenty")).ephemeral_storage is None


def _disk_node(name: str, ephemeral: str, disk_gbps: str | None = None) -> dict:
    node = disk_node(name, ephemeral)
    if disk_gbps is not None:
        node["metadata"].setdefault("annotations", {})[dt.ANNOTATION_QUALIFIED_DISK_GBPS] = disk_gbps
    return node


def _tier(nodes: list[dict], **disk) -> tuple[dict, dict]:
    """(status.plan.disk, the pod) the operator plans for a pool of these nodes."""
    from spillway.controller.status import status_plan

    result = desired(modelserver(offload={"disk": {"enabled": True, **disk}}), [summarize_node(n) for n in nodes])
    return status_plan(result)["disk"], pod(result.objects)


def test_a_mixed_pool_gets_the_tier_of_its_smallest_node_class_whatever_the_names():
    small = plan(resolve_geometry(LLAMA_8B), parse_spec(modelserver(offload={"disk": {"enabled": True}})["spec"]).request,
                 summarize_node(disk_node("x", "4Ti")).facts()).disk
    for names_ in (("a-big", "b-small"), ("b-big", "a-small")):
        big_name, small_name = names_
        status, spec = _tier([_disk_node(big_name, "28Ti"), _disk_node(small_name, "4Ti"),
                              _disk_node(f"{small_name}-2", "4Ti")])
        assert (status["tierBytes"], status["shareBytes"], status["boundBytes"]) == \
            (small.tier_bytes, small.share_bytes, small.bound_bytes)
        assert (status["sizedFor"], status["nodeClasses"]) == (small_name, 2)
        assert f"sized for node {small_name} (and 1 more like it), the smallest share of the 2 node classes" \
            in status["sizing"]
        requested = spec["containers"][0]["resources"]["requests"]["ephemeral-storage"]
        assert parse_bytes(requested) <= 4 * 2**40  # the pod fits on the small nodes
        assert next(v for v in spec["volumes"] if v["name"] == dt.VOLUME_NAME)["emptyDir"]["sizeLimit"] == \
            f"{-(-small.tier_bytes // 2**20)}Mi"
        config = json.loads(spec["containers"][0]["args"][spec["containers"][0]["args"].index("--kv-transfer-config")
                                                          + 1])
        assert config["kv_connector_extra_config"]["spillway_disk_tier_bytes"] == small.bound_bytes


def test_a_mixed_pool_leaves_the_tier_off_when_one_class_disk_loses_and_says_which():
    status, spec = _tier([_disk_node("a-fast", "28Ti", "25"), _disk_node("b-slow", "28Ti", "1.5")])
    assert (status["rendered"], status["pays"], status["decidedBy"], status["qualifiedDiskReadGBps"]) == \
        (False, "False", "b-slow", 1.5)
    assert status["verdict"].startswith("node b-slow decides for all 2 node classes")
    assert all(v["name"] != dt.VOLUME_NAME for v in spec["volumes"])
    assert "ephemeral-storage" not in spec["containers"][0]["resources"]["requests"]
    env = {e["name"] for e in spec["containers"][0]["env"]}
    assert "PYTHONHASHSEED" not in env and "secondary_tiers" not in " ".join(spec["containers"][0]["args"])
    fast, spec = _tier([_disk_node("a-fast", "28Ti", "25"), _disk_node("b-fast", "28Ti", "30")])
    assert (fast["rendered"], fast["pays"], fast["decidedBy"], fast["reloadGBps"]) == (True, "True", "a-fast", 50.0)
    assert any(v["name"] == dt.VOLUME_NAME for v in spec["volumes"])


def test_a_modelservers_pods_share_their_disk_slots_and_a_spec_cannot_claim_anothers():
    """The engine reads the slots of its ModelServer's other replicas (disk_namespace.SiblingFiles): the operator
    names the share <namespace>/<name>, so two ModelServers that name one hostPath never read each other's chunks,
    and spec.env may not set it (a tenant naming another's share would read its chunks)."""
    from spillway.core import vllm_api as api

    shared = {"disk": {"enabled": True, "volume": {"hostPath": {"path": "/mnt/nvme/kv", "capacity": "8Ti"}}}}
    envs = []
    for namespace, name in (("team-a", "llama"), ("team-b", "llama")):
        spec = pod(desired(modelserver(name, namespace, offload=shared), [summarize_node(disk_node())]).objects)
        envs.append([e for e in spec["containers"][0]["env"] if e["name"] == api.ENV_DISK_TIER_SHARE])
    assert envs == [[{"name": api.ENV_DISK_TIER_SHARE, "value": "team-a/llama"}],
                    [{"name": api.ENV_DISK_TIER_SHARE, "value": "team-b/llama"}]]
    plain = pod(desired(modelserver(), [summarize_node(disk_node())]).objects)
    assert all(e["name"] != api.ENV_DISK_TIER_SHARE for e in plain["containers"][0]["env"]), "no tier, no share"
    claimed = modelserver(offload=shared, env=[{"name": api.ENV_DISK_TIER_SHARE, "value": "team-b/llama"}])
    with pytest.raises(InvalidSpec, match=api.ENV_DISK_TIER_SHARE):
        parse_spec(claimed["spec"])
