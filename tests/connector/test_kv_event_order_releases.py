"""The connector's parent-first pass over KV events (kv_event_order.py, PATCHES.md entry 4) against each release's
own events: it reorders where a release emits a store job's blocks in set order (0.32, 0.33) and leaves 0.34's
events exactly as they are, since 0.34 keeps a store job's keys in prefix order itself.

Run on the installed vLLM and, through test_vllm_sources.py, on the 0.33 and 0.34 trees. The release's scheduler
is read, not started: how its store jobs hold their keys (`TransferJobStatus.keys` and the `keys=` of every
store job it builds, vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py). The events are the
release's own: its CPUOffloadingManager (events on) completes one store job of a request's chunks, holding the
keys as that scheduler does, and its OffloadingEventsTracker turns them into self-describing BlockStored events.
"""
from __future__ import annotations

import ast
import inspect
import random
from types import SimpleNamespace

import pytest
from support import require_vllm

require_vllm(allow_module_level=True)

from spillway_connector import compat
from spillway_connector.kv_event_order import parents_first

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import events as events_module
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as scheduler_module
except ImportError:  # 0.26: the offloading connector's events have no tracker
    pytest.skip("vLLM 0.26 has no self-describing offload events", allow_module_level=True)

import torch
from vllm.v1.core.kv_cache_utils import BlockHash
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.kv_offload.base import OffloadingKVEventsConfig, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

TOKENS_PER_BLOCK = 16
CHUNKS = 12


def _store_job_keys() -> list[str]:
    """How each store job of the release's scheduler holds its keys: 'set' or 'ordered', one per call site."""
    tree = ast.parse(inspect.getsource(scheduler_module))
    kinds = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        bound = {}  # local name -> its last assigned value
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                bound[node.targets[0].id] = node.value
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "TransferJobStatus"):
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            store = keywords.get("is_store")
            if not (isinstance(store, ast.Constant) and store.value is True):
                continue
            value = keywords["keys"]
            while isinstance(value, ast.Name) and value.id in bound:
                value = bound[value.id]
            is_set = isinstance(value, (ast.Set, ast.SetComp)) or (
                isinstance(value, ast.Call) and getattr(value.func, "id", None) == "set")
            kinds.append("set" if is_set else "ordered")
    return kinds


def _job_keys(keys_to_store: list) -> object:
    """The store job's keys as this release's scheduler holds them (its main store path)."""
    annotation = str(scheduler_module.TransferJobStatus.__dataclass_fields__["keys"].type)
    if annotation.startswith("set"):
        return set(keys_to_store)
    assert annotation.startswith("tuple"), annotation
    return tuple(dict.fromkeys(keys_to_store))


def _release_events(seed: int) -> list:
    """The BlockStored events this release emits for one store job of a CHUNKS-chunk request."""
    rng = random.Random(seed)
    hashes = [BlockHash(rng.randbytes(32)) for _ in range(CHUNKS)]
    spec = FullAttentionSpec(block_size=TOKENS_PER_BLOCK, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    group = scheduler_module.GroupOffloadConfig(
        group_idx=0, tokens_per_block=TOKENS_PER_BLOCK, tokens_per_chunk=TOKENS_PER_BLOCK, hashes_per_chunk=1,
        kv_event_group_spec=events_module.get_offloading_event_group_spec(SimpleNamespace(kv_cache_spec=spec)),
        sliding_window_size_in_chunks=None, kv_cache_spec=spec, manager_cls=FullAttentionManager)
    request = SimpleNamespace(request_id="r", block_hashes=hashes, lora_request=None, resumable=False,
                              all_token_ids=[rng.randrange(1000) for _ in range(CHUNKS * TOKENS_PER_BLOCK)],
                              kv_transfer_params=None, cache_salt=None, mm_features=[])
    tracker = events_module.OffloadingEventsTracker(OffloadingKVEventsConfig(True, True))
    manager = CPUOffloadingManager(CHUNKS * 2, cache_policy="lru", enable_events=True)
    context = ReqContext(req_id="r")
    keys = [make_offload_key(h, 0) for h in hashes]
    output = manager.prepare_store(keys, context)
    for index, key in enumerate(output.keys_to_store):
        tracker.record_store(request, group, keys.index(key), key)
    manager.complete_store(_job_keys(list(output.keys_to_store)), context)
    events = list(tracker.take_events(list(manager.take_events())))
    assert len(events) == CHUNKS and all(hasattr(e, "parent_block_hash") for e in events)
    return events


def _parent_first(events: list) -> bool:
    known: set = set()
    for event in events:
        if event.parent_block_hash is not None and event.parent_block_hash not in known:
            return False
        known.update(event.block_hashes)
    return True


def test_the_release_holds_store_job_keys_as_the_ledger_says():
    kinds = _store_job_keys()
    assert kinds, "no store job found in the release's scheduler"
    if compat.VLLM_MINOR >= (0, 34):
        assert set(kinds) == {"ordered"}, kinds  # TransferJobStatus.keys: tuple, in prefix order
    else:
        assert "set" in kinds, kinds  # the main store path: set(keys_to_store)


@pytest.mark.skipif(compat.VLLM_MINOR < (0, 32), reason="0.26's tracker takes other group configs")
def test_the_connector_reorders_only_where_the_release_does_not_order():
    reordered = 0
    for seed in range(20):
        events = _release_events(seed)
        ordered = parents_first(events)
        assert _parent_first(ordered), f"seed {seed}: the pass leaves a block before its parent"
        assert sorted(map(id, ordered)) == sorted(map(id, events))
        if compat.VLLM_MINOR >= (0, 34):
            assert _parent_first(events), f"seed {seed}: 0.34 emitted a block before its parent"
            assert [id(e) for e in ordered] == [id(e) for e in events], "0.34's order is left exactly as it is"
        reordered += [id(e) for e in ordered] != [id(e) for e in events]
    if compat.VLLM_MINOR < (0, 34):
        assert reordered >= 15, f"set order put a block before its parent in only {reordered} of 20 jobs"
    else:
        assert reordered == 0
