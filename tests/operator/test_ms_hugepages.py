"""A node's hugepages-2Mi through the operator: read from the Node, said in the status, the pool on them in the
validated pod."""
from __future__ import annotations

import json

import kubernetes_validate
import pytest
from spillway.controller.facts import nodes_fingerprint, summarize_node
from spillway.controller.manifests import desired
from spillway.controller.status import status_plan
from spillway.core import k8s_names as names
from spillway.core import vllm_api as api
from spillway.core.quantity import GiB, MiB, parse_bytes
from support.ms_examples import gpu_node, modelserver

KUBERNETES_VERSIONS = ("1.30", "1.37")


def hugepage_node(name: str, hugepages: str | None, memory: str = "1Ti") -> dict:
    node = gpu_node(name, memory, 8)
    if hugepages is not None:
        for part in ("capacity", "allocatable"):
            node["status"][part][names.HUGEPAGES_2MI_RESOURCE] = hugepages
    return node


def test_the_nodes_hugepages_are_read():
    assert summarize_node(hugepage_node("a", "320Gi")).hugepages_2mi == 320 * GiB
    assert summarize_node(hugepage_node("a", None)).hugepages_2mi is None
    assert summarize_node(hugepage_node("a", "lots")).hugepages_2mi is None  # unreadable: as if unknown


def test_hugepages_change_the_nodes_fingerprint():
    plain, huge = summarize_node(hugepage_node("a", None)), summarize_node(hugepage_node("a", "320Gi"))
    assert nodes_fingerprint([plain]) != nodes_fingerprint([huge])
    assert nodes_fingerprint([plain]) == nodes_fingerprint([summarize_node(gpu_node("a", "1Ti", 8))])


@pytest.mark.parametrize("hugepages", [None, "16Gi", "800Gi"])
def test_the_status_says_where_the_pages_come_from(hugepages):
    result = desired(modelserver(offload={"size": "32Gi"}), [summarize_node(hugepage_node("g", hugepages))])
    line = status_plan(result)["poolPages"]
    assert line.startswith("2 MiB huge pages: " if hugepages == "800Gi" else "4 KiB pages: ")
    assert {None: "allocatable hugepages-2Mi is not known", "16Gi": "the pool needs 32.00 GiB",
            "800Gi": "32.00 GiB of node g's hugepages-2Mi (100.00 GiB per replica)"}[hugepages] in line


def test_no_pool_no_pages_line():
    result = desired(modelserver(offload={"enabled": False}), [summarize_node(hugepage_node("g", "800Gi"))])
    assert status_plan(result)["poolPages"] is None


def _pod(hugepages: str | None) -> tuple[dict, object]:
    body = modelserver(offload={"size": "32Gi"})
    body["metadata"]["uid"] = "0b8f5f5e-0000-4000-8000-000000000000"
    result = desired(body, [summarize_node(hugepage_node("g", hugepages))])
    return next(o for o in result.objects if o["kind"] == "Deployment"), result


def test_a_hugepage_node_puts_the_pool_on_a_hugetlbfs_volume_in_a_valid_pod():
    """hugepages-2Mi request = limit beside memory (Kubernetes asks for a cpu or memory request with them), the
    memory limit less the pool, /dev/shm sized for the queues only, the pool's volume and its directory's name."""
    deployment, result = _pod("800Gi")
    plain, plain_result = _pod(None)
    pod, container = deployment["spec"]["template"]["spec"], deployment["spec"]["template"]["spec"]["containers"][0]
    resources, plain_resources = container["resources"], plain["spec"]["template"]["spec"]["containers"][0][
        "resources"]
    assert resources["requests"][names.HUGEPAGES_2MI_RESOURCE] == resources["limits"][names.HUGEPAGES_2MI_RESOURCE] \
        == "32768Mi"
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert parse_bytes(plain_resources["limits"]["memory"]) - parse_bytes(resources["limits"]["memory"]) \
        >= 32 * GiB - 64 * MiB  # the pool is out of the memory limit, its page tables and slack stay
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[names.VOLUME_POOL_HUGEPAGES] == {"name": names.VOLUME_POOL_HUGEPAGES,
                                                    "emptyDir": {"medium": "HugePages-2Mi"}}
    assert volumes[names.VOLUME_SHM]["emptyDir"]["sizeLimit"] == "1024Mi"
    assert {"name": names.VOLUME_POOL_HUGEPAGES, "mountPath": names.POOL_HUGEPAGES_MOUNT} in container["volumeMounts"]
    assert {"name": api.ENV_POOL_HUGEPAGES_DIR, "value": names.POOL_HUGEPAGES_MOUNT} in container["env"]
    assert "32.00 GiB of hugepages-2Mi" in result.summary()
    # the kubelet mounts the volume root's, 0755: fsGroup makes it writable by vLLM's user
    assert pod["securityContext"]["fsGroup"] == names.VLLM_IMAGE_UID
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert "fsGroup" not in plain["spec"]["template"]["spec"]["securityContext"]
    # a node without them: no request, no volume, no variable
    assert not any(k.startswith("hugepages-") for part in plain_resources.values() for k in part)
    assert names.VOLUME_POOL_HUGEPAGES not in {v["name"] for v in plain["spec"]["template"]["spec"]["volumes"]}
    assert "hugepages" not in plain_result.summary()
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(json.loads(json.dumps(deployment)), version, strict=True)


def test_nodes_without_the_pages_keep_every_pod_on_4k_pages():
    """The pod lands on any eligible node: a hugepages-2Mi request would leave it pending where they are missing."""
    body = modelserver(offload={"size": "32Gi"})
    nodes = [summarize_node(hugepage_node("a-huge", "800Gi")), summarize_node(hugepage_node("b-plain", None))]
    result = desired(body, nodes)
    assert not result.plan.pages.huge_pages and result.plan.pod.hugepages_bytes == 0
    assert status_plan(result)["poolPages"] == ("4 KiB pages: the hugepages-2Mi of node(s) a-huge would hold the "
                                                "pool, those of b-plain would not, and the pod may land on any of them")
    container = next(o for o in result.objects if o["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    assert not any(k.startswith("hugepages-") for part in container["resources"].values() for k in part)
    both = desired(body, [nodes[0], summarize_node(hugepage_node("c-huge", "800Gi"))])
    assert both.plan.pages.huge_pages


def test_auto_fills_the_nodes_huge_page_share_in_the_status_and_the_pod():
    """A node whose memory is mostly reserved as huge pages: allocatable memory 400 GiB beside 1600 GiB of
    hugepages-2Mi, 8 replicas. The memory share alone holds a 32.41 GiB pool; the huge pages hold 200 GiB each."""
    body = modelserver()
    result = desired(body, [summarize_node(hugepage_node("g", "1600Gi", memory="400Gi"))])
    status = status_plan(result)
    assert status["offloadBytes"] == 200 * GiB and status["cachedTokens"] == 200 * GiB // (128 * 1024)
    assert status["poolPages"].startswith("2 MiB huge pages: auto sized the pool from node g's hugepages-2Mi, "
                                          "200.00 GiB of the replica's 200.00 GiB, at least the 32.41 GiB")
    container = next(o for o in result.objects if o["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    limits = container["resources"]["limits"]
    assert limits[names.HUGEPAGES_2MI_RESOURCE] == "204800Mi"
    assert 8 * parse_bytes(limits["memory"]) <= 400 * GiB


def test_auto_on_nodes_of_which_some_lack_huge_pages_is_the_memory_pool():
    """The mixed rule holds for auto too: every class plans its memory pool on 4 KiB pages, the one the node without
    huge pages would plan."""
    nodes = [summarize_node(hugepage_node("a-huge", "1600Gi", memory="400Gi")),
             summarize_node(hugepage_node("b-plain", None, memory="400Gi"))]
    result = desired(modelserver(), nodes)
    alone = desired(modelserver(), nodes[1:])
    assert not result.plan.pages.huge_pages and result.plan.pool == alone.plan.pool
    assert result.plan.pod.hugepages_bytes == 0 and round(result.plan.pool.gib, 2) == 32.41
    assert status_plan(result)["poolPages"].startswith("4 KiB pages: the hugepages-2Mi of node(s) a-huge would hold")


def test_node_classes_with_huge_pages_of_different_shares_get_the_smallest():
    """auto sizes each class's pool from its own share of huge pages, and their memory limits differ by page tables
    alone (here the same MiB): the pod with the larger pool would stay pending on the class with fewer pages."""
    nodes = [summarize_node(hugepage_node("a-large", "1600Gi", memory="400Gi")),
             summarize_node(hugepage_node("b-small", "800Gi", memory="400Gi"))]
    result = desired(modelserver(), nodes)
    assert result.plan.pod.hugepages_bytes == result.plan.pool.bytes == 100 * GiB
    assert result.node.name == "b-small"


def test_a_size_only_one_class_holds_on_huge_pages_is_refused_saying_why():
    """Node class a holds 200Gi only on its hugepages-2Mi, class b (memory only) holds it in memory: the pod may land
    on either, so a plans it on 4 KiB pages too, where its memory share does not hold it."""
    from spillway.core.errors import PoolDoesNotFit

    nodes = [summarize_node(hugepage_node("a", "1600Gi", "400Gi")), summarize_node(hugepage_node("b", None, "2Ti"))]
    with pytest.raises(PoolDoesNotFit) as error:
        desired(modelserver(offload={"size": "200Gi"}), nodes)
    assert str(error.value).startswith("node a holds the pool only on its hugepages-2Mi, which node(s) b lack, and "
                                       "the pod may land on any of them; planned on 4 KiB pages: offload size 200Gi")
    # where every class holds it on huge pages, it is planned on them
    both = [summarize_node(hugepage_node(n, "1600Gi", "400Gi")) for n in "ab"]
    assert desired(modelserver(offload={"size": "200Gi"}), both).plan.pod.hugepages_bytes == 200 * GiB
