"""The groups model's rules that the ground-truth families do not reach on their own."""
from __future__ import annotations

import pytest
from spillway.adapters.model_config import catalog_config
from spillway.core.errors import ModelGeometryUnknown
from spillway.core.geometry import geometry_from_config
from spillway.core.groups import FULL, SLIDING, LayerCache, group_layers, kv_groups


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


@pytest.mark.parametrize("model_type", ["deepseek_v32", "jamba", "minimax_m1"])
def test_caches_spillway_does_not_model_are_refused_by_name(model_type):
    config = {"architectures": ["X"], "model_type": model_type, "num_hidden_layers": 4, "num_attention_heads": 4}
    with pytest.raises(ModelGeometryUnknown, match=f"{model_type}.*does not model"):
        geometry_from_config(config)
