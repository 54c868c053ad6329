"""A node's hugepages-2Mi through the operator: read from the Node, said in the status, the pod as validated."""
from __future__ import annotations

import json

import kubernetes_validate
import pytest
from spillway.controller.facts import nodes_fingerprint, summarize_node
from spillway.controller.manifests import desired
from spillway.controller.status import status_plan
from spillway.core import k8s_names as names
from spillway.core.quantity import GiB
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
    assert line.startswith("4 KiB pages: ")
    assert {None: "allocatable hugepages-2Mi is not known", "16Gi": "the pool needs 32.00 GiB",
            "800Gi": "creates its region in /dev/shm"}[hugepages] in line


def test_no_pool_no_pages_line():
    result = desired(modelserver(offload={"enabled": False}), [summarize_node(hugepage_node("g", "800Gi"))])
    assert status_plan(result)["poolPages"] is None


def test_a_hugepage_node_renders_the_same_valid_pod():
    """The pool stays on 4 KiB pages in /dev/shm: no hugepages request, the memory limit as without them."""
    body = modelserver(offload={"size": "32Gi"})
    body["metadata"]["uid"] = "0b8f5f5e-0000-4000-8000-000000000000"
    huge = desired(body, [summarize_node(hugepage_node("g", "800Gi"))])
    plain = desired(body, [summarize_node(hugepage_node("g", None))])
    deployment = next(o for o in huge.objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert not any(k.startswith("hugepages-") for part in container["resources"].values() for k in part)
    assert container["resources"] == next(o for o in plain.objects if o["kind"] == "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]["resources"]
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(json.loads(json.dumps(deployment)), version, strict=True)
