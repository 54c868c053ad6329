"""DeepSeek-V4's compressed sparse attention, as vLLM 0.33 and 0.34 cache it (vllm/models/deepseek_v4).

Every decoder layer keeps a sliding window of its latent (DeepseekV4SWACache); a layer whose layer_types entry has a
compress rate also keeps the compressed latent, one state per `ratio` tokens (DeepseekV4Attention.get_kv_cache_spec),
and its compressor's running state (CompressorStateCache); a ratio-4 layer (compressed sparse attention) also keeps
its indexer's keys and the indexer compressor's state (DeepseekV4Indexer). The layout is the one vLLM's FlashMLA
backend keeps, Hopper's default and the one its CPU build keeps too (models/deepseek_v4/nvidia/model.py
_select_dsv4_attn_cls; use_fp8_ds_mla_layout): fp8_ds_mla, UE8M0 block-scaled rows packed as uint8, every page padded
to whole 576-byte rows (kv_cache_interface.py _apply_alignment_padding). This module reads the config's part of it
and states vLLM's own refusals; core/groups.py builds the caches from these constants.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidSpec, ModelGeometryUnknown

MODEL_TYPE = "deepseek_v4"
# attention.py: "448B NoPE + 128B RoPE + 8B fp8 scale = 584B per token" of the 512-wide latent with 64 RoPE dims
# (the SWA backend takes head size 512 only: sparse_swa.py DeepseekSparseSWABackend.get_supported_head_sizes)
LATENT_ROW_BYTES = 584
LATENT_HEAD_DIM, ROPE_HEAD_DIM = 512, 64
PAGE_ALIGNMENT = 576  # alignment=576 on every spec under the fp8_ds_mla layout
SWA_BLOCK = 64  # DeepseekV4SWACache's block_size default, whatever --block-size is
# DeepseekV4SparseMLABackend and DeepseekV4IndexerBackend: get_supported_kernel_block_sizes() == [256]; the compressed
# latent and the indexer keys follow --block-size, which must be a multiple of it (v1/worker/utils.py
# select_common_block_size), and their block strides keep whole 256-token kernel pages (customize_attention_spec:
# MultipleOf(256))
KERNEL_BLOCK = 256
# CompressorStateCache: the state shares its physical pages with the KV blocks, so its block is fixed by the ratio
STATE_BLOCK = {4: 4, 128: 8}
STATE_DTYPE_BYTES = 4  # float32 (CompressorStateCache asserts it)
INDEXED_RATIO = 4  # only a ratio-4 layer runs the sparse indexer
INDEX_QUANT_BLOCK = 128  # the indexer's fp8 keys: one 4-byte scale per 128 elements, as DeepSeek-V3.2's
RATIOS = (1, *STATE_BLOCK)  # 1: a sliding window only (compress_rates names no rate for the layer type)


@dataclass(frozen=True)
class CompressedAttention:
    """The config's compressed-attention facts: each decoder layer's compress ratio and the indexer's head size."""

    ratios: tuple[int, ...]
    index_head_dim: int

    @property
    def index_key_bytes(self) -> int:
        """One indexer key: fp8 elements and their scales, uint8 (attention.py DeepseekV4Indexer k_cache_head_dim)."""
        return self.index_head_dim + self.index_head_dim // INDEX_QUANT_BLOCK * 4


def read_ratios(config: Mapping[str, Any], num_layers: int, name: str) -> tuple[int, ...]:
    """Each layer's ratio as DeepseekV4Attention reads it: max(1, compress_rates.get(layer_types[i], 0)), where vLLM
    builds the layer as modelled here."""
    types, rates = config.get("layer_types"), config.get("compress_rates")
    if not isinstance(types, list) or len(types) < num_layers or not isinstance(rates, Mapping):
        raise ModelGeometryUnknown(f"{name}: DeepSeek-V4 needs layer_types for each of its {num_layers} layers and "
                                   "compress_rates")
    ratios = tuple(max(1, rates.get(t, 0) or 0) if isinstance(t, str) else 0 for t in types[:num_layers])
    odd = sorted({r for r in ratios if r not in RATIOS})
    if odd:
        # compressor.py CompressorStateCache: assert compress_ratio in [4, 128]
        raise ModelGeometryUnknown(f"{name}: vLLM refuses it: DeepSeek-V4's compressor takes ratios 4 and 128, "
                                   f"got {odd}")
    if (config.get("head_dim"), config.get("qk_rope_head_dim")) != (LATENT_HEAD_DIM, ROPE_HEAD_DIM):
        raise ModelGeometryUnknown(f"{name}: DeepSeek-V4's packed {LATENT_ROW_BYTES}-byte rows are written for a "
                                   f"{LATENT_HEAD_DIM}-wide latent with {ROPE_HEAD_DIM} RoPE dims; head_dim "
                                   f"{config.get('head_dim')!r}, qk_rope_head_dim {config.get('qk_rope_head_dim')!r} "
                                   "is not modelled")
    return ratios


def check_serving(kv_cache_dtype: str, block_size: int, name: str) -> None:
    """vLLM's own refusals of the settings: a KV cache dtype the fp8_ds_mla layout cannot keep, a block its sparse
    kernels cannot tile."""
    if kv_cache_dtype != "auto" and not kv_cache_dtype.startswith("fp8"):
        # attention.py _resolve_dsv4_kv_cache_dtype
        raise InvalidSpec(f"{name}: vLLM refuses it: DeepseekV4 fp8_ds_mla layout only supports fp8 kv-cache, got "
                          f"{kv_cache_dtype}. Please set `--kv-cache-dtype fp8` (vllm/models/deepseek_v4/attention.py)")
    if block_size % KERNEL_BLOCK:
        raise InvalidSpec(f"{name}: vLLM refuses it: DeepSeek-V4's sparse MLA and indexer backends take "
                          f"{KERNEL_BLOCK}-token kernel blocks only, so --block-size {block_size} has no common block "
                          f"size (vllm/v1/worker/utils.py select_common_block_size); ask for a multiple of "
                          f"{KERNEL_BLOCK}")


V41_MODEL_TYPE = "deepseek_v41"
# vLLM's own error for DeepseekV41Config's defaults: the class copies the checkpoint's text_config and fills nothing, and
# both platforms' DeepseekV41ForCausalLM (deepseek_v41/nvidia/vl_model.py, amd/vl_model.py) build the vision aligner,
# which reads hidden_size, before the language model and any kernel of it
V41_DEFAULTS_REFUSAL = ("AttributeError: 'DeepseekV41Config' object has no attribute 'hidden_size' "
                        "(vllm/models/deepseek_v4/common/vision.py DeepseekV4Aligner, from "
                        "vllm/models/deepseek_v41/nvidia/vl_model.py DeepseekV41ForCausalLM.__init__)")


def refuse_v41_defaults(text: Mapping[str, Any], name: str) -> None:
    """DeepSeek-V4.1 (vllm/models/deepseek_v41): vLLM's own refusal of a config without its text fields. With them,
    its caches follow from a per-layer topology the planner does not model yet (model_facts.UNMODELLED)."""
    if text.get("hidden_size") is None:
        raise ModelGeometryUnknown(f"{name}: vLLM refuses it: {V41_DEFAULTS_REFUSAL}")


V41_UNMODELLED = ("DeepSeek-V4.1's per-layer compressed sparse attention (compress_ratios 0, 1, 2; compressed latents, "
                  "indexer keys and compressor rings on kv_source_layer_ids and index_source_layer_ids only)")
