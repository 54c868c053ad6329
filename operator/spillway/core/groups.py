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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidSpec, ModelGeometryUnknown

FULL = "full_attention"
SLIDING = "sliding_window"
CHUNKED = "chunked_local"
MAMBA = "mamba"
MLA = "mla"
ATTENTION_KINDS = (FULL, SLIDING, CHUNKED, MLA)

HOST_PAGE_BYTES = 4096  # 0.32/0.33 CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE (x86-64 Linux)
# vllm/model_executor/models/config.py and platforms/interface.py: the smallest kernel block of the
# GPU attention backends (FlashAttention/FlashInfer/Triton accept multiples of 16 tokens).
GPU_KERNEL_BLOCK = 16
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class LayerCache:
    """One decoder layer's KV cache on one tensor-parallel rank, as its vLLM KVCacheSpec sizes it."""

    kind: str
    token_bytes: int = 0  # attention: bytes per token (K and V, or the MLA latent)
    window: int | None = None  # sliding window / attention chunk, in tokens
    state_bytes: int = 0  # Mamba / linear attention: one sequence's state


@dataclass(frozen=True)
class CacheGroup:
    """One KV-cache group: layers sharing a block table."""

    kind: str
    layers: int
    page_bytes: int  # one layer, one block, one rank (after vLLM's page unification)
    block_size: int  # tokens per block
    window: int | None = None

    @property
    def block_bytes(self) -> int:
        return self.layers * self.page_bytes


@dataclass(frozen=True)
class KVGroups:
    """The KV-cache groups of one model on one vLLM release, with the host copies of each row."""

    release: tuple[int, int]
    groups: tuple[CacheGroup, ...]
    copies: int  # rank copies the host keeps per row
    replicated: bool  # every rank holds the same bytes (MLA, or fewer KV heads than ranks)

    @property
    def block_size(self) -> int:
        return min(g.block_size for g in self.groups)

    @property
    def row_bytes(self) -> int:
        """worker_kv_bytes_per_block: one block of the GPU cache on one rank (the largest group's)."""
        return max(g.block_bytes for g in self.groups)

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1 or self.groups[0].kind != FULL and self.groups[0].kind != MLA

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
        for group in self.groups:
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

def _get(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = config.get(key)
    return default if value is None else value


def positive_int(config: Mapping[str, Any], key: str, name: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelGeometryUnknown(f"{name}: config.json field {key!r} must be a positive integer, got {value!r}")
    return value


def kv_heads_and_head_dim(config: Mapping[str, Any], heads: int, name: str) -> tuple[int, int]:
    """Standard attention's KV heads and head size as vLLM reads a config: without num_key_value_heads every
    attention head has its own KV, without head_dim a head is hidden_size / heads wide."""
    kv_heads = config.get("num_key_value_heads") or heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads <= 0:
        raise ModelGeometryUnknown(f"{name}: num_key_value_heads must be a positive integer, got {kv_heads!r}")
    head_dim = config.get("head_dim")
    if head_dim is None:
        hidden = positive_int(config, "hidden_size", name)
        if hidden % heads:
            raise ModelGeometryUnknown(f"{name}: hidden_size {hidden} is not a multiple of {heads} heads")
        return kv_heads, hidden // heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ModelGeometryUnknown(f"{name}: head_dim must be a positive integer, got {head_dim!r}")
    return kv_heads, head_dim


def _split(total: int, tp: int, what: str, name: str) -> int:
    if total % tp:
        raise InvalidSpec(f"{name}: {total} {what} do not split over tensor parallel size {tp}")
    return total // tp


def layer_types(config: Mapping[str, Any], num_layers: int, name: str) -> list[str]:
    """The kind of each decoder layer, as the model's vLLM implementation assigns it."""
    model_type = str(config.get("model_type", ""))
    listed = config.get("layer_types")
    if isinstance(listed, list) and listed:
        if len(listed) != num_layers:
            raise ModelGeometryUnknown(f"{name}: layer_types has {len(listed)} entries for {num_layers} layers")
        kinds = {"full_attention": FULL, "attention": FULL, "sliding_attention": SLIDING,
                 "linear_attention": MAMBA, "mamba": MAMBA, "chunked_attention": CHUNKED}
        unknown = sorted({str(t) for t in listed if t not in kinds})
        if unknown:
            raise ModelGeometryUnknown(f"{name}: layer_types {unknown} are not layer kinds Spillway can size")
        return [kinds[t] for t in listed]
    pattern = config.get("hybrid_override_pattern")  # Nemotron-H: M = Mamba2, * = attention, - / E = MLP only
    if isinstance(pattern, str) and pattern:
        if len(pattern) != num_layers:
            raise ModelGeometryUnknown(f"{name}: hybrid_override_pattern has {len(pattern)} layers, not {num_layers}")
        return [{"M": MAMBA, "*": FULL}.get(ch, "") for ch in pattern]
    if model_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"):
        interval = positive_int(config, "full_attention_interval", name, 4)
        return [FULL if (i + 1) % interval == 0 else MAMBA for i in range(num_layers)]
    if model_type in ("llama4", "llama4_text") and config.get("attention_chunk_size"):
        # vLLM's Llama4 attention: layers with RoPE are chunked-local, every 4th (no_rope_layers 0) is global NoPE.
        interval = config.get("no_rope_layer_interval") or 4
        no_rope = config.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(num_layers)]
        return [CHUNKED if no_rope[i] else FULL for i in range(num_layers)]
    window = config.get("sliding_window")
    if model_type in ("gemma3", "gemma3_text") and window:
        period = positive_int(config, "sliding_window_pattern", name, 6)
        return [FULL if (i + 1) % period == 0 else SLIDING for i in range(num_layers)]
    if model_type in ("gemma2", "gpt_oss") and window:
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    if window and config.get("use_sliding_window", True) is not False:
        return [SLIDING] * num_layers  # Mistral v0.1-style: every layer keeps a window
    return [FULL] * num_layers


def mamba_state_bytes(config: Mapping[str, Any], tp: int, model_dtype_bytes: int, ssm_dtype_bytes: int,
                      name: str) -> int:
    """One layer's recurrent state on one rank (vllm/model_executor/layers/mamba/mamba_utils.py,
    MambaStateShapeCalculator): the conv state in the model's dtype, the SSM state in the SSM dtype."""
    model_type = str(config.get("model_type", ""))
    if model_type.startswith(("qwen3_next", "qwen3_5")):
        # gated_delta_net_state_shape
        k_heads, v_heads = positive_int(config, "linear_num_key_heads", name), positive_int(config, "linear_num_value_heads", name)
        k_dim, v_dim = positive_int(config, "linear_key_head_dim", name), positive_int(config, "linear_value_head_dim", name)
        kernel = positive_int(config, "linear_conv_kernel_dim", name, 4)
        conv = _split(k_dim * k_heads * 2 + v_dim * v_heads, tp, "linear-attention channels", name) * (kernel - 1)
        ssm = _split(v_heads, tp, "linear-attention value heads", name) * v_dim * k_dim
        return conv * model_dtype_bytes + ssm * ssm_dtype_bytes
    if model_type in ("granitemoehybrid", "nemotron_h", "bamba", "falcon_h1"):
        # mamba2_state_shape
        prefix = {"nemotron_h": ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel"),
                  "falcon_h1": ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv")}
        keys = prefix.get(model_type, ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups",
                                       "mamba_d_conv"))
        # NemotronH configs also spell n_groups/conv_kernel the Mamba way (mamba_n_groups, mamba_d_conv)
        aliases = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv"}
        heads, head_dim, state, groups, kernel = (
            positive_int(config, k if config.get(k) is not None or k not in aliases else aliases[k], name) for k in keys)
        groups += 0 if groups % tp == 0 else tp - groups
        intermediate = heads * head_dim
        conv = _split(intermediate + 2 * groups * state, tp, "Mamba channels", name) * (kernel - 1)
        ssm = _split(heads, tp, "Mamba heads", name) * head_dim * state
        return conv * model_dtype_bytes + ssm * ssm_dtype_bytes
    raise ModelGeometryUnknown(f"{name}: model_type {model_type!r} has recurrent layers Spillway cannot size")


def attention_token_bytes(kind: str, kv_heads: int, head_dim: int, tp: int, dtype_bytes: int) -> int:
    if kind == MLA:
        return head_dim * dtype_bytes  # one latent (kv_lora_rank + qk_rope_head_dim), replicated on every rank
    return 2 * max(1, kv_heads // tp) * head_dim * dtype_bytes


MLA_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config of a multimodal wrapper (Gemma 3, Llama 4), else the config itself."""
    inner = config.get("text_config")
    if isinstance(inner, Mapping) and "num_hidden_layers" not in config:
        return {**inner, "architectures": config.get("architectures"),
                "torch_dtype": inner.get("torch_dtype") or config.get("torch_dtype")}
    return config


def layer_caches(config: Mapping[str, Any], tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto",
                 name: str = "model") -> list[LayerCache]:
    """Each decoder layer's cache on one rank, from a config.json mapping (text_config already merged)."""
    tp = tensor_parallel_size
    num_layers = positive_int(config, "num_hidden_layers", name)
    heads = positive_int(config, "num_attention_heads", name)
    model_dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    model_dtype = "bfloat16" if model_dtype == "float32" else model_dtype  # vLLM serves fp32 checkpoints in 16 bit
    if model_dtype not in DTYPE_BYTES:
        raise ModelGeometryUnknown(f"{name}: unsupported dtype {model_dtype!r}")
    cache_dtype = model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    if cache_dtype not in DTYPE_BYTES or cache_dtype == "float32":
        raise InvalidSpec(f"kv cache dtype {kv_cache_dtype!r} unknown (auto, bfloat16, float16, fp8)")
    dtype_bytes = DTYPE_BYTES[cache_dtype]
    model_type = str(config.get("model_type", ""))
    kinds = layer_types(config, num_layers, name)
    if model_type in MLA_MODEL_TYPES or config.get("kv_lora_rank"):
        latent = positive_int(config, "kv_lora_rank", name) + positive_int(config, "qk_rope_head_dim", name)
        token = attention_token_bytes(MLA, 1, latent, tp, dtype_bytes)
        return [LayerCache(MLA, token) for _ in range(num_layers)]
    kv_heads, head_dim = kv_heads_and_head_dim(config, heads, name)
    if kv_heads % tp and tp % kv_heads:
        raise InvalidSpec(f"{name}: {kv_heads} KV heads neither split over nor replicate across "
                          f"tensor parallel size {tp}")
    token = attention_token_bytes(FULL, kv_heads, head_dim, tp, dtype_bytes)
    chunk = config.get("attention_chunk_size")
    state = 0
    if MAMBA in kinds:
        # vllm/model_executor/models/config.py: a config's mamba_ssm_dtype wins; NemotronH defaults to float32
        default = (config.get("mamba_ssm_cache_dtype") or "float32") if model_type == "nemotron_h" else model_dtype
        ssm_dtype = str(config.get("mamba_ssm_dtype") or default)
        state = mamba_state_bytes(config, tp, DTYPE_BYTES[model_dtype], DTYPE_BYTES.get(ssm_dtype, 4), name)
    out = []
    for kind in kinds:
        if kind == SLIDING:
            out.append(LayerCache(SLIDING, token, positive_int(config, "sliding_window", name)))
        elif kind == CHUNKED:
            out.append(LayerCache(CHUNKED, token, int(chunk)))
        elif kind == MAMBA:
            out.append(LayerCache(MAMBA, 0, None, state))
        elif kind == FULL:
            out.append(LayerCache(FULL, token))
        else:
            out.append(LayerCache(""))  # an MLP-only layer (Nemotron-H "-"): no cache
    return out


def kv_groups(config: Mapping[str, Any], release: tuple[int, int], tensor_parallel_size: int = 1,
              block_size: int = 16, kv_cache_dtype: str = "auto", name: str = "model",
              kernel_block: int = GPU_KERNEL_BLOCK) -> KVGroups:
    """The model's KV-cache groups on `release`, or ModelGeometryUnknown with vLLM's reason."""
    config = text_config(config)
    layers = layer_caches(config, tensor_parallel_size, kv_cache_dtype, name)
    groups = group_layers(layers, block_size, kernel_block, _state_chunk(config, release))
    refusal = release_refusal(release, groups)
    if refusal:
        raise ModelGeometryUnknown(f"{name}: {refusal}")
    mla = groups[0].kind == MLA
    kv_heads = config.get("num_key_value_heads") or config.get("num_attention_heads") or 1
    replicated = mla or (tensor_parallel_size > 1 and kv_heads < tensor_parallel_size)
    return KVGroups(release, groups, host_copies(release, mla, tensor_parallel_size), replicated)


# -- grouping ---------------------------------------------------------------------------------------

def group_layers(layers: Sequence[LayerCache], block_size: int, kernel_block: int = GPU_KERNEL_BLOCK,
                 state_chunk: int | None = None) -> tuple[CacheGroup, ...]:
    """vLLM's grouping of per-layer caches into KV-cache groups, pages unified."""
    cached = [layer for layer in layers if layer.kind]
    if not cached:
        raise ModelGeometryUnknown("the model has no layer with a KV cache")
    attention = [layer for layer in cached if layer.kind in ATTENTION_KINDS]
    if not attention:
        raise ModelGeometryUnknown("a model of recurrent layers only has no attention KV to offload")
    token_bytes = {layer.token_bytes for layer in attention}
    if len(token_bytes) > 1:
        raise ModelGeometryUnknown(f"attention layers of different page sizes per token {sorted(token_bytes)}")
    per_token = token_bytes.pop()
    states = {layer.state_bytes for layer in cached if layer.kind == MAMBA}
    if states:
        # _align_hybrid_block_size: the smallest multiple of the kernel alignment whose page holds one state
        align = max(kernel_block, block_size)
        if state_chunk:  # 0.26's mamba_cache_mode "all": blocks are also whole Mamba chunks
            align = math.lcm(align, state_chunk)
        block_size = max(block_size, align * _cdiv(max(states), align * per_token))
    page = block_size * per_token

    # Buckets of equal spec, in layer order (a dict keeps insertion order, as vLLM's defaultdict does).
    buckets: dict[tuple[str, int | None], int] = {}
    for layer in cached:
        key = (layer.kind, layer.window if layer.kind in (SLIDING, CHUNKED) else None)
        buckets[key] = buckets.get(key, 0) + 1
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


# Mamba2 families with SupportsMambaPrefixCaching in vLLM 0.26 (vllm/model_executor/models/*.py): there, prefix
# caching selects mamba_cache_mode "all", whose blocks are whole multiples of the Mamba chunk
# (vllm/platforms/interface.py, _align_hybrid_block_size); 0.32 and 0.33 select "align" for every model.
MAMBA_PREFIX_CACHING_0_26 = frozenset({"granitemoehybrid", "nemotron_h", "falcon_h1", "bamba", "zamba2"})


def _state_chunk(config: Mapping[str, Any], release: tuple[int, int]) -> int | None:
    if release >= (0, 32) or str(config.get("model_type", "")) not in MAMBA_PREFIX_CACHING_0_26:
        return None
    return int(config.get("mamba_chunk_size") or config.get("chunk_size") or 2048)  # ModelConfig.get_mamba_chunk_size


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
