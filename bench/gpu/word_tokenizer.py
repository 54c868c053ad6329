#!/usr/bin/env python3
"""A weightless model folder that text clients can use: config.json plus a word-level tokenizer.

Token id i is the word "w<i>" (one word, one token, split on whitespace), so any id sequence decodes to text
that encodes back to the same ids. Clients that send text (vLLM's `vllm bench serve --dataset-name random`)
then load exactly the prompts a token-id client sends.

    python3 bench/gpu/word_tokenizer.py bench/gpu/llama-3.1-8b /tmp/work/llama-3.1-8b-words
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def build(model_dir: Path, out: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = json.loads((model_dir / "config.json").read_text())
    vocab = {f"w{i}": i for i in range(int(config["vocab_size"]))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(model_dir / "config.json", out / "config.json")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20, "unk_token": "w0",
        "clean_up_tokenization_spaces": False}))
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1]), Path(sys.argv[2])))
