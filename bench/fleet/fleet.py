"""A fleet re-planned in process through the operator's planning path: 500 ModelServers over 200 GPU nodes.

What a reconcile does short of the API calls (parse the spec, find the eligible nodes and their fingerprint,
resolve the geometry, plan every eligible node, keep the smallest pod, render the objects), for every
ModelServer: once cold, once more with nothing changed (what a resync or an operator restart costs), and
after one node of a pool is resized (only that pool's ModelServers have a new fingerprint, but all are
re-planned here). Then what a node event costs the operator before any re-plan: the fingerprints of 500
ModelServers' eligible nodes. Goal: the whole fleet re-planned within 10 s on a 2-core machine.
Runs against any tree on PYTHONPATH (the figures before the plan cache came from the previous commit's tree).
"""
from __future__ import annotations

import statistics
import time

from spillway.controller import facts
from spillway.controller.facts import eligibility, summarize_node, synthetic_node
from spillway.controller.manifests import desired_for
from spillway.controller.spec import parse_spec
from spillway.core import k8s_names as names
from spillway.core.errors import SpillwayError

try:
    from spillway.controller import plan_cache
except ImportError:  # a tree from before the plan cache
    plan_cache = None

MODELSERVERS, NODES = 500, 200
# Four pools of 50 nodes; within a pool, the odd shapes a real fleet has (a smaller SKU, a qualified node).
POOLS = {
    "h200": [("2Ti", 8, None), ("1536Gi", 8, None), ("2Ti", 8, "51.2")],
    "h100": [("1Ti", 8, None), ("1536Gi", 8, None)],
    "l40s": [("768Gi", 4, None), ("512Gi", 4, None)],
    "mixed": [("2Ti", 8, None), ("1Ti", 8, None), ("1536Gi", 4, None), ("2Ti", 8, "25.6")],
}
MODELS = [("meta-llama/Llama-3.1-8B-Instruct", 1), ("meta-llama/Llama-3.1-70B-Instruct", 4),
          ("Qwen/Qwen2.5-7B-Instruct", 1), ("Qwen/Qwen3-32B", 2), ("mistralai/Mistral-7B-Instruct-v0.3", 1),
          ("google/gemma-3-12b-it", 1), ("openai/gpt-oss-20b", 1), ("Qwen/Qwen2.5-72B-Instruct", 4)]
SIZES = ["auto", "auto", "0.5", "200Gi"]


def nodes() -> list[dict]:
    out = []
    per_pool = NODES // len(POOLS)
    for pool, shapes in POOLS.items():
        for i in range(per_pool):
            memory, gpus, dma = shapes[i % len(shapes)]
            node = synthetic_node(memory, gpus, name=f"{pool}-{i:03d}", labels={"pool": pool}, cpu="64")
            if dma is not None:
                node["metadata"]["annotations"] = {names.ANNOTATION_QUALIFIED_DMA_GBPS: dma}
            out.append(node)
    return out


def modelservers() -> list[dict]:
    pools = list(POOLS)
    out = []
    for i in range(MODELSERVERS):
        model, tp = MODELS[i % len(MODELS)]
        spec = {"model": model, "tensorParallelSize": tp, "nodeSelector": {"pool": pools[i % len(pools)]},
                "offload": {"size": SIZES[(i // len(MODELS)) % len(SIZES)]}, "replicas": 1 + i % 3}
        out.append({"apiVersion": names.API_VERSION, "kind": names.KIND,
                    "metadata": {"name": f"ms-{i:03d}", "namespace": "fleet", "uid": f"uid-{i}"}, "spec": spec})
    return out


def replan_all(bodies: list[dict], summaries: list) -> tuple[float, float, int, int]:
    """Seconds (wall, CPU) to re-plan every ModelServer; how many planned and how many were refused."""
    start, cpu = time.perf_counter(), time.process_time()
    planned = refused = 0
    for body in bodies:
        spec = parse_spec(body["spec"])
        try:
            desired_for(body, spec, eligibility(summaries, spec))
            planned += 1
        except SpillwayError:
            refused += 1
    return time.perf_counter() - start, time.process_time() - cpu, planned, refused


def fingerprints(bodies: list[dict], summaries: list) -> float:
    """Seconds to find every ModelServer's eligible-node fingerprint after a node event (what the node
    handler does before it re-plans anyone)."""
    specs = [parse_spec(body["spec"]) for body in bodies]
    start = time.perf_counter()
    view = facts.NodeView(summaries) if hasattr(facts, "NodeView") else None
    found = [(view.eligibility(spec) if view is not None else eligibility(summaries, spec)).fingerprint
             for spec in specs]
    assert len(found) == len(specs)
    return time.perf_counter() - start


def main() -> None:
    node_objects = nodes()
    summaries = [summarize_node(n) for n in node_objects]
    bodies = modelservers()
    shapes = len({(s.allocatable_memory, s.gpus, s.dma_gbps) for s in summaries})
    print(f"fleet: {len(bodies)} ModelServers ({len(MODELS)} models, {len(POOLS)} node pools) x "
          f"{len(summaries)} GPU nodes ({shapes} shapes); plan cache: {'yes' if plan_cache else 'no'}")
    if plan_cache is not None:
        plan_cache.clear()
    wall, cpu, planned, refused = replan_all(bodies, summaries)
    print(f"  re-plan all, cold             {wall:7.2f} s wall {cpu:7.2f} s CPU  ({planned} planned, "
          f"{refused} refused: too large for their pool)")
    wall, cpu, _, _ = replan_all(bodies, summaries)
    print(f"  re-plan all, nothing changed  {wall:7.2f} s wall {cpu:7.2f} s CPU")
    resized = dict(node_objects[0], status={"capacity": {"memory": "1900Gi", names.GPU_RESOURCE: "8"},
                                            "allocatable": {"memory": "1900Gi", names.GPU_RESOURCE: "8"}})
    summaries[0] = summarize_node(resized)
    wall, cpu, _, _ = replan_all(bodies, summaries)
    print(f"  re-plan all, one node resized {wall:7.2f} s wall {cpu:7.2f} s CPU")
    samples = [fingerprints(bodies, summaries) for _ in range(5)]
    print(f"  node event: {len(bodies)} fingerprints {statistics.median(samples) * 1e3:8.1f} ms "
          f"(median of 5)")


if __name__ == "__main__":
    main()
