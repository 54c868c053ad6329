"""Prefix-affinity routing with a bounded imbalance (pure): which replica a request goes to.

vllm-router's kv_aware policy learns where a prefix is only from the replicas' KV events, once the blocks are
stored; a prompt that arrives while its prefix's first prompt is still being computed finds no holder and is
sent elsewhere, a miss and a second copy (three in flight it kept 50-68% CPU-pool hits against the best
possible 82.4%: docs/routing.md). This index records a prompt's prefix blocks on the replica it routes them to
the moment it routes, so the next prompt of that prefix follows at once, whatever the replica has stored yet.

- a prompt goes to the replica holding the longest run of its leading blocks;
- unless that replica has `max_imbalance` or more requests in flight beyond the least loaded one: then the
  holder's cache is not worth the queue, and the request goes to the best replica under the bound;
- a prefix no replica holds goes to the replica holding the fewest prefixes, then the least loaded, then the
  one that served the fewest requests. One at a time every replica's load is 0, and a choice by load alone
  would place every new prefix on the first replica (vllm-router's kv_aware at temperature 0 sent 48/0/0);
  the count of prefixes held spreads them evenly whatever their order of arrival.

A replica's remembered blocks are bounded by what its caches hold (`index_blocks`, the plan's GPU and CPU
blocks), least recently routed first out, as the replica's own LRU pools drop them.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Characters per block of a text prompt: the router does not tokenize, and about 4 characters make a token in
# English text with Llama-family tokenizers, so a block of `block_tokens` tokens is about 4x that many
# characters. Only the boundaries' consistency matters: the same text gives the same blocks.
CHARS_PER_TOKEN = 4

DECISION_PREFIX = "prefix"  # the replica holding the longest run of the prompt's leading blocks
DECISION_NEW = "new"  # no replica under the bound holds any of them
DECISION_OVERLOADED = "overloaded"  # a holder exists but is max_imbalance or more above the least loaded
DECISIONS = (DECISION_PREFIX, DECISION_NEW, DECISION_OVERLOADED)


@dataclass(frozen=True)
class AffinitySettings:
    block_tokens: int  # the replicas' --block-size: vLLM caches and offloads whole blocks only
    index_blocks: int  # blocks remembered per replica: what its GPU cache and CPU pool hold together
    max_imbalance: int  # requests in flight beyond the least loaded replica at which a holder is passed over

    def __post_init__(self) -> None:
        for name in ("block_tokens", "index_blocks", "max_imbalance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1; got {value!r}")


@dataclass(frozen=True)
class Decision:
    replica: str
    reason: str  # one of DECISIONS
    matched_blocks: int  # leading blocks of the prompt the chosen replica was routed before
    prompt_blocks: int


def _prompt_text(body: Mapping[str, Any]) -> str | list[int] | None:
    """What an OpenAI request's cacheable prefix is made of: the token ids or text of a completion's prompt
    (the first of a batch), or a chat's messages in order; None when the body carries neither."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]
    if isinstance(prompt, (str, list)):
        # Token ids are not checked one by one (a third of the cost of a 32K prompt): whatever a list holds is
        # hashed as it is, and vLLM refuses a prompt that is not token ids itself.
        return prompt
    messages = body.get("messages")
    if isinstance(messages, list):
        # Roles and contents in order, as a chat template lays them out: the same leading messages give the
        # same leading blocks. Non-text parts (images) are named by their type only.
        parts = []
        for message in messages:
            if not isinstance(message, Mapping):
                return None
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", p.get("type", ""))) if isinstance(p, Mapping) else str(p)
                                  for p in content)
            parts.append(f"<{message.get('role', '')}>{content if content is not None else ''}")
        return "".join(parts)
    return None


def prompt_blocks(body: Mapping[str, Any], block_tokens: int) -> list[int]:
    """Chained hashes of the prompt's whole blocks (a block's hash covers every block before it, so equal
    hashes mean equal prefixes); [] for a request without a prompt or shorter than one block."""
    source = _prompt_text(body)
    if not source:
        return []
    size = block_tokens if isinstance(source, list) else block_tokens * CHARS_PER_TOKEN
    blocks, parent = [], 0
    chunks = (source[start:start + size] for start in range(0, len(source) - size + 1, size))
    try:
        for chunk in chunks:
            parent = hash((parent, tuple(chunk) if isinstance(chunk, list) else chunk))
            blocks.append(parent)
    except TypeError:  # a list of lists or objects: not a prompt whose prefix can be named
        return []
    return blocks


class AffinityIndex:
    """Where each replica was sent which prefix blocks, and how many requests each has served."""

    def __init__(self, settings: AffinitySettings) -> None:
        self.settings = settings
        self._blocks: dict[str, OrderedDict[int, None]] = {}
        self._roots: dict[str, set[int]] = {}  # first blocks held: one per distinct prefix
        self.routed: Counter[str] = Counter()

    @property
    def replicas(self) -> list[str]:
        return list(self._blocks)

    def sync(self, replicas: Iterable[str]) -> tuple[list[str], list[str]]:
        """Follow the current replica set: a new replica starts empty, a gone one is forgotten; the others
        keep what they hold. Returns (added, removed)."""
        wanted = list(dict.fromkeys(replicas))
        removed = [r for r in self._blocks if r not in wanted]
        added = [r for r in wanted if r not in self._blocks]
        for replica in removed:
            del self._blocks[replica], self._roots[replica]
            self.routed.pop(replica, None)
        for replica in added:
            self._blocks[replica], self._roots[replica] = OrderedDict(), set()
        return added, removed

    def prefixes_held(self, replica: str) -> int:
        return len(self._roots[replica])

    def matched(self, replica: str, blocks: Sequence[int]) -> int:
        held = self._blocks[replica]
        count = 0
        for block in blocks:  # chained hashes: the first block not held ends the shared prefix
            if block not in held:
                break
            count += 1
        return count

    def choose(self, blocks: Sequence[int], in_flight: Mapping[str, int]) -> Decision:
        if not self._blocks:
            raise LookupError("no replica to route to")
        load = {r: in_flight.get(r, 0) for r in self._blocks}
        least = min(load.values())
        eligible = [r for r in self._blocks if load[r] - least < self.settings.max_imbalance]
        matched = {r: self.matched(r, blocks) for r in self._blocks}
        best = max((matched[r] for r in eligible), default=0)
        if best > 0:
            holders = [r for r in eligible if matched[r] == best]
            replica = min(holders, key=lambda r: (load[r], self.routed[r]))
            reason = DECISION_PREFIX
        else:
            replica = min(eligible, key=lambda r: (self.prefixes_held(r), load[r], self.routed[r]))
            reason = DECISION_OVERLOADED if any(matched.values()) else DECISION_NEW
        return Decision(replica, reason, matched[replica], len(blocks))

    def record(self, replica: str, blocks: Sequence[int]) -> None:
        """The replica is sent these blocks: it holds them (most recently used) from now on."""
        held, roots = self._blocks[replica], self._roots[replica]
        self.routed[replica] += 1
        # Deepest block first, so the prefix's first block is the most recent: under pressure a prefix loses
        # its tail before its head, and what stays still matches (chained hashes match from the first block).
        for block in reversed(blocks):
            held[block] = None
            held.move_to_end(block)
        if blocks:
            roots.add(blocks[0])
        while len(held) > self.settings.index_blocks:
            block, _ = held.popitem(last=False)
            roots.discard(block)

    def route(self, body: Mapping[str, Any], in_flight: Mapping[str, int]) -> Decision:
        blocks = prompt_blocks(body, self.settings.block_tokens)
        decision = self.choose(blocks, in_flight)
        self.record(decision.replica, blocks)
        return decision
