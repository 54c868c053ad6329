"""Three real vLLM CPU replicas with CPU offloading behind `spillway route` (kv-aware mode's router, as its own
process, with the pool's blocks as its index bound), one engine start for every test here.

- "tenants" (6 prefixes of 8 blocks x 8 prompts, random order, no warm-up: every prefix is new when it first
  arrives), at 1 and at 3 in flight: the CPU-pool hit rate within 10% of the best possible one at a time,
  each prefix whole on its owner; three in flight no prefix new twice (the bound's spills and the machine's
  load decide the rest: see the test);
- "groups" (12 prefixes of 6 blocks x 4 prompts after a warm-up), one at a time, against vllm-router's
  round_robin: every timed prompt routed to its prefix's holder, whole prefix matched;
- a scale-up from 2 to 3 replicas while the second pass of the same prompts runs, the way a pod becoming ready
  reaches the router: the first two replicas' hit rate does not fall (the router kept its index).

The sizes are in routing/replicas.py; bench/routing/routing_policies.py measures vllm-router's policies on the same
set-up. The report tables print with the tests.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from routing.replicas import (
    GROUPS_WORKLOAD,
    SCALE,
    TENANTS,
    best_cpu_hit,
    fitting_seed,
    prefix_groups_command,
    router,
    run_prefix_groups,
    spillway_router,
    start_replicas,
)
from spillway.core import affinity as A
from spillway.core import router_api as R
from spillway.core import routing
from support.ms_cluster import eventually

pytestmark = pytest.mark.engine

ROUTED = "routed"  # the route through `spillway route`


@pytest.fixture(scope="module")
def replicas():
    with start_replicas() as servers:
        yield servers


@pytest.fixture(scope="module")
def tenants(replicas, tmp_path_factory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("tenants")
    results = {}
    for concurrency in (1, 3):
        name = f"{ROUTED}-c{concurrency}"
        with spillway_router(replicas) as kv:
            results[concurrency] = run_prefix_groups({name: kv}, replicas, TENANTS, concurrency,
                                                     out / f"c{concurrency}.json",
                                                     seed=fitting_seed(replicas, TENANTS, name))
    return results


@pytest.fixture(scope="module")
def groups(replicas, tmp_path_factory) -> dict:
    # The warm-up sends all 12 tenants at once; how many of them the load bound spreads off their ring owners
    # (each then returns to its owner, recomputed once, in the timed phase) depends on how fast the replicas
    # answer, so this comparison of locality alone lifts the bound out of reach (4 x the mean, above 12 in
    # flight over 3). The bound itself is tested in test_affinity.py and test_router_endpoint.py.
    with router(replicas, R.POLICY_ROUND_ROBIN) as rr, spillway_router(replicas, ["--load-factor", "4"]) as kv:
        return run_prefix_groups({R.POLICY_ROUND_ROBIN: rr, ROUTED: kv}, replicas, GROUPS_WORKLOAD, 1,
                                 tmp_path_factory.mktemp("groups") / "result.json",
                                 seed=fitting_seed(replicas, GROUPS_WORKLOAD, ROUTED))


def _counter(route: dict, metric: str, **labels: str) -> float:
    """The sum of a router counter's deltas over the timed phase, for samples with these labels."""
    wanted = [f"{k}={v}" for k, v in labels.items()]
    return sum(v for k, v in route["router"].items()
               if k.split("{")[0] == metric and all(w in k for w in wanted))


def _route(result: dict, name: str) -> dict:
    return next(r for r in result["routes"] if r["name"] == name)


def _tenants(result: dict, capsys) -> tuple[dict, list[float]]:
    with capsys.disabled():
        print(f"\n{result['stdout']}")
    route = result["routes"][0]
    assert route["errors"] == 0 and route["ok"] == TENANTS["groups"] * TENANTS["prompts_per_group"]
    return route, [r["requests"] for r in route["replicas"]]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_tenants_keep_locality(tenants, concurrency, capsys):
    """One at a time every prompt goes to its prefix's owner on the ring: a prefix's first prompt is new, every
    later one a prefix decision, and each replica serves whole prefixes. Three in flight a prompt still follows
    its prefix's first while that one is computed (placement needs no KV event), so no prefix is new twice;
    the load bound may pass a busy owner over for the next replica along the ring. How many prompts meet a
    busy owner, or arrive while their prefix's first is still computed (a miss on the owner too: the pool has
    nothing yet), depends on the order in which the replicas answer, which the machine's load moves: the
    fast suite's four workers on two cores took this run from 76.5% (alone) to 58.8%. So three in flight the
    hit rate is held only above half the best, a floor for a lost record rather than a measure of locality;
    the locality comparison at 3 in flight is bench/routing's (docs/routing.md)."""
    route, requests = _tenants(tenants[concurrency], capsys)
    new = _counter(route, routing.ROUTER_METRIC_REQUESTS, decision=A.DECISION_NEW)
    spilled = _counter(route, routing.ROUTER_METRIC_REQUESTS, decision=A.DECISION_OVERLOADED)
    followed = _counter(route, routing.ROUTER_METRIC_REQUESTS, decision=A.DECISION_PREFIX)
    assert new + spilled + followed == TENANTS["groups"] * TENANTS["prompts_per_group"]
    if concurrency == 1:
        assert route["cpu_hit_rate"] >= 0.9 * best_cpu_hit(TENANTS), route["cpu_hit_rate"]
        assert (new, spilled) == (TENANTS["groups"], 0)
        assert all(r % TENANTS["prompts_per_group"] == 0 for r in requests), requests  # whole prefixes
    else:
        assert route["cpu_hit_rate"] >= 0.5 * best_cpu_hit(TENANTS), route["cpu_hit_rate"]
        assert new <= TENANTS["groups"], route["router"]


def test_groups_beat_round_robin_by_a_clear_margin(groups, capsys):
    """Each pool holds the groups the router leaves on its replica (4 on average, at most 6 under the seed
    the test picks), not the 12 that round_robin spreads over all three; round_robin finds a group's prefix only where one of its recent prompts landed."""
    with capsys.disabled():
        print(f"\n{groups['stdout']}")
    rr, kv = _route(groups, R.POLICY_ROUND_ROBIN), _route(groups, ROUTED)
    for route in (rr, kv):
        assert route["errors"] == 0 and route["ok"] == GROUPS_WORKLOAD["groups"] * GROUPS_WORKLOAD["prompts_per_group"]
    # Every timed prompt went to the replica its prefix's warm-up prompt went to, its whole prefix matched.
    assert _counter(kv, routing.ROUTER_METRIC_REQUESTS, decision=A.DECISION_PREFIX) == kv["ok"], kv["router"]
    assert _counter(kv, routing.ROUTER_METRIC_MATCHED_BLOCKS) == kv["ok"] * GROUPS_WORKLOAD["prefix_blocks"]
    assert kv["cpu_hit_rate"] >= 1.4 * rr["cpu_hit_rate"], (rr["cpu_hit_rate"], kv["cpu_hit_rate"])
    assert kv["cpu_hit_rate"] >= 0.9 * best_cpu_hit(GROUPS_WORKLOAD)
    assert sum(x["requests"] > 0 for x in kv["replicas"]) >= 2, kv["replicas"]  # 12 keys on a ring of 3


def test_scaling_from_two_to_three_replicas_keeps_the_index(replicas, tmp_path, capsys):
    """Two passes of the same prompts through one router over the first two replicas; before the second pass
    ends the third joins, as a pod becoming ready reaches the router (its workers list). Every prefix of the
    second pass is one the router placed on the first two, so their hit rate holds (a restarted router would
    have forgotten where each prefix is)."""
    first_two = replicas[:2]
    with spillway_router(first_two) as kv:
        before = run_prefix_groups({"scale": kv}, replicas, SCALE, 1, tmp_path / "before.json")
        cmd = prefix_groups_command({"scale": kv}, replicas, SCALE, 1, tmp_path / "after.json")
        second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(3.0)  # into the second pass's warm-up or timed phase
            kv.set_workers([s.base_url for s in replicas])
            # The router reads its workers file between its /metrics probes of the replicas, which on a loaded
            # machine take seconds: the join is waited for, not assumed from the file's write.
            listed = eventually(lambda: replicas[2].base_url in kv.workers() and kv.workers(),
                                what="the third replica in the router's workers")
            output, _ = second.communicate(timeout=900)
        finally:
            if second.poll() is None:
                second.kill()
        assert second.returncode == 0, f"{output}\n{kv.log_tail()}"
        assert replicas[2].base_url in kv.workers()  # still routed over once the pass ended
    after = json.loads((tmp_path / "after.json").read_text())
    with capsys.disabled():
        print(f"\n{before['stdout']}\n{output}")
    assert len(listed) == 3, listed
    hit = {name: _first_two_hit(r["routes"][0]) for name, r in (("before", before), ("after", after))}
    assert hit["after"] >= hit["before"] - 0.02, hit
    assert hit["before"] >= 0.9 * best_cpu_hit(SCALE), hit


def _first_two_hit(route: dict) -> float:
    rows = route["replicas"][:2]
    prompt = sum(r["prompt_tokens"] or 0 for r in rows)
    return sum(r["cpu_hit_tokens"] or 0 for r in rows) / prompt
