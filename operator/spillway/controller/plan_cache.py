"""Plans remembered across reconciles: a fleet re-plans the same model on the same node shapes again and again.

core.planner.plan() is a pure function of (geometry, request, node facts), so its answer, or its refusal, is
kept under those inputs. A ModelServer's eligible nodes are planned once per distinct shape (the facts less the
name; `plan_for_nodes` picks the representative whose name the plan carries), and ModelServers that share a
model, a request and a node pool share the plans. Bounded (least recently used first out) and thread-safe:
kopf runs reconciles in a thread pool.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import asdict
from typing import Any

from ..core.errors import SpillwayError
from ..core.geometry import ModelGeometry
from ..core.planner import NodeFacts, Plan, ServingRequest, plan

MAX_ENTRIES = 8192  # a plan is a few KiB: tens of MiB at most

_entries: OrderedDict[tuple[Any, ...], Plan | SpillwayError] = OrderedDict()
_guard = threading.Lock()


def geometry_key(geometry: ModelGeometry) -> str:
    """The geometry's identity for the cache, its config.json included (compare=False leaves it out of ==)."""
    return json.dumps([{k: str(v) for k, v in asdict(geometry).items() if k != "config"}, geometry.config],
                      sort_keys=True, default=str)


def shape(facts: NodeFacts) -> tuple[Any, ...]:
    """What planning reads of a node besides its name."""
    return (facts.allocatable_memory, facts.gpus, facts.dma_gbps, facts.dma_table, facts.cpu_millis,
            facts.ephemeral_storage, facts.disk_read_gbps, facts.hugepages_2mi)


def cached_plan(geometry: ModelGeometry, key: str, request: ServingRequest, facts: NodeFacts) -> Plan:
    """plan(geometry, request, facts), computed once per (geometry key, request, facts); a refusal is kept too."""
    entry_key = (key, request, facts)
    with _guard:
        found = _entries.get(entry_key)
        if found is not None:
            _entries.move_to_end(entry_key)
    if found is None:
        try:
            found = plan(geometry, request, facts)
        except SpillwayError as exc:
            found = exc
        with _guard:
            _entries[entry_key] = found
            while len(_entries) > MAX_ENTRIES:
                _entries.popitem(last=False)
    if isinstance(found, SpillwayError):
        raise found
    return found


def clear() -> None:
    with _guard:
        _entries.clear()
