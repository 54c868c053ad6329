"""vLLM releases that pin each pool tensor in one host registration (0.26) cannot pin 512 GiB or more in one call
(vllm#51080); from 0.32 vLLM registers the region in chunks (vllm#51081). The planner never plans such a pool."""
from __future__ import annotations

import pytest
from spillway.adapters.model_config import resolve_geometry
from spillway.core.errors import PoolDoesNotFit
from spillway.core.footprint import MAX_PIN_CALL_BYTES, largest_pin_call
from spillway.core.planner import NodeFacts, OffloadRequest, ServingRequest, plan

GiB = 2**30
NODE = NodeFacts(4 * 2**40, 8, "big-memory-node")  # 4 TiB: one replica's share is far above 512 GiB


def _plan(version: str, size: str = "auto", tp: int = 1):
    request = ServingRequest(tensor_parallel_size=tp, replicas_per_node=1, vllm_version=version,
                             offload=OffloadRequest(size=size))
    return plan(resolve_geometry("meta-llama/Llama-3.1-8B-Instruct"), request, NODE)


def test_auto_stays_under_one_registration_on_releases_without_chunked_pinning():
    old, new = _plan("0.26.1"), _plan("0.33.0")
    assert new.pool.bytes > MAX_PIN_CALL_BYTES  # 0.33 pins the whole share in chunks
    assert old.pool.bytes < new.pool.bytes
    # 0.26's one cross-layer tensor per rank, rounded up to a power of two, stays under the ceiling
    assert largest_pin_call((0, 26), old.pool.bytes, 1, (1,)) < MAX_PIN_CALL_BYTES
    assert old.pool.bytes > 200 * GiB  # capped at the ceiling, not far below it


def test_more_ranks_pin_more_in_total():
    assert _plan("0.26.1", tp=4).pool.bytes > _plan("0.26.1").pool.bytes


@pytest.mark.parametrize("size", ["600Gi", "300Gi"])
def test_an_explicit_pool_that_one_call_cannot_pin_is_refused(size):
    with pytest.raises(PoolDoesNotFit, match="vllm#51080"):
        _plan("0.26.1", size)
    assert _plan("0.33.0", size).pool.bytes <= int(size[:-2]) * GiB
