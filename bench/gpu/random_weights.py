#!/usr/bin/env python3
"""A Llama checkpoint of seeded random weights of ordinary scale, for `spillway loadtest verify` on the GPU.

vLLM's `--load-format dummy` draws every weight from uniform(-1e-3, 1e-3): attention is all but uniform and the
greedy tokens hardly depend on the KV, so a verify run over dummy weights would pass with wrong KV too. Here every
matrix is normal(0, std) (0.02: transformers' LlamaConfig.initializer_range) and the norms are 1, as the tests'
KV-sensitive model does (tests/support/kv_weights.py), drawn on the GPU when there is one (16 GB for
Llama-3.1-8B in seconds) and written as one safetensors file that vLLM's ordinary loader reads.

    python3 bench/gpu/random_weights.py bench/gpu/llama-3.1-8b /dev/shm/llama-random --seed 7
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

WEIGHTS_FILE = "model.safetensors"
INIT_STD = 0.02  # transformers LlamaConfig.initializer_range


def shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """name -> shape of a LlamaForCausalLM checkpoint (transformers' layout, which vLLM's loader maps)."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or h // heads
    q, kv, inter = heads * head_dim, config["num_key_value_heads"] * head_dim, config["intermediate_size"]
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], h),
                                       "model.norm.weight": (h,), "lm_head.weight": (config["vocab_size"], h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                    p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                    p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                    p + "mlp.down_proj.weight": (h, inter),
                    p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    return out


def write(model_dir: Path, dest: Path, seed: int, std: float = INIT_STD) -> Path:
    """dest/ with model_dir's files (config, tokenizer) and seeded random weights; the same seed, the same bytes
    on the same device type."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.is_file() and item.name != WEIGHTS_FILE:
            shutil.copy2(item, dest / item.name)
    config = json.loads((model_dir / "config.json").read_text())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, shape in sorted(shapes(config).items()):  # a fixed draw order: the seed alone decides every value
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            drawn = torch.empty(shape, dtype=torch.float32, device=device).normal_(0.0, std, generator=generator)
            tensors[name] = drawn.to(torch.bfloat16).cpu()
    save_file(tensors, str(dest / WEIGHTS_FILE), metadata={"format": "pt", "seed": str(seed), "std": str(std)})
    return dest


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--std", type=float, default=INIT_STD)
    a = p.parse_args()
    t0 = time.time()
    write(a.model_dir, a.dest, a.seed, a.std)
    size = os.path.getsize(a.dest / WEIGHTS_FILE)
    print(f"random weights: {size / 1e9:.2f} GB in {a.dest} in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
