"""Three real vLLM CPU replicas with CPU offloading and KV events, behind the real vllm-router (PyPI wheel) with
the settings `spillway route` runs it with (router_api.KV_AWARE_SETTINGS), one engine start for every test here.

- "tenants" (6 prefixes of 8 blocks x 8 prompts, random order, no warm-up: every prefix is new when it first
  arrives), at 1 and at 3 in flight. One at a time: the CPU-pool hit rate within 10% of the best possible and
  not every request on one replica (a new prefix no longer lands where the others are). Three in flight: every
  replica used, and the hit rate short of the best possible (what is measured and why: docs/routing.md);
- "groups" (12 prefixes of 6 blocks x 4 prompts after a warm-up), one at a time, against round_robin;
- a scale-up from 2 to 3 replicas between two passes of the same prompts, through the router's worker API as
  `spillway route` does it: the first two replicas' hit rate does not fall (the router kept its index).

The sizes are in routing/replicas.py; bench/routing_policies.py measures the other policies on the same set-up.
The report tables print with the tests.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from routing.replicas import (
    BLOCK,
    DEBUG_LOG,
    GROUPS_WORKLOAD,
    SCALE,
    TENANTS,
    best_cpu_hit,
    kv_decisions,
    prefix_groups_command,
    router,
    run_prefix_groups,
    start_replicas,
)
from spillway.commands.route import RouterWorkers
from spillway.core import router_api as R

pytestmark = pytest.mark.engine

ROUTED = "routed"  # the route through the router as `spillway route` runs it


@pytest.fixture(scope="module")
def replicas():
    with start_replicas() as servers:
        yield servers


@pytest.fixture(scope="module")
def tenants(replicas, tmp_path_factory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("tenants")
    results = {}
    for concurrency in (1, 3):
        with router(replicas, R.POLICY_KV_AWARE, R.KV_AWARE_SETTINGS) as kv:
            results[concurrency] = run_prefix_groups({f"{ROUTED}-c{concurrency}": kv}, replicas, TENANTS,
                                                     concurrency, out / f"c{concurrency}.json")
    return results


@pytest.fixture(scope="module")
def groups(replicas, tmp_path_factory) -> dict:
    with router(replicas, R.POLICY_ROUND_ROBIN) as rr, \
         router(replicas, R.POLICY_KV_AWARE, (*R.KV_AWARE_SETTINGS, *DEBUG_LOG)) as kv:
        result = run_prefix_groups({R.POLICY_ROUND_ROBIN: rr, ROUTED: kv}, replicas, GROUPS_WORKLOAD, 1,
                                   tmp_path_factory.mktemp("groups") / "result.json")
        result["kv_decisions"] = kv_decisions(kv)
        return result


def _route(result: dict, name: str) -> dict:
    return next(r for r in result["routes"] if r["name"] == name)


def _tenants(result: dict, capsys) -> tuple[dict, list[float]]:
    with capsys.disabled():
        print(f"\n{result['stdout']}")
    route = result["routes"][0]
    assert route["errors"] == 0 and route["ok"] == TENANTS["groups"] * TENANTS["prompts_per_group"]
    return route, [r["requests"] for r in route["replicas"]]


def test_one_at_a_time_tenants_keep_locality_and_spread(tenants, capsys):
    """With one request in flight every replica's load is 0 at each decision: a new prefix costs the same
    everywhere, and the temperature samples among the replicas instead of always taking the first (which sent
    all 48 to one replica). Which replica each new prefix gets is random: an even share is likely, not sure."""
    route, requests = _tenants(tenants[1], capsys)
    assert route["cpu_hit_rate"] >= 0.9 * best_cpu_hit(TENANTS), route["cpu_hit_rate"]
    # Each new prefix picks a replica at random, so an even share is not certain: with 6 prefixes over 3
    # replicas one replica idles in about a quarter of runs. What the temperature guarantees is that the
    # prefixes do not all go to one replica (temperature 0 sent 48/0/0; all six on one now: 0.4% of runs).
    assert max(requests) < sum(requests), requests


def test_three_in_flight_tenants_balance(tenants, capsys):
    """The load term spreads the first concurrent prompts; a prompt whose prefix's first prompt is still in
    flight finds no holder in the index (the replica publishes the blocks only once they are stored), so
    locality is partly lost: measured 50.0-68.1% against the best possible 82.4% (round_robin 52%)."""
    route, requests = _tenants(tenants[3], capsys)
    # Once indexed, a prefix stays with its holder whatever its load, so the balance rests on where the new
    # prefixes fell: 3/42/3 to 14/15/19 in eight runs (docs/routing.md). The first three prompts arrive together
    # and the load term has spread them over the three replicas in every run: that much is asserted.
    assert min(requests) > 0, requests
    assert route["cpu_hit_rate"] >= 0.55 * best_cpu_hit(TENANTS), route["cpu_hit_rate"]  # round_robin: 52%


def test_groups_beat_round_robin_by_a_clear_margin(groups, capsys):
    """Each pool holds the 4 groups a locality-keeping router leaves on its replica, not the 12 that round_robin
    spreads over all three; round_robin finds a group's prefix only where one of its recent prompts landed."""
    with capsys.disabled():
        print(f"\n{groups['stdout']}")
    rr, kv = _route(groups, R.POLICY_ROUND_ROBIN), _route(groups, ROUTED)
    for route in (rr, kv):
        assert route["errors"] == 0 and route["ok"] == GROUPS_WORKLOAD["groups"] * GROUPS_WORKLOAD["prompts_per_group"]
    # The router credits the replica it picks with the prefix blocks its index holds there. Each pool holds its
    # prefixes whole (the kv share fits), so a credit is the whole prefix, or nothing where the index has not
    # heard of it yet. When the connector published a store job's blocks in set order, vllm-router dropped each
    # block whose parent it had not indexed (spillway_connector/kv_event_order.py): the index held the first 1
    # to 3 of 6 blocks, the holder looked 25-76 tokens cheaper than an empty replica instead of 153, and on a
    # slow CI machine the hit rate fell to 81.4% (best possible 92.3%).
    decisions = groups["kv_decisions"]
    assert len(decisions) == kv["warmup"]["requests"] + kv["ok"], decisions
    whole_prefix = int(GROUPS_WORKLOAD["prefix_blocks"] * BLOCK * R.DEFAULT_KV_PENALTY_HOST)
    assert {credit for _, credit in decisions[-kv["ok"]:]} <= {0, whole_prefix}, decisions
    assert kv["cpu_hit_rate"] >= 1.4 * rr["cpu_hit_rate"], (rr["cpu_hit_rate"], kv["cpu_hit_rate"])
    assert kv["cpu_hit_rate"] >= 0.9 * best_cpu_hit(GROUPS_WORKLOAD)
    assert all(x["requests"] > 0 for x in kv["replicas"]), kv["replicas"]
    # The router's own counters: prefix lookups that hit its index of the replicas' (CPU-medium) events.
    hits = sum(v for k, v in kv["router"].items() if k.startswith(R.METRIC_KV_PLACEMENT_LOOKUPS) and "hit" in k)
    assert hits > 0, kv["router"]


def test_scaling_from_two_to_three_replicas_keeps_the_index(replicas, tmp_path, capsys):
    """Two passes of the same prompts through one router over the first two replicas; before the second pass
    ends the third joins through /add_worker. Every prefix of the second pass is one the router saw stored on
    the first two, so their hit rate holds (a restarted router would have forgotten where each prefix is)."""
    first_two = replicas[:2]
    with router(first_two, R.POLICY_KV_AWARE, R.KV_AWARE_SETTINGS) as kv:
        before = run_prefix_groups({"scale": kv}, replicas, SCALE, 1, tmp_path / "before.json")
        cmd = prefix_groups_command({"scale": kv}, replicas, SCALE, 1, tmp_path / "after.json")
        second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(3.0)  # into the second pass's warm-up or timed phase
            RouterWorkers(kv.port).add(replicas[2].base_url)
            output, _ = second.communicate(timeout=900)
        finally:
            if second.poll() is None:
                second.kill()
        assert second.returncode == 0, f"{output}\n{kv.log_tail()}"
        listed = kv.workers()
    after = json.loads((tmp_path / "after.json").read_text())
    with capsys.disabled():
        print(f"\n{before['stdout']}\n{output}")
    assert replicas[2].base_url in listed
    hit = {name: _first_two_hit(r["routes"][0]) for name, r in (("before", before), ("after", after))}
    assert hit["after"] >= hit["before"] - 0.02, hit
    assert hit["before"] >= 0.9 * best_cpu_hit(SCALE), hit


def _first_two_hit(route: dict) -> float:
    rows = route["replicas"][:2]
    prompt = sum(r["prompt_tokens"] or 0 for r in rows)
    return sum(r["cpu_hit_tokens"] or 0 for r in rows) / prompt
