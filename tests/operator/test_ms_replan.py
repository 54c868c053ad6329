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
from spillway.controller.replan import ApiLane, Replanner
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


def test_a_re_plans_requests_go_first_and_handlers_still_progress():
    """While a re-plan runs, kopf's handlers keep at most their share of requests in flight (the re-plan's are
    never held); one that waits gets its turn when a handler's request ends; with no re-plan, none waits."""
    lane = ApiLane(handler_requests=1)
    release, entered = threading.Event(), []

    def handler_request(name: str) -> None:
        with lane.request():
            entered.append(name)
            release.wait(10)

    first = threading.Thread(target=handler_request, args=("first",))
    first.start()
    _until(lambda: entered == ["first"])
    replan_started, replan_done, replan_requests = threading.Event(), threading.Event(), []

    def replan() -> None:
        with lane.replanning():
            replan_started.set()
            for _ in range(3):
                with lane.request():  # not held, though a handler's request is in flight
                    replan_requests.append(1)
            replan_done.wait(10)

    replanning = threading.Thread(target=replan)
    replanning.start()
    replan_started.wait(10)
    _until(lambda: len(replan_requests) == 3)
    second = threading.Thread(target=handler_request, args=("second",))
    second.start()
    time.sleep(0.2)
    assert entered == ["first"], "a second handler request went ahead while a re-plan runs"
    release.set()  # the first ends: the waiting one goes, the re-plan still running
    _until(lambda: entered == ["first", "second"])
    replan_done.set()
    for thread in (first, second, replanning):
        thread.join(10)

    release.clear()
    many = [threading.Thread(target=handler_request, args=(f"free-{i}",)) for i in range(3)]
    for thread in many:
        thread.start()
    _until(lambda: len(entered) == 5)  # no re-plan running: all three at once
    release.set()
    for thread in many:
        thread.join(10)


def _until(check, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
