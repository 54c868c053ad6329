"""Model geometry: how many bytes of KV cache one token and one block take.

Computed from the facts core.model_facts reads from a Hugging Face `config.json`; the bytes of a block and of a
token are those of the model's KV-cache groups (core/groups.py), the one model of what vLLM allocates and the
offload moves, so a hybrid's Mamba or window layers are not counted as attention. Reading that file, the bundled
catalog or the hub is spillway.adapters' job. An architecture is
sized only where vLLM 0.33's own answer for it is recorded and the planner agrees with it (core/vllm_coverage.py,
generated from tests/planner/coverage/truth.json); every other one is refused with the reason.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from spillway_connector.versions import require_supported

from .errors import InvalidSpec, ModelGeometryUnknown
from .groups import CacheGroup, KVGroups, host_copies, kv_groups
from .model_facts import FULL, MLA, ModelFacts, cached_hash, check_config, read_facts, text_config
from .options import Attention
from .vllm_api import IMAGE_VLLM_VERSION
from .vllm_coverage import REFUSED, SIZED

# Tokens per GPU KV block; vLLM's own default is 16. 64-token blocks (8 MiB cross-layer copies for Llama-3.1-8B
# instead of 2 MiB, a quarter of the offload keys) measured 1.21x the prompt throughput of 16-token blocks at 100%
# CPU hits (254.1K vs 209.3K tok/s, same call), the same at 50% (76.0K vs 76.4K) and 0% (44.3K vs 44.3K without
# offload), and TTFT from CPU 122 vs 140 ms at 32K tokens (bench/block-size). The price is the
# grain of a hit: vLLM matches a cached prefix in whole blocks, so a prefix loses up to 63 tokens instead of 15.
DEFAULT_BLOCK_SIZE = 64

IMAGE_RELEASE = require_supported(IMAGE_VLLM_VERSION)  # the vLLM release a layout is sized for unless told

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
    # The text config.json (a multimodal wrapper's language model) and the facts read from it; None: a geometry
    # given field by field, every layer full attention.
    config: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    max_model_len: int | None = None  # vLLM's default: the config's max_position_embeddings
    facts: ModelFacts | None = field(default=None, repr=False)  # compared: two models differ by their facts
    __hash__ = cached_hash  # memoized steps hash it on every call (model_facts.cached_hash)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("config", "facts")}


@dataclass(frozen=True)
class KVLayout:
    """Geometry with tensor parallelism, block size, cache dtype and vLLM release applied. Its bytes are the KV-cache
    groups': one offload row per block of a group, as vLLM allocates and copies it."""

    geometry: ModelGeometry
    tensor_parallel_size: int
    block_size: int  # tokens per block asked (--block-size); a Mamba hybrid's KV block is larger (kv_block_size)
    kv_cache_dtype: str
    dtype_bytes: int
    kv_heads_per_rank: int
    layer_page_bytes: int  # one K (or V, or MLA latent) page of one attention layer, one KV block, one rank
    block_bytes: int  # one offload row: one KV block of a group's layers, K and V, ONE rank: the DMA unit
    bytes_per_token: int  # a long prefix's KV per token, all ranks (GPU side): its rows over the block's tokens
    replicated: bool  # MLA: every rank holds the same latent
    groups: KVGroups

    @property
    def kv_per_layer(self) -> int:
        return 1 if self.geometry.attention == Attention.MLA else 2

    @property
    def kv_block_size(self) -> int:
        return self.groups.block_size

    @property
    def prefix_rows(self) -> int:
        return self.groups.prefix_rows


# Checkpoints vLLM serves as another architecture when a field is present: an UnlimitedOCRForCausalLM config with a
# DASH sparse_attention_config is Unlimited-OCR-2, its text model renamed UnlimitedOCR2TextForCausalLM (vLLM 0.34
# vllm/model_executor/models/config.py UnlimitedOCRForCausalLMConfig.verify_and_update_model_config), whose
# refusal is then the checkpoint's.
SERVED_AS = {"UnlimitedOCRForCausalLM": ("sparse_attention_config", "UnlimitedOCR2TextForCausalLM")}


def geometry_from_config(config: Mapping[str, Any], name: str = "model",
                         transformers_class: bool = False) -> ModelGeometry:
    """Parse a Hugging Face config.json mapping (filled as vLLM fills it: adapters.model_config) into ModelGeometry,
    or raise ModelGeometryUnknown. `transformers_class`: the architecture is a model class transformers ships, which
    vLLM serves through its Transformers backend when its registry does not name it (sized where its answer is
    recorded, as every architecture)."""
    architecture = check_config(config, name)
    if architecture in REFUSED:
        # before the reading: where vLLM itself refuses the model, its reason is the one to give, not a field the
        # reading would miss first
        raise ModelGeometryUnknown(f"{name}: architecture {architecture!r} is refused: {REFUSED[architecture]}")
    field, served = SERVED_AS.get(architecture, (None, None))
    if field and config.get(field) is not None and served in REFUSED:
        raise ModelGeometryUnknown(f"{name}: architecture {architecture!r} with a {field} is served as {served!r}, "
                                   f"which is refused: {REFUSED[served]}")
    facts = read_facts(config, name)
    if architecture not in SIZED and transformers_class:
        # vLLM's registry falls back to its Transformers backend for a class transformers ships; the reading of its
        # layers is checked per architecture like any other (tests/planner/coverage: 3 of the 17 recorded would be
        # mis-sized by reading attention types alone), so one with no recorded answer is not sized
        raise ModelGeometryUnknown(
            f"{name}: architecture {architecture!r} would be served by vLLM's Transformers backend, but no vLLM "
            "answer for it is recorded, so Spillway cannot size its KV pool exactly")
    if architecture not in SIZED:
        raise ModelGeometryUnknown(
            f"{name}: architecture {architecture!r} is neither in vLLM 0.33's registry (text generation, multimodal, "
            "Transformers backend) nor a model class of transformers, so vLLM would need the model's remote code; "
            "Spillway cannot size its KV pool exactly")
    attention = Attention.MLA if facts.mla else Attention.STANDARD
    return ModelGeometry(name, architecture, facts.num_layers, attention, facts.num_kv_heads,
                         facts.num_attention_heads, facts.head_dim, facts.dtype, dict(text_config(config)[0]),
                         facts.max_model_len, facts)


@functools.lru_cache(maxsize=256)
def kv_layout(
    geometry: ModelGeometry,
    tensor_parallel_size: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kv_cache_dtype: str = "auto",
    release: tuple[int, int] = IMAGE_RELEASE,
) -> KVLayout:
    """Apply tensor parallelism, block size and cache dtype (vLLM's own rules) on `release`."""
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
    mla = geometry.attention == Attention.MLA
    if mla:
        heads_per_rank, replicated = 1, True
    else:
        kv = geometry.num_kv_heads
        if kv % tensor_parallel_size and tensor_parallel_size % kv:
            raise InvalidSpec(
                f"{geometry.name}: {kv} KV heads neither split over nor replicate across "
                f"tensor parallel size {tensor_parallel_size}"
            )
        heads_per_rank, replicated = max(1, kv // tensor_parallel_size), kv < tensor_parallel_size
    kv_per_layer = 1 if mla else 2
    if geometry.facts is not None:
        groups = kv_groups(geometry.facts, release, tensor_parallel_size, block_size, kv_cache_dtype, geometry.name)
    else:  # a geometry given field by field: every layer full attention (or MLA), one group
        page = block_size * heads_per_rank * geometry.head_dim * dtype_bytes * kv_per_layer
        groups = KVGroups(release, (CacheGroup(MLA if mla else FULL, geometry.num_layers, page, block_size),),
                          host_copies(release, mla, tensor_parallel_size), replicated)
    # A hybrid moves one row per block of each group, and past their windows only the full-attention groups' rows
    # grow with the prefix: its bytes a token are theirs, not every layer's as attention (Nemotron-H-8B: 4 of 52).
    block_bytes = groups.row_bytes
    return KVLayout(
        geometry=geometry,
        tensor_parallel_size=tensor_parallel_size,
        block_size=block_size,
        kv_cache_dtype=dtype,
        dtype_bytes=dtype_bytes,
        kv_heads_per_rank=heads_per_rank,
        layer_page_bytes=groups.attention_page_bytes // kv_per_layer,
        block_bytes=block_bytes,
        bytes_per_token=groups.prefix_bytes_per_token(tensor_parallel_size),
        replicated=replicated,
        groups=groups,
    )
