"""The groups model's rules that the ground-truth families do not reach on their own."""
from __future__ import annotations

import pytest
from spillway.adapters.model_config import catalog_config
from spillway.core.errors import ModelGeometryUnknown
from spillway.core.geometry import geometry_from_config
from spillway.core.groups import FULL, MAMBA, SLIDING, LayerCache, group_layers, kv_groups


def test_buckets_under_one_and_a_half_times_the_smallest_take_the_largest_size():
    # vLLM's own example (kv_cache_planning.py): gpt-oss-20b plus an EAGLE layer, 12 sliding + 13 full layers,
    # becomes two groups of 13, not 12 + 2 x 12.
    layers = [LayerCache(SLIDING, 512, 128)] * 12 + [LayerCache(FULL, 512)] * 13
    groups = group_layers(layers, 16)
    assert [(g.kind, g.layers) for g in groups] == [(SLIDING, 12), (FULL, 13)]
    five_to_one = group_layers([LayerCache(SLIDING, 512, 1024)] * 10 + [LayerCache(FULL, 512)] * 2, 16)
    assert [(g.kind, g.layers) for g in five_to_one] == [(SLIDING, 2)] * 5 + [(FULL, 2)]


def test_a_multimodal_wrapper_sizes_like_its_language_model():
    wrapper = catalog_config("google/gemma-3-27b-it")
    text = {**wrapper["text_config"], "architectures": ["Gemma3ForCausalLM"], "torch_dtype": "bfloat16"}
    assert kv_groups(wrapper, (0, 33)) == kv_groups(text, (0, 33))
    assert geometry_from_config(wrapper).num_layers == 62


def test_tokens_held_count_each_groups_window_once_per_request():
    config = {**catalog_config("openai/gpt-oss-20b")}
    groups = kv_groups(config, (0, 33), block_size=16)
    sliding, full = groups.groups
    assert groups.window_chunks(sliding) == 8 and groups.window_chunks(full) is None  # 128-token window
    # a 131072-token request stores 8192 full chunks and 8 sliding ones
    assert groups.tokens_held(8200, 131072) == 131072
    assert groups.chunks_per_request(100) == 7 + 7  # short requests: every chunk still in the window


def _hy_v4(**fields) -> dict:
    return {"architectures": ["HYV4ForCausalLM"], "model_type": "hy_v4", "num_hidden_layers": 4,
            "num_attention_heads": 32, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_topk": 2048,
            "index_head_dim": 128, **fields}


def test_hy_v4_keeps_indexer_caches_only_on_its_sparse_layers():
    plain = kv_groups(_hy_v4(), (0, 33), block_size=64)  # no sparse layer: MLA latents only, as vLLM records
    assert [(g.kind, g.layers, g.page_bytes) for g in plain.groups] == [("mla", 4, 64 * 576 * 2)]
    sparse = kv_groups(_hy_v4(layer_types=["sparse_attention"] * 4), (0, 33), block_size=64)
    # MLA and its uint8 indexer keys (128 + one 4-byte scale) in one UniformTypeKVCacheSpecs group
    assert [(g.layers, g.page_bytes) for g in sparse.groups] == [(8, 4 * 64 * (576 * 2 + 132))]
    with pytest.raises(ModelGeometryUnknown, match="indexer caches on some layers only"):
        kv_groups(_hy_v4(layer_types=["sparse_attention", "full_attention"] * 2), (0, 33))
    with pytest.raises(ModelGeometryUnknown, match="indexer caches on some layers only"):
        kv_groups(_hy_v4(layer_types=["sparse_attention"] * 4, indexer_types=["full", "shared"] * 2), (0, 33))
    with pytest.raises(ModelGeometryUnknown, match="kv_lora_rank"):  # HYV4MLAAttention is MLA on every layer
        kv_groups({**_hy_v4(), "kv_lora_rank": None}, (0, 33))


def _gemma4(**fields) -> dict:
    return {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "num_hidden_layers": 30,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 512,
            "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5, **fields}


def test_gemma4_global_layers_of_another_head_size_pack_as_vllm_033_groups_them():
    # the per_layer_config transformers derives from global_head_dim, or the one a config.json carries
    derived = kv_groups(_gemma4(global_head_dim=512), (0, 33), block_size=128)
    written = kv_groups(_gemma4(per_layer_config={f"{i:02d}": {"head_dim": 512} for i in range(5, 30, 6)}),
                        (0, 33), block_size=128)
    assert derived == written
    sliding_page, full_page = 128 * 4 * 2 * 256 * 2, 128 * 4 * 2 * 512 * 2
    assert [(g.kind, g.layers, g.page_bytes) for g in derived.groups] == [
        (SLIDING, 9, 9 * sliding_page), (SLIDING, 8, 8 * sliding_page), (SLIDING, 8, 8 * sliding_page),
        (FULL, 5, 5 * full_page)]
    assert derived.row_bytes == 5 * full_page
    with pytest.raises(ModelGeometryUnknown, match="different page sizes"):
        kv_groups(_gemma4(global_head_dim=512), (0, 32), block_size=128)


def test_gemma4_layers_sharing_kv_are_refused():
    with pytest.raises(ModelGeometryUnknown, match="num_kv_shared_layers"):
        kv_groups(_gemma4(num_kv_shared_layers=10), (0, 33))


def test_a_loop_coder_keeps_one_full_and_loop_num_minus_one_window_caches_per_layer():
    config = {"architectures": ["IQuestLoopCoderForCausalLM"], "model_type": "iquest_loopcoder",
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "loop_num": 3, "loop_window_size": 32}
    groups = kv_groups(config, (0, 33), block_size=16)
    assert sorted((g.kind, g.layers, g.window) for g in groups.groups) == [
        (FULL, 4, None), (SLIDING, 4, 32), (SLIDING, 4, 32)]
    with pytest.raises(ModelGeometryUnknown, match="sliding first loop"):  # its first loop's window is not modelled
        kv_groups({**config, "sliding_window": 4096}, (0, 33))


def test_cohere2_keeps_three_sliding_layers_to_one_full_with_vllms_window_plus_one():
    groups = kv_groups(catalog_config("CohereLabs/c4ai-command-a-03-2025"), (0, 33), 8, 64)
    assert [(g.kind, g.layers, g.window) for g in groups.groups] == [(SLIDING, 16, 4097)] * 3 + [(FULL, 16, None)]


def test_deepseek_v32_adds_an_indexer_cache_to_every_mla_layer():
    config = {**catalog_config("deepseek-ai/DeepSeek-V3.1"), "model_type": "deepseek_v32",
              "architectures": ["DeepseekV32ForCausalLM"], "index_head_dim": 128}
    groups = kv_groups(config, (0, 33), 8, 64)
    (group,) = groups.groups
    # one group of 61 latents (576 x 2 B) and 61 indexer keys (128 fp8 B + 4 B of scale) per token
    assert (group.layers, group.page_bytes, group.uniform_type) == (122, 64 * 61 * (576 * 2 + 132), True)
    # Hopper's sparse MLA reads the latent as flat rows: the block stride is a whole number of 1152 B rows
    assert groups.row_bytes == -(-group.page_bytes // 1152) * 1152 > group.page_bytes


def test_falcon_h1_keeps_attention_and_mamba_in_every_layer():
    config = {"architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 512,
              "mamba_n_heads": 16, "mamba_d_head": 32, "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_d_conv": 4}
    kinds = [g.kind for g in kv_groups(config, (0, 33), 1, 64).groups]
    assert kinds.count(FULL) == 1 and kinds.count(MAMBA) == 1


def _ling3(**fields) -> dict:
    return {"architectures": ["BailingMoeV3ForCausalLM"], "model_type": "bailing_hybrid", "num_hidden_layers": 10,
            "num_attention_heads": 16, "head_dim": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
            "layer_group_size": 5, "short_conv_kernel_size": 4, **fields}


def test_an_mla_hybrids_block_is_a_multiple_of_128_from_0_32():
    # bailing_moe_v3.py: layers 4 and 9 MLA, the rest Kimi delta attention, whose state (conv 3 x 3 x 16 x 128 in
    # bf16, recurrent 16 x 128 x 128 in float32) a 1152 B/token MLA page holds from 928 tokens
    state = 3 * 3 * 16 * 128 * 2 + 16 * 128 * 128 * 4
    assert [(g.kind, g.layers) for g in kv_groups(_ling3(), (0, 33), block_size=16).groups] == \
        [("mamba", 2)] * 4 + [("mla", 2)]
    for release, block in [((0, 33), 1024), ((0, 32), 1024), ((0, 26), 16 * -(-state // (16 * 1152)))]:
        assert kv_groups(_ling3(), release, block_size=16).block_size == block


def test_kimi_delta_attention_keeps_its_recurrent_state_in_float32():
    # kda_state_dtype is called without the SSM dtype: a user's bfloat16 state changes nothing
    assert kv_groups(_ling3(mamba_ssm_dtype="bfloat16"), (0, 33), block_size=16) == \
        kv_groups(_ling3(), (0, 33), block_size=16)
