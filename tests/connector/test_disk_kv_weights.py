"""The seeded random weights the disk-tier tests run under (support/kv_weights.py) make the KV visible: zeroed,
negated or another prompt's KV for one 32-token chunk changes the greedy continuation, computed by transformers'
own Llama on the very checkpoint vLLM loads. Under vLLM's dummy weights the same check is the control."""
from __future__ import annotations

import random
from pathlib import Path

from support.kv_weights import KvSensitiveLlama, greedy, kv_changes_output, write_kv_sensitive_model

PROMPT_TOKENS, CHUNK = 128, 32


def prompt(seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, vocab) for _ in range(PROMPT_TOKENS)]


def test_wrong_kv_of_one_chunk_changes_greedy_output(tmp_path: Path):
    model = KvSensitiveLlama()
    directory = write_kv_sensitive_model(tmp_path / "model", model)
    first, other = prompt(0, model.vocab_size), prompt(1, model.vocab_size)
    for chunk in (slice(0, CHUNK), slice(2 * CHUNK, 3 * CHUNK)):
        changed = kv_changes_output(directory, first, chunk, other)
        assert changed == {"zero": True, "negate": True, "other_prompt": True}, (chunk, changed)


def test_same_seed_same_checkpoint_other_seed_other_model(tmp_path: Path):
    a = write_kv_sensitive_model(tmp_path / "a", KvSensitiveLlama(seed=3))
    b = write_kv_sensitive_model(tmp_path / "b", KvSensitiveLlama(seed=3))
    c = write_kv_sensitive_model(tmp_path / "c", KvSensitiveLlama(seed=4))
    weights = [(d / "model.safetensors").read_bytes() for d in (a, b, c)]
    assert weights[0] == weights[1] and weights[0] != weights[2]
    p = prompt(2, KvSensitiveLlama().vocab_size)
    assert greedy(a, p, 8) != greedy(c, p, 8), "another seed is another model: its KV must not be served"
