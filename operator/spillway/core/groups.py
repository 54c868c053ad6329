"""vLLM's KV-cache groups, and what its CPU offload pool holds of them, per vLLM release.

vLLM gives every decoder layer a KV-cache spec (full attention, sliding window, chunked local
attention, MLA latent, Mamba/linear-attention state), groups layers of equal spec so each group
shares one block table, and the OffloadingConnector stores one CPU chunk row per (chunk of
prefix, group). This module repeats those rules from a model's config facts, purely:

* layers -> groups: vllm/v1/core/kv_cache_utils.py (0.26, 0.32) and kv_cache_planning.py (0.33),
  `_get_kv_cache_groups_uniform_page_size`: buckets of equal spec, a group size of the smallest
  bucket (or the largest, when it is under 1.5x the smallest), each bucket dealt round-robin into
  groups of that size;
* Mamba hybrids: the attention block grows until its page holds one Mamba state, and the state is
  padded to that page (vllm/platforms/interface.py `_align_hybrid_block_size`);
* the chunk row: `build_offloading_config` takes `worker_kv_bytes_per_block` from the GPU cache's
  one backing allocation, whose block holds the largest group's pages (groups alias it);
  `CPUOffloadingSpec` multiplies it by the ranks whose copies the host keeps (one for MLA where
  vLLM keeps a single host copy, vllm#48906) and by blocks_per_chunk, and rounds it up to the
  page size (0.32, 0.33: mmap.PAGESIZE; 0.26: no rounding);
* every OffloadKey (chunk hash, group) takes one whole row (vllm#56871), and a sliding-window,
  chunked-local or Mamba group keeps only the chunks its attention can reach back to
  (`get_sliding_window_size_in_chunks`); the tokens a pool holds are vLLM 0.33's own
  `cpu_kv_cache_size_tokens` (vllm/v1/kv_offload/cpu/common.py): chunks x max_model_len //
  chunks one request of max_model_len tokens stores.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from itertools import chain
from typing import Any

from . import deepseek_v4 as dsv4
from .errors import InvalidSpec, ModelGeometryUnknown
from .model_facts import (
    CHUNKED,
    DTYPE_BYTES,
    FULL,
    INDEXER,
    MAMBA,
    MLA,
    RING,
    SCONV,
    SLIDING,
    STEP5_REGION,
    MambaShape,
    ModelFacts,
    cached_hash,
    read_facts,
)

ATTENTION_KINDS = (FULL, SLIDING, CHUNKED, MLA, INDEXER)

HOST_PAGE_BYTES = 4096  # 0.32/0.33 CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE (x86-64 Linux)
# vllm/model_executor/models/config.py and platforms/interface.py: the smallest kernel block of the
# GPU attention backends (FlashAttention/FlashInfer/Triton accept multiples of 16 tokens).
GPU_KERNEL_BLOCK = 16
GDN_CHECKPOINT_ALIGNMENT = 64  # vllm/v1/attention/backends/gdn_attn.py FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
# Model types whose recurrent layers are vLLM's GatedDeltaNet (qwen_gdn_linear_attn.py): qwen3_next.py, qwen3_5.py,
# olmo_hybrid.py, and vllm/models/qwen4_exp (QwenGatedDeltaNetAttention)
GDN_CHECKPOINTED = ("qwen3_next", "qwen3_5", "qwen4_exp", "olmo_hybrid")
MLA_HYBRID_BLOCK = 128
# Model types whose own vLLM model code arrived in a release (vllm/model_executor/models/zaya.py: 0.34); earlier
# releases serve them through the Transformers backend
NATIVE_SINCE = {"zaya": (0, 34)}
# Kernel pages smaller than a block that a model's attention backend reads (customize_spec's block_stride_alignment
# MultipleOf(n)): every block stride keeps whole n-token pages (vllm/models/step5/nvidia/sparse_attention.py)
KERNEL_PAGE_TOKENS = {"step5": STEP5_REGION}
RING_ROW_BYTES = 1024  # step5/nvidia/csa_tail_ring.py: the ring's rows are 1 KiB, its block stride a multiple
# MLA made sparse by an indexer, whose Hopper backend reads the bf16 latent as flat rows
# (vllm/v1/attention/backends/mla/sparse_utils.py align_blocks_to_rows: block strides in whole rows): DeepSeek-V3.2
# (a deepseek_v3 or deepseek_v32 config with an indexer), GLM-5 and vLLM 0.34's Mistral Large 4 on
# FLASH_ATTN_MLA_SPARSE (platforms/cuda.py: SM90's first sparse backend for a 576-wide latent)
# and Dots3Note's padded latent (Dots3NotePaddedSparseBackend: a FLASH_ATTN_MLA_SPARSE)
ROW_ALIGNED_MLA = frozenset({"deepseek_v3", "deepseek_v32", "glm_moe_dsa", "mistral_large_4", "dots3_note"})


@dataclass(frozen=True)
class LayerCache:
    """One decoder layer's KV cache on one tensor-parallel rank, as its vLLM KVCacheSpec sizes it."""

    kind: str
    token_bytes: int = 0  # attention: bytes per token (K and V, or the MLA latent)
    window: int | None = None  # sliding window / attention chunk, in tokens
    state_bytes: int = 0  # Mamba / linear attention: one sequence's state
    # vLLM's block_stride_alignment: a MultipleOf(n) kernel page of n tokens, or a fixed number of bytes
    stride_tokens: int = 0
    stride_bytes: int = 0
    block_tokens: int = 0  # a block the spec fixes itself (Inkling's conv state, a ring), else the cache's block
    tokens_per_state: int = 1  # > 1: token_bytes are one state's, covering that many tokens (a kpool indexer)
    min_kernel_tokens: int = 0  # the smallest kernel block its backend takes, where the hybrid block must tile it
    page_alignment: int = 0  # the spec's `alignment`: a page padded to whole rows of it (DeepSeek-V4's 576 bytes)

    def page_bytes(self, block_size: int) -> int:
        return self._padded((self.block_tokens or block_size) // self.tokens_per_state * self.token_bytes)

    def stride_alignment(self, block_size: int) -> int:
        """KVCacheSpec.get_block_stride_alignment: the bytes every block stride is a multiple of (the page of one
        kernel block, padded as the spec pads its pages)."""
        if self.stride_bytes:
            return self.stride_bytes
        kernel = math.gcd(self.stride_tokens, block_size) if self.stride_tokens else block_size
        return 1 if kernel == block_size else self._padded(kernel // self.tokens_per_state * self.token_bytes)

    def _padded(self, page: int) -> int:
        # kv_cache_interface.py _apply_alignment_padding: page_size_padded, the page rounded up to the alignment
        return _round_up(page, self.page_alignment) if self.page_alignment else page


@dataclass(frozen=True)
class CacheGroup:
    """One KV-cache group: layers sharing a block table."""

    kind: str
    layers: int
    page_bytes: int  # one layer, one block, one rank (after vLLM's page unification)
    block_size: int  # tokens per block
    window: int | None = None
    # vLLM's UniformTypeKVCacheSpecs: layers of one kind but different pages in one group; page_bytes is then the
    # whole group's (the sum of its layers' pages), as vLLM's spec reports it
    uniform_type: bool = False
    alignment: int = 1  # the lcm of its layers' block stride alignments, in bytes
    # KVCacheSpec.prefix_cacheable: False for a window vLLM replays instead (0.34's bounded-replay SlidingWindowMLASpec,
    # DeepSeek-V4.1's), which it does not offload
    prefix_cacheable: bool = True

    @property
    def block_bytes(self) -> int:
        return self.page_bytes if self.uniform_type else self.layers * self.page_bytes


@dataclass(frozen=True)
class KVGroups:
    """The KV-cache groups of one model on one vLLM release, with the host copies of each row."""

    release: tuple[int, int]
    groups: tuple[CacheGroup, ...]
    copies: int  # rank copies the host keeps per row
    replicated: bool  # every rank holds the same bytes (MLA, or fewer KV heads than ranks)
    __hash__ = cached_hash  # memoized steps hash it on every call, nested in others' keys

    @property
    def block_size(self) -> int:
        return min(g.block_size for g in self.offloaded)

    @property
    def offloaded(self) -> tuple[CacheGroup, ...]:
        """The groups vLLM offloads: its prefix-cacheable ones (a ring, CircularBufferSpec, is not; nor is a
        bounded-replay window)."""
        return tuple(g for g in self.groups if g.kind != RING and g.prefix_cacheable)

    @property
    def row_bytes(self) -> int:
        """worker_kv_bytes_per_block: one block of the GPU cache on one rank (the largest group's), its stride a
        multiple of every layer's alignment (kv_cache_planning.py _get_kv_cache_bytes_per_block, block-outermost)."""
        return _round_up(max(g.block_bytes for g in self.groups), math.lcm(*(g.alignment for g in self.groups)))

    @property
    def prefix_rows(self) -> int:
        """Rows each block of a long prefix takes: one per group that keeps the whole prefix (full attention, MLA).
        A window or Mamba group keeps only its last chunks, so past them it adds no bytes a token; a model of
        windows only (Mistral v0.1) still takes one row a block up to its window."""
        return max(1, sum(1 for g in self.offloaded if self.window_chunks(g) is None))

    def prefix_bytes_per_token(self, tensor_parallel_size: int) -> int:
        """A long prefix's bytes per token, all ranks: a row per block of each group that keeps the whole prefix, each
        at its own block (DeepSeek-V4's latents take a row per 256 tokens beside windows in blocks of 64, 8 and 4),
        or one row a block of the smallest where only windows do (prefix_rows)."""
        keeping = [g for g in self.offloaded if self.window_chunks(g) is None] or \
            [min(self.offloaded, key=lambda g: g.block_size)]
        return int(self.row_bytes * tensor_parallel_size * sum(Fraction(1, g.block_size) for g in keeping))

    @property
    def row_layers(self) -> int:
        """Layers of the group whose block makes the row: the per-layer copies of one row when each layer has its
        own tensor (the plan's 'default' layout)."""
        return max(self.groups, key=lambda g: g.block_bytes).layers

    @property
    def attention_page_bytes(self) -> int:
        """One attention layer's page of one block, one rank (K and V, or the MLA latent), in the largest attention
        group: a Mamba hybrid's is its grown block's. A group of layers of different pages (UniformTypeKVCacheSpecs)
        gives its mean."""
        attention = [g for g in self.groups if g.kind in ATTENTION_KINDS]
        if not attention:  # recurrent layers only: a layer's state page, the unit of a per-layer copy
            return max(g.page_bytes for g in self.groups)
        group = max(attention, key=lambda g: g.block_bytes)
        return group.page_bytes // group.layers if group.uniform_type else group.page_bytes

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1 or self.groups[0].kind not in (FULL, MLA)

    def alignment(self) -> int:
        return 1 if self.release < (0, 32) else HOST_PAGE_BYTES

    def chunk_bytes(self, blocks_per_chunk: int = 1) -> int:
        """One CPU chunk row as CPUOffloadingSpec computes it (kv_bytes_per_chunk, padded)."""
        return _round_up(self.row_bytes * self.copies * blocks_per_chunk, self.alignment())

    def window_chunks(self, group: CacheGroup, blocks_per_chunk: int = 1) -> int | None:
        """Chunks of `group` one request keeps (vLLM's get_sliding_window_size_in_chunks)."""
        chunk_tokens = group.block_size * blocks_per_chunk
        if group.kind == MAMBA:
            return 1
        if group.kind == CHUNKED:
            return _cdiv(group.window, chunk_tokens)
        if group.kind == SLIDING:
            if self.release < (0, 32):
                return _cdiv(group.window, chunk_tokens)
            # 0.32/0.33: max(cdiv(w, c), cdiv(w - 1 + extra_retained_tokens, c)); extra is 0 without EAGLE
            return max(_cdiv(group.window, chunk_tokens), _cdiv(group.window - 1, chunk_tokens))
        return None

    def chunks_per_request(self, tokens: int, blocks_per_chunk: int = 1) -> int:
        total = 0
        for group in self.offloaded:
            chunks = _cdiv(tokens, group.block_size * blocks_per_chunk)
            window = self.window_chunks(group, blocks_per_chunk)
            total += chunks if window is None else min(chunks, window)
        return total

    def tokens_held(self, num_chunks: int, max_model_len: int, blocks_per_chunk: int = 1) -> int:
        """Tokens of prefix `num_chunks` rows hold for requests of max_model_len tokens (vLLM 0.33's
        cpu_kv_cache_size_tokens; the same rule describes 0.26 and 0.32, which do not print it)."""
        return num_chunks * max_model_len // self.chunks_per_request(max_model_len, blocks_per_chunk)

    def describe(self) -> list[str]:
        out = []
        for group in self.groups:
            reach = f", window {group.window} tokens" if group.window else ""
            out.append(f"{group.kind} x{group.layers} layers, {group.block_size}-token blocks of "
                       f"{group.page_bytes} B per layer{reach}")
        return out


# -- config facts -> per-layer caches ---------------------------------------------------------------

def _split(total: int, tp: int, what: str, name: str) -> int:
    if total % tp:
        raise InvalidSpec(f"{name}: {total} {what} do not split over tensor parallel size {tp}")
    return total // tp


def mamba_state_bytes(shape: MambaShape, tp: int, model_dtype_bytes: int, ssm_dtype_bytes: int, name: str) -> int:
    """One layer's recurrent state on one rank (vllm/model_executor/layers/mamba/mamba_utils.py,
    MambaStateShapeCalculator): the conv state in the model's dtype, the temporal state in the SSM dtype."""
    if shape.kind == "cca":  # zaya.py _cca_state_shapes: replicated on every rank, all in the model's dtype
        return (shape.heads * shape.head_dim * shape.conv_kernel + shape.v_heads * shape.head_dim // 2) * \
            model_dtype_bytes
    if shape.kind == "gdn":  # gated_delta_net_state_shape
        conv = _split(shape.k_dim * shape.k_heads * 2 + shape.v_dim * shape.v_heads, tp,
                      "linear-attention channels", name) * (shape.conv_kernel - 1)
        ssm = _split(shape.v_heads, tp, "linear-attention value heads", name) * shape.v_dim * shape.k_dim
    elif shape.kind == "linear":  # linear_attention_state_shape: per head a head_dim x head_dim state, model dtype
        conv, ssm = _split(shape.heads, tp, "linear-attention heads", name) * shape.head_dim * shape.head_dim, 0
    elif shape.kind == "short_conv":  # short_conv_state_shape: a conv state only, in the model's dtype
        conv, ssm = _split(shape.intermediate, tp, "convolution channels", name) * (shape.conv_kernel - 1), 0
    elif shape.kind == "mamba1":  # mamba1_state_shape
        inner = _split(shape.intermediate, tp, "Mamba channels", name)
        conv, ssm = inner * (shape.conv_kernel - 1), inner * shape.state
    else:  # mamba2_state_shape: groups are replicated to follow their heads' shards
        groups = shape.groups + (0 if shape.groups % tp == 0 else tp - shape.groups)
        conv = _split(shape.intermediate + 2 * groups * shape.state, tp, "Mamba channels", name) * (shape.conv_kernel - 1)
        ssm = _split(shape.heads, tp, "Mamba heads", name) * shape.head_dim * shape.state
    return conv * model_dtype_bytes + ssm * ssm_dtype_bytes


def _facts(config: Mapping[str, Any] | ModelFacts, name: str) -> ModelFacts:
    return config if isinstance(config, ModelFacts) else read_facts(config, name)


def layer_caches(config: Mapping[str, Any] | ModelFacts, tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto",
                 name: str = "model") -> list[LayerCache]:
    """Each cache of each decoder layer on one rank, in vLLM's layer order."""
    return list(_layer_caches(_facts(config, name), tensor_parallel_size, kv_cache_dtype))


@functools.lru_cache(maxsize=256)
def _layer_caches(facts: ModelFacts, tp: int, kv_cache_dtype: str) -> tuple[LayerCache, ...]:
    keys, made = _distinct_layers(facts, tp, kv_cache_dtype)
    return tuple(chain.from_iterable(map(made.__getitem__, keys)))


def _layer_runs(facts: ModelFacts, tp: int, kv_cache_dtype: str) -> dict[LayerCache, int]:
    """Each distinct cache with its number of layers, in order of first appearance: what the grouping needs,
    without a per-layer sequence (a cold plan stays within bench/planner/plan.py's 50 us goal)."""
    keys, made = _distinct_layers(facts, tp, kv_cache_dtype)
    runs: dict[LayerCache, int] = {}
    for key, caches in made.items():
        count = keys.count(key)
        for cache in caches:
            runs[cache] = runs.get(cache, 0) + count
    return runs


def _distinct_layers(facts: ModelFacts, tp: int, kv_cache_dtype: str) -> tuple[tuple, dict[Any, tuple[LayerCache, ...]]]:
    """Per layer a key (its kinds, with Gemma 4 its heads), and the caches of each distinct key in order of first
    appearance: layers of one kind keep equal caches, built once, not once per layer."""
    name = facts.name
    cache_dtype = facts.dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    if cache_dtype not in DTYPE_BYTES or cache_dtype == "float32":
        raise InvalidSpec(f"kv cache dtype {kv_cache_dtype!r} unknown (auto, bfloat16, float16, fp8)")
    dtype_bytes = DTYPE_BYTES[cache_dtype]
    if facts.compressed is not None and facts.compressed.kv_sources is not None:
        keys = tuple(zip(facts.compressed.ratios, facts.compressed.kv_sources))
        return keys, {key: _v41_caches(*key, facts) for key in dict.fromkeys(keys)}
    if facts.compressed is not None:
        return facts.compressed.ratios, {r: _compressed_caches(r, facts) for r in dict.fromkeys(facts.compressed.ratios)}
    if facts.mla:
        token = facts.head_dim * dtype_bytes  # one latent (kv_lora_rank + qk_rope_head_dim), on every rank
    else:
        token = _token_bytes(facts.num_kv_heads, facts.head_dim + facts.v_head_dim, tp, dtype_bytes, name)
    state = 0
    if facts.mamba is not None:
        model_bytes = DTYPE_BYTES[facts.dtype]
        state = mamba_state_bytes(facts.mamba, tp, model_bytes, DTYPE_BYTES.get(facts.ssm_dtype or facts.dtype, 4),
                                  name)
    if facts.layer_heads is None:
        return facts.kinds, {kinds: _caches_of(kinds, token, state, facts, tp) for kinds in dict.fromkeys(facts.kinds)}
    # Gemma 4, MiMo-V2: each layer's own KV heads and K and V head sizes
    keys = tuple(zip(facts.kinds, facts.layer_heads))
    return keys, {(kinds, heads): _caches_of(kinds, _token_bytes(heads[0], heads[1] + heads[2], tp, dtype_bytes, name),
                                             state, facts, tp) for kinds, heads in dict.fromkeys(keys)}


def _token_bytes(kv_heads: int, kv_head_dims: int, tp: int, dtype_bytes: int, name: str) -> int:
    """One token's K and V on one rank: KV heads split over the ranks, or replicated when fewer than ranks."""
    if kv_heads % tp and tp % kv_heads:
        raise InvalidSpec(f"{name}: {kv_heads} KV heads neither split over nor replicate across "
                          f"tensor parallel size {tp}")
    return max(1, kv_heads // tp) * kv_head_dims * dtype_bytes


def _caches_of(kinds: tuple[str, ...], token: int, state: int, facts: ModelFacts, tp: int) -> tuple[LayerCache, ...]:
    out = []
    for kind in kinds:
        if kind in (SLIDING, CHUNKED):
            out.append(LayerCache(kind, token, facts.window))
        elif kind == MAMBA:
            out.append(LayerCache(MAMBA, 0, None, state))
        elif kind == INDEXER and facts.indexer_tokens > 1:
            # GLM-5.3-Flash's kpool keys: DeepGEMM's paged-MQA pages of 32 or 64 states (get_paged_mqa_page_sizes)
            # set the smallest kernel block the hybrid block tiles and the block stride (MultipleOf the largest)
            kpool = facts.indexer_tokens
            out.append(LayerCache(INDEXER, facts.indexer_bytes, tokens_per_state=kpool, stride_tokens=64 * kpool,
                                  min_kernel_tokens=32 * kpool))
        elif kind == INDEXER:  # MiniMax-M3, Step5: the indexer keys beside a sparse layer's own KV (in its kinds)
            out.append(LayerCache(INDEXER, facts.indexer_bytes))
        elif kind == RING and facts.indexer_tokens > 1:
            # glm5next Glm5NextTailCache: one index_kpool ring a request of two bf16 rows (K, gate score), replicated
            out.append(LayerCache(RING, facts.ring_bytes, block_tokens=facts.indexer_tokens))
        elif kind == RING:  # Step5's CSA tail ring: the main page's bytes at the main block, in 1 KiB rows
            out.append(LayerCache(RING, token, stride_bytes=RING_ROW_BYTES))
        elif kind == SCONV:  # Inkling's conv state: a SlidingWindowSpec of its kernel, in blocks of its kernel
            heads, head, kernel = facts.sconv
            if heads < tp:  # InklingConvState asserts tp_size <= num_kv_heads
                raise InvalidSpec(f"{facts.name}: vLLM refuses it: sconv SWA cache supports tp_size <= num_kv_heads "
                                  f"({heads}), got {tp}")
            out.append(LayerCache(SLIDING, _split(heads, tp, "conv-state KV heads", facts.name) * head * 2, kernel,
                                  block_tokens=kernel))
        elif kind == MLA and (facts.indexer_tokens > 1 or
                              (facts.indexer_bytes and facts.model_type in ROW_ALIGNED_MLA)):
            # Hopper's sparse MLA backends read the latent as flat rows (align_blocks_to_rows): block strides in rows
            out.append(LayerCache(MLA, token, stride_bytes=token))
        else:
            out.append(LayerCache(kind, token, stride_tokens=KERNEL_PAGE_TOKENS.get(facts.model_type, 0)))
        if kind == MLA and facts.indexer_bytes and INDEXER not in kinds:
            out.append(LayerCache(INDEXER, facts.indexer_bytes))  # uint8 keys: the cache dtype does not apply
    return tuple(out)


def _compressed_caches(ratio: int, facts: ModelFacts) -> tuple[LayerCache, ...]:
    """One DeepSeek-V4 layer's caches (core/deepseek_v4.py) in the order the layer registers them: the indexer's keys
    and its compressor's state first (DeepseekV4Attention builds its indexer before its window), then the window,
    the compressed latent and the latent compressor's state. vLLM buckets layers by first appearance, so the order
    is the order of its groups."""
    row = dsv4.PAGE_ALIGNMENT

    def state(head_dim: int) -> LayerCache:
        # CompressorStateCache: kv and score states of coff x head_dim each (coff 2 where windows overlap, ratio 4),
        # a window of coff x ratio tokens, in blocks of the ratio's own size
        coff = 2 if ratio == dsv4.INDEXED_RATIO else 1
        return LayerCache(SLIDING, 2 * coff * head_dim * dsv4.STATE_DTYPE_BYTES, coff * ratio,
                          block_tokens=dsv4.STATE_BLOCK[ratio], page_alignment=row)

    window = LayerCache(SLIDING, dsv4.LATENT_ROW_BYTES, facts.window, block_tokens=dsv4.SWA_BLOCK, page_alignment=row)
    if ratio == 1:
        return (window,)
    caches = []
    if ratio == dsv4.INDEXED_RATIO:
        caches += [LayerCache(INDEXER, facts.indexer_bytes, tokens_per_state=ratio, stride_tokens=dsv4.KERNEL_BLOCK,
                              page_alignment=row), state(facts.compressed.index_head_dim)]
    latent = LayerCache(MLA, dsv4.LATENT_ROW_BYTES, tokens_per_state=ratio, stride_tokens=dsv4.KERNEL_BLOCK,
                        page_alignment=row)
    return (*caches, window, latent, state(facts.head_dim))


def _v41_caches(ratio: int, kv_source: bool, facts: ModelFacts) -> tuple[LayerCache, ...]:
    """One DeepSeek-V4.1 layer's caches (core/deepseek_v4.py) in the order it registers them: a kv source's compressed
    latent (the attention layer itself, registered before its indexer) and its indexer's keys, one state per `ratio`
    tokens at --block-size, strides in whole 64-token kernel pages; every layer's window in 32-token blocks; a ratio-2
    source's compressor ring (CircularBufferSpec, float32 [kv, score] rows in blocks of 8, pages unpadded)."""
    row = dsv4.PAGE_ALIGNMENT
    window = LayerCache(SLIDING, dsv4.LATENT_ROW_BYTES, facts.window, block_tokens=dsv4.V41_SWA_BLOCK,
                        page_alignment=row)
    if not kv_source:
        return (window,)
    latent = LayerCache(MLA, dsv4.LATENT_ROW_BYTES, tokens_per_state=ratio, stride_tokens=dsv4.V41_KERNEL_BLOCK,
                        page_alignment=row)
    keys = LayerCache(INDEXER, facts.indexer_bytes, tokens_per_state=ratio, stride_tokens=dsv4.V41_KERNEL_BLOCK,
                      page_alignment=row)
    if ratio != dsv4.RING_RATIO:
        return (latent, keys, window)
    ring = LayerCache(RING, 2 * facts.head_dim * dsv4.STATE_DTYPE_BYTES, block_tokens=dsv4.RING_BLOCK)
    return (latent, keys, window, ring)


def clear_group_caches() -> None:
    _layer_caches.cache_clear()
    _kv_groups.cache_clear()


def kv_groups(config: Mapping[str, Any] | ModelFacts, release: tuple[int, int], tensor_parallel_size: int = 1,
              block_size: int = 16, kv_cache_dtype: str = "auto", name: str = "model",
              kernel_block: int = GPU_KERNEL_BLOCK) -> KVGroups:
    """The model's KV-cache groups on `release`, or ModelGeometryUnknown with vLLM's reason."""
    return _kv_groups(_facts(config, name), release, tensor_parallel_size, block_size, kv_cache_dtype, kernel_block)


@functools.lru_cache(maxsize=256)
def _kv_groups(facts: ModelFacts, release: tuple[int, int], tp: int, block_size: int, kv_cache_dtype: str,
               kernel_block: int) -> KVGroups:
    # 0.32, 0.33 (vllm/platforms/interface.py _align_hybrid_block_size): an MLA hybrid's block is a multiple of 128
    mla_align = MLA_HYBRID_BLOCK if facts.mla and release >= (0, 32) else None
    state_chunk = _state_chunk(facts, release)
    if kernel_block == GPU_KERNEL_BLOCK and release >= (0, 33) and facts.model_type.startswith(GDN_CHECKPOINTED):
        # CUDA (Hopper): the gated delta-net layers prefill through FlashInfer, whose checkpoints in align mode fall
        # every 64 tokens, and _align_hybrid_block_size takes the lcm of the kernel alignment with them
        # (qwen_gdn_linear_attn.py _checkpoint_alignment, gdn_attn.py FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64;
        # 0.33 and 0.34): Qwen3-Next at --block-size 16 gets 576-token blocks, not 544. The CPU engine has no
        # FlashInfer and keeps its kernel's alignment.
        state_chunk = math.lcm(state_chunk or 1, GDN_CHECKPOINT_ALIGNMENT)
    if facts.compressed is not None:
        dsv4.check_serving(kv_cache_dtype, block_size, facts.name, facts.compressed)
    runs = _layer_runs(facts, tp, kv_cache_dtype)
    if release < NATIVE_SINCE.get(facts.model_type, release):
        # before its own model code, vLLM serves the architecture through its Transformers backend
        # (registry.py's fallback), which builds the attention layers only: no recurrent state
        runs = {layer: count for layer, count in runs.items() if layer.kind != MAMBA}
    groups = _group_runs(runs, block_size, kernel_block,
                         state_chunk, facts.name, packed=release >= (0, 33), min_align=mla_align)
    refusal = release_refusal(release, groups)
    if refusal:
        raise ModelGeometryUnknown(f"{facts.name}: {refusal}")
    if facts.compressed is not None and facts.compressed.kv_sources is not None and \
            release >= dsv4.BOUNDED_REPLAY_SINCE:
        # DeepSeek-V4.1's window on 0.34: bounded replay, not prefix-cacheable, so not offloaded
        groups = tuple(replace(g, prefix_cacheable=False) if g.kind == SLIDING else g for g in groups)
    mla = facts.mla
    replicated = mla or (tp > 1 and facts.num_kv_heads < tp)
    return KVGroups(release, groups, host_copies(release, mla, tp), replicated)


# -- grouping ---------------------------------------------------------------------------------------

def group_layers(layers: Sequence[LayerCache], block_size: int, kernel_block: int = GPU_KERNEL_BLOCK,
                 state_chunk: int | None = None, name: str = "model", packed: bool = False) -> tuple[CacheGroup, ...]:
    """vLLM's grouping of per-layer caches into KV-cache groups, pages unified. `packed`: vLLM 0.33's grouping of
    attention layers of different pages (_packed_groups)."""
    # Each distinct cache with its layer count, in order of first appearance: layers share their LayerCache
    # objects (_layer_caches), so counting by identity is one C-level pass, and equal caches built apart merge here.
    ids = list(map(id, layers))
    runs: dict[LayerCache, int] = {}
    for key, layer in dict(zip(ids, layers)).items():
        runs[layer] = runs.get(layer, 0) + ids.count(key)
    return _group_runs(runs, block_size, kernel_block, state_chunk, name, packed)


def _group_runs(runs: Mapping[LayerCache, int], block_size: int, kernel_block: int, state_chunk: int | None,
                name: str, packed: bool, min_align: int | None = None) -> tuple[CacheGroup, ...]:
    runs = {layer: count for layer, count in runs.items() if layer.kind}
    if not runs:
        raise ModelGeometryUnknown(f"{name}: the model has no layer with a KV cache")
    if packed and any(layer.kind == MAMBA for layer in runs) and any(layer.kind in (INDEXER, RING) for layer in runs):
        return _packed_hybrid_groups(runs, block_size, kernel_block, state_chunk, name, min_align)
    if packed and any(layer.kind == RING and layer.block_tokens for layer in runs):
        # a ring in blocks of its own beside caches in theirs (DeepSeek-V4.1's compressor rings, 32-token windows and
        # compressed latents at the block asked): one bucket per type, as _get_packed_kv_cache_groups makes them
        return _packed_attention_buckets(runs, block_size, name)
    rings = {layer: count for layer, count in runs.items() if layer.kind == RING}
    if rings:
        # CircularBufferSpec is a type of its own (one UniformTypeKVCacheSpecs group of them), after the others
        others = _group_runs({layer: count for layer, count in runs.items() if layer.kind != RING}, block_size,
                             kernel_block, state_chunk, name, packed, min_align)
        if len({layer.token_bytes for layer in rings}) > 1 or len(rings) > 1:
            raise ModelGeometryUnknown(f"{name}: rings of different pages are not modelled")
        ring, count = next(iter(rings.items()))
        if any(g.block_size != block_size for g in others):
            raise ModelGeometryUnknown(f"{name}: a ring beside blocks grown for recurrent state is not modelled")
        return (*others, CacheGroup(RING, count, count * block_size * ring.token_bytes, block_size, None, True,
                                    ring.stride_alignment(block_size)))
    attention = [layer for layer in runs if layer.kind in ATTENTION_KINDS]
    if not attention:
        # a model of recurrent layers only (Mamba, Mamba2, FalconMamba): no attention page to align to, so the state
        # block is the block asked (vllm/model_executor/models/config.py MambaModelConfig: with prefix caching the
        # mamba_block_size is the cache's block_size) and each layer's page its state; one spec, one group
        states = {layer.state_bytes for layer in runs}
        if len(states) > 1:
            raise ModelGeometryUnknown(f"{name}: recurrent layers of different state sizes {sorted(states)} are not "
                                       "modelled")
        return (CacheGroup(MAMBA, sum(runs.values()), states.pop(), block_size),)
    token_bytes = {layer.token_bytes for layer in attention}
    if len(token_bytes) > 1:
        # 0.33 UniformTypeKVCacheSpecs.from_specs: every layer the same kind of attention (MLA and its indexer
        # cache alike) with different pages: one group of them all
        if len(runs) == len(attention) and len({_type_key(layer) for layer in runs}) == 1:
            first = next(iter(runs))
            page = sum(block_size * layer.token_bytes * count for layer, count in runs.items())
            alignment = math.lcm(*(layer.stride_alignment(block_size) for layer in runs))
            return (CacheGroup(first.kind, sum(runs.values()), page, block_size, first.window, True, alignment),)
        if packed and len(runs) == len(attention):
            if all(layer.kind in (FULL, SLIDING) for layer in runs):
                return _packed_groups(runs, block_size, name)
            return _packed_attention_buckets(runs, block_size, name)
        raise ModelGeometryUnknown(f"{name}: attention layers of different page sizes per token "
                                   f"{sorted(token_bytes)}")
    per_token = token_bytes.pop()
    states = {layer.state_bytes for layer in runs if layer.kind == MAMBA}
    if states:
        # _align_hybrid_block_size: the smallest multiple of the kernel alignment whose page holds one state
        align = max(kernel_block, block_size, min_align or 0)
        if state_chunk:  # 0.26's mamba_cache_mode "all": blocks are also whole Mamba chunks
            align = math.lcm(align, state_chunk)
        block_size = max(block_size, align * _cdiv(max(states), align * per_token))
    page = block_size * per_token

    # Buckets of equal spec, in layer order (a dict keeps insertion order, as vLLM's defaultdict does).
    buckets: dict[tuple[str, int | None], int] = {}
    for layer, count in runs.items():
        key = (layer.kind, layer.window if layer.kind in (SLIDING, CHUNKED) else None)
        buckets[key] = buckets.get(key, 0) + count
    if len(buckets) == 1:
        (kind, window), count = next(iter(buckets.items()))
        return (CacheGroup(kind, count, page, block_size, window),)
    smallest, largest = min(buckets.values()), max(buckets.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups = []
    for (kind, window), count in buckets.items():
        num_groups = _cdiv(count, group_size)
        for i in range(num_groups):
            groups.append(CacheGroup(kind, len(range(i, count, num_groups)), page, block_size, window))
    return tuple(groups)


def _packed_groups(runs: Mapping[LayerCache, int], block_size: int, name: str) -> tuple[CacheGroup, ...]:
    """vLLM 0.33's grouping of attention layers whose pages differ (vllm/v1/core/kv_cache_planning.py
    _get_packed_kv_cache_groups, the block-outermost layout): layers of one type form a bucket (one
    UniformTypeKVCacheSpecs group, its page the sum of its layers'); a sliding-window bucket is a state bucket and
    splits round-robin into groups of as many layers as fit the widest bucket's page. Written for buckets of one
    page size each (Gemma 4: sliding layers of one head size, full ones of another; Inkling: conv states in blocks of
    their own beside full attention); a bucket mixing page sizes is refused."""
    buckets: dict[tuple[str, int | None], list[int]] = {}  # (kind, window) -> [page bytes, layers, block]
    for layer, count in runs.items():
        if layer.kind not in (FULL, SLIDING):
            raise ModelGeometryUnknown(f"{name}: {layer.kind} layers beside attention of other pages are not modelled")
        key = (layer.kind, layer.window if layer.kind == SLIDING else None)
        block = layer.block_tokens or block_size
        bucket = buckets.setdefault(key, [layer.page_bytes(block_size), 0, block])
        if bucket[0] != layer.page_bytes(block_size) or bucket[2] != block:
            raise ModelGeometryUnknown(f"{name}: {layer.kind} layers of different page sizes in one group are not "
                                       "modelled")
        bucket[1] += count
    # the widest group's page: a state (sliding) bucket down to one layer per group, any other bucket whole
    anchor = max(page * (1 if kind == SLIDING else count) for (kind, _), (page, count, _) in buckets.items())
    groups = []
    for (kind, window), (page, count, block) in buckets.items():
        num_groups = _cdiv(count, max(anchor // page, 1)) if kind == SLIDING else 1
        for i in range(num_groups):
            layers = len(range(i, count, num_groups))
            groups.append(CacheGroup(kind, layers, layers * page, block, window, True))
    return tuple(groups)


def _packed_hybrid_groups(runs: Mapping[LayerCache, int], block_size: int, kernel_block: int,
                          state_chunk: int | None, name: str, min_align: int | None) -> tuple[CacheGroup, ...]:
    """A recurrent hybrid whose other caches differ in page (GLM-5.3-Flash: KDA, an MLA latent, its indexer's kpool
    keys and its tail ring), as vLLM 0.33 sizes it: the block grown to hold a state in attention pages and tiling
    every backend's smallest kernel block (vllm/platforms/interface.py _align_hybrid_block_size), recurrent pages
    padded to the attention page, then _get_packed_kv_cache_groups' buckets (_packed_buckets)."""
    main = {layer.token_bytes for layer in runs if layer.kind in (FULL, MLA, SLIDING, CHUNKED)
            and not layer.block_tokens and layer.tokens_per_state == 1}
    if len(main) != 1:
        raise ModelGeometryUnknown(f"{name}: a recurrent hybrid with attention of {len(main)} page sizes is not "
                                   "modelled")
    per_token = main.pop()
    align = max(kernel_block, block_size, min_align or 0)
    if state_chunk:
        align = math.lcm(align, state_chunk)
    grown = align * _cdiv(max(layer.state_bytes for layer in runs if layer.kind == MAMBA), align * per_token)
    backends = math.lcm(*(layer.min_kernel_tokens or 1 for layer in runs))
    block = max(block_size, backends * _cdiv(grown, backends))
    buckets: dict[tuple, list] = {}  # type -> [kind, block, window, {page: layers}, alignment]
    for layer, count in runs.items():
        own = layer.block_tokens or block
        window = layer.window if layer.kind in (SLIDING, CHUNKED) else None
        key = (_type_key(layer)[0], window, own)
        page = block * per_token if layer.kind == MAMBA else layer.page_bytes(block)
        bucket = buckets.setdefault(key, [layer.kind, own, window, {}, 1])
        bucket[3][page] = bucket[3].get(page, 0) + count
        bucket[4] = math.lcm(bucket[4], layer.stride_alignment(own))
    return _packed_buckets(list(buckets.values()), name)


def _packed_attention_buckets(runs: Mapping[LayerCache, int], block_size: int, name: str) -> tuple[CacheGroup, ...]:
    """Attention of several types and pages without recurrent state (Dots3Note: sliding-window MLA beside sparse MLA
    and its indexer's keys), as vLLM 0.33 groups it: one bucket per type (an MLA latent and its indexer's keys share
    FullAttentionSpec's, _type_key), then _get_packed_kv_cache_groups' split (_packed_buckets)."""
    buckets: dict[tuple, list] = {}  # type -> [kind, block, window, {page: layers}, alignment]
    for layer, count in runs.items():
        own = layer.block_tokens or block_size
        window = layer.window if layer.kind in (SLIDING, CHUNKED) else None
        bucket = buckets.setdefault((_type_key(layer)[0], window, own), [layer.kind, own, window, {}, 1])
        page = layer.page_bytes(own)
        bucket[3][page] = bucket[3].get(page, 0) + count
        bucket[4] = math.lcm(bucket[4], layer.stride_alignment(own))
    return _packed_buckets(list(buckets.values()), name)


def _packed_buckets(buckets: list[list], name: str) -> tuple[CacheGroup, ...]:
    """vllm/v1/core/kv_cache_planning.py _get_packed_kv_cache_groups on buckets of one type each ([kind, block,
    window, {page: layers}, alignment], in order of first layer): a balanced bucket (as many layers of each page)
    is a repeating pattern, split into groups of the repeats _approximate_gcd picks; recurrent, ring and (without
    such a pattern) sliding buckets are state buckets, split to fit the block the widest group needs."""
    maxper = [max(b[3].values()) for b in buckets]
    balanced = [len(set(b[3].values())) == 1 for b in buckets]
    floor = max((m for m, bal, b in zip(maxper, balanced, buckets) if bal and len(b[3]) > 1), default=0)
    repeats = _approximate_gcd([m for m, bal in zip(maxper, balanced) if bal], floor) if floor else None

    def groups_for(i: int) -> int:
        return _cdiv(maxper[i], repeats) if balanced[i] and repeats else 1

    def widest(i: int, n: int) -> int:
        return sum(_cdiv(count, n) * page for page, count in buckets[i][3].items())

    def is_state(i: int) -> bool:
        return buckets[i][0] in (MAMBA, RING) or (repeats is None and buckets[i][0] == SLIDING)

    anchor = max(widest(i, sum(b[3].values()) if is_state(i) else groups_for(i)) for i, b in enumerate(buckets))
    groups = []
    for i, (kind, block, window, pages, alignment) in enumerate(buckets):
        n = groups_for(i)
        if anchor and is_state(i):
            n = max(n, _cdiv(sum(pages.values()), max(anchor // next(iter(pages)), 1)))
        if n > 1 and not balanced[i]:
            raise ModelGeometryUnknown(f"{name}: an unbalanced bucket of {kind} layers split in groups is not modelled")
        if n == 1:  # the bucket whole, balanced or not (DeepSeek-V4's latents and indexer keys: 23, 20 and 20)
            groups.append(CacheGroup(kind, sum(pages.values()), sum(p * c for p, c in pages.items()), block, window,
                                     True, alignment))
            continue
        for g in range(n):
            reps = len(range(g, maxper[i], n))
            groups.append(CacheGroup(kind, reps * len(pages), reps * sum(pages), block, window, True, alignment))
    return tuple(groups)


def _approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """kv_cache_planning.py _approximate_gcd: the chunk in [lower_bound, max] padding the values least (ties: the
    larger)."""
    best, best_pad = lower_bound, None
    for d in range(max(1, lower_bound), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best):
            best, best_pad = d, pad
    return best


def _type_key(layer: LayerCache) -> tuple[str, int | None]:
    # vllm/v1/core/single_type_kv_cache_manager.py register_all_kvcache_specs: MLAAttentionSpec (an MLA latent, an
    # indexer's keys) groups with FullAttentionSpec (uniform_type_base_spec)
    kind = FULL if layer.kind in (MLA, INDEXER) else layer.kind
    return kind, layer.window


# Mamba2 families with SupportsMambaPrefixCaching in vLLM 0.26 (vllm/model_executor/models/*.py): there, prefix
# caching selects mamba_cache_mode "all", whose blocks are whole multiples of the Mamba chunk
# (vllm/platforms/interface.py, _align_hybrid_block_size); 0.32 and 0.33 select "align" for every model.
MAMBA_PREFIX_CACHING_0_26 = frozenset({"granitemoehybrid", "nemotron_h", "falcon_h1", "bamba", "zamba2"})


def _state_chunk(facts: ModelFacts, release: tuple[int, int]) -> int | None:
    if release >= (0, 32) or facts.model_type not in MAMBA_PREFIX_CACHING_0_26:
        return None
    return facts.mamba_chunk


def host_copies(release: tuple[int, int], mla: bool, tensor_parallel_size: int) -> int:
    """Rank copies of each row the host pool keeps. 0.32 and 0.33 keep one copy of an MLA latent, which
    every rank holds identically, when the ranks share one node's /dev/shm region (`replicated_layout`
    in build_offloading_config, vllm#48906); 0.26 keeps one per rank."""
    if mla and release >= (0, 32):
        return 1
    return tensor_parallel_size


def release_refusal(release: tuple[int, int], groups: Sequence[CacheGroup]) -> str | None:
    """vLLM's own reason a release cannot offload these groups, or None."""
    kinds = {g.kind for g in groups}
    if release < (0, 32) and CHUNKED in kinds:
        return ("vLLM 0.26 cannot offload chunked local attention (Llama 4): its offloading scheduler's "
                "get_sliding_window_size_in_chunks asserts every other group is a FullAttentionSpec; "
                "vLLM 0.32 added ChunkedLocalAttentionSpec windows")
    return None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(n: int, unit: int) -> int:
    return _cdiv(n, unit) * unit
