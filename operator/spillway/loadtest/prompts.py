"""Deterministic, unique prompts: token-id lists (or plain text where the server takes no ids).

Every prompt is drawn from its own key (experiment, point, index, part) and the run's seed, so a re-run
with the same seed sends the same prompts, and a run with a new seed shares no prefix with earlier ones
(the server's CPU pool outlives a run: reused prompts would turn recomputes into hits).
"""
from __future__ import annotations

import hashlib
import random

# Token ids [FIRST_ID, FIRST_ID + id_range) are used: clear of the special ids at the start of most
# vocabularies, inside any real one. vLLM's engine fails on ids outside the vocabulary.
FIRST_ID = 10
DEFAULT_ID_RANGE = 1000


class PromptSource:
    def __init__(self, seed: int, id_range: int = DEFAULT_ID_RANGE, fmt: str = "ids") -> None:
        self.seed = seed
        self.ids = range(FIRST_ID, FIRST_ID + id_range)
        self.fmt = fmt

    def token_ids(self, n: int, *key: object) -> list[int]:
        digest = hashlib.blake2b(repr((self.seed, *key)).encode(), digest_size=8).digest()
        words = memoryview(random.Random(int.from_bytes(digest, "little")).randbytes(4 * n)).cast("I")
        first, size = self.ids.start, len(self.ids)
        return [first + w % size for w in words]

    def render(self, token_ids: list[int]) -> list[int] | str:
        """The prompt as sent: ids, or one short word per id (about one token each) in text mode."""
        if self.fmt == "ids":
            return token_ids
        return " ".join(f"w{t}" for t in token_ids)

    def prompt(self, n: int, *key: object) -> list[int] | str:
        return self.render(self.token_ids(n, *key))
