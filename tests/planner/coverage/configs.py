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
from pathlib import Path

REGISTRY_PATH = "vllm/model_executor/models/registry.py"
REGISTRIES = {"_TEXT_GENERATION_MODELS": "text-generation", "_MULTIMODAL_MODELS": "multimodal"}

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
    "AfmoeForCausalLM": {"score_func": "sigmoid"},  # arcee-ai/Trinity (AFMoE): sigmoid routing
    "Glm4MoeForCausalLM": {"head_dim": 128},  # zai-org/GLM-4.5
    "Glm4MoeLiteForCausalLM": {"first_k_dense_replace": 1},  # zai-org/GLM-4.7-Flash
    "HYV3ForCausalLM": {"first_k_dense_replace": 1},
    "ChatGLMModel": {"original_rope": True},  # zai-org/chatglm3-6b
    "ChatGLMForConditionalGeneration": {"original_rope": True},
    "NemotronForCausalLM": {"num_key_value_heads": 8},  # nvidia/Minitron-8B-Base
    "LongcatFlashForCausalLM": {"mla_scale_q_lora": True, "mla_scale_kv_lora": True},  # meituan-longcat
    "MiniCPMForCausalLM": {"dim_model_base": 256, "scale_emb": 12, "scale_depth": 1.4},  # openbmb/MiniCPM-2B
    "ExaoneForCausalLM": {"activation_function": "silu"},  # LGAI-EXAONE/EXAONE-3.0-7.8B-Instruct
}

TEXT_PATCHES: dict[str, dict] = {
    "Glm4vMoeForConditionalGeneration": {"text_config": {"head_dim": 128}},  # zai-org/GLM-4.5V
    "Qwen3VLMoeForConditionalGeneration": {"text_config": {"norm_topk_prob": True}},  # Qwen/Qwen3-VL-30B-A3B
}


def registry_architectures(tree: str) -> dict[str, tuple[str, str]]:
    """architecture -> (registry, module) of vLLM's text-generation and multimodal registries, read unimported."""
    module = ast.parse((Path(tree) / REGISTRY_PATH).read_text())
    out: dict[str, tuple[str, str]] = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in REGISTRIES:
            for arch, (mod, _cls) in ast.literal_eval(node.value).items():
                out[arch] = (REGISTRIES[node.targets[0].id], mod)
    return out


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


def build_config(arch: str, module: str) -> dict:
    from transformers import AutoConfig
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    model_type = model_type_of(arch, module)
    if model_type in _CONFIG_REGISTRY:
        config = _CONFIG_REGISTRY[model_type]().to_dict()
    elif model_type in known_model_types():
        config = AutoConfig.for_model(model_type).to_dict()
    else:
        config = {**GENERIC_TEXT, "model_type": model_type}
    config = {**_jsonable(config), **PATCHES.get(arch, {})}
    for key, sub in TEXT_PATCHES.get(arch, {}).items():
        config[key] = {**config[key], **sub}
    config["architectures"] = [arch]
    config["dtype"] = "bfloat16"
    for key, sub in list(config.items()):
        if isinstance(sub, dict) and ("dtype" in sub or "torch_dtype" in sub):
            sub["dtype"] = "bfloat16"
    config.pop("torch_dtype", None)
    config.pop("transformers_version", None)
    return config
