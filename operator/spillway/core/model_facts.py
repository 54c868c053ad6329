"""The one reading of a model's config.json: what the geometry and the KV-cache groups both follow from.

vLLM decides each decoder layer's KV cache from its config the way its model code reads it: the attention
geometry as vllm/transformers_utils/model_arch_config_convertor.py derives it (head size, KV heads and their
aliases), each layer's kind from `layer_types` and the patterns models carry instead (sliding-window periods,
Jamba's attention period and offset, Nemotron-H's override pattern, Falcon-H1's attention and Mamba in every
layer), MLA latents and DeepSeek-V3.2's indexer cache, and the recurrent state of Mamba and linear-attention
layers. `read_facts` does that reading once; everything else works on the frozen, hashable result.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

from .deepseek_v4 import (
    INDEXED_RATIO,
    RING_RATIO,
    V41_MODEL_TYPE,
    CompressedAttention,
    read_ratios,
    read_v41_topology,
    refuse_v41_defaults,
)
from .deepseek_v4 import MODEL_TYPE as DEEPSEEK_V4
from .errors import ModelGeometryUnknown

FULL = "full_attention"
SLIDING = "sliding_window"
CHUNKED = "chunked_local"
MAMBA = "mamba"
MLA = "mla"
INDEXER = "indexer"  # DeepSeek-V3.2's sparse-attention indexer keys: an MLA-shaped cache of uint8
# vLLM's CircularBufferSpec: one block a request for the keys of a compression group still open (Step5's CSA tail
# ring), outside prefix caching, so never offloaded
RING = "ring"
# Inkling's short-convolution state (vllm/models/inkling/nvidia/sconv_swa_attn.py InklingConvState): a sliding window
# of sconv_kernel_size tokens in blocks of that size, its four streams packed into one power-of-two head per KV head
SCONV = "sconv"
NONE = ""  # a layer without a cache (an MLP-only layer)

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1}
# vllm/transformers_utils/config.py CONFIG_FIELD_ALIASES["total_num_kv_heads"], in vLLM's order of lookup.
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
LAYER_TYPE_KINDS = {
    "full_attention": FULL, "attention": FULL, "global": FULL, "global_attention": FULL, "full": FULL,
    "sliding_attention": SLIDING, "sliding_window": SLIDING, "local": SLIDING, "local_attention": SLIDING,
    "chunked_attention": CHUNKED,
    "linear_attention": MAMBA, "mamba": MAMBA, "mamba2": MAMBA,
    "conv": MAMBA,  # LFM2's short convolution: a recurrent conv state (vllm/model_executor/layers/mamba/short_conv.py)
    # DeepSeek-V3.2-style sparse MLA (GLM-5's glm_moe_dsa): an MLA latent, its indexer cache from index_head_dim
    # (read_facts); _layer_kinds admits it only there
    "indexed_attention": FULL,
    "mlp": NONE,  # an MLP-only layer (vllm/model_executor/models/dory.py, beam: no attention, so no cache)
    "moe": NONE,  # Nemotron-H's MoE layer (nemotron_h.py: an MLP block, no cache)
}
# vllm/model_executor/models/commandr.py, cohere2_moe.py: Cohere's sliding layers see [pos - window, pos], so vLLM
# passes sliding_window + 1.
WINDOW_OFFSET = {"cohere2": 1, "cohere2_moe": 1}
# vllm/models/dots3_note/nvidia/model.py: its sliding MLA's window is sliding_window_size
WINDOW_FIELD = {"dots3_note": "sliding_window_size"}
# Multimodal wrappers keep the language model's config under one of these keys (vLLM's hf_text_config;
# "llm_config": vllm/transformers_utils/config.py _CONFIG_ATTRS_MAPPING).
# "decoder": an encoder-decoder's config, whose text config transformers' get_text_config finds there
# (Nemotron-Parse's MBart decoder).
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config", "thinker_config", "decoder")
# vllm/model_executor/models/nemotron_parse3_5.py MBartDecoderLayer reads an MBart decoder's own names (transformers'
# MBartConfig maps the generic ones to its encoder's): decoder_layers layers of decoder_attention_heads heads,
# self_attention_kv_heads KV heads where given, each d_model // heads wide.
MBART_DECODER = {"num_hidden_layers": "decoder_layers", "num_attention_heads": "decoder_attention_heads",
                 "num_key_value_heads": "self_attention_kv_heads"}
MULTIMODAL_CONFIG_KEYS = ("vision_config", "audio_config", "vision_tower_config", "visual")
# vllm/transformers_utils/configs/moondream3.py: Moondream3Config builds its text model from config["text"]
# (Moondream3TextConfig: its names, its defaults where a field is absent) and overwrites the top-level fields
# with that model's
MOONDREAM3_TEXT = {"hidden_size": ("dim", 2048), "num_hidden_layers": ("n_layers", 24),
                   "num_attention_heads": ("n_heads", 32), "num_key_value_heads": ("n_kv_heads", 32),
                   "max_position_embeddings": ("max_context", 4096)}
# vllm/transformers_utils/model_arch_config_convertor.py is_deepseek_mla: the model types whose kv_lora_rank is an
# MLA latent (MiniCPM3 also has one, but vLLM gives it full attention)
MLA_MODEL_TYPES = frozenset({
    "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v41", "dots3_note", "deepseek_mtp",
    "k3_dspark", "glm5_next", "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite", "glm4_moe_lite_mtp", "kimi_k2",
    "kimi_linear", "longcat_flash", "pangu_ultra_moe", "pangu_ultra_moe_mtp", "bailing_hybrid",
    "bailing_hybrid_mtp", "bailing_hybrid_v3_mtp", "hy_v4", "hy_v4_mtp", "mistral_large_4",
})
# vllm/models/hy_v4/nvidia/attention.py: every HY-V4 layer is MLA (HYV4MLAAttention); a layer keeps an indexer
# cache only where index_topk is set, layer_types names it sparse, and it computes its own top-k (not a "shared"
# layer of indexer_types, nor one index_topk_freq / index_topk_pattern skip)
HY_V4_SPARSE = ("sparse_attention", "sparse", "indexed_attention")
# Model types whose recurrent layers are Kimi delta attention (MambaStateShapeCalculator.kda_state_shape)
KDA_STATE = frozenset({"alice_ai", "bailing_hybrid", "glm5_next", "glm5_next_text"})
# vllm/models/glm5next: GLM-5.3-Flash's indexed layers keep the kpool indexer's keys, one state per index_kpool
# tokens, and the pool's tail ring beside their NoPE MLA latent
KPOOL = frozenset({"glm5_next", "glm5_next_text"})
# Ling 2.5 shares Ling 3's model type bailing_hybrid (vllm/config/speculative.py) but its recurrent layers are
# linear attention (bailing_moe_linear.py)
LING_LINEAR = "BailingMoeV2_5ForCausalLM"
# Architectures whose model code builds MLA attention on every layer whatever the model type (vLLM's
# is_deepseek_mla does not list theirs; the layer's MLAAttention keeps an MLAAttentionSpec all the same):
# vllm/model_executor/models/sarvam.py SarvamMLAAttention
MLA_ARCHITECTURES = frozenset({"SarvamMLAForCausalLM"})
# Model types whose attention takes each layer's window from interleaved_sliding_window (None: global attention),
# ahead of layer_types: vllm/model_executor/models/plamo3.py (indexed by layer), openpangu.py (cyclic)
INTERLEAVED_WINDOWS = frozenset({"plamo3", "openpangu"})
# vllm/model_executor/models/mimo_v2.py (MiMo-V2-Omni builds its MiMoV2FlashForCausalLM): a 0/1
# hybrid_layer_pattern (1: sliding, over sliding_window_size tokens), the sliding layers with heads of their own
# (swa_*), V heads of their own size (v_head_dim) on both kinds
SWA_HEADS = frozenset({"mimo_v2", "mimo_v2_flash", "mimo_v2_omni"})
# Gemma 4 (and DiffusionGemma, its attention): each layer's head size and KV heads from per_layer_config, which
# transformers' Gemma4TextConfig builds from global_head_dim (default 512) and num_global_key_value_heads for the
# full-attention layers when a config.json does not carry it (vllm/model_executor/models/gemma4.py reads it).
PER_LAYER_HEADS = frozenset({"gemma4", "gemma4_text", "diffusion_gemma", "diffusion_gemma_text"})
# vllm/model_executor/models/longcat_flash.py: each decoder layer holds two attention blocks, each its own cache
ATTENTIONS_PER_LAYER = {"longcat_flash": 2}
# Transformers configs keep their own names in config.json; their attribute_map gives vLLM the standard ones.
ALIASES = {"num_hidden_layers": ("n_layer", "n_layers", "num_layers"), "num_attention_heads": ("n_head", "n_heads"),
           "hidden_size": ("n_embd", "d_model"), "max_position_embeddings": ("n_positions", "max_sequence_length")}
# Model types whose vLLM model code builds caches the config fields above do not describe; refused by name until
# the planner models them (each reason says what vLLM does differently).
UNMODELLED: dict[str, str] = {}

# Model types of recurrent layers only (vllm/model_executor/models/mamba.py, mamba2.py; FalconMamba is mamba.py's):
# one group of MambaSpec pages at the block the plan gives, which vLLM offloads with prefix caching on (the plan
# renders it for every Mamba group); without attention heads, vLLM's head-count checks pass at any TP
# (ModelConfig.get_total_num_attention_heads: 0 where the config has none)
RECURRENT_ONLY = frozenset({"mamba", "mamba2", "falcon_mamba"})

# Bounds on a config's geometry, far above any model vLLM serves (the largest registry configs: 126 decoder layers,
# 128 heads of 576 elements), below what would allocate a per-layer list the size of the memory or overflow a
# float: a config past them is refused, not expanded (check_bounds).
GEOMETRY_BOUNDS = {"layers": 100_000, "heads": 1 << 16, "head_dim": 1 << 16, "hidden_size": 1 << 24}
BOUNDED_FIELDS = {
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "heads": ("num_attention_heads", "n_head", "n_heads", *KV_HEAD_KEYS),
    "head_dim": ("head_dim", "attention_head_dim", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                 "v_head_dim", "index_head_dim"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
}

# Model types whose transformers config class always fills layer_types (its __post_init__ derives them from the
# layer count and the pattern fields), and whose vLLM model code reads them: a config of theirs without them was not
# filled as vLLM fills it, and its layers' kinds are not in it.
FILLED_LAYER_TYPES = frozenset({
    "gemma2", "gemma3", "gemma3_text", "cohere2", "gpt_oss", "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text",
    "qwen3_5_moe_text", "olmo3", "qwen4_exp", "qwen4_exp_text",
})


_HASHED_FIELDS: dict[type, Callable[[Any], tuple]] = {}


def cached_hash(self) -> int:
    """A frozen dataclass's hash (its hashed fields, as dataclasses hash them), computed once per object: the
    planner's memoized steps hash their inputs on every call, several of them the same request, model and groups,
    nested. `__hash__ = cached_hash` in the class body (a dataclass keeps a __hash__ its body defines)."""
    value = self.__dict__.get("_hash")
    if value is None:
        fields_of = _HASHED_FIELDS.get(type(self))
        if fields_of is None:
            names = [f.name for f in fields(self) if (f.compare if f.hash is None else f.hash)]
            fields_of = _HASHED_FIELDS[type(self)] = attrgetter(*names, *names[:1]) if len(names) == 1 else \
                attrgetter(*names)  # one name: attrgetter would give the value, not a tuple
        value = hash(fields_of(self))
        object.__setattr__(self, "_hash", value)
    return value


@dataclass(frozen=True)
class MambaShape:
    """One recurrent layer's state, before tensor parallelism (vllm/model_executor/layers/mamba/mamba_utils.py
    MambaStateShapeCalculator): `kind` names the calculator, the numbers are its arguments."""

    kind: str  # "mamba1", "mamba2", "gdn", "short_conv", "linear", "cca"
    intermediate: int = 0
    groups: int = 0
    heads: int = 0
    head_dim: int = 0
    state: int = 0
    conv_kernel: int = 0
    k_heads: int = 0
    v_heads: int = 0
    k_dim: int = 0
    v_dim: int = 0


@dataclass(frozen=True)
class ModelFacts:
    name: str
    architecture: str
    model_type: str
    dtype: str  # the dtype vLLM serves the model in ("auto": 16 bit for float32 checkpoints)
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int  # standard attention; MLA: 1 (the latent)
    head_dim: int  # standard: K head size; MLA: kv_lora_rank + qk_rope_head_dim
    v_head_dim: int
    mla: bool
    kinds: tuple[tuple[str, ...], ...]  # per decoder layer, each cache it keeps (Falcon-H1: attention and Mamba)
    window: int | None  # sliding window / attention chunk, in tokens, as vLLM passes it
    indexer_bytes: int  # DeepSeek-V3.2: bytes per token of one layer's indexer cache (0: none)
    # per decoder layer (KV heads, K head size, V head size) where layers differ (Gemma 4's full-attention layers,
    # MiMo-V2's sliding ones), else None
    layer_heads: tuple[tuple[int, int, int], ...] | None
    mamba: MambaShape | None
    ssm_dtype: str | None  # the Mamba temporal state's dtype when the config names one
    mamba_chunk: int  # ModelConfig.get_mamba_chunk_size (0.26 aligns hybrid blocks to it)
    max_model_len: int | None
    multimodal: bool
    sconv: tuple[int, int, int] | None = None  # Inkling: (KV heads, packed head size, kernel) of its conv state
    indexer_tokens: int = 1  # tokens each indexer state covers (GLM-5.3-Flash's kpool: index_kpool)
    ring_bytes: int = 0  # GLM-5.3-Flash's tail ring: bytes per token (K and gate score of index_head_dim, bf16)
    compressed: CompressedAttention | None = None  # DeepSeek-V4: each layer's compress ratio (core/deepseek_v4.py)

    __hash__ = cached_hash  # the planner's memoized steps key on the facts, whose per-layer tuple is long

    @property
    def attention_layers(self) -> int:
        return sum(1 for kinds in self.kinds if any(k in (FULL, SLIDING, CHUNKED, MLA) for k in kinds))


def _int(config: Mapping[str, Any], key: str, name: str, default: int | None = None) -> int:
    value = config.get(key)
    value = default if value is None else value
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelGeometryUnknown(f"{name}: config.json field {key!r} must be a positive integer, got {value!r}")
    return value


def check_config(config: Any, name: str = "model") -> str:
    """What any reading needs first, cheap and before a config class is built: a JSON object within the geometry
    bounds, naming its architecture (returned)."""
    if not isinstance(config, Mapping):
        raise ModelGeometryUnknown(f"{name}: config.json must be a JSON object")
    check_bounds(config, name)
    architectures = config.get("architectures") or []
    architecture = architectures[0] if isinstance(architectures, list) and architectures else None
    if architecture is None:
        raise ModelGeometryUnknown(f"{name}: config.json has no 'architectures' entry")
    if not isinstance(architecture, str):
        raise ModelGeometryUnknown(f"{name}: config.json 'architectures' must list class names (strings), "
                                   f"got {architectures!r}"[:300])
    return architecture


def check_bounds(config: Any, name: str = "model", depth: int = 0) -> None:
    """Refuse a config whose layer count, heads, head size or hidden size no model has (GEOMETRY_BOUNDS), in it
    and in the language model's config a multimodal wrapper nests: one line, before anything is sized or a
    per-layer list expanded."""
    if not isinstance(config, Mapping) or depth > 3:
        return
    for bound, keys in BOUNDED_FIELDS.items():
        limit = GEOMETRY_BOUNDS[bound]
        for key in keys:
            value = config.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > limit:
                shown = str(value) if value < 10**12 else f"about 10**{len(str(value)) - 1}"
                raise ModelGeometryUnknown(f"{name}: config.json field {key!r} is {shown}, beyond any model vLLM "
                                           f"serves (at most {limit:,})")
    for key in TEXT_CONFIG_KEYS:
        check_bounds(config.get(key), name, depth + 1)


def _first(config: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    return next((config[k] for k in keys if config.get(k) is not None), None)


def text_config(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
    """The language model's config of a multimodal wrapper (nested as Qwen2.5-Omni's thinker's is), with the
    wrapper's architectures and dtype, and whether the config describes a multimodal model."""
    multimodal = any(key in config for key in MULTIMODAL_CONFIG_KEYS)
    if config.get("model_type") == "moondream3":
        nested = config.get("config")
        text = nested.get("text") if isinstance(nested, Mapping) else None
        text = text if isinstance(text, Mapping) else {}
        read = {key: text.get(own, default) for key, (own, default) in MOONDREAM3_TEXT.items()}
        keep = {key: config.get(key) for key in ("architectures", "model_type", "dtype", "torch_dtype")}
        return {**keep, **read}, True
    for key in TEXT_CONFIG_KEYS:
        inner = config.get(key)
        if isinstance(inner, Mapping) and inner and "num_hidden_layers" not in config:
            merged = {**inner, "architectures": config.get("architectures")}
            if config.get("mamba_ssm_dtype") is not None:  # the state dtype a user sets on the whole model
                merged["mamba_ssm_dtype"] = config["mamba_ssm_dtype"]
            if merged.get("dtype") is None and merged.get("torch_dtype") is None:
                merged["dtype"] = config.get("dtype") or config.get("torch_dtype")
            if key == "decoder" and inner.get("model_type") == "mbart":
                merged.update({own: inner[theirs] for own, theirs in MBART_DECODER.items()
                               if inner.get(theirs) is not None})
            deeper, _ = text_config(merged)
            return deeper, True
    return _aliased(config), multimodal


def _aliased(config: Mapping[str, Any]) -> Mapping[str, Any]:
    missing = {key: _first(config, names) for key, names in ALIASES.items() if config.get(key) is None}
    found = {key: value for key, value in missing.items() if value is not None}
    return {**config, **found} if found else config


def _dtype(config: Mapping[str, Any], name: str) -> str:
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16").removeprefix("torch.")
    if dtype not in DTYPE_BYTES or dtype.startswith("fp8"):
        raise ModelGeometryUnknown(f"{name}: unsupported dtype {dtype!r}")
    # vLLM's dtype "auto" serves float32 checkpoints in 16 bit (vllm/config/model.py _get_and_verify_dtype)
    return {"float32": "bfloat16", "float": "bfloat16", "half": "float16"}.get(dtype, dtype)


def _attention_geometry(config: Mapping[str, Any], heads: int, name: str) -> tuple[int, int]:
    kv = _first(config, KV_HEAD_KEYS)
    if kv is None and isinstance(config.get("attn_config"), Mapping):
        # vllm/transformers_utils/model_arch_config_convertor.py DbrxModelArchConfigConvertor
        kv = config["attn_config"].get("kv_n_heads")
    if config.get("multi_query") and not config.get("new_decoder_architecture"):  # Falcon-7B: one KV head
        kv = 1
    if kv is None or config.get("multi_query_attention") is False:
        # vllm/model_executor/models/chatglm.py: multi_query_group_num counts only with multi_query_attention
        kv = heads
    if not isinstance(kv, int) or isinstance(kv, bool) or kv <= 0:
        raise ModelGeometryUnknown(f"{name}: KV heads must be a positive integer, got {kv!r} "
                                   f"(config.json {', '.join(KV_HEAD_KEYS)})")
    head_dim = config.get("head_dim") or config.get("attention_head_dim")  # Zamba2: over twice the hidden size
    if head_dim is None or head_dim == 0:
        head_dim = config.get("hidden_size_per_head")
    if head_dim is None:
        hidden = _int(config, "hidden_size", name)
        if hidden % heads:
            raise ModelGeometryUnknown(f"{name}: hidden_size {hidden} is not a multiple of {heads} heads")
        head_dim = hidden // heads
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
        raise ModelGeometryUnknown(f"{name}: head_dim must be a positive integer, got {head_dim!r}")
    return kv, head_dim


def _interleaved_windows(config: Mapping[str, Any], num_layers: int, name: str) -> list[int | None] | None:
    windows = config.get("interleaved_sliding_window")
    if windows is None or isinstance(windows, list) and not windows:
        return None
    if isinstance(windows, int) and not isinstance(windows, bool):
        windows = [windows]
    if not isinstance(windows, list):
        raise ModelGeometryUnknown(f"{name}: interleaved_sliding_window must be a window or a list of them")
    per_layer = [windows[i % len(windows)] for i in range(num_layers)]
    for window in per_layer:
        if window is not None:
            _int({"w": window}, "w", name)
    return per_layer


def _listed_kinds(config: Mapping[str, Any], num_layers: int, name: str) -> list[str] | None:
    for key in ("layer_types", "layers_block_type", "layer_type"):
        listed = config.get(key)
        if isinstance(listed, list) and listed:
            if len(listed) < num_layers:
                raise ModelGeometryUnknown(f"{name}: {key} has {len(listed)} entries for {num_layers} layers")
            unknown = sorted({str(t) for t in listed[:num_layers] if str(t) not in LAYER_TYPE_KINDS})
            if unknown:
                raise ModelGeometryUnknown(f"{name}: {key} {unknown} are not layer kinds Spillway can size")
            return [LAYER_TYPE_KINDS[str(t)] for t in listed[:num_layers]]
    pattern = config.get("hybrid_override_pattern")  # Nemotron-H: M = Mamba2, * = attention, - / E = MLP only
    if isinstance(pattern, str) and pattern:
        if len(pattern) != num_layers:
            raise ModelGeometryUnknown(f"{name}: hybrid_override_pattern has {len(pattern)} layers, not {num_layers}")
        return [{"M": MAMBA, "*": FULL}.get(ch, NONE) for ch in pattern]
    return None


def _layer_kinds(config: Mapping[str, Any], model_type: str, num_layers: int, name: str) -> list[tuple[str, ...]]:
    if model_type == "falcon_h1":  # vllm/model_executor/models/falcon_h1.py: attention and Mamba2 side by side
        return [(FULL, MAMBA)] * num_layers
    if model_type == "jamba":  # vllm/model_executor/models/jamba.py: attention where i % period == offset
        period, offset = _int(config, "attn_layer_period", name, 8), config.get("attn_layer_offset", 4)
        return [(FULL,) if i % period == offset else (MAMBA,) for i in range(num_layers)]
    if model_type == "zaya":
        # vLLM 0.34 zaya.py: a 'hybrid' layer keeps its compressed convolutional attention's history (a MambaSpec,
        # registered first) and full attention, a 'hybrid_sliding' one the history and a sliding window
        kinds = {"hybrid": (MAMBA, FULL), "hybrid_sliding": (MAMBA, SLIDING)}
        types = config.get("layer_types")
        if not isinstance(types, list) or len(types) < num_layers or any(t not in kinds for t in types[:num_layers]):
            raise ModelGeometryUnknown(f"{name}: Zaya's layer_types must name 'hybrid' or 'hybrid_sliding' for each "
                                       f"of {num_layers} layers")
        return [kinds[t] for t in types[:num_layers]]
    if model_type in RECURRENT_ONLY:  # mamba.py, mamba2.py: a mixer and no attention in every layer
        return [(MAMBA,)] * num_layers
    if model_type == "zamba2":
        # vllm/model_executor/models/zamba2.py: every layer a Mamba2 mixer, a 'hybrid' one also the shared attention;
        # the attention layers register first, so vLLM's first group is theirs
        types = config.get("layers_block_type") or []
        if len(types) != num_layers:
            raise ModelGeometryUnknown(f"{name}: layers_block_type has {len(types)} entries for {num_layers} layers")
        hybrid = sum(t == "hybrid" for t in types)
        return [(FULL, MAMBA)] * hybrid + [(MAMBA,)] * (num_layers - hybrid)
    if model_type == "iquest_loopcoder":
        # vllm/model_executor/models/iquest_loopcoder.py: loop_num attentions per layer, the first over the model's
        # cache config, each further one a window of loop_window_size
        if config.get("sliding_window") is not None:
            raise ModelGeometryUnknown(f"{name}: a loop coder with a sliding first loop is not modelled")
        return [(FULL,) + (SLIDING,) * (_int(config, "loop_num", name, 2) - 1)] * num_layers
    if model_type == "hy_v4":
        return [(FULL,)] * num_layers
    if model_type == "step5":
        return _step5_kinds(config, num_layers, name)
    if model_type in KPOOL:
        # glm5next/common/model.py _is_kda_layer: linear_attention layers are Kimi delta attention, the others MLA
        # whose indexer registers its keys and tail ring first (attention.py)
        types = config.get("layer_types")
        if not isinstance(types, list) or len(types) < num_layers:
            raise ModelGeometryUnknown(f"{name}: layer_types needs an entry for each of {num_layers} layers")
        return [(MAMBA,) if t == "linear_attention" else (INDEXER, RING, FULL) for t in types[:num_layers]]
    if model_type == "inkling_model":
        # inkling/nvidia/model.py InklingDecoderLayer: the conv state (registered first), then full attention, or a
        # window of sliding_window_size on the layers local_layer_ids names
        local = set(config.get("local_layer_ids") or ())
        return [(SCONV, SLIDING if i in local else FULL) for i in range(num_layers)]
    if model_type.startswith("minimax_m3"):
        # vllm/models/minimax_m3/nvidia/model.py: a layer sparse_attention_freq marks is MiniMaxM3SparseAttention, its
        # KV and its indexer's keys (read_facts: indexer_bytes); every other layer plain attention
        sparse = config.get("sparse_attention_config")
        freq = sparse.get("sparse_attention_freq") if isinstance(sparse, Mapping) else None
        if freq is None:
            return [(FULL,)] * num_layers
        if not isinstance(freq, list) or len(freq) < num_layers:
            raise ModelGeometryUnknown(f"{name}: sparse_attention_config's sparse_attention_freq needs an entry for "
                                       f"each of {num_layers} layers")
        return [(FULL, INDEXER) if freq[i] else (FULL,) for i in range(num_layers)]
    if model_type == "domyn_edge":
        # vllm/model_executor/models/domyn_edge.py: a layer's window is the first of its window_sizes pair, 0 for
        # global attention
        return [(SLIDING,) if window else (FULL,) for window in _domyn_windows(config, num_layers, name)]
    if model_type == "nemotron_nas":
        groups = _deci_groups(config, num_layers, name)
        if all(group is None for group in groups):
            raise ModelGeometryUnknown(f"{name}: every DeciLM layer's attention is a no-op: no KV cache to offload")
        return [() if group is None else (FULL,) for group in groups]
    if model_type == "kimi_linear":
        # vllm/transformers_utils/configs/kimi_linear.py is_kda_layer: the layers linear_attn_config's kda_layers
        # lists (counting from 1) are Kimi delta attention, the others MLA
        linear = config.get("linear_attn_config")
        kda = linear.get("kda_layers") if isinstance(linear, Mapping) else None
        if linear is not None and not isinstance(kda, list):
            raise ModelGeometryUnknown(f"{name}: linear_attn_config must list its kda_layers")
        return [(MAMBA,) if kda and i + 1 in kda else (FULL,) for i in range(num_layers)]
    if model_type == "bailing_hybrid" and _architecture(config) == LING_LINEAR:
        # bailing_moe_linear.py is_linear_layer: every layer_group_size-th layer (absent: 1) is (MLA) attention, the
        # others linear attention
        group = _int(config, "layer_group_size", name, 1)
        return [(FULL,) if (i + 1) % group == 0 else (MAMBA,) for i in range(num_layers)]
    if model_type == "bailing_hybrid":
        # bailing_moe_v3.py _is_kda_layer: every layer_group_size-th layer, and those past the last whole group, are
        # (MLA) attention, the others Kimi delta attention; layer_types is not read
        group = _int(config, "layer_group_size", name)
        last = num_layers // group * group
        return [(FULL,) if (i + 1) % group == 0 or i >= last else (MAMBA,) for i in range(num_layers)]
    if model_type in SWA_HEADS:
        pattern = config.get("hybrid_layer_pattern")
        if not isinstance(pattern, list) or len(pattern) < num_layers:
            raise ModelGeometryUnknown(f"{name}: hybrid_layer_pattern needs an entry for each of {num_layers} layers")
        return [(SLIDING,) if kind == 1 else (FULL,) for kind in pattern[:num_layers]]
    windows = _interleaved_windows(config, num_layers, name) if model_type in INTERLEAVED_WINDOWS else None
    if windows is not None:
        listed = config["interleaved_sliding_window"]
        if model_type == "plamo3" and (not isinstance(listed, list) or len(listed) < num_layers):
            # plamo3.py indexes the list by layer: an entry per layer
            raise ModelGeometryUnknown(f"{name}: interleaved_sliding_window needs an entry for each of {num_layers} "
                                       "layers")
        return [(FULL,) if window is None else (SLIDING,) for window in windows]
    if model_type in ("llama4", "llama4_text"):
        # vllm/model_executor/models/llama4.py reads no_rope_layers (transformers' Llama4TextConfig fills it), not
        # layer_types: a layer with RoPE is chunked-local where attention_chunk_size is set, a NoPE layer global.
        no_rope = config.get("no_rope_layers")
        if not config.get("attention_chunk_size"):
            return [(FULL,)] * num_layers
        if not isinstance(no_rope, list) or len(no_rope) < num_layers:
            raise ModelGeometryUnknown(f"{name}: no_rope_layers needs an entry for each of {num_layers} layers")
        return [(CHUNKED,) if no_rope[i] else (FULL,) for i in range(num_layers)]
    types = config.get("layer_types")
    if isinstance(types, list) and "indexed_attention" in types and model_type.startswith("qwen4_exp"):
        # vllm/models/qwen4_exp/nvidia/model.py: an indexed layer without the QSA indexer (indexer_n_heads unset) is
        # Qwen3-Next's full attention; with it, QSA keeps a compressed-key and a ring cache beside its KV, and a
        # PLE layer a short-convolution state beside its gated delta-net
        if config.get("indexer_n_heads") is not None:
            raise ModelGeometryUnknown(f"{name}: Qwen4-Exp's QSA indexer (indexer_n_heads) keeps compressed-key and "
                                       "ring caches Spillway does not model")
        if config.get("ple_layer_ids"):
            raise ModelGeometryUnknown(f"{name}: Qwen4-Exp's per-layer embeddings (ple_layer_ids) keep a "
                                       "convolution state Spillway does not model")
    elif isinstance(types, list) and "indexed_attention" in types:
        # vllm/models/deepseek_v32/attention.py: every layer's indexer keeps keys unless index_topk_freq or
        # index_topk_pattern skips it; indexed attention elsewhere (Qwen4-Exp's) is not this cache
        if not (model_type in MLA_MODEL_TYPES and config.get("kv_lora_rank") is not None
                and config.get("index_head_dim")):
            raise ModelGeometryUnknown(f"{name}: indexed attention outside DeepSeek-V3.2-style sparse MLA keeps "
                                       "caches Spillway does not model")
        if config.get("index_topk_pattern") or (config.get("index_topk_freq") or 1) != 1:
            raise ModelGeometryUnknown(f"{name}: an indexer on some layers only (index_topk_freq, "
                                       "index_topk_pattern) is not modelled")
    listed = _listed_kinds(config, num_layers, name)
    if listed is not None and model_type in ("gemma3n", "gemma3n_text"):
        # vllm/model_executor/models/gemma3n.py: the last num_kv_shared_layers layers read the KV of an earlier
        # layer of their kind (kv_sharing_target_layer_name) and keep no cache of their own
        first_shared = num_layers - (config.get("num_kv_shared_layers") or 0)
        return [(kind,) if kind and i < first_shared else () for i, kind in enumerate(listed)]
    if listed is not None and model_type == "dory":
        # vllm/model_executor/models/dory.py: in recurrent_kv_cache_mode "per_loop" each of the n_recurrent_layers
        # after the n_input_layers keeps one cache per loop (n_recurrent_loops attentions of its kind)
        loops = _int(config, "n_recurrent_loops", name, 1) if config.get("recurrent_kv_cache_mode") == "per_loop" else 1
        first = config.get("n_input_layers") or 0
        recurrent = range(first, first + (config.get("n_recurrent_layers") or 0))
        return [(kind,) * (loops if i in recurrent else 1) if kind else () for i, kind in enumerate(listed)]
    if listed is not None and model_type == "rnj1":
        # vllm/model_executor/models/rnj1.py: a chunked layer attends its chunk and one before it, which vLLM keeps as
        # a sliding window of config.sliding_window (per_layer_sliding_window with chunk_lookback 1)
        return [((SLIDING,) if kind == CHUNKED else (kind,)) if kind else () for kind in listed]
    if listed is not None:
        return [(kind,) if kind else () for kind in listed]
    if model_type in FILLED_LAYER_TYPES:
        raise ModelGeometryUnknown(f"{name}: config.json of model_type {model_type!r} without layer_types, which "
                                   "transformers' config class fills and vLLM reads: fill it as vLLM does "
                                   "(spillway.adapters.model_config.filled_config)")
    window = config.get("sliding_window")
    if window and config.get("use_sliding_window", True) is not False:
        return [(SLIDING,)] * num_layers  # Mistral v0.1-style: every layer keeps a window
    return [(FULL,)] * num_layers


# vllm/models/step5/nvidia: the CSA summary keeps one 256-byte state per eight-token region (Step5SparseSummaryCache),
# and the DSA backend's pages tile eight-token kernel blocks (block_stride_alignment MultipleOf(8))
STEP5_SUMMARY_BYTES, STEP5_REGION = 256, 8


def _step5_kinds(config: Mapping[str, Any], num_layers: int, name: str) -> list[tuple[str, ...]]:
    """step5/nvidia/config.py, model.py: with a sparse_config every full-attention layer is DSA: its KV, the CSA
    summary (an indexer-like cache) and the CSA tail ring. Without one vLLM refuses the checkpoint."""
    sparse = config.get("sparse_config")
    if sparse is None:
        raise ModelGeometryUnknown(f"{name}: vLLM refuses it: Step5 requires a checkpoint with a sparse_config "
                                   "section; dense-only checkpoints are not supported (vllm/models/step5/nvidia)")
    if not isinstance(sparse, Mapping) or sparse.get("enabled") is False:
        raise ModelGeometryUnknown(f"{name}: Step5 with its sparse_config disabled is not modelled")
    types = config.get("layer_types") or ["full_attention"] * num_layers
    applied = sparse.get("apply_to_layer_types") or ["full_attention"]
    if len(types) < num_layers or any(t != "full_attention" or t not in applied for t in types[:num_layers]):
        raise ModelGeometryUnknown(f"{name}: Step5 layers other than DSA full attention are not modelled")
    return [(FULL, INDEXER, RING)] * num_layers


def _domyn_windows(config: Mapping[str, Any], num_layers: int, name: str) -> list[int]:
    pairs = config.get("window_sizes")
    if not isinstance(pairs, list) or len(pairs) < num_layers or not all(
            isinstance(p, list) and p and isinstance(p[0], int) and not isinstance(p[0], bool) and p[0] >= 0
            for p in pairs[:num_layers]):
        raise ModelGeometryUnknown(f"{name}: DomynEdge's window_sizes needs a (window, 0) pair for each of "
                                   f"{num_layers} layers")
    return [p[0] for p in pairs[:num_layers]]


def _mamba_shape(config: Mapping[str, Any], model_type: str, name: str) -> MambaShape:
    def get(*keys: str, default: int | None = None) -> int:
        return _int(config, next((k for k in keys if config.get(k) is not None), keys[0]), name, default)

    hidden = config.get("hidden_size") or 0
    # olmo_hybrid.py and Qwen4-Exp size their gated delta-net state with the same calculator and fields as Qwen3-Next
    if model_type.startswith(("qwen3_next", "qwen3_5", "qwen4_exp", "olmo_hybrid")):
        return MambaShape("gdn", conv_kernel=get("linear_conv_kernel_dim", default=4),
                          k_heads=get("linear_num_key_heads"), v_heads=get("linear_num_value_heads"),
                          k_dim=get("linear_key_head_dim"), v_dim=get("linear_value_head_dim"))
    if model_type == "bailing_hybrid" and _architecture(config) == LING_LINEAR:
        # bailing_moe_linear.py: linear_attention_state_shape, one head_dim x head_dim state per attention head in the
        # model's dtype (linear_attention_state_dtype under "auto"); head_dim absent: hidden_size // heads
        heads = get("num_attention_heads")
        head_dim = config.get("head_dim") or _int(config, "hidden_size", name) // heads
        return MambaShape("linear", heads=heads, head_dim=head_dim)
    if model_type == "kimi_linear":
        # kimi_k3/nvidia/model.py get_mamba_state_shape_from_config: kda_state_shape over linear_attn_config's
        # num_heads heads of head_dim, its short_conv_kernel_size
        linear = config["linear_attn_config"]
        heads, dim = _int(linear, "num_heads", name), _int(linear, "head_dim", name)
        return MambaShape("gdn", conv_kernel=_int(linear, "short_conv_kernel_size", name), k_heads=heads,
                          v_heads=heads, k_dim=dim, v_dim=dim)
    if model_type in KDA_STATE:
        # get_mamba_state_shape_from_config: kda_state_shape, the gated delta-net calculator's arithmetic with key and
        # value heads alike; alice_ai.py over linear_num_key_heads heads of linear_key_head_dim (it requires value
        # heads to match), bailing_moe_v3.py over num_attention_heads heads of head_dim
        if model_type == "alice_ai":
            heads, dim, kernel = get("linear_num_key_heads"), get("linear_key_head_dim"), get("linear_conv_kernel_dim")
        elif model_type in KPOOL:  # glm5next/common/kda.py: linear_num_heads heads of linear_head_dim
            heads, dim, kernel = get("linear_num_heads"), get("linear_head_dim"), get("linear_conv_kernel_dim")
        else:
            heads, dim, kernel = get("num_attention_heads"), get("head_dim"), get("short_conv_kernel_size")
        return MambaShape("gdn", conv_kernel=kernel, k_heads=heads, v_heads=heads, k_dim=dim, v_dim=dim)
    if model_type == "zaya":
        # zaya.py _cca_state_shapes: the q/k projections' raw history of cca_time0 + cca_time1 - 2 steps over every
        # query and KV head, and half a value of each KV head from the previous token; short_conv_state_dtype (the
        # model's dtype); not split over TP (the shapes take no TP size: the spec is tp_replicated)
        heads, kv = get("num_attention_heads"), get("num_key_value_heads")
        history = get("cca_time0", default=2) + get("cca_time1", default=2) - 2
        return MambaShape("cca", heads=heads + kv, head_dim=get("head_dim"), conv_kernel=history, v_heads=kv)
    if model_type in ("lfm2", "lfm2_moe", "lfm3"):
        # lfm2.py / lfm2_moe.py / lfm3.py (vLLM 0.34) get_mamba_state_shape_from_config: short_conv_state_shape over
        # conv_dim (LFM2-MoE, LFM3: hidden_size) channels and conv_L_cache taps
        channels = get("conv_dim") if model_type == "lfm2" else get("hidden_size")
        return MambaShape("short_conv", intermediate=channels, conv_kernel=get("conv_L_cache"))
    if model_type in ("jamba", "mamba", "falcon_mamba"):
        # mamba.py serves FalconMamba too (its MambaConfig-shaped config: intermediate_size, state_size, conv_kernel)
        intermediate = config.get("intermediate_size") if model_type != "jamba" else None
        intermediate = intermediate or get("mamba_expand", default=2) * hidden
        return MambaShape("mamba1", intermediate=intermediate, state=get("mamba_d_state", "state_size", default=16),
                          conv_kernel=get("mamba_d_conv", "conv_kernel", default=4))
    if model_type in ("granitemoehybrid", "nemotron_h", "bamba", "falcon_h1", "mamba2", "zamba2"):
        heads = get("mamba_n_heads", "mamba_num_heads", "n_mamba_heads", "num_heads")
        head_dim = get("mamba_d_head", "mamba_head_dim", "mamba_headdim", "head_dim")
        intermediate = heads * head_dim
        if model_type == "falcon_h1" and config.get("mamba_d_ssm"):
            intermediate = config["mamba_d_ssm"]
        return MambaShape("mamba2", intermediate=intermediate, heads=heads, head_dim=head_dim,
                          groups=get("mamba_n_groups", "n_groups", "mamba_ngroups"),
                          state=get("mamba_d_state", "ssm_state_size", "state_size"),
                          conv_kernel=get("mamba_d_conv", "conv_kernel"))
    raise ModelGeometryUnknown(f"{name}: model_type {model_type!r} has recurrent layers whose state Spillway does "
                               "not model")


def _layer_heads(config: Mapping[str, Any], kinds: list[tuple[str, ...]], kv_heads: int, head_dim: int,
                 name: str) -> tuple[tuple[int, int], ...] | None:
    if config.get("num_kv_shared_layers"):
        # gemma4.py, as gemma3n.py: the last layers read an earlier layer's KV; not written for Gemma 4 here
        raise ModelGeometryUnknown(f"{name}: Gemma 4 layers sharing another layer's KV (num_kv_shared_layers) are "
                                   "not modelled")
    overrides = config.get("per_layer_config")
    if overrides is None:
        # transformers' Gemma4TextConfig.__post_init__: the full-attention layers take global_head_dim, and
        # num_global_key_value_heads where attention_k_eq_v (absent: true) and it is set
        override: dict[str, Any] = {"head_dim": config.get("global_head_dim") or 512}
        if config.get("attention_k_eq_v", True) and config.get("num_global_key_value_heads") is not None:
            override["num_key_value_heads"] = config["num_global_key_value_heads"]
        overrides = {i: override for i, layer in enumerate(kinds) if layer == (FULL,)}
    if not isinstance(overrides, Mapping):
        raise ModelGeometryUnknown(f"{name}: config.json field 'per_layer_config' must map layers to fields")
    out = [(kv_heads, head_dim, head_dim)] * len(kinds)
    for key, fields_ in overrides.items():
        index = int(key) if str(key).isdigit() else -1  # transformers writes the keys zero-padded ("05")
        if not 0 <= index < len(kinds) or not isinstance(fields_, Mapping):
            raise ModelGeometryUnknown(f"{name}: per_layer_config entry {key!r} names no layer of {len(kinds)}")
        heads, size = _int(fields_, "num_key_value_heads", name, kv_heads), _int(fields_, "head_dim", name, head_dim)
        out[index] = (heads, size, size)
    return tuple(out) if len(set(out)) > 1 else None


def _deci_groups(config: Mapping[str, Any], num_layers: int, name: str) -> list[int | None]:
    """nemotron_nas.py DeciLMDecoderLayer: each layer's block_configs entry; None where its attention is a no-op
    (no attention, no cache), else its n_heads_in_group (its KV heads: num_attention_heads // that)."""
    blocks = config.get("block_configs")
    if not isinstance(blocks, list) or len(blocks) < num_layers:
        raise ModelGeometryUnknown(f"{name}: DeciLM's block_configs must hold an entry for each of {num_layers} layers")
    out: list[int | None] = []
    for block in blocks[:num_layers]:
        attention = block.get("attention") if isinstance(block, Mapping) else None
        if not isinstance(attention, Mapping):
            raise ModelGeometryUnknown(f"{name}: a block_configs entry without its attention block")
        out.append(None if attention.get("no_op") else _int(attention, "n_heads_in_group", name))
    return out


def _deci_heads(config: Mapping[str, Any], kinds: list[tuple[str, ...]], heads: int, head_dim: int,
                name: str) -> tuple[int, tuple[tuple[int, int, int], ...] | None]:
    """DeciLM's KV heads: vLLM's NemotronNasModelArchConfigConvertor takes the first attention layer's as the
    model's, and each attention layer builds its own (heads // n_heads_in_group); Attention asserts the ratio."""
    per_layer = []
    for group in _deci_groups(config, len(kinds), name):
        kv_heads = heads // group if group is not None else 0
        if group is not None and (kv_heads == 0 or heads % kv_heads):
            raise ModelGeometryUnknown(f"{name}: vLLM refuses it: num_heads ({heads}) is not divisible by "
                                       f"num_kv_heads ({kv_heads}) (n_heads_in_group {group})")
        per_layer.append((kv_heads or 1, head_dim, head_dim))
    attention = [h for h, layer in zip(per_layer, kinds, strict=True) if layer]  # one at least (_layer_kinds)
    out = tuple(per_layer)
    return attention[0][0], out if len({h for h in attention}) > 1 else None


def _swa_heads(config: Mapping[str, Any], kinds: list[tuple[str, ...]], full: tuple[int, int, int],
               name: str) -> tuple[tuple[int, int, int], ...] | None:
    """mimo_v2.py: the sliding layers' own KV heads, K and V head sizes (swa_*; V absent: K's size)."""
    k_dim = _int(config, "swa_head_dim", name)
    swa = (_int(config, "swa_num_key_value_heads", name), k_dim, _int(config, "swa_v_head_dim", name, k_dim))
    out = tuple(swa if layer == (SLIDING,) else full for layer in kinds)
    return out if len(set(out)) > 1 else None


def _hy_v4_indexed(config: Mapping[str, Any], num_layers: int, name: str) -> bool:
    """Whether every HY-V4 layer keeps an indexer cache (False: none does); a schedule of some is refused."""
    types = config.get("layer_types") or []
    sparse = {i for i in range(num_layers) if i < len(types) and types[i] in HY_V4_SPARSE}
    if "index_topk" not in config or not sparse:
        return False
    shared = config.get("indexer_types")
    skipped = isinstance(shared, list) and "shared" in shared
    skipped = skipped or (config.get("index_topk_freq") or 1) != 1 or config.get("index_topk_pattern") is not None
    if len(sparse) == num_layers and not skipped:
        return True
    raise ModelGeometryUnknown(f"{name}: HY-V4 indexer caches on some layers only (layer_types, indexer_types, "
                               "index_topk_freq) are not modelled")


# vllm/transformers_utils/model_arch_config_convertor.py derive_max_model_len_and_key: the smallest of these the
# config carries (model_max_length, where set, wins)
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# vllm/config/model.py _get_and_verify_max_len: RoPE types whose max_position_embeddings is already scaled
SCALED_ROPE = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})


def _rope_parameters(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """vLLM's iter_rope_parameters: one dict per layer type where nested (rope_scaling: the name before
    transformers 5, which vLLM's patch_rope_parameters renames)."""
    params = config.get("rope_parameters")
    if not isinstance(params, Mapping) or not params:
        params = config.get("rope_scaling")
    if not isinstance(params, Mapping) or not params:
        return []
    if all(isinstance(v, Mapping) for v in params.values()):
        return [p for p in params.values() if p]
    return [params]


def _max_model_len(config: Mapping[str, Any], model_type: str) -> int | None:
    """The max_model_len vLLM derives when none is given (vllm/config/model.py _get_and_verify_max_len): the
    smallest length key, times the RoPE factor of a scaling type that leaves it unscaled (not Gemma 3's, already
    scaled); with LongRoPE, original_max_position_embeddings. None: the config names no length."""
    lengths = [v for k in MAX_LEN_KEYS if isinstance(v := config.get(k), (int, float)) and not isinstance(v, bool)]
    derived: float | None = min(lengths) if lengths else None
    if isinstance(config.get("model_max_length"), (int, float)) and config["model_max_length"]:
        derived = config["model_max_length"]
    if derived is None or derived <= 0:
        return None
    rope = _rope_parameters(config)
    if rope and "gemma3" not in model_type:
        factor = 1.0
        for params in rope:
            kind = params.get("rope_type") or params.get("type")
            if kind not in SCALED_ROPE:
                factor = params.get("factor", factor)
        derived *= factor if isinstance(factor, (int, float)) and factor else 1.0
    if any((p.get("rope_type") or p.get("type")) == "longrope" for p in rope):
        original = config.get("original_max_position_embeddings")
        derived = original if isinstance(original, (int, float)) and original > 0 else derived
    length = int(derived)
    return length if 0 < length < 1 << 40 else None


def _architecture(config: Mapping[str, Any]) -> str | None:
    architectures = config.get("architectures")
    return architectures[0] if isinstance(architectures, list) and architectures else None


def _mla(config: Mapping[str, Any], model_type: str) -> bool:
    if model_type == "hy_v4" or _architecture(config) in MLA_ARCHITECTURES:
        return True
    return model_type in MLA_MODEL_TYPES and config.get("kv_lora_rank") is not None


def _mistral_large_4_modelled(config: Mapping[str, Any], name: str) -> None:
    """vLLM 0.34's Mistral Large 4 (vllm/models/mistral/common/layer_spec.py): every layer keeps its MLA latent and,
    with index_topk, its indexer's keys, as DeepSeek-V3.2's do. Layers that read an earlier layer's latent
    (kv_source_layers) or its top-k (index_sharing "shared") keep none, and fp8_kv_cache turns the latent into
    fp8_ds_mla rows (vllm/model_executor/models/config.py MistralLarge4ForCausalLM): neither is modelled."""
    layers = config.get("num_hidden_layers")
    sources = config.get("kv_source_layers")
    if sources is not None and isinstance(layers, int) and list(sources) != list(range(layers)):
        raise ModelGeometryUnknown(f"{name}: Mistral Large 4's KV-sharing layers (kv_source_layers) keep no cache "
                                   "of their own; Spillway does not model them")
    if "shared" in (config.get("index_sharing") or []):
        raise ModelGeometryUnknown(f"{name}: Mistral Large 4's shared indexers (index_sharing) keep no keys of "
                                   "their own; Spillway does not model them")
    if config.get("fp8_kv_cache"):
        raise ModelGeometryUnknown(f"{name}: Mistral Large 4's fp8 latent (fp8_kv_cache: fp8_ds_mla rows) is not "
                                   "modelled")


def _deepseek_v4_facts(text: Mapping[str, Any], architecture: str, name: str, multimodal: bool) -> ModelFacts:
    """DeepSeek-V4 (vllm/models/deepseek_v4): an MLA model (is_deepseek_mla: its head_dim is the latent, one KV head on
    every rank) whose layers keep the caches core/deepseek_v4.py describes, by each layer's compress ratio."""
    num_layers = _int(text, "num_hidden_layers", name)
    ratios = read_ratios(text, num_layers, name)
    compressed = CompressedAttention(ratios, _int(text, "index_head_dim", name) if INDEXED_RATIO in ratios else 0)
    # descriptive only: the caches are built from the ratios (groups.py); a window, the compressed latent and its
    # compressor's state, the indexer's keys on a ratio-4 layer
    kinds = [(SLIDING,) if r == 1 else (INDEXER, SLIDING, MLA) if r == 4 else (SLIDING, MLA)
             for r in compressed.ratios]
    return ModelFacts(name, architecture, DEEPSEEK_V4, _dtype(text, name), num_layers,
                      _int(text, "num_attention_heads", name), 1, _int(text, "head_dim", name), 0, True, tuple(kinds),
                      _int(text, "sliding_window", name), compressed.index_key_bytes if compressed.index_head_dim else 0,
                      None, None, None, 2048, _max_model_len(text, DEEPSEEK_V4), multimodal, compressed=compressed)


def _deepseek_v41_facts(text: Mapping[str, Any], architecture: str, name: str, multimodal: bool) -> ModelFacts:
    """DeepSeek-V4.1 (vllm/models/deepseek_v41): DeepSeek-V4's MLA and caches, kept by kv-sharing groups: every layer
    its window, a kv source (compress ratio 1 or 2) the compressed latent, the indexer's keys and, at ratio 2, its
    compressor's ring; the layers after it read the source's (core/deepseek_v4.py read_v41_topology)."""
    num_layers = _int(text, "num_hidden_layers", name)
    ratios, sources = read_v41_topology(text, num_layers, name)
    compressed = CompressedAttention(ratios, _int(text, "index_head_dim", name) if any(sources) else 0, sources)
    # descriptive only: groups.py builds the caches from the topology
    kinds = [(MLA, INDEXER, SLIDING, RING) if s and r == RING_RATIO else (MLA, INDEXER, SLIDING) if s else (SLIDING,)
             for r, s in zip(ratios, sources)]
    return ModelFacts(name, architecture, V41_MODEL_TYPE, _dtype(text, name), num_layers,
                      _int(text, "num_attention_heads", name), 1, _int(text, "head_dim", name), 0, True, tuple(kinds),
                      _int(text, "sliding_window", name), compressed.index_key_bytes if compressed.index_head_dim else 0,
                      None, None, None, 2048, _max_model_len(text, V41_MODEL_TYPE), multimodal, compressed=compressed)


def read_facts(config: Mapping[str, Any], name: str = "model") -> ModelFacts:
    """The facts of a config.json mapping, or ModelGeometryUnknown saying what is missing or impossible."""
    architecture = check_config(config, name)
    text, multimodal = text_config(config)
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    if model_type == V41_MODEL_TYPE:
        refuse_v41_defaults(text, name)
        return _deepseek_v41_facts(text, architecture, name, multimodal)
    if model_type in UNMODELLED:
        raise ModelGeometryUnknown(f"{name}: model_type {model_type!r} keeps a cache Spillway does not model yet: "
                                   f"{UNMODELLED[model_type]}")
    if model_type == "mistral_large_4":
        _mistral_large_4_modelled(text, name)
    if model_type == DEEPSEEK_V4:
        return _deepseek_v4_facts(text, architecture, name, multimodal)
    if text.get("num_hidden_layers") is None and model_type == "nemotron_h" and text.get("layers_block_type"):
        # transformers' NemotronHConfig.num_hidden_layers is the length of its layers_block_type
        text = {**text, "num_hidden_layers": len(text["layers_block_type"])}
    num_layers = _int(text, "num_hidden_layers", name) * ATTENTIONS_PER_LAYER.get(model_type, 1)
    dtype = _dtype(text, name)
    kinds = _layer_kinds(text, model_type, num_layers, name)
    flat = {kind for layer in kinds for kind in layer}
    mla = _mla(text, model_type)
    attention = flat & {FULL, SLIDING, CHUNKED}
    heads = _int(text, "num_attention_heads", name) if attention or mla else (text.get("num_attention_heads") or 0)
    kv_heads, head_dim, v_head_dim = 1, 0, 0
    if mla:
        # GLM-5.3-Flash's latent is NoPE (mla_use_nope, qk_rope_head_dim 0)
        latent = _int(text, "kv_lora_rank", name)
        head_dim = latent + ((text.get("qk_rope_head_dim") or 0) if model_type in KPOOL else
                             _int(text, "qk_rope_head_dim", name))
        kinds = [tuple(MLA if k == FULL else k for k in layer) for layer in kinds]
        if model_type == "dots3_note":
            # vllm/models/dots3_note/nvidia/model.py: the sliding layers' own MLA latent (swa_*), and the sparse
            # layers' latent padded to its rows (Dots3NotePaddedMLAAttention physical_head_size)
            head_dim = _int(text, "swa_kv_lora_rank", name) + _int(text, "swa_qk_rope_head_dim", name)
    elif attention and model_type == "minicpm3":
        # vllm/model_executor/models/minicpm3.py: Attention(heads, qk_nope + qk_rope, num_kv_heads=heads), its V
        # padded to that head size
        kv_heads, head_dim = heads, _int(text, "qk_nope_head_dim", name) + _int(text, "qk_rope_head_dim", name)
        v_head_dim = head_dim
    elif attention and model_type == "nemotron_nas":
        _, head_dim = _attention_geometry(text, heads, name)  # llama.py LlamaAttention's: the KV heads are DeciLM's
        v_head_dim = head_dim
        kv_heads, deci_heads = _deci_heads(text, kinds, heads, head_dim, name)
    elif attention:
        kv_heads, head_dim = _attention_geometry(text, heads, name)
        if heads % kv_heads:
            # vllm/model_executor/layers/attention/attention.py Attention.__init__ asserts it
            raise ModelGeometryUnknown(f"{name}: vLLM refuses it: num_heads ({heads}) is not divisible by "
                                       f"num_kv_heads ({kv_heads})")
        v_head_dim = _int(text, "v_head_dim", name, head_dim) if model_type in SWA_HEADS else head_dim
    window = None
    if SLIDING in flat and model_type == "iquest_loopcoder":
        window = _int(text, "loop_window_size", name, 64)
    elif SLIDING in flat and model_type in SWA_HEADS:
        window = _int(text, "sliding_window_size", name)
    elif SLIDING in flat and model_type == "inkling_model":
        if (text.get("swa_num_key_value_heads") or kv_heads, text.get("swa_head_dim") or head_dim) != (kv_heads,
                                                                                                        head_dim):
            raise ModelGeometryUnknown(f"{name}: Inkling's local layers with heads of their own (swa_*) are not "
                                       "modelled")
        window = _int(text, "sliding_window_size", name)
    elif SLIDING in flat and model_type == "domyn_edge":
        # "HF window (w, 0) attends to w+1 keys; vLLM's window counts all keys"
        distinct = {w + 1 for w in _domyn_windows(text, num_layers, name) if w}
        if len(distinct) != 1:
            raise ModelGeometryUnknown(f"{name}: sliding layers of different windows {sorted(distinct)} are not "
                                       "modelled")
        window = distinct.pop()
    elif SLIDING in flat and model_type in INTERLEAVED_WINDOWS:
        distinct = {w for w in _interleaved_windows(text, num_layers, name) or () if w is not None}
        if len(distinct) != 1:
            raise ModelGeometryUnknown(f"{name}: sliding layers of different windows {sorted(distinct)} are not "
                                       "modelled")
        window = distinct.pop()
    elif SLIDING in flat:
        window = _int(text, WINDOW_FIELD.get(model_type, "sliding_window"), name) + WINDOW_OFFSET.get(model_type, 0)
    elif CHUNKED in flat:
        window = _int(text, "attention_chunk_size", name)
    indexer = 0
    if mla and text.get("index_head_dim") and (model_type != "hy_v4" or _hy_v4_indexed(text, num_layers, name)):
        # vllm/model_executor/models/deepseek_v2.py DeepseekV32IndexerCache: fp8 keys plus a 4-byte scale per
        # 128-element quantization block, stored as uint8
        index_dim = _int(text, "index_head_dim", name)
        indexer = index_dim + index_dim // 128 * 4
    indexer_tokens, ring_bytes = 1, 0
    if INDEXER in flat and model_type in KPOOL:
        # Glm5NextIndexerCache: DeepSeek-V3.2's fp8 keys and scales, one state per index_kpool tokens
        indexer_tokens = _int(text, "index_kpool", name)
        ring_bytes = 2 * _int(text, "index_head_dim", name) * DTYPE_BYTES["bfloat16"]
    if INDEXER in flat and model_type == "step5":
        indexer = STEP5_SUMMARY_BYTES // STEP5_REGION  # uint8 summaries: the KV cache dtype does not apply
    if INDEXER in flat and model_type.startswith("minimax_m3"):
        # vllm/models/minimax_m3/common/indexer.py MiniMaxM3IndexerCache: one sparse_index_dim key per token, bf16
        # (the indexer's dtype under --attention-config's "auto"), on every rank
        indexer = _int(text["sparse_attention_config"], "sparse_index_dim", name) * DTYPE_BYTES["bfloat16"]
    mamba = _mamba_shape(text, model_type, name) if MAMBA in flat else None
    ssm_dtype = text.get("mamba_ssm_dtype") or text.get("mamba_ssm_cache_dtype")
    if ssm_dtype is None and model_type == "nemotron_h":
        ssm_dtype = "float32"  # vllm/model_executor/models/config.py: NemotronH keeps its SSM state in float32
    if ssm_dtype is None and model_type == "kimi_linear":
        ssm_dtype = "float32"  # kda_state_dtype with the SSM dtype at "auto": the recurrent state in float32
    if model_type in KDA_STATE and _architecture(text) != LING_LINEAR:
        # alice_ai.py, bailing_moe_v3.py: kda_state_dtype(model dtype, mamba_cache_dtype), its SSM dtype left at
        # "auto": the recurrent state in float32 whatever the config or the user asks
        ssm_dtype = "float32"
    max_len = _max_model_len(text, str(config.get("model_type") or model_type))
    chunk = int(text.get("mamba_chunk_size") or text.get("chunk_size") or 2048)
    layer_heads = None
    if model_type == "nemotron_nas" and attention:
        layer_heads = deci_heads
    elif model_type in PER_LAYER_HEADS:
        layer_heads = _layer_heads(text, kinds, kv_heads, head_dim, name)
    elif model_type == "domyn_edge" and text.get("per_layer_config"):
        # domyn_edge.py takes each layer's head_dim from transformers' per_layer_config overrides; layers of
        # different head sizes (different pages within a kind) are not modelled
        if not isinstance(text["per_layer_config"], Mapping) or any(
                not isinstance(o, Mapping) or set(o) & {"head_dim", "num_key_value_heads"}
                for o in text["per_layer_config"].values()):
            raise ModelGeometryUnknown(f"{name}: DomynEdge layers with their own head_dim or KV heads "
                                       "(per_layer_config) are not modelled")
    elif model_type in SWA_HEADS and SLIDING in flat:
        layer_heads = _swa_heads(text, kinds, (kv_heads, head_dim, v_head_dim), name)
    sconv = None
    if SCONV in flat:
        # InklingConvState: per KV head K, V and an attention- and an MLP-output chunk of hidden_size // KV heads,
        # padded to a power of two; bf16 (the model's dtype, which it asserts)
        raw = 2 * head_dim + 2 * (_int(text, "hidden_size", name) // kv_heads)
        sconv = (kv_heads, 1 << (raw - 1).bit_length(), _int(text, "sconv_kernel_size", name, 4))
    return ModelFacts(name, architecture, model_type, dtype, num_layers, heads, kv_heads, head_dim, v_head_dim,
                      mla, tuple(kinds), window, indexer, layer_heads, mamba, str(ssm_dtype) if ssm_dtype else None, chunk,
                      max_len, multimodal, sconv, indexer_tokens, ring_bytes)
