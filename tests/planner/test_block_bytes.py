"""The plan's bytes of a block and of a token come from the KV-cache groups, the rows the offload moves.

Nemotron-H-8B with bf16 Mamba state was measured on an H200 with vLLM 0.33 (bench/hybrid-kv):
`Registering ... (row=8650752)` for 16-token blocks asked (528-token attention blocks), `row=9437184` for 64 (576).
Counting its 52 layers as attention said 212,992 B a token and 3,407,872 B a 16-token block instead.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from spillway.adapters.model_config import resolve_geometry
from spillway.controller.status import status_plan
from spillway.core.geometry import ModelGeometry, geometry_from_config, kv_layout
from spillway.core.options import Connector, Layout
from spillway.core.planner import SMALL_BLOCK_WARNING, NodeFacts, OffloadRequest, ServingRequest, plan
from spillway.core.quantity import parse_bytes
from spillway.core.rates import interpolate_log2

REPO = Path(__file__).resolve().parents[2]
KiB, MiB = 1024, 2**20
# The H200 of the run: 131961788Ki allocatable, one GPU; a DMA table whose rate depends on the copy's size, so the
# lookup shows which size it was made at.
H200 = parse_bytes("131961788Ki")
DMA_TABLE = ((256 * KiB, 12.0), (1 * MiB, 30.0), (4 * MiB, 45.0), (16 * MiB, 52.0))


def nemotron_bf16_state() -> ModelGeometry:
    config = json.loads((REPO / "bench/gpu/nemotron-h-8b/config.json").read_text())
    # the H200 run's planner config: the model's, with the state dtype its engines ran (--mamba-ssm-cache-dtype)
    return geometry_from_config({**config, "mamba_ssm_cache_dtype": "bfloat16"}, "nemotron-h-8b")


def native_8gi(block_size: int, layout: Layout = Layout.CONTIGUOUS) -> ServingRequest:
    return ServingRequest(block_size=block_size,
                          offload=OffloadRequest(size="8Gi", connector=Connector.NATIVE, layout=layout))


# block size asked -> (vLLM's attention block, its offload row as the H200 logged it)
H200_ROWS = {16: (528, 8_650_752), 64: (576, 9_437_184)}


@pytest.mark.parametrize("block_size", sorted(H200_ROWS))
def test_hybrid_block_and_copy_bytes_are_the_measured_rows(block_size):
    kv_block, row = H200_ROWS[block_size]
    p = plan(nemotron_bf16_state(), native_8gi(block_size), NodeFacts(H200, 1, dma_table=DMA_TABLE))
    geometry = p.to_dict()["geometry"]
    assert (geometry["block_size"], geometry["kv_block_size"]) == (block_size, kv_block)
    assert geometry["block_bytes"] == row == p.groups.row_bytes
    assert geometry["bytes_per_token"] == 4 * 4096  # 4 attention layers x 8 KV heads x 256 (K and V) x 2 B
    assert geometry["layer_page_bytes"] == kv_block * 8 * 128 * 2  # one attention layer's K of the grown block
    assert p.transfer.copy_bytes == row
    assert p.transfer.qualified_gbps == interpolate_log2(DMA_TABLE, row)
    assert p.transfer.reload_tokens_per_s == p.transfer.qualified_gbps * 1e9 * kv_block / row
    assert p.pool.chunk_bytes == row


def test_hybrid_pool_and_status_agree_with_the_h200():
    p = plan(nemotron_bf16_state(), native_8gi(16), NodeFacts(H200, 1))
    assert (p.pool.chunks, p.pool.bytes) == (992, 8_581_545_984)  # vLLM: 992 rows, 8.58 GB mmap file
    desired = SimpleNamespace(plan=p, node=SimpleNamespace(name="h200", dma_gbps=None), eligible=(object(),))
    assert status_plan(desired)["blockBytes"] == 8_650_752


def test_hybrid_per_layer_copies_are_the_grown_blocks_pages():
    p = plan(nemotron_bf16_state(), native_8gi(64, Layout.DEFAULT), NodeFacts(H200, 1, dma_table=DMA_TABLE))
    page = 576 * 4096  # one layer's K and V of a 576-token block: a quarter of the row
    assert p.transfer.copy_bytes == page == 9_437_184 // 4
    assert any("4 copies of 2.25 MiB" in w for w in p.warnings), p.warnings


def test_several_full_attention_groups_each_add_a_row_per_block():
    # 2 Mamba layers and 6 attention layers: groups of 2, so 3 full-attention groups, each a row per prefix block
    config = {**json.loads((REPO / "bench/gpu/nemotron-h-8b/config.json").read_text()),
              "num_hidden_layers": 8, "hybrid_override_pattern": "M*M*****", "mamba_ssm_cache_dtype": "bfloat16"}
    layout = kv_layout(geometry_from_config(config, "six-attention"), block_size=64)
    assert [g.kind for g in layout.groups.groups].count("full_attention") == 3
    assert layout.prefix_rows == 3
    assert layout.block_bytes == 2 * 576 * 4096
    assert layout.bytes_per_token == 6 * 4096  # every attention layer once, no Mamba layer


def test_window_groups_copy_their_own_rows():
    # gpt-oss-20b: a sliding group and a full group of 12 layers each; each copy is one group's row
    layout = kv_layout(resolve_geometry("openai/gpt-oss-20b"), block_size=64)
    assert layout.block_bytes == 1_572_864 == 12 * 64 * 8 * 64 * 2 * 2
    assert layout.bytes_per_token == 12 * 8 * 64 * 2 * 2  # past the window only the full group grows
    # Gemma-3-4B, 16-token blocks: 320 KiB rows, under the size where DMA runs well (all 34 layers: 2.1 MiB)
    small = plan(resolve_geometry("google/gemma-3-4b-it"), ServingRequest(block_size=16), NodeFacts(H200, 1))
    assert small.layout.block_bytes == 320 * KiB < SMALL_BLOCK_WARNING
    assert any(w.startswith("KV block is 320.0 KiB per rank") for w in small.warnings), small.warnings


@pytest.mark.parametrize("block_size,block_bytes", [(16, 2 * MiB), (64, 8 * MiB)])
def test_pure_attention_is_unchanged(block_size, block_bytes):
    llama = resolve_geometry("meta-llama/Llama-3.1-8B-Instruct")
    p = plan(llama, ServingRequest(block_size=block_size), NodeFacts(H200, 1, dma_table=DMA_TABLE))
    geometry = p.to_dict()["geometry"]
    assert geometry["bytes_per_token"] == 128 * KiB
    assert geometry["layer_page_bytes"] == block_size * 8 * 128 * 2
    assert (geometry["block_bytes"], geometry["kv_block_size"]) == (block_bytes, block_size)
    assert p.transfer.copy_bytes == block_bytes == p.pool.chunk_bytes
    assert p.transfer.reload_tokens_per_s == p.transfer.qualified_gbps * 1e9 * block_size / block_bytes
    # the same model given field by field (no config facts) sizes the same
    fields = ModelGeometry(llama.name, llama.architecture, 32, llama.attention, 8, 32, 128, "bfloat16")
    assert kv_layout(fields, 1, block_size).block_bytes == block_bytes
