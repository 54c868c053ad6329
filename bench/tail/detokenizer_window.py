"""What the plugin's detokenizer window saves (spillway_connector/detokenizer_window.py): the first detokenizer step
of a 131,008-token prompt.

vLLM's FastIncrementalDetokenizer primes tokenizers' DecodeStream with the whole prompt; its first step (the
request's first output token) decodes that prompt twice. The connector's plugin primes it with the prompt's last
tokens (from a token where the text splits cleanly). This times, in one process, building the stream plus its
first step, primed with the whole prompt and with the window (the window's choice included: the connector's own
prompt_window), on a 131,008-token prompt (the window alternating with the whole prompt, as
"window", and repeated on its own, as "window_back_to_back": the first tokenizer call after a whole-prompt decode
pays ~0.3 ms more on this machine), for two tokenizers built here without downloads:
the project's word-level tokenizer at Llama 3's vocabulary (128,256, bench/gpu/llama-3.1-8b/config.json; as
bench/gpu's servers load it) and a byte-level BPE trained here on synthetic text (multi-byte UTF-8, emoji,
CJK). The returned texts are checked equal. Medians of --reps repetitions (min-max), in milliseconds.

    .venv/bin/python bench/tail/detokenizer_window.py [--reps 9] [--tokens 131008] [--json OUT.json]

The tokenizer builders are shared with tests/connector/test_detokenizer_window.py.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "connector"))

WORD_MODEL = REPO / "bench" / "gpu" / "llama-3.1-8b"
SPECIAL_TOKENS = ["<s>", "</s>", "<|eot|>"]
ADDED_TOKENS = ["<tool>"]  # added, not special: decoded even with skip_special_tokens
# Synthetic text: ASCII words, accented Latin, CJK, emoji (4 bytes, some with a variation selector or a ZWJ),
# punctuation, runs of spaces and newlines.
WORDS = ["the", "cache", "offload", "token", "and", "of", "to", "résumé", "naïve", "Größe", "façade", "über",
         "中文", "字符", "漢字", "東京", "日本語", "한국어", "Ελληνικά", "русский", "עברית", "😀", "🎉", "🙂",
         "👍🏽", "❤️", "👨‍👩‍👧", "🇫🇷", "…", "—", "¿qué?", "x", "42", "3.14", ",", ".", "!", "(", ")"]
SEPARATORS = [" ", " ", " ", "  ", "\n", "\n\n", "\t", ""]


def patched_window():
    """The window the plugin primes vLLM's decode stream with (spillway_connector.detokenizer_window)."""
    from spillway_connector.detokenizer_window import prompt_window

    return prompt_window


def synthetic_text(rng: random.Random, words: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(SEPARATORS) for _ in range(words))


def corpus(seed: int = 0, lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    return [synthetic_text(rng, rng.randint(5, 60)) for _ in range(lines)]


def word_tokenizer(vocab_size: int | None = None):
    """The project's word-level tokenizer (bench/gpu/word_tokenizer.py), at Llama 3's vocabulary by default."""
    from tokenizers import Tokenizer

    sys.path.insert(0, str(REPO / "bench" / "gpu"))
    import word_tokenizer as words

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        model.mkdir()
        config = json.loads((WORD_MODEL / "config.json").read_text())
        if vocab_size is not None:
            config["vocab_size"] = vocab_size
        (model / "config.json").write_text(json.dumps(config))
        return Tokenizer.from_file(str(words.build(model, Path(tmp) / "out") / "tokenizer.json"))


def byte_level_bpe(vocab_size: int = 2000, seed: int = 0):
    """A GPT-2/Llama 3-style byte-level BPE (ByteLevel pre-tokenizer and decoder), trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(seed), trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        special_tokens=SPECIAL_TOKENS))
    tok.add_tokens(ADDED_TOKENS)
    return tok


def sentencepiece_bpe(decoder: str = "strip", vocab_size: int = 600, seed: int = 0):
    """A SentencePiece-style BPE with byte fallback (Metaspace pre-tokenizer, <0x00>..<0xFF> pieces in the
    vocabulary, not special), trained here on a small vocabulary so that rare characters fall back to bytes.
    decoder "strip": Llama 2/Mistral's Replace(▁), ByteFallback, Fuse, Strip(1 leading space); "metaspace":
    ByteFallback then the Metaspace decoder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    # Rare characters stay out of the training text: they reach the tokenizer as bytes.
    common = [w for w in WORDS if w.isascii() or w in ("résumé", "中文", "😀")]
    lines = ["".join(rng.choice(common) + rng.choice(SEPARATORS) for _ in range(rng.randint(5, 40)))
             for _ in range(2000)]
    trained = Tokenizer(models.BPE(unk_token=None))
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                           special_tokens=SPECIAL_TOKENS))
    spec = json.loads(trained.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    if decoder == "strip":
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    elif decoder == "metaspace":
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    else:
        raise ValueError(decoder)
    tok.add_tokens(ADDED_TOKENS)
    return tok


def long_prompt(tok, tokens: int, seed: int = 0) -> list[int]:
    """`tokens` ids: random words' ids for the word-level tokenizer, else encoded synthetic text."""
    rng = random.Random(seed)
    if tok.get_vocab_size() > 100_000:  # the word-level tokenizer: ids as bench/gpu's clients send them
        return [rng.randrange(tok.get_vocab_size()) for _ in range(tokens)]
    ids: list[int] = []
    while len(ids) < tokens:
        ids += tok.encode(synthetic_text(rng, 2000)).ids
    return ids[:tokens]


def first_step(tok, primed: list[int], next_id: int, skip: bool = True) -> str | None:
    from tokenizers.decoders import DecodeStream

    return DecodeStream(ids=primed, skip_special_tokens=skip).step(tok, next_id)


def time_one(tok, prompt: list[int], next_id: int, reps: int) -> dict:
    window = patched_window()
    full_text = first_step(tok, prompt, next_id)
    primed = window(tok, prompt, True)
    assert first_step(tok, primed, next_id) == full_text, "the window's first text differs"
    timings: dict[str, list[float]] = {"full": [], "window": [], "window_back_to_back": []}
    for _ in range(reps):
        started = time.perf_counter()
        first_step(tok, window(tok, prompt, True), next_id)
        timings["window_back_to_back"].append((time.perf_counter() - started) * 1e3)
    for _ in range(reps):
        started = time.perf_counter()
        first_step(tok, prompt, next_id)
        timings["full"].append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        first_step(tok, window(tok, prompt, True), next_id)
        timings["window"].append((time.perf_counter() - started) * 1e3)
    return {"window_tokens": len(primed), "first_text": full_text,
            **{name: {"median_ms": round(statistics.median(ms), 3), "min_ms": round(min(ms), 3),
                      "max_ms": round(max(ms), 3)} for name, ms in timings.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=131_008)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import tokenizers

    results = {"tokens": args.tokens, "reps": args.reps, "tokenizers": tokenizers.__version__,
               "python": platform.python_version(), "machine": platform.machine(), "cases": {}}
    for name, build in (("word-level (vocab 128256)", word_tokenizer), ("byte-level BPE", byte_level_bpe)):
        tok = build()
        prompt = long_prompt(tok, args.tokens)
        next_id = long_prompt(tok, 1, seed=1)[0]
        case = time_one(tok, prompt, next_id, args.reps)
        results["cases"][name] = case
        print(f"{name}: first step of a {args.tokens:,}-token prompt: full {case['full']['median_ms']:.2f} ms "
              f"({case['full']['min_ms']:.2f}-{case['full']['max_ms']:.2f}), window of {case['window_tokens']} "
              f"tokens {case['window']['median_ms']:.3f} ms ({case['window']['min_ms']:.3f}-"
              f"{case['window']['max_ms']:.3f}; {case['window_back_to_back']['median_ms']:.3f} back to back); "
              f"same text {case['first_text']!r}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
