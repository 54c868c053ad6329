"""Model geometry: how many bytes of KV cache one token and one block take.

Computed from the mapping of a Hugging Face `config.json`; reading that file, the bundled
catalog or the hub is spillway.adapters' job. Models whose KV cache is not one uniform
full-attention cache (sliding-window, hybrid attention/SSM) are refused with a clear
message rather than sized wrongly.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import InvalidSpec, ModelGeometryUnknown
from .groups import kv_heads_and_head_dim, layer_caches, positive_int, text_config
from .options import Attention

# Tokens per GPU KV block; vLLM's own default is 16. 64-token blocks (8 MiB cross-layer copies for Llama-3.1-8B
# instead of 2 MiB, a quarter of the offload keys) measured 1.21x the prompt throughput of 16-token blocks at 100%
# CPU hits (254.1K vs 209.3K tok/s, same call), the same at 50% (76.0K vs 76.4K) and 0% (44.3K vs 44.3K without
# offload), and TTFT from CPU 122 vs 140 ms at 32K tokens (bench/results/h200-2026-12-01-r5). The price is the
# grain of a hit: vLLM matches a cached prefix in whole blocks, so a prefix loses up to 63 tokens instead of 15.
DEFAULT_BLOCK_SIZE = 64

# Architectures whose attention is standard (MHA/GQA) with separate K and V on every layer.
STANDARD_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM",
    "Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
    "Phi3ForCausalLM", "GraniteForCausalLM", "GraniteMoeForCausalLM", "OlmoForCausalLM",
    "Olmo2ForCausalLM", "InternLM2ForCausalLM", "ExaoneForCausalLM", "GemmaForCausalLM",
    "DeepseekForCausalLM", "Glm4ForCausalLM", "Glm4MoeForCausalLM", "SmolLM3ForCausalLM",
    # sliding-window, chunked-local and Mamba hybrids: their KV-cache groups come from groups.py
    "GptOssForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration",
    "Llama4ForCausalLM", "Llama4ForConditionalGeneration", "Qwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM", "GraniteMoeHybridForCausalLM",
    "NemotronHForCausalLM",
})
# Multi-head latent attention: one compressed latent (+ rope key) per token per layer.
MLA_ARCHITECTURES = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK2ForCausalLM"})
# Families with recurrent or sparse layers whose state Spillway does not model (yet): refused by name.
UNMODELLED_MODEL_TYPES = frozenset({
    "jamba", "mamba", "mamba2", "falcon_h1", "zamba2", "bamba", "minimax", "minimax_m1", "plamo2", "lfm2",
    "deepseek_v32",
})

TORCH_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 2, "float": 2}
KV_CACHE_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class ModelGeometry:
    """Per-model KV facts, before tensor parallelism and block size are applied."""

    name: str
    architecture: str
    num_layers: int
    attention: Attention
    num_kv_heads: int  # standard: KV heads; mla: 1 (the latent)
    num_attention_heads: int
    head_dim: int  # standard: K (= V) head size; mla: kv_lora_rank + qk_rope_head_dim
    dtype: str  # the model's own dtype (what `--kv-cache-dtype auto` stores)
    # The config.json facts vLLM's KV-cache groups follow from (groups.py); None: every layer full attention.
    config: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    max_model_len: int | None = None  # vLLM's default: the config's max_position_embeddings

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "config"}


@dataclass(frozen=True)
class KVLayout:
    """Geometry with tensor parallelism, block size and cache dtype applied."""

    geometry: ModelGeometry
    tensor_parallel_size: int
    block_size: int
    kv_cache_dtype: str
    dtype_bytes: int
    kv_heads_per_rank: int
    layer_page_bytes: int  # one K (or V, or MLA latent) page of one layer, one rank
    block_bytes: int  # one block, all layers, K and V, ONE rank: the DMA unit
    bytes_per_token: int  # whole model, all ranks (GPU side)
    replicated: bool  # MLA: every rank holds the same latent

    @property
    def kv_per_layer(self) -> int:
        return 1 if self.geometry.attention == Attention.MLA else 2


def _refuse_unmodelled(config: Mapping[str, Any], name: str) -> None:
    model_type = str(config.get("model_type", ""))
    if model_type in UNMODELLED_MODEL_TYPES:
        raise ModelGeometryUnknown(
            f"{name}: model_type {model_type!r} keeps a recurrent or sparse-index cache Spillway does not model; "
            "Spillway cannot size its KV pool exactly"
        )


def geometry_from_config(config: Mapping[str, Any], name: str = "model") -> ModelGeometry:
    """Parse a Hugging Face config.json mapping into ModelGeometry, or raise ModelGeometryUnknown."""
    if not isinstance(config, Mapping):
        raise ModelGeometryUnknown(f"{name}: config.json must be a JSON object")
    config = text_config(config)
    architectures = config.get("architectures") or []
    architecture = architectures[0] if isinstance(architectures, list) and architectures else None
    if architecture is None:
        raise ModelGeometryUnknown(f"{name}: config.json has no 'architectures' entry")
    if not isinstance(architecture, str):
        raise ModelGeometryUnknown(f"{name}: config.json 'architectures' must list class names (strings), "
                                   f"got {architectures!r}"[:300])
    _refuse_unmodelled(config, name)
    num_layers = positive_int(config, "num_hidden_layers", name)
    heads = positive_int(config, "num_attention_heads", name)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in TORCH_DTYPE_BYTES:
        raise ModelGeometryUnknown(f"{name}: unsupported dtype {dtype!r} (known: {sorted(TORCH_DTYPE_BYTES)})")
    if dtype == "float32":
        dtype = "bfloat16"  # vLLM serves float32 checkpoints in 16-bit by default
    if architecture in MLA_ARCHITECTURES:
        latent = positive_int(config, "kv_lora_rank", name) + positive_int(config, "qk_rope_head_dim", name)
        return ModelGeometry(name, architecture, num_layers, Attention.MLA, 1, heads, latent, dtype,
                             dict(config), _max_model_len(config))
    if architecture not in STANDARD_ARCHITECTURES:
        raise ModelGeometryUnknown(
            f"{name}: architecture {architecture!r} is not one Spillway can size "
            f"(standard: {len(STANDARD_ARCHITECTURES)} known, MLA: {sorted(MLA_ARCHITECTURES)})"
        )
    kv_heads, head_dim = kv_heads_and_head_dim(config, heads, name)
    layer_caches(config, 1, "auto", name)  # a layer kind or recurrent state it cannot size fails here, by name
    return ModelGeometry(name, architecture, num_layers, Attention.STANDARD, kv_heads, heads, head_dim, dtype,
                         dict(config), _max_model_len(config))


def _max_model_len(config: Mapping[str, Any]) -> int | None:
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def kv_layout(
    geometry: ModelGeometry,
    tensor_parallel_size: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kv_cache_dtype: str = "auto",
) -> KVLayout:
    """Apply tensor parallelism, block size and cache dtype (vLLM's own rules)."""
    if tensor_parallel_size < 1:
        raise InvalidSpec(f"tensor parallel size must be >= 1, got {tensor_parallel_size}")
    if block_size < 1:
        raise InvalidSpec(f"block size must be >= 1 token, got {block_size}")
    if geometry.num_attention_heads % tensor_parallel_size:
        raise InvalidSpec(
            f"{geometry.name}: {geometry.num_attention_heads} attention heads do not split over "
            f"tensor parallel size {tensor_parallel_size}"
        )
    dtype = geometry.dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    if dtype not in KV_CACHE_DTYPE_BYTES:
        raise InvalidSpec(f"kv cache dtype {kv_cache_dtype!r} unknown (auto, {', '.join(KV_CACHE_DTYPE_BYTES)})")
    dtype_bytes = KV_CACHE_DTYPE_BYTES[dtype]
    if geometry.attention == Attention.MLA:
        heads_per_rank, replicated = 1, True
    else:
        kv = geometry.num_kv_heads
        if kv % tensor_parallel_size and tensor_parallel_size % kv:
            raise InvalidSpec(
                f"{geometry.name}: {kv} KV heads neither split over nor replicate across "
                f"tensor parallel size {tensor_parallel_size}"
            )
        heads_per_rank, replicated = max(1, kv // tensor_parallel_size), kv < tensor_parallel_size
    layer_page = block_size * heads_per_rank * geometry.head_dim * dtype_bytes
    kv_per_layer = 1 if geometry.attention == Attention.MLA else 2
    block_bytes = layer_page * kv_per_layer * geometry.num_layers
    return KVLayout(
        geometry=geometry,
        tensor_parallel_size=tensor_parallel_size,
        block_size=block_size,
        kv_cache_dtype=dtype,
        dtype_bytes=dtype_bytes,
        kv_heads_per_rank=heads_per_rank,
        layer_page_bytes=layer_page,
        block_bytes=block_bytes,
        bytes_per_token=block_bytes * tensor_parallel_size // block_size,
        replicated=replicated,
    )
