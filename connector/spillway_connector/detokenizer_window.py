"""The window of a prompt that primes its decode stream to the same text as the whole prompt (plugin.py).

Why the result is the same. tokenizers' DecodeStream reads the prompt only until its first text: that step
returns decode(prompt + new)[len(decode(prompt)):] and keeps only the output tokens afterwards, so a window W of
the prompt gives the same text whenever decode(prompt + X) = A + decode(W + X) for every continuation X, with A
fixed. That holds when W starts at a token t that decodes alone to text beginning with a whole character and is
not a byte-fallback piece: every decoder tokenizers ships is local past such a token (ByteLevel's lossy UTF-8
resynchronises at a lead byte; Metaspace's, WordPiece's and Strip's first-token rules then apply to t, inside the
fixed A; ByteFallback decodes a run of <0xNN> pieces as a whole, valid or all U+FFFD, and t ends any run). So the
window is the last WINDOW (32) tokens, moved back one token at a time to such a t (at most SCAN tokens), and the
whole prompt, exactly as before, when:
  - no such t lies within the scan (a long run of byte-fallback pieces or skipped special tokens);
  - the window's text ends in U+FFFD (the prompt ends mid-character): tokenizers then keeps no prefix and the
    first text it returns is the whole primed text (the prompt's, with the new token), which a window would cut;
  - the prompt is 32 tokens or fewer, its ids are None (prompt embeddings), or the tokenizer raises.
A plain "last 32 tokens" differs (tests/connector/test_detokenizer_window.py keeps the cases): a prompt ending in
32 skipped special tokens loses the next word's leading space (Metaspace/Strip), a prompt ending in a run of
byte-fallback pieces longer than 32 gets U+FFFD for output that continues it, and a prompt ending mid-character
returns the window's text where vLLM returns the whole prompt's. 32 rather than 1: a margin for a decoder whose
context reaches a few tokens back (CTC's repeats, a character's 4 bytes); it costs microseconds.
vLLM's slow detokenizer already primes from the last few prompt tokens only
(INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5, vllm/tokenizers/detokenizer_utils.py).
"""
from __future__ import annotations

from typing import Any

WINDOW = 32  # prompt tokens the stream is primed with, at least
SCAN = 1024  # how far back the window's start may move to a clean token before the whole prompt is used


def clean_start(tokenizer: Any, token_id: int, skip_special_tokens: bool) -> bool:
    """Decoded alone: text that starts with a whole character; and not a byte-fallback piece (<0xNN>), whose run
    ByteFallback decodes as a whole."""
    piece = tokenizer.id_to_token(token_id)
    if piece is None or (len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")):
        return False
    text = tokenizer.decode([token_id], skip_special_tokens=skip_special_tokens)
    return bool(text) and not text.startswith("\ufffd")


def prompt_window(tokenizer: Any, prompt_token_ids: Any, skip_special_tokens: bool) -> Any:
    """The ids to prime the decode stream with: a window of the prompt, or `prompt_token_ids` itself."""
    if prompt_token_ids is None or len(prompt_token_ids) <= WINDOW:
        return prompt_token_ids
    try:
        start = len(prompt_token_ids) - WINDOW
        lowest = max(start - SCAN, 1)
        while not clean_start(tokenizer, prompt_token_ids[start], skip_special_tokens):
            if start <= lowest:
                return prompt_token_ids
            start -= 1
        window = prompt_token_ids[start:]
        # Text ending mid-character: the stream keeps no prefix and returns the whole primed text first.
        if tokenizer.decode(window, skip_special_tokens=skip_special_tokens).endswith("\ufffd"):
            return prompt_token_ids
        return window
    except Exception:  # noqa: BLE001 - the stream decodes the whole prompt, as without the window
        return prompt_token_ids
