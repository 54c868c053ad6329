"""Model geometry: the source document's block-size table and vLLM's sizing rules."""
from __future__ import annotations

import json

import pytest
from spillway.adapters.model_config import catalog_ids, geometry_of, load_config_file, resolve_geometry
from spillway.core.errors import InvalidSpec, ModelGeometryUnknown
from spillway.core.geometry import geometry_from_config, kv_layout
from spillway.core.model_source import ModelSource

KiB, MiB = 1024, 1024 * 1024

# The source document's table (16-token blocks unless stated): old block = one layer's K (or V) page,
# new block = all layers, K and V, one tensor-parallel rank. Its sizes are rounded to 2-3 digits.
# Llama-3.1-70B's 8 KB implies tensor parallel size 4 (8 KV heads / 4 ranks x 128 x 2 bytes x 16 tokens).
SEED_TABLE = [
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", 2, 16, 16 * KiB, 2 * MiB),
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", 1, 64, 72 * KiB, 1.9 * MiB),
    ("meta-llama/Llama-3.1-8B-Instruct", 1, 16, 32 * KiB, 2 * MiB),
    ("meta-llama/Llama-3.2-1B-Instruct", 1, 16, 16 * KiB, 0.5 * MiB),
    ("meta-llama/Llama-3.1-70B-Instruct", 4, 16, 8 * KiB, 1.25 * MiB),
    ("mistralai/Mistral-7B-Instruct-v0.2", 1, 16, 32 * KiB, 2 * MiB),
    ("mistralai/Mistral-Small-24B-Instruct-2501", 1, 16, 32 * KiB, 2.5 * MiB),
    ("Qwen/Qwen2.5-3B-Instruct", 1, 16, 8 * KiB, 0.56 * MiB),
    ("Qwen/Qwen3-0.6B", 1, 16, 32 * KiB, 1.75 * MiB),
    ("Qwen/Qwen2.5-7B-Instruct", 1, 16, 16 * KiB, 0.87 * MiB),
    ("Qwen/Qwen3-4B-Instruct-2507", 1, 16, 32 * KiB, 2.25 * MiB),
    ("Qwen/Qwen2.5-1.5B-Instruct", 1, 16, 8 * KiB, 0.44 * MiB),
    ("Qwen/Qwen3-1.7B", 1, 16, 32 * KiB, 1.75 * MiB),
    ("Qwen/Qwen3-32B", 2, 16, 16 * KiB, 2 * MiB),
    # Not reproduced: the table's Qwen/Qwen3-8B row (28 KB -> 1.97 MB) contradicts the model's public
    # config (36 layers, 8 KV heads, head_dim 128 -> 32 KiB -> 2.25 MiB, like Qwen3-4B); see the test below.
]


@pytest.mark.parametrize("model,tp,block_size,old,new", SEED_TABLE, ids=[row[0] for row in SEED_TABLE])
def test_seed_block_size_table(model, tp, block_size, old, new):
    layout = kv_layout(resolve_geometry(model), tp, block_size)
    assert layout.layer_page_bytes == old
    assert layout.block_bytes == pytest.approx(new, rel=0.012)  # the table prints 2-3 significant digits


def test_qwen3_8b_follows_its_public_config():
    layout = kv_layout(resolve_geometry("Qwen/Qwen3-8B"), block_size=16)
    assert (layout.layer_page_bytes, layout.block_bytes) == (32 * KiB, int(2.25 * MiB))


def test_head_dim_field_wins_over_hidden_by_heads():
    # Qwen3-0.6B: hidden 1024 / 16 heads = 64, but head_dim is 128.
    geometry = resolve_geometry("Qwen/Qwen3-0.6B")
    assert geometry.head_dim == 128
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "hidden_size": 256}
    assert geometry_from_config(cfg).head_dim == 64


def test_tensor_parallel_splits_heads_but_keeps_at_least_one_per_rank():
    geometry = resolve_geometry("meta-llama/Llama-3.1-70B-Instruct")  # 8 KV heads
    assert kv_layout(geometry, 8).kv_heads_per_rank == 1
    assert not kv_layout(geometry, 8).replicated
    qwen = resolve_geometry("Qwen/Qwen2.5-3B-Instruct")  # 2 KV heads, 16 attention heads
    layout = kv_layout(qwen, 4)
    assert layout.kv_heads_per_rank == 1 and layout.replicated
    # every rank holds its own replica of the head: the whole model's bytes count each copy
    assert layout.bytes_per_token == layout.block_bytes * 4 // layout.block_size


def test_mla_latent_is_replicated_on_every_rank():
    geometry = resolve_geometry("deepseek-ai/DeepSeek-V3")
    one, eight = kv_layout(geometry, 1, 16), kv_layout(geometry, 8, 16)
    assert one.block_bytes == eight.block_bytes == 16 * 576 * 2 * 61  # no separate K and V
    assert eight.bytes_per_token == 8 * one.bytes_per_token


@pytest.mark.parametrize("dtype,factor", [("auto", 1), ("bfloat16", 1), ("float16", 1), ("fp8", 0.5)])
def test_kv_cache_dtype(dtype, factor):
    geometry = resolve_geometry("meta-llama/Llama-3.1-8B-Instruct")
    assert kv_layout(geometry, block_size=16, kv_cache_dtype=dtype).block_bytes == 2 * MiB * factor


def test_block_size_scales_block_bytes():
    geometry = resolve_geometry("meta-llama/Llama-3.1-8B-Instruct")
    assert kv_layout(geometry, block_size=32).block_bytes == 4 * MiB


@pytest.mark.parametrize("cfg,message", [
    ({"architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "num_hidden_layers": 2,
      "num_attention_heads": 4}, "Zamba2Config .*refuses"),
    ({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 0, "hidden_size": 64}, "KV heads must be a positive integer, got 0"),
    ({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": -8}, "head_dim must be a positive integer"),
    ({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 3,
      "hidden_size": 64}, "not a multiple of 3 heads"),
    ({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "num_hidden_layers": 4,
      "num_attention_heads": 4, "head_dim": 32, "sliding_window": 512,
      "layer_types": ["sliding_attention", "full_attention"]}, r"\(4\) must be equal to the number of `layer_types` \(2\)"),
    ({"architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2", "num_hidden_layers": 4,
      "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32, "sliding_window": 0,
      "sliding_window_pattern": 4}, "sliding_window"),
    ({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "num_hidden_layers": 2,
      "num_attention_heads": 4, "head_dim": 32, "layer_types": ["sliding_attention", "cross_attention"],
      "sliding_window": 512}, "layer_types` entries must be in"),
    ({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "num_hidden_layers": 2,
      "num_attention_heads": 4, "hidden_size": 64, "layer_types": ["full_attention", "linear_attention"],
      "linear_num_key_heads": 0}, "linear_num_key_heads"),
    ({"architectures": ["SomethingNewForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 4,
      "hidden_size": 64}, "neither in vLLM 0.33's registry"),
    ({"num_hidden_layers": 2}, "architectures"),
    ({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 0, "num_attention_heads": 4}, "num_hidden_layers"),
    # impossible geometry: no heads, a negative window, a latent of no width, per-layer lists too short
    ({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 0, "hidden_size": 64},
     "num_attention_heads"),
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 64, "sliding_window": -4096},
     "sliding_window"),
    ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 2,
      "num_attention_heads": 4, "kv_lora_rank": 0, "qk_rope_head_dim": 64}, "kv_lora_rank"),
    ({"architectures": ["SarvamMLAForCausalLM"], "model_type": "sarvam", "num_hidden_layers": 2,
      "num_attention_heads": 4, "hidden_size": 64}, "kv_lora_rank"),
    ({"architectures": ["Plamo3ForCausalLM"], "model_type": "plamo3", "num_hidden_layers": 4,
      "num_attention_heads": 4, "hidden_size": 64, "interleaved_sliding_window": [2048, None]},
     "interleaved_sliding_window needs an entry for each of 4 layers"),
    ({"architectures": ["Plamo3ForCausalLM"], "model_type": "plamo3", "num_hidden_layers": 2,
      "num_attention_heads": 4, "hidden_size": 64, "interleaved_sliding_window": [0, None]}, "positive integer"),
    ({"architectures": ["MiMoV2ForCausalLM"], "model_type": "mimo_v2", "num_hidden_layers": 4,
      "num_attention_heads": 4, "hidden_size": 64, "hybrid_layer_pattern": [0, 1]}, "hybrid_layer_pattern"),
    ({"architectures": ["MiMoV2ForCausalLM"], "model_type": "mimo_v2", "num_hidden_layers": 2,
      "num_attention_heads": 4, "head_dim": 16, "hybrid_layer_pattern": [0, 1], "sliding_window_size": 128,
      "swa_head_dim": 16, "swa_num_key_value_heads": 0}, "swa_num_key_value_heads"),
    ({"architectures": ["HfMoondream"], "model_type": "moondream3", "config": {"text": {"n_kv_heads": 0}}},
     "KV heads must be a positive integer, got 0"),
    ({"architectures": ["BailingMoeV3ForCausalLM"], "model_type": "bailing_hybrid", "num_hidden_layers": 4,
      "num_attention_heads": 4, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 128,
      "short_conv_kernel_size": 4}, "layer_group_size"),
    ({"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "num_hidden_layers": 4,
      "num_attention_heads": 4, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
      "linear_attn_config": {"num_heads": 4, "head_dim": 64}}, "kda_layers"),
    # DeciLM (nemotron_nas.py): each layer's attention from block_configs; vLLM asserts the head ratio per layer
    ({"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron_nas", "num_hidden_layers": 2,
      "num_attention_heads": 4, "hidden_size": 64, "block_configs": [{"attention": {"n_heads_in_group": 2}}]},
     "block_configs must hold an entry for each of 2 layers"),
    ({"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron_nas", "num_hidden_layers": 1,
      "num_attention_heads": 10, "hidden_size": 160, "block_configs": [{"attention": {"n_heads_in_group": 3}}]},
     r"num_heads \(10\) is not divisible by num_kv_heads \(3\)"),
    ({"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron_nas", "num_hidden_layers": 1,
      "num_attention_heads": 4, "hidden_size": 64, "block_configs": [{"attention": {"no_op": True}}]},
     "attention is a no-op"),
])
def test_models_it_cannot_size_get_a_clear_message(cfg, message):
    with pytest.raises(ModelGeometryUnknown, match=message):
        geometry_of(cfg)


def test_disabled_sliding_window_is_full_attention():
    geometry = resolve_geometry("Qwen/Qwen2.5-7B-Instruct")  # sliding_window set, use_sliding_window false
    assert geometry.attention == "standard"


def test_indivisible_tensor_parallelism_is_invalid():
    geometry = resolve_geometry("Qwen/Qwen2.5-7B-Instruct")  # 28 heads, 4 KV heads
    with pytest.raises(InvalidSpec, match="do not split"):
        kv_layout(geometry, 8)


def test_config_file_errors(tmp_path):
    with pytest.raises(ModelGeometryUnknown, match="cannot read"):
        load_config_file(tmp_path / "missing.json")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ModelGeometryUnknown, match="malformed JSON"):
        load_config_file(tmp_path)  # a directory resolves to its config.json


def test_catalog_is_case_insensitive_and_every_entry_sizes():
    assert resolve_geometry("META-LLAMA/llama-3.1-8b-instruct").num_layers == 32
    for model_id in catalog_ids():
        assert kv_layout(resolve_geometry(model_id)).block_bytes > 0
    with pytest.raises(ModelGeometryUnknown, match="not in Spillway's catalog"):
        resolve_geometry("acme/unknown-model")


def test_config_from_file_matches_catalog(tmp_path):
    from spillway.adapters.model_config import catalog_config
    path = tmp_path / "config.json"
    path.write_text(json.dumps(catalog_config("meta-llama/Llama-3.1-8B-Instruct")))
    assert resolve_geometry(ModelSource(config_file=str(path))).num_kv_heads == 8
