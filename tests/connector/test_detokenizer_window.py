"""The plugin's detokenizer window (spillway_connector/detokenizer_window.py, installed by plugin.py): vLLM's
FastIncrementalDetokenizer primes its decode stream with the prompt's last tokens (from a token where the text
splits cleanly) instead of the whole prompt.

The output text is compared on tokenizers built here without downloads (the builders live in
bench/tail/detokenizer_window.py): the project's word-level tokenizer, a byte-level BPE and two SentencePiece-style
BPEs with byte fallback (Llama 2's Strip decoder, and the Metaspace decoder). For many random prompts and
continuations, tokenizers' DecodeStream primed with the whole prompt returns the same steps as one primed with the
window; and vLLM's own FastIncrementalDetokenizer, stock and with the plugin's window, returns the same decode_next
texts. The cases where a plain "last 32 tokens" differs are kept as tests too. The plugin installs the window only
over the __init__ it was verified against (0.26.0, 0.32.0, 0.33.0, 0.34.0 read the same).
"""
from __future__ import annotations

import importlib.util
import logging
import random
import types
from pathlib import Path

import pytest
from spillway_connector import detokenizer_window as DW
from spillway_connector import plugin, source_guard
from support import vllm_available
from support.tools import skip_or_fail
from support.vllm_trees import vllm_trees

REPO = Path(__file__).resolve().parents[2]
BENCH_FILE = REPO / "bench" / "tail" / "detokenizer_window.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_detokenizer_window", BENCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_bench()
window = DW.prompt_window
W = DW.WINDOW


def test_every_supported_detokenizer_reads_as_verified():
    """The installed vLLM's and every tree's FastIncrementalDetokenizer.__init__ carry a verified fingerprint."""
    sources = [Path(tree) / "vllm" / "v1" / "engine" / "detokenizer.py" for tree in vllm_trees()]
    if vllm_available():
        from vllm.v1.engine import detokenizer

        assert not source_guard.differences({"FastIncrementalDetokenizer.__init__":
                                             detokenizer.FastIncrementalDetokenizer.__init__}, plugin.DETOKENIZER_CODE)
    for path in sources:
        import ast
        import hashlib

        module = ast.parse(path.read_text())
        cls, = (n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "FastIncrementalDetokenizer")
        init, = (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
        init.decorator_list = []
        digest = hashlib.sha256(source_guard.canonical(init).encode()).hexdigest()[:16]
        assert digest in plugin.DETOKENIZER_CODE["FastIncrementalDetokenizer.__init__"], path


def test_a_detokenizer_whose_init_moved_keeps_vllms(monkeypatch, caplog):
    if not vllm_available():
        skip_or_fail("vLLM is not installed")
    monkeypatch.setattr(source_guard, "_refused", set())
    monkeypatch.setattr(plugin, "DETOKENIZER_CODE", {"FastIncrementalDetokenizer.__init__": frozenset({"other"})})
    from vllm.v1.engine import detokenizer

    before = detokenizer.FastIncrementalDetokenizer.__init__
    with caplog.at_level(logging.WARNING, logger="spillway_connector"):
        assert not plugin.install_detokenizer_window()
    assert detokenizer.FastIncrementalDetokenizer.__init__ is before
    assert any("FastIncrementalDetokenizer.__init__" in r.getMessage() for r in caplog.records)


TOKENIZERS = ["word-level", "byte-level", "sp-strip", "sp-metaspace"]
CASES_PER_TOKENIZER = 500
MAX_PROMPT = 3000


@pytest.fixture(scope="module")
def tokenizers_built() -> dict:
    pytest.importorskip("tokenizers")
    return {"word-level": bench.word_tokenizer(), "byte-level": bench.byte_level_bpe(),
            "sp-strip": bench.sentencepiece_bpe("strip"), "sp-metaspace": bench.sentencepiece_bpe("metaspace")}


def _gpt2_byte_chars() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for byte in range(256):
        if byte not in chars:
            chars[byte], extra = chr(256 + extra), extra + 1
    return chars


def byte_ids(tok, name: str, data: bytes) -> list[int]:
    """Ids that decode to exactly these bytes, one token a byte (byte-level: its alphabet; SentencePiece: <0xNN>)."""
    if name == "byte-level":
        chars = _gpt2_byte_chars()
        return [tok.token_to_id(chars[byte]) for byte in data]
    return [tok.token_to_id(f"<0x{byte:02X}>") for byte in data]


def _text_ids(tok, name: str, rng: random.Random, tokens: int) -> list[int]:
    if name == "word-level":
        return [rng.randrange(tok.get_vocab_size()) for _ in range(tokens)]
    ids: list[int] = []
    while len(ids) < tokens:
        ids += tok.encode(bench.synthetic_text(rng, max(tokens // 2, 4))).ids
    start = rng.randrange(len(ids) - tokens + 1)
    return ids[start:start + tokens]


MULTIBYTE = ["é", "中", "😀", "👍🏽", "❤️", "ह", "𝄞", "Ω"]


def _piece(tok, name: str, rng: random.Random, tokens: int) -> list[int]:
    """A random stretch of ids: text, uniform random ids, special/added tokens, or single-byte tokens."""
    kind = rng.choice(["text", "text", "random", "special", "bytes"] if name != "word-level" else ["random"])
    if kind == "text":
        return _text_ids(tok, name, rng, tokens)
    if kind == "random":
        return [rng.randrange(tok.get_vocab_size()) for _ in range(tokens)]
    if kind == "special":
        names = bench.SPECIAL_TOKENS + bench.ADDED_TOKENS
        return [tok.token_to_id(rng.choice(names)) for _ in range(tokens)]
    data = "".join(rng.choice(MULTIBYTE) for _ in range(tokens)).encode()
    if rng.random() < 0.2:  # an invalid byte somewhere in the run
        at = rng.randrange(len(data) + 1)
        data = data[:at] + bytes([rng.choice([0xFF, 0x80, 0xC3, 0xF0])]) + data[at:]
    return byte_ids(tok, name, data)


def _case(tok, name: str, rng: random.Random) -> tuple[list[int], list[int]]:
    """A prompt (1 to MAX_PROMPT tokens, its tail often special tokens or a run of bytes, or ending mid-character)
    and a continuation of several tokens (often the rest of that character)."""
    length = min(int(2 ** rng.uniform(0, 11.6)), MAX_PROMPT)
    prompt: list[int] = []
    while len(prompt) < length:
        prompt += _piece(tok, name, rng, rng.randint(1, max(1, min(length - len(prompt), 80))))
    prompt = prompt[:length]
    continuation: list[int] = []
    if name != "word-level" and rng.random() < 0.3:  # the prompt ends mid-way through a character's bytes
        data = rng.choice(MULTIBYTE[1:]).encode()
        cut = rng.randrange(1, len(data))
        prompt += byte_ids(tok, name, data[:cut])
        continuation += byte_ids(tok, name, data[cut:])
    while len(continuation) < rng.randint(2, 12):
        continuation += _piece(tok, name, rng, rng.randint(1, 4))
    return prompt, continuation


def steps(tok, primed, continuation, skip: bool) -> list:
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=primed, skip_special_tokens=skip)
    out = []
    for token_id in continuation:
        try:
            out.append(stream.step(tok, token_id))
        except Exception as exc:  # noqa: BLE001 - the error is part of the result compared
            out.append(f"{type(exc).__name__}: {str(exc)[:27]}")
            break
    return out


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_window_returns_the_whole_prompts_steps(tokenizers_built, name):
    tok = tokenizers_built[name]
    rng = random.Random(f"detokenizer-window-{name}")
    windowed = compared = 0
    for index in range(CASES_PER_TOKENIZER):
        prompt, continuation = _case(tok, name, rng)
        for skip in (True, False):
            primed = window(tok, prompt, skip)
            assert primed == prompt or primed == prompt[len(prompt) - len(primed):]
            full, ours = steps(tok, prompt, continuation, skip), steps(tok, primed, continuation, skip)
            assert ours == full, (f"{name} case {index} (skip_special_tokens={skip}): prompt of {len(prompt)} "
                                  f"tokens, tail {prompt[-40:]}, window of {len(primed)}, continuation "
                                  f"{continuation}: {ours} != {full}")
            # Long prompts whose text does not end mid-character (those keep the whole prompt by design).
            if len(prompt) > W and not tok.decode(prompt, skip_special_tokens=skip).endswith("\ufffd"):
                compared += 1
                windowed += len(primed) < len(prompt)
    # The window is actually taken for nearly all of them (the others hold no clean token: bytes, specials).
    assert compared >= 100 and windowed >= 0.85 * compared, (
        f"{windowed} of {compared} long prompts primed with a window")


def _clean_text(tok, name: str, tokens: int = 200) -> list[int]:
    """Ids of text whose last token ends a whole character: the window may start within it."""
    if name == "word-level":
        return [(7 * i) % tok.get_vocab_size() for i in range(tokens)]
    ids = tok.encode("the cache offload token and of to résumé 中文 😀 " * (tokens // 4)).ids
    return ids[:tokens - 1] + tok.encode(" x").ids[-1:]


def _special(tok, name: str = "<s>") -> int:
    return tok.token_to_id(name)


@pytest.mark.parametrize(("name", "case"), [
    # 40 skipped special tokens after text: "last 32" sees no text and the next word loses its leading space.
    ("sp-strip", "special-tail"), ("sp-metaspace", "special-tail"),
    # A run of 60 byte-fallback pieces (20 CJK characters): "last 32" starts mid-character, ByteFallback decodes
    # the whole run as U+FFFD, and the character the continuation completes never appears.
    ("sp-strip", "byte-run"), ("sp-metaspace", "byte-run"),
    # The prompt ends mid-character: tokenizers keeps no prefix and returns the whole primed text with the
    # first complete character, so "last 32" returns less of the prompt's text than vLLM does.
    ("byte-level", "mid-character"), ("sp-strip", "mid-character"),
    # An invalid byte, then 60 ASCII byte pieces: "last 32" reads "AAA..." where ByteFallback makes the whole
    # run U+FFFD (a byte piece is no place to start even when it decodes alone to a whole character).
    ("sp-strip", "invalid-byte-run"), ("sp-metaspace", "invalid-byte-run"),
])
def test_a_plain_last_32_differs_where_the_patch_does_not(tokenizers_built, name, case):
    tok = tokenizers_built[name]
    text = _clean_text(tok, name)
    if case == "special-tail":
        prompt, continuation = text + [_special(tok)] * 40, tok.encode("hello world").ids
    elif case == "byte-run":
        prompt = text + byte_ids(tok, name, "東京東京東京東京東京東京東京東京東京東京".encode())
        continuation = byte_ids(tok, name, "京".encode()) + tok.encode(" ok").ids
    elif case == "invalid-byte-run":
        prompt = text + byte_ids(tok, name, b"\xff" + b"A" * 60)
        continuation = byte_ids(tok, name, b"B") + tok.encode(" ok").ids
    else:
        prompt = text + byte_ids(tok, name, "😀".encode()[:2])
        continuation = byte_ids(tok, name, "😀".encode()[2:]) + tok.encode(" ok").ids
    full = steps(tok, prompt, continuation, True)
    assert steps(tok, prompt[-W:], continuation, True) != full, "a plain last-32 window no longer differs here"
    primed = window(tok, prompt, True)
    assert steps(tok, primed, continuation, True) == full
    if case in ("mid-character", "invalid-byte-run"):
        assert primed == prompt  # the whole prompt, as vLLM primes it
    else:
        assert W < len(primed) < len(prompt)  # moved back to a clean token, not the whole prompt


def test_the_window_keeps_none_and_short_prompts(tokenizers_built):
    tok = tokenizers_built["byte-level"]
    assert window(tok, None, True) is None
    short = tok.encode("a short prompt").ids
    assert window(tok, short, True) is short
    long_ = _text_ids(tok, "byte-level", random.Random(1), 500)
    assert len(window(tok, long_, True)) == W  # text splits cleanly at most tokens


# -- the same text: vLLM's own FastIncrementalDetokenizer, stock and with the plugin's window --------------------------------
VLLM_CASES_PER_TOKENIZER = 60


@pytest.fixture(scope="module")
def detokenizers():
    """(vLLM's FastIncrementalDetokenizer, the same class with the plugin's window), from one module each."""
    if not vllm_available():
        skip_or_fail("vLLM is not installed")
    from vllm.v1.engine import detokenizer

    spec = importlib.util.spec_from_file_location("spillway_windowed_detokenizer", detokenizer.__file__)
    windowed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(windowed)
    original_init = detokenizer.FastIncrementalDetokenizer.__init__
    assert not getattr(original_init, "_spillway_replacement", False), "the plugin ran in this process"
    assert plugin.install_detokenizer_window(windowed)
    assert getattr(windowed.FastIncrementalDetokenizer.__init__, "_spillway_replacement", False)
    return detokenizer.FastIncrementalDetokenizer, windowed.FastIncrementalDetokenizer


def _request(prompt, skip: bool, spaces: bool):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=64, skip_special_tokens=skip, spaces_between_special_tokens=spaces)
    return types.SimpleNamespace(request_id="r", prompt_token_ids=prompt, prompt_embeds=None, sampling_params=params)


def _decode(cls, backend, request, continuation) -> list:
    detokenizer = cls(backend, request)
    out = []
    for token_id in continuation:
        try:
            out.append(detokenizer.decode_next(token_id))
        except Exception as exc:  # noqa: BLE001 - the error is part of the result compared
            out.append(f"{type(exc).__name__}: {str(exc)[:27]}")
            break
    return out


@pytest.mark.parametrize("name", TOKENIZERS)
def test_vllms_detokenizer_with_the_window_returns_the_originals_text(tokenizers_built, detokenizers, monkeypatch, name):
    import tokenizers.decoders
    from transformers import TokenizersBackend

    original, patched = detokenizers
    backend = TokenizersBackend(tokenizer_object=tokenizers_built[name])
    tok = backend._tokenizer
    primed: list = []
    real_stream = tokenizers.decoders.DecodeStream

    def recording_stream(ids=None, skip_special_tokens=False):
        primed.append(None if ids is None else len(ids))
        return real_stream(ids=ids, skip_special_tokens=skip_special_tokens)

    monkeypatch.setattr(tokenizers.decoders, "DecodeStream", recording_stream)
    rng = random.Random(f"vllm-{name}")
    cases = [_case(tok, name, rng) for _ in range(VLLM_CASES_PER_TOKENIZER)]
    cases.append(([], tok.encode("x").ids))
    cases.append((None, [3, 4, 5]))  # prompt embeddings: no prompt ids
    cases.append((_clean_text(tok, name, 4000), _piece(tok, name, rng, 6)))
    for prompt, continuation in cases:
        for skip, spaces in ((True, True), (False, True), (False, False)):
            primed.clear()
            want = _decode(original, backend, _request(prompt, skip, spaces), continuation)
            got = _decode(patched, backend, _request(prompt, skip, spaces), continuation)
            assert got == want, f"{name}: prompt tail {(prompt or [])[-40:]}, continuation {continuation}"
            if prompt is None:
                assert primed[:2] == [None, None]
            elif len(prompt) == 4000:
                assert primed[0] == 4000 and primed[1] < 4000, primed  # the plugin's class primes a window
