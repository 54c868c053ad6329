"""DeepSeek-V4's compressed sparse attention as vLLM 0.33 and 0.34 cache it (core/deepseek_v4.py): each layer's pages
from the source's formulas, the groups vLLM's packed grouping makes of them, its recorded answer, and vLLM's own
refusals of settings it cannot serve."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from spillway.core.errors import InvalidSpec, ModelGeometryUnknown
from spillway.core.groups import INDEXER, MLA, RING, SLIDING, kv_groups, layer_caches

sys.path.insert(0, str(Path(__file__).resolve().parent / "coverage"))
from compare import RELEASES, entry_of, statuses

HCA, CSA = "heavily_compressed_attention", "compressed_sparse_attention"


def _config(layer_types: list[str], **fields) -> dict:
    return {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "dtype": "bfloat16",
            "num_hidden_layers": len(layer_types), "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64,
            "sliding_window": 128, "index_head_dim": 128, "layer_types": layer_types,
            "compress_rates": {CSA: 4, HCA: 128}, **fields}


def test_each_layer_keeps_its_caches_in_pages_padded_to_576_byte_rows():
    caches = layer_caches(_config([HCA, CSA, "sliding_attention"]))
    assert [(c.kind, c.block_tokens or 256, c.window, c.page_bytes(256)) for c in caches] == [
        # HCA: the window (64 x 584 B = 37376 -> 37440), the latent (256 / 128 = 2 states of 584 B -> 1728), its
        # compressor's fp32 state (8 x 1024 x 4 = 32768 -> 32832) over 128 tokens
        (SLIDING, 64, 128, 37440), (MLA, 256, None, 1728), (SLIDING, 8, 128, 32832),
        # CSA: the indexer's keys (64 x 132 = 8448 -> 8640) and their compressor's state (4 x 512 x 4 -> 8640), then
        # the window, the latent (64 states -> 37440) and its compressor's state (4 x 2048 x 4 -> 32832) over 8 tokens
        (INDEXER, 256, None, 8640), (SLIDING, 4, 8, 8640), (SLIDING, 64, 128, 37440), (MLA, 256, None, 37440),
        (SLIDING, 4, 8, 32832),
        # a layer type compress_rates does not name: its window only
        (SLIDING, 64, 128, 37440)]


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("arch", ["DeepseekV4ForCausalLM", "DeepseekV4ForConditionalGeneration"])
def test_the_recorded_model_is_sized_as_vllm_sizes_it(arch, version):
    """vLLM's answer (truth.json): five groups, the window's 43 layers split 22 + 21, the latents and indexer keys
    one bucket of three pages, the two compressor-state buckets whole; a 961,344-byte row."""
    row = next(s for s in statuses(version) if s.arch == arch)
    assert row.status == "sized" and row.ours == row.theirs
    assert [g[:4] for g in row.ours["groups"]] == [("uniform", 22, 823680, 64), ("uniform", 21, 786240, 64),
                                                   ("uniform", 63, 961344, 256), ("uniform", 23, 755136, 8),
                                                   ("uniform", 40, 829440, 4)]


def test_the_fp8_cache_it_keeps_is_the_same_at_any_tensor_parallel_size():
    """Every cache is one head replicated on every rank (max_tp_shards 1), and vLLM keeps one host copy of an MLA
    model's row (replicated_layout); auto and fp8 both select the fp8_ds_mla layout."""
    config = entry_of("DeepseekV4ForCausalLM")["config"]
    one = kv_groups(config, (0, 34), 1, 256)
    assert kv_groups(config, (0, 34), 8, 256, "fp8") == kv_groups(config, (0, 34), 8, 256)
    assert kv_groups(config, (0, 34), 8, 256).groups == one.groups and kv_groups(config, (0, 34), 8, 256).copies == 1


def test_a_larger_block_keeps_whole_256_token_kernel_pages():
    groups = kv_groups(_config([HCA, CSA] * 2), (0, 34), 1, 512)
    latents = next(g for g in groups.groups if g.block_size == 512)
    assert latents.layers == 6 and latents.page_bytes == 2 * 2880 + 2 * 74880 + 2 * 17280  # 4 / 128 states, padded
    # each block stride a multiple of each latent's and key's page at the 256-token kernel block
    assert all(groups.row_bytes % page == 0 for page in (1728, 37440, 8640))


@pytest.mark.parametrize(("settings", "match"), [
    ({"kv_cache_dtype": "bfloat16"}, "fp8_ds_mla layout only supports fp8 kv-cache"),
    ({"block_size": 64}, "256-token kernel blocks only"),
])
def test_settings_vllm_cannot_serve_are_refused_with_its_reason(settings, match):
    with pytest.raises(InvalidSpec, match=match):
        kv_groups(_config([HCA, CSA]), (0, 33), **{"block_size": 256, **settings})


@pytest.mark.parametrize(("fields", "match"), [
    ({"compress_rates": {CSA: 2, HCA: 128}}, "ratios 4 and 128"),
    ({"head_dim": 256}, "not modelled"),
    ({"num_hidden_layers": 3}, "layer_types for each"),
])
def test_a_config_vllm_would_not_build_as_modelled_is_refused(fields, match):
    with pytest.raises(ModelGeometryUnknown, match=match):
        kv_groups(_config([HCA, CSA], **fields), (0, 33), block_size=256)


def test_a_long_prefix_costs_the_latent_row_per_256_tokens():
    """Past the windows only the latents' group grows with a prefix, a row per 256-token block, not per 4-token block
    of the smallest window group."""
    from spillway.core.geometry import geometry_from_config, kv_layout

    layout = kv_layout(geometry_from_config(entry_of("DeepseekV4ForCausalLM")["config"]), 2, 256)
    assert layout.block_bytes == 961344 and layout.bytes_per_token == 961344 * 2 // 256


V41_TEXT = {"hidden_size": 4096, "num_hidden_layers": 4, "compress_ratios": [0, 2, 2, 1],
            "kv_source_layer_ids": [1, 3], "index_source_layer_ids": [1, 3]}


def test_deepseek_v41_defaults_are_refused_with_vllms_own_error():
    """DeepseekV41Config fills no text field; vLLM's model raises on hidden_size before its language model."""
    with pytest.raises(ModelGeometryUnknown, match="vLLM refuses it: AttributeError: 'DeepseekV41Config' object has "
                                                   "no attribute 'hidden_size'"):
        layer_caches({"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41"})


def _v41(**fields) -> dict:
    text = {"num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64, "sliding_window": 128,
            "index_head_dim": 128, "dtype": "bfloat16", **V41_TEXT, **fields}
    return {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "text_config": text}


def test_deepseek_v41_keeps_compressed_caches_on_its_kv_sources_only():
    """Every layer its window in 32-token blocks (32 x 584 B = 18688 -> 19008); a kv source the compressed latent and
    the indexer's keys, one state per ratio tokens at the block asked (ratio 2: 64 x 584 -> 37440, 64 x 132 -> 8640;
    ratio 1: 128 x 584 -> 74880, 128 x 132 -> 17280) and, at ratio 2, its compressor's unpadded fp32 ring of
    [kv, score] rows (8 x 1024 x 4 = 32768); the layer reading layer 1's caches keeps its window only."""
    caches = layer_caches(_v41())
    assert [(c.kind, c.block_tokens or 128, c.page_bytes(128)) for c in caches] == [
        (SLIDING, 32, 19008),
        (MLA, 128, 37440), (INDEXER, 128, 8640), (SLIDING, 32, 19008), (RING, 8, 32768),
        (SLIDING, 32, 19008),
        (MLA, 128, 74880), (INDEXER, 128, 17280), (SLIDING, 32, 19008)]


@pytest.mark.parametrize("version", RELEASES)
def test_deepseek_v41_is_sized_as_vllm_sizes_it(version):
    """vLLM's answer (truth.json) for the written topology: three uniform-type groups, the 43 windows, the 21 sources'
    latents and keys, the 11 ratio-2 rings; a 9,884,160-byte row (the largest group's block rounded to the lcm of the
    latents' and keys' 64-token kernel pages). 0.33 offloads the windows (4 chunks a request) beside the latents;
    0.34's windows are bounded replay, not offloaded, so each request takes 16 chunks, not 20."""
    row = next(s for s in statuses(version) if s.arch == "DeepseekV41ForCausalLM")
    assert row.status == "sized" and row.ours == row.theirs
    assert [g[:4] for g in row.ours["groups"]] == [("uniform", 43, 817344, 32), ("uniform", 42, 1428480, 128),
                                                   ("uniform", 11, 360448, 8)]
    assert (row.ours["row"], row.ours["chunks"]) == (9884160, 434)
    assert row.ours["tokens"] == {"0.33": 44441, "0.34": 55552}[version]


def test_deepseek_v41_offloads_its_window_on_0_33_only():
    config = entry_of("DeepseekV41ForCausalLM")["config"]
    assert [g.kind for g in kv_groups(config, (0, 33), 1, 128).offloaded] == [SLIDING, MLA]
    assert [g.kind for g in kv_groups(config, (0, 34), 1, 128).offloaded] == [MLA]


@pytest.mark.parametrize(("settings", "match"), [
    ({"kv_cache_dtype": "bfloat16"}, "packed KV layouts only support fp8 kv-cache"),
    ({"block_size": 32}, "64-token kernel blocks only on Hopper"),
])
def test_deepseek_v41_settings_vllm_cannot_serve_are_refused_with_its_reason(settings, match):
    with pytest.raises(InvalidSpec, match=match):
        kv_groups(_v41(), (0, 34), **{"block_size": 128, **settings})


@pytest.mark.parametrize(("fields", "match"), [
    ({"compress_ratios": [0, 4, 2, 1]}, "layer 1 has compress_ratio=4; only 0"),
    ({"kv_source_layer_ids": []}, "requires kv_source_layer_ids"),
    ({"kv_source_layer_ids": [2, 3], "index_source_layer_ids": [2, 3]}, "compressed layer 1 has no kv or index"),
    ({"kv_source_layer_ids": [0, 1, 3], "index_source_layer_ids": [0, 1, 3]}, "kv source layer 0 has compress_ratio 0"),
    ({"index_source_layer_ids": [1]}, "index sources other than its kv sources"),
    ({"candidate_source_layer_id": 1}, "candidate blocks"),
])
def test_deepseek_v41_topologies_vllm_refuses_or_the_planner_does_not_model(fields, match):
    with pytest.raises(ModelGeometryUnknown, match=match):
        layer_caches(_v41(**fields))


@pytest.mark.parametrize(("arch", "block"), [("DeepseekV4ForCausalLM", 256), ("DeepseekV41ForCausalLM", 64)])
def test_a_plan_without_a_block_size_takes_the_block_vllm_picks_for_the_model(arch, block):
    """No --block-size asked: vLLM picks the smallest block every attention backend takes (platforms/interface.py
    _preferred_block_size_for_backends): DeepSeek-V4's sparse MLA and indexer kernels take 256 only, so 256, not
    Spillway's 64, which vLLM would refuse; DeepSeek-V4.1's Hopper kernels (64) take 64."""
    from spillway.core.geometry import geometry_from_config
    from spillway.core.planner import ServingRequest, plan

    geometry = geometry_from_config(entry_of(arch)["config"])
    rendered = plan(geometry, ServingRequest(vllm_version="0.34.0"))
    assert rendered.layout.block_size == block
    assert rendered.args[rendered.args.index("--block-size") + 1] == str(block)


def test_a_block_size_asked_is_kept_and_refused_as_vllm_refuses_it():
    from spillway.core.geometry import geometry_from_config
    from spillway.core.planner import ServingRequest, plan

    geometry = geometry_from_config(entry_of("DeepseekV4ForCausalLM")["config"])
    with pytest.raises(InvalidSpec, match="--block-size 64 has no common block size"):
        plan(geometry, ServingRequest(block_size=64, vllm_version="0.34.0"))
    assert plan(geometry, ServingRequest(block_size=512, vllm_version="0.34.0")).layout.block_size == 512



def test_an_offload_block_is_refused_where_offloaded_groups_keep_blocks_of_several_sizes():
    """vLLM asserts that every offloaded group has one block size when the connector's block_size is given
    (kv_connector/v1/offloading/config.py): the plan refuses it rather than render an engine that never starts.
    DeepSeek-V4.1 on 0.34 offloads one group (its windows are replayed, not offloaded), so it may set one."""
    from spillway.core.geometry import geometry_from_config
    from spillway.core.planner import NodeFacts, OffloadRequest, ServingRequest, plan

    def planned(arch, chunk=None):
        request = ServingRequest(vllm_version="0.34.0", offload=OffloadRequest(offload_block_size=chunk),
                                 kv_cache_dtype="fp8")
        return plan(geometry_from_config(entry_of(arch)["config"]), request, NodeFacts(2**41, 8, "h200"))

    assert len({g.block_size for g in planned("DeepseekV4ForCausalLM").layout.groups.offloaded}) > 1
    with pytest.raises(InvalidSpec, match="all groups must have the same block size"):
        planned("DeepseekV4ForCausalLM", 1024)
    assert len({g.block_size for g in planned("DeepseekV41ForCausalLM").layout.groups.offloaded}) == 1
    args = planned("DeepseekV41ForCausalLM", 256).args
    assert json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]["block_size"] == 256


def test_the_reload_rate_counts_each_whole_prefix_group_at_its_own_block():
    """DeepSeek-V4 reloads a latent row per 256 tokens of prefix, not per its windows' 4-token blocks: the node's
    link moves one rank's prefix bytes a token (KVGroups.prefix_bytes_per_token)."""
    from spillway.core.geometry import geometry_from_config
    from spillway.core.planner import NodeFacts, ServingRequest, plan

    p = plan(geometry_from_config(entry_of("DeepseekV4ForCausalLM")["config"]),
             ServingRequest(vllm_version="0.34.0", kv_cache_dtype="fp8"), NodeFacts(2**41, 8, "h200", dma_gbps=50.0))
    groups = p.layout.groups
    whole = [g for g in groups.offloaded if groups.window_chunks(g) is None]
    assert {g.block_size for g in whole} == {256} and min(g.block_size for g in groups.offloaded) < 256
    # whole bytes a token (prefix_bytes_per_token rounds down): within 0.1%; a row per 4-token block would be 64x less
    assert p.transfer.reload_tokens_per_s == pytest.approx(50e9 * 256 / (groups.row_bytes * len(whole)), rel=1e-3)
