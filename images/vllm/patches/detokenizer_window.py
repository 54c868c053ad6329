"""A small patch to vLLM's fast detokenizer: prime each request's decode stream with the prompt's last tokens.

What it fixes. vLLM's OpenAI server detokenizes a request's output with `FastIncrementalDetokenizer`
(vllm/v1/engine/detokenizer.py), which builds `tokenizers.decoders.DecodeStream(ids=prompt_token_ids)`: the
stream is primed with the whole prompt, and its first `step` (the request's first output token, on the
time-to-first-token path) decodes that whole prompt twice (tokenizers' step_decode_stream: once for the prefix,
once with the new token). For a 131,008-token prompt that first step took 33-38 ms on the 2-core CPU machine,
against ~0.0-0.3 ms primed with the last 32 tokens (bench/tail/detokenizer_window.py); the API server's time before
vLLM's clock starts was 65 ms at 128K on the H200. vLLM's slow detokenizer already primes from the last few
prompt tokens only (INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5, vllm/tokenizers/detokenizer_utils.py).

Why the result is the same. The stream reads the prompt only until its first text: that step returns
decode(prompt + new)[len(decode(prompt)):] and keeps only the output tokens afterwards, so a window W of the
prompt gives the same text whenever decode(prompt + X) = A + decode(W + X) for every continuation X, with A
fixed. That holds when W starts at a token t that decodes alone to text beginning with a whole character and
is not a byte-fallback piece: every decoder tokenizers ships is local past such a token (ByteLevel's lossy
UTF-8 resynchronises at a lead byte; Metaspace's, WordPiece's and Strip's first-token rules then apply to t,
inside the fixed A; ByteFallback decodes a run of <0xNN> pieces as a whole, valid or all U+FFFD, and t ends
any run). So the window is the last _SPILLWAY_DETOKENIZER_WINDOW (32) tokens, moved back one token at a time
to such a t (at most _SPILLWAY_WINDOW_SCAN tokens), and the whole prompt, exactly as before, when:
  - no such t lies within the scan (a long run of byte-fallback pieces or skipped special tokens);
  - the window's text ends in U+FFFD (the prompt ends mid-character): tokenizers then keeps no prefix and the
    first text it returns is the whole primed text (the prompt's, with the new token), which a window would cut;
  - the prompt is 32 tokens or fewer, its ids are None (prompt embeddings), or the tokenizer raises.
A plain "last 32 tokens" differs (tests/images/test_detokenizer_window_patch.py keeps the cases): a prompt
ending in 32 skipped special tokens loses the next word's leading space (Metaspace/Strip), a prompt ending in
a run of byte-fallback pieces longer than 32 gets U+FFFD for output that continues it, and a prompt ending
mid-character returns the window's text where vLLM returns the whole prompt's. 32 rather than 1: a margin for
a decoder whose context reaches a few tokens back (CTC's repeats, a character's 4 bytes); it costs
microseconds.

When it can go. When vLLM (or tokenizers' DecodeStream) stops decoding the whole prompt when primed: `apply`
refuses a detokenizer whose `FastIncrementalDetokenizer.__init__` no longer reads as below (exit 1, one line).
vLLM 0.32.0 and 0.33.0 read the same there (the whole file is identical).

Applied at image build time (images/vllm/Dockerfile) and by bench/gpu/serve_bench.py for an engine that asks
for it; never at run time. `python3 detokenizer_window.py apply|revert|check [SITE_PACKAGES]`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# The shared apply/revert/check machinery lives beside this file (the image copies the folder whole).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from source_patch import PatchError, SourcePatch, vllm_release, vllm_site

__all__ = ["HELPERS", "MARKER", "NAME", "PATCH", "PATCHED_IDS", "WINDOW", "PatchError", "apply", "is_applied",
           "patch_source", "revert", "target", "vllm_release", "vllm_site"]

NAME = "detokenizer_window"
TARGET = Path("vllm/v1/engine/detokenizer.py")
MARKER = f"# Spillway patch: {NAME}"
WINDOW = 32  # prompt tokens the stream is primed with, at least (see the docstring)
SCAN = 1024  # how far back the window's start may move to a clean token before the whole prompt is used

# vLLM 0.32.0's and 0.33.0's FastIncrementalDetokenizer.__init__ (the comment lines between may change).
ORIGINAL = re.compile(
    r'(?P<head>[ ]{8}self\.tokenizer: Tokenizer = tokenizer\._tokenizer\n'
    r'\n'
    r'(?:[ ]{8}\#[^\n]*\n)*'
    r'[ ]{8}self\.stream = tokenizers\.decoders\.DecodeStream\(\n)'
    r'[ ]{12}ids=request\.prompt_token_ids,\n'
    r'(?P<tail>[ ]{12}skip_special_tokens=self\.skip_special_tokens,\n'
    r'[ ]{8}\)\n)'
)
CLASS_LINE = re.compile(r"^class FastIncrementalDetokenizer\(BaseIncrementalDetokenizer\):\n", re.MULTILINE)

PATCHED_IDS = f'''            {MARKER} (images/vllm/patches/{NAME}.py).
            ids=_spillway_prompt_window(
                self.tokenizer, request.prompt_token_ids, self.skip_special_tokens
            ),
'''

HELPERS = f'''{MARKER} (images/vllm/patches/{NAME}.py).
# The decode stream is primed with the prompt's last tokens, from a token where the prompt's text splits cleanly,
# not with the whole prompt (which its first step decodes twice: ~35 ms at 128K tokens); the whole prompt as
# before where no such window gives the same text.
_SPILLWAY_DETOKENIZER_WINDOW = {WINDOW}
_SPILLWAY_WINDOW_SCAN = {SCAN}


def _spillway_clean_start(tokenizer, token_id, skip_special_tokens):
    # Decoded alone: text that starts with a whole character; and not a byte-fallback piece (<0xNN>), whose run
    # ByteFallback decodes as a whole.
    piece = tokenizer.id_to_token(token_id)
    if piece is None or (len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")):
        return False
    text = tokenizer.decode([token_id], skip_special_tokens=skip_special_tokens)
    return bool(text) and not text.startswith("\\ufffd")


def _spillway_prompt_window(tokenizer, prompt_token_ids, skip_special_tokens):
    if prompt_token_ids is None or len(prompt_token_ids) <= _SPILLWAY_DETOKENIZER_WINDOW:
        return prompt_token_ids
    try:
        start = len(prompt_token_ids) - _SPILLWAY_DETOKENIZER_WINDOW
        lowest = max(start - _SPILLWAY_WINDOW_SCAN, 1)
        while not _spillway_clean_start(tokenizer, prompt_token_ids[start], skip_special_tokens):
            if start <= lowest:
                return prompt_token_ids
            start -= 1
        window = prompt_token_ids[start:]
        # Text ending mid-character: the stream keeps no prefix and returns the whole primed text first.
        if tokenizer.decode(window, skip_special_tokens=skip_special_tokens).endswith("\\ufffd"):
            return prompt_token_ids
        return window
    except Exception:  # the stream decodes the whole prompt, as without the patch
        return prompt_token_ids


'''


def _transform(source: str) -> str:
    found = ORIGINAL.findall(source)
    classes = CLASS_LINE.findall(source)
    taken = [name for name in ("_spillway_prompt_window", "_spillway_clean_start") if name in source]
    if len(found) != 1 or len(classes) != 1 or taken:
        raise PatchError(f"{TARGET}: FastIncrementalDetokenizer.__init__ does not read as vLLM 0.32-0.33's "
                         f"({len(found)} matches, {len(classes)} classes, names taken {taken}); this vLLM "
                         f"needs its own look before the patch is carried")
    patched = ORIGINAL.sub(lambda m: m["head"] + PATCHED_IDS + m["tail"], source, count=1)
    return CLASS_LINE.sub(lambda m: HELPERS + m[0], patched, count=1)


PATCH = SourcePatch(NAME, TARGET, _transform, releases=("0.32", "0.33"))
target, is_applied, patch_source, apply, revert = (PATCH.target, PATCH.is_applied, PATCH.patch_source,
                                                   PATCH.apply, PATCH.revert)


if __name__ == "__main__":
    sys.exit(PATCH.main(sys.argv[1:]))
