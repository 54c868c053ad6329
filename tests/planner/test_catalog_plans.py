"""Every current model of the catalog plans on an 8-GPU node: its KV-cache groups, its pool, its footprint.
And the pool is as large as the measured footprint allows: >= 90% of what the share leaves the pool."""
from __future__ import annotations

import pytest
from spillway.adapters.model_config import catalog_config, resolve_geometry
from spillway.core.errors import ModelGeometryUnknown, PoolDoesNotFit
from spillway.core.footprint import next_power_of_two
from spillway.core.geometry import DEFAULT_BLOCK_SIZE
from spillway.core.groups import CHUNKED, FULL, MAMBA, MLA, SLIDING, kv_groups
from spillway.core.planner import NodeFacts, OffloadRequest, ServingRequest, plan

GiB, MiB = 2**30, 2**20
NODE = NodeFacts(2 * 2**40, 8, "h200-node")

# model id -> (tensor parallel size, {group kind: groups}, layers of the largest group)
CURRENT_MODELS = {
    "openai/gpt-oss-20b": (1, {SLIDING: 1, FULL: 1}, 12),
    "openai/gpt-oss-120b": (2, {SLIDING: 1, FULL: 1}, 18),
    "google/gemma-3-4b-it": (1, {SLIDING: 6, FULL: 1}, 5),  # 34 layers: 29 sliding in 6 groups, 5 global
    "google/gemma-3-12b-it": (1, {SLIDING: 5, FULL: 1}, 8),
    "google/gemma-3-27b-it": (2, {SLIDING: 6, FULL: 1}, 10),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": (4, {CHUNKED: 3, FULL: 1}, 12),
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": (8, {CHUNKED: 3, FULL: 1}, 12),
    "Qwen/Qwen3-30B-A3B": (1, {FULL: 1}, 48),
    "Qwen/Qwen3-Next-80B-A3B-Instruct": (2, {MAMBA: 3, FULL: 1}, 12),
    "deepseek-ai/DeepSeek-V3.1": (8, {MLA: 1}, 61),
    "moonshotai/Kimi-K2-Instruct": (8, {MLA: 1}, 61),
    "zai-org/GLM-4.5": (8, {FULL: 1}, 92),
    "zai-org/GLM-4.6": (8, {FULL: 1}, 92),
    "mistralai/Mistral-Large-Instruct-2407": (4, {FULL: 1}, 88),
    "microsoft/phi-4": (1, {FULL: 1}, 40),
    "nvidia/Nemotron-H-8B-Base-8K": (1, {MAMBA: 6, FULL: 1}, 4),
}


def _plan(model: str, tp: int, version: str = "0.33.0", size: str = "auto", block_size: int = DEFAULT_BLOCK_SIZE):
    request = ServingRequest(tensor_parallel_size=tp, block_size=block_size, offload=OffloadRequest(size=size),
                             vllm_version=version)
    return plan(resolve_geometry(model), request, NODE)


@pytest.mark.parametrize("model", sorted(CURRENT_MODELS))
@pytest.mark.parametrize("version", ["0.33.0", "0.32.0", "0.26.0"])
def test_current_models_plan(model, version):
    tp, kinds, largest = CURRENT_MODELS[model]
    if version == "0.26.0" and CHUNKED in kinds:
        with pytest.raises(ModelGeometryUnknown, match="get_sliding_window_size_in_chunks asserts"):
            _plan(model, tp, version)
        return
    result = _plan(model, tp, version)
    groups, pool, pod = result.groups, result.pool, result.pod
    counted: dict[str, int] = {}
    for group in groups.groups:
        counted[group.kind] = counted.get(group.kind, 0) + 1
    assert counted == kinds
    assert max(g.layers for g in groups.groups) == largest
    assert pool.chunk_bytes >= groups.row_bytes * groups.copies and pool.tokens > 0
    # the pod holds the pool's footprint and stays inside its share of the node
    assert pod.memory_limit_bytes >= pool.footprint_bytes + pod.process_reserve_bytes
    assert NODE.allocatable_memory >= result.node.replicas_per_node * pod.memory_limit_bytes
    budget = result.node.share_bytes - result.node.fixed_bytes
    if version != "0.26.0":
        assert pool.bytes >= 0.9 * budget  # the measured path wastes under 10% of the share
        assert pod.shm_bytes >= pool.bytes  # vLLM checks /dev/shm has room for its whole region


def test_llama_8b_pool_fills_the_share_on_033_and_whole_powers_of_two_on_026():
    llama = "meta-llama/Llama-3.1-8B-Instruct"
    modern = _plan(llama, 1, "0.33.0")
    budget = modern.node.share_bytes - modern.node.fixed_bytes
    assert modern.pool.bytes >= 0.99 * budget  # 227.7 GiB of a 228.2 GiB budget (243.2 GiB share)
    old = _plan(llama, 1, "0.26.0")
    assert old.pool.bytes == 128 * GiB == next_power_of_two(old.pool.bytes)  # one tensor, filled to the brim
    assert old.pod.shm_bytes == 1 * GiB  # 0.26's pinned pool is not in /dev/shm
    # 114 GiB (the old 2.0x rule's pool) costs 0.26 a 128 GiB tensor: the rule says so
    odd = _plan(llama, 1, "0.26.0", "114Gi")
    assert odd.pool.footprint_bytes >= 128 * GiB and "power of two" in odd.pool.footprint


def test_explicit_size_is_checked_against_the_footprint():
    llama = "meta-llama/Llama-3.1-8B-Instruct"
    assert _plan(llama, 1, "0.33.0", "200Gi").pool.bytes == 200 * GiB  # kept exactly
    # on 0.26, 200 GiB pins a 256 GiB tensor, more than the 243 GiB share
    with pytest.raises(PoolDoesNotFit, match=r"costs 256\.\d GiB .*power of two.*largest pool that fits is 128"):
        _plan(llama, 1, "0.26.0", "200Gi")


def test_mla_single_host_copy_from_032():
    kimi = "moonshotai/Kimi-K2-Instruct"
    assert _plan(kimi, 8, "0.33.0").pool.copies == 1
    old = _plan(kimi, 8, "0.26.0")
    assert old.pool.copies == 8 and old.pool.chunk_bytes == 8 * old.groups.row_bytes


def test_mamba_hybrid_blocks_follow_the_release():
    # 0.26 rounds Nemotron-H's blocks to whole 256-token Mamba chunks: 1280 tokens, the 5 MiB rows the H200
    # measurement pinned (bench/footprint/results/footprint.json, mamba-16-auto). 0.33 needs the smallest
    # multiple of the asked block whose page holds a state (vllm/platforms/interface.py _align_hybrid_block_size):
    # 1088 from the planner's 64-token default, 1040 from 16.
    nemotron = "nvidia/Nemotron-H-8B-Base-8K"
    old, modern = _plan(nemotron, 1, "0.26.0"), _plan(nemotron, 1, "0.33.0")
    assert (old.groups.block_size, modern.groups.block_size) == (1280, 1088)
    assert _plan(nemotron, 1, "0.26.0", block_size=16).groups.block_size == 1280
    assert _plan(nemotron, 1, "0.33.0", block_size=16).groups.block_size == 1040
    assert old.groups.groups[0].page_bytes == 5 * MiB
    # Qwen3-Next's gated delta-net prefills through FlashInfer on CUDA, whose checkpoints fall every 64 tokens: the
    # hybrid block is a multiple of 64 whatever block is asked (576, where a 16-token alignment gives 544)
    assert _plan("Qwen/Qwen3-Next-80B-A3B-Instruct", 2, block_size=16).groups.block_size == 576
    assert _plan("Qwen/Qwen3-Next-80B-A3B-Instruct", 2, block_size=32).groups.block_size == 576
    assert _plan("Qwen/Qwen3-Next-80B-A3B-Instruct", 2).groups.block_size == 576
    qwen3_next = catalog_config("Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert kv_groups(qwen3_next, (0, 33), 2, 16, kernel_block=32).block_size == 544  # no FlashInfer: the CPU's 32
    assert kv_groups(qwen3_next, (0, 32), 2, 16).block_size == 544  # 0.32 had no checkpoint alignment
    # vLLM aligns a Mamba hybrid's offloaded blocks only with prefix caching on
    assert "--enable-prefix-caching" in modern.args
    assert "--enable-prefix-caching" not in _plan("meta-llama/Llama-3.1-8B-Instruct", 1).args
