"""The kv-aware router's placement policy (core/affinity.py), on its own: where prefixes go, when a holder is
passed over, what the index forgets."""
from __future__ import annotations

import random

import pytest
from spillway.core import affinity as A

BLOCK = 4


def _index(replicas=("a", "b", "c"), index_blocks=1000, max_imbalance=4) -> A.AffinityIndex:
    index = A.AffinityIndex(A.AffinitySettings(block_tokens=BLOCK, index_blocks=index_blocks,
                                               max_imbalance=max_imbalance))
    index.sync(replicas)
    return index


def _prompt(prefix: int, suffix: int, prefix_blocks: int = 3) -> dict:
    return {"prompt": [prefix] * (prefix_blocks * BLOCK) + [1000 + suffix] * (BLOCK - 1)}


def test_blocks_are_whole_and_chained():
    one = A.prompt_blocks({"prompt": list(range(11))}, BLOCK)
    assert len(one) == 2  # 11 tokens: two whole blocks, the rest is not cached by vLLM either
    other = A.prompt_blocks({"prompt": [99, *range(1, 11)]}, BLOCK)
    assert one[1] != other[1]  # the second block's hash covers the first
    assert A.prompt_blocks({"prompt": list(range(12))}, BLOCK)[:2] == one


@pytest.mark.parametrize("body", [
    {"prompt": "x" * (8 * BLOCK * A.CHARS_PER_TOKEN)},
    {"prompt": [list(range(40))]},
    {"messages": [{"role": "system", "content": "s" * 200}, {"role": "user", "content": [{"type": "text",
                                                                                         "text": "q" * 100}]}]},
])
def test_text_batches_and_chats_have_blocks(body):
    assert len(A.prompt_blocks(body, BLOCK)) >= 2


@pytest.mark.parametrize("body", [{}, {"prompt": []}, {"prompt": [1, 2]}, {"prompt": [{"a": 1}] * 9},
                                  {"messages": "hi"}, {"messages": [1, 2]}, {"prompt": {"a": 1}}])
def test_requests_without_a_usable_prompt_have_no_blocks(body):
    assert A.prompt_blocks(body, BLOCK) == []


def test_chats_sharing_leading_messages_share_leading_blocks():
    system = {"role": "system", "content": "You answer questions about the handbook. " * 20}
    a = A.prompt_blocks({"messages": [system, {"role": "user", "content": "first question"}]}, BLOCK)
    b = A.prompt_blocks({"messages": [system, {"role": "user", "content": "another one entirely"}]}, BLOCK)
    shared = sum(1 for x, y in zip(a, b) if x == y)
    assert shared >= len(system["content"]) // (BLOCK * A.CHARS_PER_TOKEN) - 1


def test_one_at_a_time_new_prefixes_spread_evenly_and_stay():
    """Every replica idle at each decision: the prefixes held decide, so 6 prefixes land 2/2/2 in any order, and
    each prefix's later prompts follow its first."""
    for seed in range(20):
        index = _index()
        order = [(p, s) for p in range(6) for s in range(8)]
        random.Random(seed).shuffle(order)
        where: dict[int, set[str]] = {}
        for prefix, suffix in order:
            decision = index.route(_prompt(prefix, suffix), {})
            where.setdefault(prefix, set()).add(decision.replica)
        assert all(len(r) == 1 for r in where.values()), where
        assert sorted(index.routed.values()) == [16, 16, 16], index.routed


def test_a_prompt_follows_its_prefix_before_any_replica_reports_it():
    index = _index()
    first = index.route(_prompt(1, 0), {})
    second = index.route(_prompt(1, 1), {first.replica: 1})  # the first is still being computed
    assert (second.replica, second.reason, second.matched_blocks) == (first.replica, A.DECISION_PREFIX, 3)


def test_an_overloaded_holder_is_passed_over_and_both_then_hold_it():
    index = _index(max_imbalance=2)
    holder = index.route(_prompt(1, 0), {}).replica
    load = {holder: 2}
    diverted = index.route(_prompt(1, 1), load)
    assert diverted.replica != holder and diverted.reason == A.DECISION_OVERLOADED
    again = index.route(_prompt(1, 2), {holder: 2, diverted.replica: 1})
    assert (again.replica, again.reason) == (diverted.replica, A.DECISION_PREFIX)
    assert index.route(_prompt(1, 3), {diverted.replica: 1}).replica == holder  # the less loaded holder


def test_the_longest_shared_prefix_wins():
    index = _index()
    short = {"prompt": [7] * BLOCK + [8] * (4 * BLOCK)}
    long = {"prompt": [7] * BLOCK + [9] * (4 * BLOCK)}
    a = index.route(short, {}).replica
    other = next(r for r in index.replicas if r != a)
    index.record(other, A.prompt_blocks(long, BLOCK))
    decision = index.route(long, {})  # a holds its first block, other all five
    assert (decision.replica, decision.matched_blocks) == (other, 5)


def test_the_index_keeps_prefix_heads_within_its_capacity():
    index = _index(replicas=("a",), index_blocks=6)
    for prefix in range(4):
        index.route(_prompt(prefix, 0), {})
    assert len(index._blocks["a"]) == 6
    # The newest prefix is whole; the one before it keeps its head (tails go first)
    assert index.matched("a", A.prompt_blocks(_prompt(3, 0), BLOCK)) == 3
    assert index.matched("a", A.prompt_blocks(_prompt(2, 0), BLOCK)) >= 1
    assert index.prefixes_held("a") <= 3


def test_pod_changes_keep_the_others_and_a_new_pod_takes_new_prefixes():
    index = _index(replicas=("a", "b"))
    placed = {p: index.route(_prompt(p, 0), {}).replica for p in range(4)}
    added, removed = index.sync(["a", "b", "c"])
    assert (added, removed) == (["c"], [])
    assert all(index.route(_prompt(p, 1), {}).replica == r for p, r in placed.items())
    assert index.route(_prompt(9, 0), {}).replica == "c"
    index.sync(["b", "c"])
    assert "a" not in index.replicas
    assert all(index.route(_prompt(p, 2), {}).replica in ("b", "c") for p in placed)


def test_no_replica_is_a_lookup_error():
    with pytest.raises(LookupError):
        _index(replicas=()).route(_prompt(1, 0), {})


@pytest.mark.parametrize("field", ["block_tokens", "index_blocks", "max_imbalance"])
@pytest.mark.parametrize("value", [0, -1, True, 2.5, "8"])
def test_settings_refuse_nonsense(field, value):
    good = {"block_tokens": 16, "index_blocks": 10, "max_imbalance": 4}
    with pytest.raises(ValueError, match=field):
        A.AffinitySettings(**{**good, field: value})
