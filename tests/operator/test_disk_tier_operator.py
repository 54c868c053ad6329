"""spec.offload.disk through the real operator (`kopf run`) against the kmock API emulator: what only the cluster
can tell (a claim that is missing, too small or read-only; the node's ephemeral storage; the release) is a
condition with the numbers and nothing is deployed; a claim created later is found on the retry; status.plan.disk
holds the planner's own figures and goes when the tier is switched off."""
from __future__ import annotations

import pytest
from spillway.adapters.model_config import resolve_geometry
from spillway.controller.facts import summarize_node
from spillway.controller.spec import parse_spec
from spillway.core import disk_tier as dt
from spillway.core.planner import plan
from spillway.core.quantity import parse_bytes
from support.crd_schema import admit
from support.ms_api import Api
from support.ms_cluster import eventually
from support.ms_examples import LLAMA_8B, gpu_node

CLAIM = "kv-tier"


def disk_node(api: Api, name: str = "a", ephemeral: str | None = "28Ti", disk_gbps: str | None = None) -> dict:
    body = gpu_node(f"{api.pool}-{name}", "2Ti", 8, labels={"pool": api.pool})
    if ephemeral is not None:
        body["status"]["allocatable"]["ephemeral-storage"] = ephemeral
    if disk_gbps is not None:
        body["metadata"].setdefault("annotations", {})[dt.ANNOTATION_QUALIFIED_DISK_GBPS] = disk_gbps
    api.core.create_node(body)
    return body


def claim(api: Api, storage: str, modes: tuple[str, ...] = ("ReadWriteMany",), name: str = CLAIM) -> None:
    api.core.create_namespaced_persistent_volume_claim(api.namespace, {
        "metadata": {"name": name},
        "spec": {"accessModes": list(modes), "resources": {"requests": {"storage": storage}}}})


def on_claim(capacity: str = "4Ti", **disk) -> dict:
    return {"disk": {"enabled": True, "volume": {"persistentVolumeClaim": {"claimName": CLAIM, "capacity": capacity}},
                     **disk}}


def failed(api: Api, reason: str) -> dict[str, dict]:
    api.planned(status="False", reason=reason)
    return {c["type"]: c for c in api.get()["status"]["conditions"]}


def expected_disk(api: Api, node: dict) -> dt.DiskTierPlan:
    """The planner's own tier for this ModelServer on this node, computed here rather than read from the operator."""
    spec = parse_spec(api.get()["spec"])
    return plan(resolve_geometry(LLAMA_8B), spec.request, summarize_node(node).facts()).disk


def stored(status: dict) -> dict:
    """The status as the API server keeps it after a merge patch: a null removes its key."""
    if isinstance(status, dict):
        return {k: stored(v) for k, v in status.items() if v is not None}
    return status


def test_a_missing_claim_is_a_condition_until_it_is_created(api):
    node = disk_node(api)
    api.modelserver(replicas=2, offload=on_claim())
    conditions = failed(api, "DiskVolumeNotFound")
    message = conditions["Planned"]["message"]
    for words in (f"no PersistentVolumeClaim {CLAIM} in namespace {api.namespace}", "Pending"):
        assert words in message, message
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == ("True", "DiskVolumeNotFound")
    assert conditions["Ready"]["reason"] == "NotDeployed"
    assert api.deployments() == [] and api.services() == []
    assert ("Warning", "DiskVolumeNotFound") in {(t, r) for t, r, _ in eventually(api.events)}

    claim(api, "4Ti")  # nothing watches claims: the operator's retry finds it
    api.planned(status="True", timeout=60)
    deployment = eventually(api.deployment)
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == dt.VOLUME_NAME)
    assert volume == {"name": dt.VOLUME_NAME, "persistentVolumeClaim": {"claimName": CLAIM}}
    disk = eventually(lambda: api.get()["status"].get("plan", {}).get("disk"), what="status.plan.disk")
    want = expected_disk(api, node)
    assert want.share_bytes == 4 * 2**40 // 2  # the claim's capacity, shared by both replicas
    assert (disk["volume"], disk["tierBytes"], disk["boundBytes"], disk["chunks"], disk["cachedTokens"]) == \
        (dt.PVC, want.tier_bytes, want.bound_bytes, want.chunks, want.tokens)
    assert disk["rendered"] is True and disk["pays"] == "Unknown" and "ephemeralStorage" not in disk
    assert disk["breakEvenGBps"] == round(want.break_even_gbps, 3) and "not qualified" in disk["verdict"]


@pytest.mark.parametrize(("pvc", "replicas", "reason", "words"), [
    (("1Ti", ("ReadWriteMany",)), 1, "DiskTierDoesNotFit",
     ["capacity 4Ti (4.00 TiB) is more than PersistentVolumeClaim kv-tier holds (1.00 TiB)", "at most 1.00 TiB"]),
    (("4Ti", ("ReadOnlyMany",)), 1, "InvalidSpec", ["kv-tier is ReadOnlyMany", "writes its chunk files"]),
    (("4Ti", ("ReadWriteOncePod",)), 2, "InvalidSpec", ["ReadWriteOncePod: one pod may mount it", "all 2 replicas"]),
])
def test_a_claim_that_cannot_carry_the_tier_is_a_condition(api, pvc, replicas, reason, words):
    disk_node(api)
    claim(api, *pvc)
    api.modelserver(replicas=replicas, offload=on_claim())
    message = failed(api, reason)["Planned"]["message"]
    for word in words:
        assert word in message, message
    assert api.deployments() == []


@pytest.mark.parametrize(("ephemeral", "spec", "reason", "words"), [
    ("28Ti", {"offload": {"disk": {"enabled": True, "size": "5Ti"}}}, "DiskTierDoesNotFit",
     ["offload.disk.size 5Ti (5.00 TiB) exceeds the replica's share of 3.32 TiB", "28.00 TiB allocatable",
      "at most 3.17 TiB"]),
    (None, {"offload": {"disk": {"enabled": True}}}, "DiskTierDoesNotFit",
     ["reports no allocatable ephemeral-storage"]),
    ("28Ti", {"vllmVersion": "0.26.0", "offload": {"disk": {"enabled": True}}}, "InvalidSpec",
     ["vLLM 0.32 or newer", "vLLM 0.26"]),
])
def test_what_the_node_or_the_release_refuses_is_a_condition(api, ephemeral, spec, reason, words):
    disk_node(api, ephemeral=ephemeral)
    api.modelserver(**spec)
    conditions = failed(api, reason)
    for word in words:
        assert word in conditions["Planned"]["message"], conditions["Planned"]["message"]
    assert "nothing is deployed" in conditions["Degraded"]["message"]
    assert api.deployments() == []


def test_status_plan_disk_says_whether_it_pays_and_goes_with_the_tier(api):
    node = disk_node(api, disk_gbps="0.5")  # far below any break-even: a disk hit loses to recompute
    api.modelserver(offload={"disk": {"enabled": True}})
    api.planned(status="True")
    disk = eventually(lambda: api.get()["status"].get("plan", {}).get("disk"), what="status.plan.disk")
    want = expected_disk(api, node)
    assert want.pays is False and not want.active
    assert (disk["rendered"], disk["pays"], disk["qualifiedDiskReadGBps"]) == (False, "False", 0.5)
    assert disk["breakEvenGBps"] == round(want.break_even_gbps, 3) > 0.5
    assert "does not pay" in disk["verdict"] and "32K tokens" in disk["verdict"]
    assert want.ephemeral_request_bytes == want.share_bytes  # the pod's request = limit is the replica's share
    assert parse_bytes(disk["ephemeralStorage"]) == -(-want.share_bytes // 2**20) * 2**20  # in whole MiB, up
    assert disk["tierBytes"] == want.tier_bytes and disk["sizing"] == want.why
    pod = eventually(api.deployment)["spec"]["template"]["spec"]
    assert all(v["name"] != dt.VOLUME_NAME for v in pod["volumes"])  # planned, judged, left off
    ms = api.get()
    assert admit({k: ms[k] for k in ("apiVersion", "kind", "metadata", "spec")} | {"status": stored(ms["status"])})[1] \
        == [], "status.plan.disk is pruned or refused by the CRD's status schema"

    api.patch({"spec": {"offload": {"disk": {"enabled": False}}}})
    eventually(lambda: "disk" not in (api.get()["status"].get("plan") or {"disk": 1}), what="status.plan.disk gone")


def test_a_mixed_pool_is_sized_for_its_smallest_node_class_and_the_status_says_so(api):
    disk_node(api, "a", ephemeral="28Ti")  # first by name, and the largest
    small = disk_node(api, "b", ephemeral="4Ti")
    api.modelserver(offload={"disk": {"enabled": True}})
    api.planned(status="True")
    disk = eventually(lambda: api.get()["status"].get("plan", {}).get("disk"), what="status.plan.disk")
    want = expected_disk(api, small)
    assert (disk["tierBytes"], disk["shareBytes"], disk["boundBytes"]) == \
        (want.tier_bytes, want.share_bytes, want.bound_bytes)
    assert (disk["sizedFor"], disk["nodeClasses"], disk["reloadGBps"]) == (small["metadata"]["name"], 2,
                                                                           dt.DEFAULT_RELOAD_GBPS)
    assert "the smallest share of the 2 node classes" in disk["sizing"]
    container = eventually(api.deployment)["spec"]["template"]["spec"]["containers"][0]
    assert parse_bytes(container["resources"]["requests"]["ephemeral-storage"]) <= 4 * 2**40
    ms = api.get()
    assert admit({k: ms[k] for k in ("apiVersion", "kind", "metadata", "spec")} | {"status": stored(ms["status"])})[1] \
        == [], "status.plan.disk is pruned or refused by the CRD's status schema"


def test_a_host_path_tier_is_refused_when_the_administrator_allows_none(api):
    disk_node(api)
    api.modelserver(offload={"disk": {"enabled": True, "volume": {"hostPath": {"path": "/mnt/nvme/kv",
                                                                                "capacity": "8Ti"}}}})
    conditions = failed(api, "DiskHostPathNotAllowed")
    message = conditions["Planned"]["message"]
    assert "/mnt/nvme/kv: this operator allows no node directory for a disk tier" in message, message
    assert "operator.diskTier.hostPathPrefixes" in message
    assert api.deployments() == []
