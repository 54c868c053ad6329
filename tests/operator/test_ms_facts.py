"""Nodes -> NodeFacts, which nodes a replica may land on, and the fingerprint that triggers a re-plan."""
from __future__ import annotations

import json

import pytest
from spillway.controller.facts import (
    affinity_allows,
    eligible_nodes,
    nodes_fingerprint,
    summarize_node,
    tolerated,
)
from spillway.controller.spec import parse_spec
from spillway.core import k8s_names as names
from spillway.core.errors import NoEligibleNodes
from spillway.core.quantity import GiB
from support.ms_examples import LLAMA_8B, cpu_node, gpu_node


def summaries(*nodes):
    return [s for s in (summarize_node(n) for n in nodes) if s is not None]


def test_summary_reads_allocatable_memory_gpus_and_qualified_dma():
    node = summarize_node(gpu_node("a", memory="1536Gi", gpus=4, dma="52.5"))
    assert (node.name, node.allocatable_memory, node.gpus, node.dma_gbps) == ("a", 1536 * GiB, 4, 52.5)
    assert node.facts().dma_gbps == 52.5
    assert summarize_node(cpu_node("cpu")) is None
    assert summarize_node(gpu_node("bad", dma="fast")).dma_gbps is None


@pytest.mark.parametrize("cpu, millis", [("16", 16_000), ("15500m", 15_500), ("0.5", 500), (None, None),
                                         ("lots", None), ("-4", None), ("0", None), ("16Gi", None)])
def test_summary_reads_allocatable_cpu_and_a_bad_one_is_unknown(cpu, millis):
    node = summarize_node(gpu_node("a", cpu=cpu))
    assert node is not None and node.cpu_millis == millis == node.facts().cpu_millis


def test_node_selector_taints_and_affinity_decide_eligibility():
    nodes = summaries(
        gpu_node("a100", labels={"pool": "a100"}),
        gpu_node("h200", labels={"pool": "h200"}, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        gpu_node("flaky", labels={"pool": "h200"}, taints=[{"key": "node.kubernetes.io/unreachable",
                                                            "effect": "NoExecute"}]),
        gpu_node("soft", labels={"pool": "h200"}, taints=[{"key": "x", "effect": "PreferNoSchedule"}]),
        cpu_node("cpu"),
    )
    pick = lambda **spec: [n.name for n in eligible_nodes(nodes, parse_spec({"model": LLAMA_8B, **spec}))]
    assert pick() == ["a100", "flaky", "soft"]  # the lifecycle taint does not take a node out of the pool
    assert pick(nodeSelector={"pool": "h200"}) == ["flaky", "soft"]
    tolerate = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pick(nodeSelector={"pool": "h200"}, tolerations=tolerate) == ["flaky", "h200", "soft"]
    required = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a100"]}]}]}}}
    assert pick(affinity=required) == ["a100"]


def test_toleration_and_affinity_rules():
    node = summaries(gpu_node("n", labels={"gen": "9"}, taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]))[0]
    assert tolerated(node, [{"key": "k", "operator": "Equal", "value": "v"}])
    assert not tolerated(node, [{"key": "k", "operator": "Equal", "value": "w"}])
    assert not tolerated(node, [{"key": "k", "operator": "Exists", "effect": "NoExecute"}])
    assert tolerated(node, [{"operator": "Exists"}])
    term = lambda *exprs: {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": list(exprs)}]}}}
    assert affinity_allows(node, term({"key": "gen", "operator": "Gt", "values": ["8"]}))
    assert not affinity_allows(node, term({"key": "gen", "operator": "Lt", "values": ["8"]}))
    assert affinity_allows(node, term({"key": "zone", "operator": "DoesNotExist"}))
    assert not affinity_allows(node, term({"key": "gen", "operator": "NotIn", "values": ["9"]}))
    by_name = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]}}}
    assert affinity_allows(node, by_name)


@pytest.mark.parametrize("nodes, spec, words", [
    ([], {}, [f"no node has {names.GPU_RESOURCE}"]),
    ([gpu_node("a", labels={"pool": "x"})], {"nodeSelector": {"pool": "y"}}, ["none of the 1 GPU nodes",
                                                                              '"pool": "y"']),
    ([gpu_node("a", taints=[{"key": "t", "effect": "NoSchedule"}])], {}, ["none is allowed by the tolerations"]),
    ([gpu_node("a", gpus=4), gpu_node("b", gpus=2)], {"tensorParallelSize": 8},
     ["tensorParallelSize 8 needs 8 GPUs", "at most 4"]),
])
def test_no_eligible_nodes_says_why(nodes, spec, words):
    with pytest.raises(NoEligibleNodes) as raised:
        eligible_nodes(summaries(*nodes), parse_spec({"model": LLAMA_8B, **spec}))
    for word in words:
        assert word in str(raised.value)


def test_fingerprint_follows_planning_facts_only():
    a = summaries(gpu_node("a", labels={"x": "1"}), gpu_node("b"))
    relabeled = summaries(gpu_node("b"), gpu_node("a", labels={"x": "2"}))
    resized = summaries(gpu_node("a", memory="1Ti"), gpu_node("b"))
    more_cpu = summaries(gpu_node("a", labels={"x": "1"}, cpu="64"), gpu_node("b"))
    assert nodes_fingerprint(a) == nodes_fingerprint(relabeled)
    assert nodes_fingerprint(a) != nodes_fingerprint(resized)
    assert nodes_fingerprint(a) != nodes_fingerprint(more_cpu)
    assert nodes_fingerprint(a) != nodes_fingerprint(a[:1])


def test_fingerprint_changes_with_the_qualification_table():
    def qualified(gbps: float) -> dict:
        node = gpu_node("a", dma="51.3")
        table = {"v": 1, "method": "dma", "sizes": [2**20, 2**21], "c2g": [gbps, gbps]}
        node["metadata"]["annotations"][names.ANNOTATION_QUALIFICATION] = json.dumps(table)
        return node
    assert nodes_fingerprint(summaries(qualified(50.0))) == nodes_fingerprint(summaries(qualified(50.0)))
    assert nodes_fingerprint(summaries(qualified(50.0))) != nodes_fingerprint(summaries(qualified(5.0)))
