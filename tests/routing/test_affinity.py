"""The kv-aware router's placement policy (core/affinity.py), on its own: blocks and keys, the ring's owners,
the load bound relative to the mean, what a new or restarted replica takes, the record's memory bound and the
circuit breaker."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tracemalloc
from collections import Counter

import pytest
from spillway.core import affinity as A

BLOCK = 4
PODS = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 5))


def _index(replicas=PODS, **settings) -> A.AffinityIndex:
    index = A.AffinityIndex(A.AffinitySettings(**{"block_tokens": BLOCK, "index_blocks": 1000, **settings}))
    index.sync(replicas)
    return index


def _prompt(prefix: int, suffix: int, prefix_blocks: int = 6) -> dict:
    return {"prompt": [prefix] * (prefix_blocks * BLOCK) + [1000 + suffix] * (BLOCK - 1)}


def _owner(index: A.AffinityIndex, prefix: int) -> str:
    return index.choose(A.prompt_blocks(_prompt(prefix, 0), BLOCK), {}).replica


def test_blocks_are_whole_and_chained():
    one = A.prompt_blocks({"prompt": list(range(11))}, BLOCK)
    assert len(one) == 2  # 11 tokens: two whole blocks, the rest is not cached by vLLM either
    other = A.prompt_blocks({"prompt": [99, *range(1, 11)]}, BLOCK)
    assert one[1] != other[1]  # the second block's hash covers the first
    assert A.prompt_blocks({"prompt": list(range(12))}, BLOCK)[:2] == one


def test_blocks_are_capped_at_what_a_decision_needs():
    long = {"prompt": list(range(100_000))}
    assert len(A.prompt_blocks(long, BLOCK, max_blocks=16)) == 16
    text = {"prompt": "y" * 10_000_000}
    assert len(A.prompt_blocks(text, BLOCK, max_blocks=8)) == 8


def test_text_blocks_are_the_same_in_every_process():
    """Router pods agree only if a text's block hashes do not depend on the process's string hash seed."""
    code = ("from spillway.core import affinity as A; "
            "print(A.prompt_blocks({'messages': [{'role': 'user', 'content': 'z' * 400}]}, 4)[-1])")
    seen = {subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert len(seen) == 1, seen


@pytest.mark.parametrize("body", [
    {"prompt": "x" * (8 * BLOCK * A.CHARS_PER_TOKEN)},
    {"prompt": [list(range(40))]},
    {"messages": [{"role": "system", "content": "s" * 200}, {"role": "user", "content": [{"type": "text",
                                                                                         "text": "q" * 100}]}]},
])
def test_text_batches_and_chats_have_blocks(body):
    assert len(A.prompt_blocks(body, BLOCK)) >= 2


@pytest.mark.parametrize("body", [{}, {"prompt": []}, {"prompt": [1, 2]}, {"prompt": [{"a": 1}] * 9},
                                  {"prompt": ["a"] * 9}, {"prompt": [None] * 9}, {"prompt": ["a"] + [1] * 8},
                                  {"prompt": [[1]] * 9}, {"messages": "hi"},
                                  {"messages": [1, 2]}, {"prompt": {"a": 1}}])
def test_requests_without_a_usable_prompt_have_no_blocks(body):
    """Ids that would hash differently in each process (a str, None) or not at all: no blocks, so router pods
    never disagree on them (vLLM refuses the prompt anyway)."""
    assert A.prompt_blocks(body, BLOCK) == []


def test_token_ids_hash_alike_in_every_process():
    """Router pods agree only if every process hashes a prompt alike: no per-process seed in the hashes."""
    body = {"prompt": list(range(40))}
    code = ("import json, sys; from spillway.core import affinity as A; "
            f"print(json.dumps(A.prompt_blocks({body!r}, {BLOCK})))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert runs == {json.dumps(A.prompt_blocks(body, BLOCK)) + "\n"}


def test_deep_content_is_not_recursed_into():
    deep: object = "x"
    for _ in range(5000):
        deep = {"text": deep}
    body = {"messages": [{"role": "user", "content": [deep, {"type": "text", "text": "q" * 64}]}]}
    assert len(A.prompt_blocks(body, BLOCK)) >= 1


def test_chats_sharing_leading_messages_share_leading_blocks():
    system = {"role": "system", "content": "You answer questions about the handbook. " * 20}
    a = A.prompt_blocks({"messages": [system, {"role": "user", "content": "first question"}]}, BLOCK)
    b = A.prompt_blocks({"messages": [system, {"role": "user", "content": "another one entirely"}]}, BLOCK)
    assert a[:A.DEFAULT_KEY_BLOCKS] == b[:A.DEFAULT_KEY_BLOCKS]


def test_placement_is_the_same_for_every_router_and_every_order():
    """Two routers that saw different traffic in different orders place every prefix alike: placement is a
    function of the prompt and the pod set only."""
    first, second = _index(), _index(replicas=tuple(reversed(PODS)))
    for prefix in range(50):
        first.route(_prompt(prefix, 0), {})
    for prefix in random.Random(3).sample(range(200), 200):
        second.route(_prompt(prefix, 1), {})
    assert all(_owner(first, p) == _owner(second, p) for p in range(200))


def test_prompts_sharing_the_key_blocks_share_a_replica():
    index = _index(key_blocks=2)
    a = {"prompt": [5] * (2 * BLOCK) + [6] * (4 * BLOCK)}
    b = {"prompt": [5] * (2 * BLOCK) + [7] * (4 * BLOCK)}
    assert index.route(a, {}).replica == index.route(b, {}).replica


def test_prefixes_spread_over_every_replica():
    index = _index()
    owners = Counter(_owner(index, p) for p in range(400))
    assert set(owners) == set(PODS)
    assert max(owners.values()) < 1.5 * 100 and min(owners.values()) > 0.5 * 100, owners


def test_a_prompt_follows_its_prefix_and_is_counted_as_a_match():
    index = _index()
    first = index.route(_prompt(1, 0), {})
    second = index.route(_prompt(1, 1), {first.replica: 1})  # the first is still being computed
    assert (second.replica, second.reason, second.matched_blocks) == (first.replica, A.DECISION_PREFIX, 6)
    assert first.reason == A.DECISION_NEW


def test_the_load_bound_acts_at_low_concurrency_and_spills_along_the_ring():
    """5 in flight over 4 replicas: the mean is 1.25 (this request counted), the bound ceil(1.25 x 1.25) = 2,
    so a hot prefix's owner holding 2 is passed over for its successor, always the same one; with 1 it is not
    (the bound is never below 2)."""
    index = _index()
    owner = _owner(index, 7)
    spill = index.choose(A.prompt_blocks(_prompt(7, 1), BLOCK), {owner: 2, "other": 3})
    assert spill.replica != owner and spill.reason == A.DECISION_OVERLOADED
    successor = next(r for r in index._ring.walk(A.prompt_blocks(_prompt(7, 0), BLOCK)[3]) if r != owner)
    assert spill.replica == successor
    assert index.choose(A.prompt_blocks(_prompt(7, 2), BLOCK), {owner: 1}).replica == owner  # under the bound


def test_a_hot_prefix_spreads_before_its_owner_queues():
    """Closed loop at 8 in flight, every request of one prefix: no replica ever holds more than the bound."""
    index = _index()
    load: Counter[str] = Counter()
    for i in range(8):
        load[index.route(_prompt(9, i), load).replica] += 1
    assert max(load.values()) <= 3 and len(load) >= 3, load  # ceil(1.25 x 8 / 4) = 3


def test_a_new_replica_takes_its_share_at_once_and_the_others_keep_theirs():
    index = _index(replicas=PODS[:3])
    before = {p: _owner(index, p) for p in range(200)}
    added, removed = index.sync(PODS)
    assert (added, removed) == ([PODS[3]], [])
    after = {p: _owner(index, p) for p in range(200)}
    moved = [p for p in before if before[p] != after[p]]
    assert all(after[p] == PODS[3] for p in moved)  # only to the new replica
    assert len(moved) >= 0.5 * 200 / 4, len(moved)  # at least half its even share, on its first request


def test_a_restarted_replica_is_forgotten_but_keeps_its_arcs():
    index = _index()
    owner = index.route(_prompt(3, 0), {}).replica
    index.forget(owner)
    again = index.route(_prompt(3, 1), {})
    assert (again.replica, again.reason, again.matched_blocks) == (owner, A.DECISION_NEW, 0)


def test_excluded_replicas_pass_their_prompts_to_the_next_along_the_ring():
    index = _index()
    blocks = A.prompt_blocks(_prompt(4, 0), BLOCK)
    owner = index.choose(blocks, {}).replica
    other = index.choose(blocks, {}, exclude=[owner]).replica
    assert other != owner
    assert index.choose(blocks, {}, exclude=list(PODS)).replica == owner  # none left: all are candidates


def test_the_record_keeps_prefix_heads_within_its_capacity():
    index = _index(replicas=(PODS[0],), index_blocks=8)
    for prefix in range(4):
        index.route(_prompt(prefix, 0), {})
    assert len(index._blocks[PODS[0]]) == 8
    assert index.matched(PODS[0], A.prompt_blocks(_prompt(3, 0), BLOCK)) == 6  # the newest whole
    assert index.matched(PODS[0], A.prompt_blocks(_prompt(2, 0), BLOCK)) >= 1  # the one before keeps its head


def test_the_record_stays_within_its_memory_budget():
    budget = 1 << 20
    index = _index(index_blocks=10**9, index_bytes=budget)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for prefix in range(1500):  # 24,000 blocks against a budget of 5,461
            index.record(PODS[prefix % 4], A.prompt_blocks({"prompt": list(range(prefix, prefix + 64))}, BLOCK))
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert sum(len(b) for b in index._blocks.values()) <= budget // A.INDEX_ENTRY_BYTES
    assert used <= budget, used


def test_no_replica_is_a_lookup_error():
    with pytest.raises(LookupError):
        _index(replicas=()).route(_prompt(1, 0), {})


def test_the_breaker_opens_after_failures_and_closes_on_success():
    breaker = A.Breaker(failures=2, cooldown_s=5)
    assert not breaker.failed("a", now=0)
    assert breaker.failed("a", now=1) and breaker.open(now=2) == ["a"]
    assert breaker.open(now=6.5) == []  # half open: one request may try it
    breaker.failed("a", now=7)
    assert breaker.open(now=8) == ["a"]  # failed again: open again
    breaker.succeeded("a")
    assert breaker.open(now=8) == []


@pytest.mark.parametrize("field, value", [(f, v) for f in ("block_tokens", "index_blocks", "index_bytes", "key_blocks")
                                          for v in (0, -1, True, 2.5, "8")]
                         + [("load_factor", v) for v in (0.5, float("nan"), float("inf"), True, "2")])
def test_settings_refuse_nonsense(field, value):
    good = {"block_tokens": 16, "index_blocks": 10}
    with pytest.raises(ValueError, match=field):
        A.AffinitySettings(**{**good, field: value})


def test_router_pods_bound_the_load_they_estimate_for_all():
    """With 3 router pods each sees a third of a pod's requests: one in flight to a hot prefix's owner here is
    about three there, above the bound of 2, so its next prompt goes on to the successor."""
    alone, one_of_three = _index(), _index(peers=3)
    blocks = A.prompt_blocks(_prompt(7, 1), BLOCK)
    owner = alone.choose(blocks, {}).replica
    assert alone.choose(blocks, {owner: 1}).replica == owner
    spill = one_of_three.choose(blocks, {owner: 1})
    assert spill.replica != owner and spill.reason == A.DECISION_OVERLOADED


def test_router_pods_keep_a_spilled_prefix_on_its_successor():
    """One of 3 router pods with one request in flight on a prefix's owner and one on its successor: the owner
    is over its bound (1 x 3 + 1 > 3), the successor, which holds the prefix since the first spill, takes one
    more of this pod's own before the prefix is copied to a third replica. Alone, the same pod would count
    the successor's one as one and place the prompt there as well."""
    one_of_three, alone = _index(peers=3), _index()
    blocks = A.prompt_blocks(_prompt(7, 1), BLOCK)
    owner, successor, *_ = one_of_three._ring.walk(blocks[3])
    load = {owner: 1, successor: 1}
    assert one_of_three.choose(blocks, {owner: 1}).replica == successor
    spill = one_of_three.choose(blocks, load)
    assert (spill.replica, spill.reason) == (successor, A.DECISION_OVERLOADED)
    assert alone.choose(blocks, load).replica == owner  # 1 + 1 <= 2: alone, the owner keeps it
    # Beyond the slack the walk goes on: 5 in flight make the bound ceil(1.25 x 16 / 4) = 5, the owner at 2
    # reads 7 and the successor at 3 reads 10, above 5 + 2.
    assert one_of_three.choose(blocks, {owner: 2, successor: 3}).replica not in (owner, successor)


def test_router_pods_see_the_others_requests_in_the_replicas_reports():
    """One of 3 router pods holds none of a hot prefix's requests on its owner, the other pods hold 2 there:
    on its own estimate (0 x 3) the owner is empty and would take one more, 3 in all against a bound of 2
    (bench/fleet/README.md: it reached 4). The owner's report (its engine's running and waiting, less this
    pod's own then) says 2, so the prompt goes on to the successor, as it would through one router pod."""
    index = _index(peers=3)
    blocks = A.prompt_blocks(_prompt(7, 1), BLOCK)
    owner, successor, *_ = index._ring.walk(blocks[3])
    assert index.choose(blocks, {}).replica == owner  # no report: the estimate alone
    reports = {owner: A.Report.read(2, own_then=0, at=10.0)}
    spill = index.choose(blocks, {}, reports=reports, now=10.5)
    assert (spill.replica, spill.reason) == (successor, A.DECISION_OVERLOADED)
    # This pod's own requests count at once, the others' as of the read: one own request sent since makes 3.
    assert index.choose(blocks, {owner: 1}, reports={owner: A.Report.read(1, 0, 10.0)}, now=10.1).replica != owner


def test_a_stale_report_is_not_used():
    """A replica whose /metrics stopped answering says nothing of its load now: past the report's time to
    live the pod bounds on its own estimate again."""
    index = _index(peers=3)
    blocks = A.prompt_blocks(_prompt(7, 1), BLOCK)
    owner = index.choose(blocks, {}).replica
    reports = {owner: A.Report.read(5, 0, at=10.0)}
    assert index.choose(blocks, {}, reports=reports, now=10.0 + A.DEFAULT_REPORT_TTL_S).replica != owner
    assert index.choose(blocks, {}, reports=reports, now=10.1 + A.DEFAULT_REPORT_TTL_S).replica == owner


def test_the_mean_comes_from_the_reports_where_fresh():
    """One of 3 router pods happens to hold 3 of the fleet's 4 requests in flight: its estimate (x 3) makes
    the bound ceil(1.25 x (9 + 1) / 4) = 4, and a hot prefix's owner holding the other pods' 2 would take a
    third. The replicas' reports say the fleet holds 4, so the bound is ceil(1.25 x 5 / 4) = 2, the bound
    one router pod would have."""
    index = _index(peers=3)
    blocks = A.prompt_blocks(_prompt(7, 1), BLOCK)
    owner, successor, third, fourth = index._ring.walk(blocks[3])
    own = {third: 2, fourth: 1}  # this pod's: none on the owner
    assert index.choose(blocks, own).replica == owner  # 0 x 3 + 1 <= ceil(1.25 x 10 / 4) = 4
    reports = {owner: A.Report.read(1, 0, 0.0), successor: A.Report.read(0, 0, 0.0),
               third: A.Report.read(2, 2, 0.0), fourth: A.Report.read(1, 1, 0.0)}
    # 4 in the fleet: bound 2, the owner at 1 takes one more; at 2 it does not
    assert index.choose(blocks, own, reports=reports, now=0.1).replica == owner
    reports[owner] = A.Report.read(2, 0, 0.0)
    spill = index.choose(blocks, own, reports=reports, now=0.1)
    assert (spill.replica, spill.reason) == (successor, A.DECISION_OVERLOADED)


def test_a_report_counts_the_pods_own_requests_once():
    """The replica's count holds this pod's requests of the moment it was read: they are taken out, and this
    pod's count now put in. A pod alone uses no report: its own count is exact, and a report a read's age old
    could only add requests that are gone."""
    assert A.Report.read(3, own_then=2, at=0.0).others == 1
    assert A.Report.read(1, own_then=2, at=0.0).others == 0  # not yet in the engine, or already answered
    index = _index()
    blocks = A.prompt_blocks(_prompt(7, 1), BLOCK)
    owner = index.choose(blocks, {}).replica
    reports = {owner: A.Report.read(5, own_then=0, at=0.0)}
    assert index.choose(blocks, {owner: 1}, reports=reports, now=0.1).replica == owner  # 1 + 1 <= 2
    assert _index(peers=3).choose(blocks, {}, reports=reports, now=0.1).replica != owner  # 5 others there


def test_when_every_replica_reads_over_the_bound_the_least_loaded_takes_it():
    """In a burst between two reads a pod's estimate (its own x peers) can put every replica over a bound
    taken from the reports: the least loaded takes the prompt, the same one for every pod."""
    index = _index(peers=3)
    blocks = A.prompt_blocks(_prompt(7, 1), BLOCK)
    walk = list(index._ring.walk(blocks[3]))
    own = {walk[0]: 3, walk[1]: 3, walk[2]: 2, walk[3]: 3}
    reports = {r: A.Report.read(0, 0, 0.0) for r in walk}  # read before the burst: the fleet was empty
    # The fleet holds 11 (this pod's, the others' none), so the bound is ceil(1.25 x 12 / 4) = 4; this pod's
    # estimate reads 9, 9, 6 and 9, less the slack of 2 after the owner: all above it.
    decision = index.choose(blocks, own, reports=reports, now=0.1)
    assert (decision.replica, decision.reason) == (walk[2], A.DECISION_OVERLOADED)


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "2"])
def test_a_report_time_to_live_must_be_seconds(value):
    with pytest.raises(ValueError, match="report_ttl_s"):
        A.AffinitySettings(block_tokens=BLOCK, index_blocks=10, report_ttl_s=value)
