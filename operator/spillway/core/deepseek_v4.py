"""DeepSeek-V4's compressed sparse attention, as vLLM 0.33 and 0.34 cache it (vllm/models/deepseek_v4).

Every decoder layer keeps a sliding window of its latent (DeepseekV4SWACache); a layer whose layer_types entry has a
compress rate also keeps the compressed latent, one state per `ratio` tokens (DeepseekV4Attention.get_kv_cache_spec),
and its compressor's running state (CompressorStateCache); a ratio-4 layer (compressed sparse attention) also keeps
its indexer's keys and the indexer compressor's state (DeepseekV4Indexer). The layout is the one vLLM's FlashMLA
backend keeps, Hopper's default and the one its CPU build keeps too (models/deepseek_v4/nvidia/model.py
_select_dsv4_attn_cls; use_fp8_ds_mla_layout): fp8_ds_mla, UE8M0 block-scaled rows packed as uint8, every page padded
to whole 576-byte rows (kv_cache_interface.py _apply_alignment_padding). This module reads the config's part of it
and states vLLM's own refusals; core/groups.py builds the caches from these constants.

DeepSeek-V4.1 (vllm/models/deepseek_v41) keeps the same rows by kv-sharing groups: every layer a window in 32-token
blocks; a kv source (compress ratio 1 or 2) the compressed latent and the indexer's keys at --block-size, and at ratio
2 its compressor's ring (CircularBufferSpec); the layers after a source read its caches. On 0.34 the window is
bounded replay, not offloaded.
"""
from __future__ import annotations

import math
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
    # DeepSeek-V4.1 (None for V4): whether each layer is a kv source, the one layer of its kv-sharing group that keeps
    # the compressed latent, the indexer's keys and the compressor (the others read the source's)
    kv_sources: tuple[bool, ...] | None = None

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


def check_serving(kv_cache_dtype: str, block_size: int, name: str, compressed: CompressedAttention | None = None) -> None:
    """vLLM's own refusals of the settings: a KV cache dtype the fp8_ds_mla layout cannot keep, a block its sparse
    kernels cannot tile (DeepSeek-V4's; DeepSeek-V4.1's where `compressed` is its topology)."""
    if compressed is not None and compressed.kv_sources is not None:
        _check_v41_serving(kv_cache_dtype, block_size, name)
        return
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
    its caches follow from its per-layer topology (read_v41_topology)."""
    if text.get("hidden_size") is None:
        raise ModelGeometryUnknown(f"{name}: vLLM refuses it: {V41_DEFAULTS_REFUSAL}")


# DeepSeek-V4.1 (vllm/models/deepseek_v41, 0.33 and 0.34 alike) on Hopper: DeepseekV4FlashMLAAttention
# (nvidia/model.py _select_dsv4_attn_cls: FlashMLA sparse below SM100) in the fp8_ds_mla layout of V4's 584-byte rows
# (attention.py: swa_bytes_per_token 584 and kv_page_alignment 576 without SM100's MXFP8 record)
V41_RATIOS = (0, 1, 2)  # attention.py: 0 a sliding window only, 1 a full-length compressed cache, 2 ratio-2
V41_SWA_BLOCK = 32  # attention.py: DeepseekV4SWACache(block_size=32), whatever --block-size is
# The compressed latent's and the indexer keys' kernel block on Hopper (deepseek_v41/sparse_mla.py
# get_supported_kernel_block_sizes: 64 on the SM90 family; v1/attention/backends/mla/indexer.py: 64 on CUDA): their
# block is --block-size, a multiple of it (select_common_block_size), their strides whole 64-token kernel pages
V41_KERNEL_BLOCK = 64
RING_RATIO = 2  # compressor.py DeepseekCompressor: only a gated ratio-2 compressor keeps a state (CompressorStateCache)
# CompressorStateCache: a CircularBufferSpec of [kv, score] rows (state_dim 2 x head_dim, float32), its block the
# drafts + bonus + previous row as a power of two >= 8: 8 without speculative decoding, which no plan renders
RING_BLOCK = 8
# 0.34's CacheConfig.swa_bounded_replay (default on; CUDA keeps it with prefix caching, which a plan turns on): the
# window's SlidingWindowMLASpec is bounded_replay, so not prefix_cacheable, and vLLM offloads only the compressed
# group; 0.33's window is not bounded (its spec's default) and is offloaded
BOUNDED_REPLAY_SINCE = (0, 34)


def read_v41_topology(text: Mapping[str, Any], num_layers: int, name: str) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """Each decoder layer's compress ratio and whether it is a kv source, as DeepseekV4Attention (deepseek_v41/
    attention.py) reads them, with vLLM's own refusals; a topology whose caches the planner has not verified against
    vLLM's (index sources other than the kv sources, candidate blocks) is refused as not modelled."""
    given = text.get("compress_ratios")
    given = given if isinstance(given, list) else []
    # compress_ratios[layer_id] where the list has it, else 0 (a pure sliding window)
    ratios = tuple(int(given[i]) if i < len(given) else 0 for i in range(num_layers))
    odd = next((i for i, r in enumerate(ratios) if r not in V41_RATIOS), None)
    if odd is not None:
        raise ModelGeometryUnknown(f"{name}: vLLM refuses it: DeepSeek V4.1 layer {odd} has compress_ratio="
                                   f"{ratios[odd]}; only 0 (sliding window), 1 and 2 are supported. "
                                   "(vllm/models/deepseek_v41/attention.py)")
    kv = tuple(text.get("kv_source_layer_ids") or ())
    index = tuple(text.get("index_source_layer_ids") or ())
    compressed = [i for i, r in enumerate(ratios) if r]
    if compressed and (not kv or not index):
        raise ModelGeometryUnknown(f"{name}: vLLM refuses it: DeepSeek V4.1 requires kv_source_layer_ids / "
                                   "index_source_layer_ids in the config for compressed layers (layer "
                                   f"{compressed[0]} has compress_ratio={ratios[compressed[0]]}). "
                                   "(vllm/models/deepseek_v41/attention.py)")
    orphan = next((i for i in compressed if not any(s <= i for s in kv) or not any(s <= i for s in index)), None)
    if orphan is not None:
        # max(s for s in kv_source_layers if s <= layer_id) of no source
        raise ModelGeometryUnknown(f"{name}: vLLM refuses it: compressed layer {orphan} has no kv or index source "
                                   "at or below it: ValueError: max() arg is an empty sequence "
                                   "(vllm/models/deepseek_v41/attention.py DeepseekV4Attention.__init__)")
    sources = tuple(i in kv for i in range(num_layers))
    plain = next((i for i in range(num_layers) if sources[i] and not ratios[i]), None)
    if plain is not None:
        # a kv source builds its compressor, which takes ratios 1 and 2 only
        raise ModelGeometryUnknown(f"{name}: vLLM refuses it: kv source layer {plain} has compress_ratio 0: "
                                   "NotImplementedError: DeepSeek V4.1 compressor supports compress_ratio 1 "
                                   "(full-length compressed cache) and 2; got 0 (vllm/models/deepseek_v41/compressor.py)")
    if {i for i in index if i < num_layers} != {i for i in kv if i < num_layers}:
        raise ModelGeometryUnknown(f"{name}: DeepSeek-V4.1 index sources other than its kv sources (an indexer "
                                   "sharing another layer's keys, a compressed cache without keys) are not modelled")
    candidate = text.get("candidate_source_layer_id")
    if isinstance(candidate, int) and candidate >= 0:  # attention.py's default: -1, none
        raise ModelGeometryUnknown(f"{name}: DeepSeek-V4.1's candidate blocks (candidate_source_layer_id "
                                   f"{candidate}) are not modelled")
    if (text.get("head_dim"), text.get("qk_rope_head_dim")) != (LATENT_HEAD_DIM, ROPE_HEAD_DIM):
        # compressor.py: assert self.head_dim == 512 and self.rope_head_dim == 64
        raise ModelGeometryUnknown(f"{name}: vLLM refuses it: DeepSeek-V4.1's compressor asserts head_dim "
                                   f"{LATENT_HEAD_DIM} and qk_rope_head_dim {ROPE_HEAD_DIM}, got "
                                   f"{text.get('head_dim')!r} and {text.get('qk_rope_head_dim')!r}")
    return ratios, sources


def _check_v41_serving(kv_cache_dtype: str, block_size: int, name: str) -> None:
    if kv_cache_dtype not in ("auto", "fp8", "fp8_ds_mla"):
        # attention.py _resolve_dsv4_kv_cache_dtype, on the FlashMLA layout Hopper selects
        raise InvalidSpec(f"{name}: vLLM refuses it: DeepseekV4 packed KV layouts only support fp8 kv-cache, got "
                          f"{kv_cache_dtype}. Please set `--kv-cache-dtype fp8` or select a backend that supports "
                          "bfloat16 KV cache. (vllm/models/deepseek_v41/attention.py)")
    if block_size % V41_KERNEL_BLOCK:
        raise InvalidSpec(f"{name}: vLLM refuses it: DeepSeek-V4.1's sparse MLA and indexer backends take "
                          f"{V41_KERNEL_BLOCK}-token kernel blocks only on Hopper, so --block-size {block_size} has no "
                          "common block size (vllm/v1/worker/utils.py select_common_block_size); ask for a multiple "
                          f"of {V41_KERNEL_BLOCK}")


# The window cache's backend (v1/attention/backends/mla/sparse_swa.py DeepseekSparseSWABackend): MultipleOf(32)
SWA_KERNEL_BLOCK = 32


def own_block_size(compressed: CompressedAttention, default: int) -> int:
    """The block vLLM picks itself where no --block-size is given (platforms/interface.py
    update_block_size_for_backend, _preferred_block_size_for_backends; 0.33 and 0.34 on CUDA): `default` where every
    attention backend takes it, else the smallest lcm of one kernel block of each. DeepSeek-V4's sparse MLA and
    indexer backends take 256, its window's multiples of 32 and its compressor's any block: 256. DeepSeek-V4.1's on
    Hopper take 64, 64, multiples of 32 and any: a default of 64 stands."""
    kernel = V41_KERNEL_BLOCK if compressed.kv_sources is not None else KERNEL_BLOCK
    if default % kernel == 0 and default % SWA_KERNEL_BLOCK == 0:
        return default
    return math.lcm(kernel, SWA_KERNEL_BLOCK)
