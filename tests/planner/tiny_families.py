"""Tiny config.json files of every model family Spillway sizes: each family's layer kinds, windows and
recurrent state in a few small layers, for vLLM's own offloading configuration to size (dummy weights).

The Mamba chunks equal the CPU engine's 128-token block, so vLLM 0.26's chunk-aligned hybrid blocks (mamba_cache_mode
"all") and 0.32's "align" blocks agree on the specs the 0.32 engine records; 0.26's own alignment is checked against
the H200 measurement (test_footprint_measured.py)."""
from __future__ import annotations

_BASE = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 2048, "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0}


def _cfg(architecture: str, model_type: str, layers: int, **fields) -> dict:
    return {"architectures": [architecture], "model_type": model_type, **_BASE, "num_hidden_layers": layers, **fields}


FAMILIES: dict[str, dict] = {
    "llama": _cfg("LlamaForCausalLM", "llama", 2),
    "qwen3_moe": _cfg("Qwen3MoeForCausalLM", "qwen3_moe", 2, head_dim=64, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[]),
    "mistral_sliding": _cfg("MistralForCausalLM", "mistral", 2, sliding_window=256),
    "gpt_oss": _cfg("GptOssForCausalLM", "gpt_oss", 4, head_dim=32, sliding_window=128,
                    layer_types=["sliding_attention", "full_attention"] * 2, num_local_experts=4,
                    num_experts_per_tok=2, experts_per_token=2, intermediate_size=128, rope_theta=150000.0,
                    rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                  "original_max_position_embeddings": 4096, "truncate": False},
                    initial_context_length=4096, swiglu_limit=7.0),
    "gemma2": _cfg("Gemma2ForCausalLM", "gemma2", 4, head_dim=32, sliding_window=256, query_pre_attn_scalar=32,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh"),
    "gemma3": _cfg("Gemma3ForCausalLM", "gemma3_text", 12, head_dim=32, sliding_window=512,
                   layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2, query_pre_attn_scalar=32,
                   rope_local_base_freq=10000.0, rope_theta=1000000.0),
    "llama4": _cfg("Llama4ForCausalLM", "llama4_text", 4, head_dim=32, attention_chunk_size=256,
                   no_rope_layers=[1, 1, 1, 0], intermediate_size_mlp=256, interleave_moe_layer_step=1,
                   num_local_experts=2, num_experts_per_tok=1, use_qk_norm=True, rope_theta=500000.0),
    "qwen3_next": _cfg("Qwen3NextForCausalLM", "qwen3_next", 4, head_dim=64, full_attention_interval=4,
                       layer_types=["linear_attention"] * 3 + ["full_attention"], linear_conv_kernel_dim=4,
                       linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=4,
                       linear_num_value_heads=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                       shared_expert_intermediate_size=64, decoder_sparse_step=1, partial_rotary_factor=0.25,
                       mlp_only_layers=[]),
    "granite4": _cfg("GraniteMoeHybridForCausalLM", "granitemoehybrid", 4,
                     layer_types=["mamba"] * 3 + ["attention"], mamba_d_conv=4, mamba_d_state=16, mamba_expand=2,
                     mamba_n_groups=1, mamba_n_heads=8, mamba_d_head=32, mamba_chunk_size=128, mamba_conv_bias=True,
                     mamba_proj_bias=False, num_local_experts=0, num_experts_per_tok=0, shared_intermediate_size=256,
                     position_embedding_type="nope", attention_multiplier=1.0, embedding_multiplier=1.0,
                     residual_multiplier=1.0, logits_scaling=1.0),
    "nemotron_h": _cfg("NemotronHForCausalLM", "nemotron_h", 4, hybrid_override_pattern="M-M*", head_dim=32,
                       mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=64, n_groups=2, conv_kernel=4, expand=2,
                       chunk_size=128, use_conv_bias=True, use_bias=False, mamba_hidden_act="silu",
                       mlp_hidden_act="relu2", layer_norm_epsilon=1e-5, residual_in_fp32=False),
    "deepseek_v3": _cfg("DeepseekV3ForCausalLM", "deepseek_v3", 2, num_key_value_heads=4, kv_lora_rank=64,
                        q_lora_rank=96, qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32,
                        moe_intermediate_size=64, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                        first_k_dense_replace=1, moe_layer_freq=1, n_group=1, topk_group=1,
                        routed_scaling_factor=1.0, norm_topk_prob=True, scoring_func="sigmoid",
                        topk_method="noaux_tc"),
}
