"""Node events -> re-plans (controller/replan.py) and plans per node shape (manifests.plan_for_nodes with the
plan cache), in process: a burst of snapshots re-plans each ModelServer once, for the last nodes; planning one
node per shape picks what planning every node would."""
from __future__ import annotations

import logging
import threading
import time

import pytest
from spillway.adapters.model_config import resolve_geometry
from spillway.controller import plan_cache
from spillway.controller.facts import eligibility, summarize_node
from spillway.controller.manifests import plan_for_nodes
from spillway.controller.replan import Replanner
from spillway.controller.spec import parse_spec
from spillway.core.errors import PoolDoesNotFit
from spillway.core.planner import plan
from support.ms_examples import LLAMA_8B, gpu_node


def _nodes(*memories: str, pool: str = "a"):
    return tuple(summarize_node(gpu_node(f"{pool}-{i:02d}", memory, labels={"pool": pool}))
                 for i, memory in enumerate(memories))


def test_a_burst_of_node_events_re_plans_each_modelserver_once_for_the_last_nodes():
    calls, done = [], threading.Event()

    def replan(namespace, name, fingerprint, nodes):
        calls.append((name, fingerprint, len(nodes)))
        if len(calls) == 3:
            done.set()

    replanner = Replanner(replan, logging.getLogger("test"), settle=0.05)
    spec = parse_spec({"model": LLAMA_8B, "nodeSelector": {"pool": "a"}})
    servers = {("ns", f"ms-{i}"): {"spec": spec, "fingerprint": "planned-before", "trigger": None} for i in range(3)}
    servers[("ns", "new")] = {"spec": spec, "fingerprint": None, "trigger": None}  # its create reconcile plans it
    for count in range(1, 41):  # 40 node events in a burst
        replanner.offer(_nodes(*["2Ti"] * count), servers)
    assert done.wait(10)
    time.sleep(0.3)
    last = eligibility(_nodes(*["2Ti"] * 40), spec).fingerprint
    assert sorted(calls) == [(f"ms-{i}", last, 40) for i in range(3)]
    assert replanner.changed(_nodes(*["2Ti"] * 40), servers) == 0  # nothing moved since: nothing re-planned


@pytest.mark.parametrize("memories", [("1Ti", "2Ti", "1Ti", "1536Gi", "2Ti"), ("2Ti",) * 6, ("300Gi", "2Ti", "300Gi")])
def test_one_plan_per_node_shape_picks_what_planning_every_node_would(memories):
    plan_cache.clear()
    spec = parse_spec({"model": LLAMA_8B, "offload": {"size": "600Gi"}})
    nodes = sorted(_nodes(*memories), key=lambda n: n.name)
    geometry = resolve_geometry(LLAMA_8B)
    try:
        every = min(((plan(geometry, spec.request, n.facts()), n) for n in nodes),
                    key=lambda p: (p[0].pod.memory_limit_bytes, p[1].name))
    except PoolDoesNotFit as exc:
        with pytest.raises(PoolDoesNotFit) as found:
            plan_for_nodes(geometry, spec, nodes)
        assert str(found.value) == str(exc)
        return
    chosen, node = plan_for_nodes(geometry, spec, nodes)
    assert (node.name, chosen.pod, chosen.pool) == (every[1].name, every[0].pod, every[0].pool)
    again, _ = plan_for_nodes(geometry, spec, nodes)
    assert again is chosen  # the cache's own object: planned once
