"""A tiny Llama with seeded random weights of ordinary scale, under which the KV cache decides the output.

vLLM's `--load-format dummy` fills every weight with uniform(-1e-3, 1e-3) (vllm/model_executor/model_loader/
weight_utils.py initialize_dummy_weights), so attention is all but uniform and the values it averages are tiny:
greedy tokens hardly depend on the KV, and a test cannot tell KV loaded wrong from KV loaded right. Here every
matrix is drawn from normal(0, std) as a real initialiser does (0.02 is the Llama/GPT-2 `initializer_range`,
transformers LlamaConfig's default), the norms are 1, and the weights are written as a real safetensors
checkpoint that vLLM loads with its ordinary loader. Under these weights zeroing, swapping or flipping a chunk's
KV changes the greedy continuation (kv_changes_output shows it with transformers' own Llama on the same files;
tests/connector/test_disk_kv_weights.py runs it).

    model = KvSensitiveLlama()                   # a TinyLlama: same config, same KV geometry
    VllmServer(model=model, ...)                 # writes config.json + model.safetensors, loads them
    write_kv_sensitive_model(directory, model)   # the directory alone, for another server or client

Same seed, same bytes: two writes give the same checkpoint (a different seed is "another revision" of the model
under the same name and path).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .vllm_server import TinyLlama

WEIGHTS_FILE = "model.safetensors"
LOAD_FORMAT_SAFETENSORS = "safetensors"  # vLLM's --load-format for a safetensors checkpoint
INIT_STD = 0.02  # transformers LlamaConfig.initializer_range


@dataclass(frozen=True)
class KvSensitiveLlama(TinyLlama):
    """TinyLlama's config with real (seeded random) weights: vLLM loads them instead of dummy ones."""

    seed: int = 0
    std: float = INIT_STD

    @property
    def load_format(self) -> str:
        return LOAD_FORMAT_SAFETENSORS

    def config(self) -> dict:
        config = super().config()
        config.pop("seed", None)
        config.pop("std", None)
        config["initializer_range"] = self.std
        return config

    def write(self, directory: Path) -> Path:
        return write_kv_sensitive_model(directory, self)

    def tensors(self) -> dict:
        """name -> bf16 tensor, in the layout of transformers' LlamaForCausalLM (vLLM's loader maps it)."""
        import torch

        head_dim = self.hidden_size // self.num_attention_heads
        h, kv = self.hidden_size, self.num_key_value_heads * head_dim
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, h)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes.update({
                p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (self.intermediate_size, h),
                p + "mlp.up_proj.weight": (self.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, self.intermediate_size),
                p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            })
        shapes.update({"model.norm.weight": (h,), "lm_head.weight": (self.vocab_size, h)})
        generator = torch.Generator().manual_seed(self.seed)
        tensors = {}
        for name in sorted(shapes):  # a fixed draw order: the seed alone decides every value
            shape = shapes[name]
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                tensors[name] = torch.normal(0.0, self.std, shape, generator=generator).to(torch.bfloat16)
        return tensors


def write_kv_sensitive_model(directory: Path, model: KvSensitiveLlama = KvSensitiveLlama()) -> Path:
    """Write config.json and model.safetensors of `model` into `directory` (no tokenizer: prompts are token ids)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(model.config(), indent=2))
    save_file(model.tensors(), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    # safetensors writes the file owner-only (0600); a checkpoint is read by the image's own user, as a
    # mounted model volume is (tests/images/test_vllm_cpu_image.py)
    (directory / WEIGHTS_FILE).chmod(0o644)
    return directory


def greedy(directory: Path, prompt: list[int], new_tokens: int, corrupt=None) -> list[int]:
    """Greedy continuation of `prompt` by transformers' LlamaForCausalLM on the checkpoint in `directory`, in
    float32. `corrupt(keys, values)` may change the prompt's KV (per layer, [batch, kv_heads, tokens, head_dim],
    in place) before the first new token is drawn: what a wrong chunk loaded from a KV tier does."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(directory), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        cache = out.past_key_values
        if corrupt is not None:
            for layer in _cache_layers(cache):
                corrupt(*layer)
        tokens = []
        for _ in range(new_tokens):
            token = int(out.logits[0, -1].argmax())
            tokens.append(token)
            out = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
    return tokens


def _cache_layers(cache) -> list:
    """(keys, values) per layer of a transformers cache, as tensors that may be changed in place."""
    if hasattr(cache, "layers"):  # transformers >= 4.56: DynamicCache.layers[i].keys / .values
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(cache.key_cache[i], cache.value_cache[i]) for i in range(len(cache.key_cache))]


def prompt_kv(directory: Path, prompt: list[int]) -> list[tuple]:
    """(keys, values) per layer of `prompt`, computed by transformers' Llama in float32."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(directory), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        cache = model(torch.tensor([prompt]), use_cache=True).past_key_values
    return [(k.clone(), v.clone()) for k, v in _cache_layers(cache)]


def kv_changes_output(directory: Path, prompt: list[int], tokens: slice, other: list[int],
                      new_tokens: int = 8) -> dict[str, bool]:
    """Whether zeroing, negating, or taking from prompt `other` (another prompt's chunk file) the KV of
    `prompt[tokens]` changes the greedy continuation: the evidence that this checkpoint can show wrong KV."""
    clean = greedy(directory, prompt, new_tokens)
    foreign = iter(prompt_kv(directory, other))

    def zero(k, v):
        k[:, :, tokens] = 0
        v[:, :, tokens] = 0

    def negate(k, v):
        k[:, :, tokens] *= -1
        v[:, :, tokens] *= -1

    def other_prompt(k, v):
        ok, ov = next(foreign)
        k[:, :, tokens], v[:, :, tokens] = ok[:, :, tokens], ov[:, :, tokens]

    return {name: greedy(directory, prompt, new_tokens, change) != clean
            for name, change in (("zero", zero), ("negate", negate), ("other_prompt", other_prompt))}
