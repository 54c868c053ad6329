"""Prefix placement by consistent hashing with bounded loads (pure): which replica a request goes to.

A prompt's placement is a function of its leading blocks and the live replica set only, so every router pod
places a prefix on the same replica without sharing anything, a router pod that restarts routes as the others
do, and a replica that joins (or comes back under its address) takes its arcs of the ring, and so its share
of prefixes, at once (KubeAI's PrefixHash works so; Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing
with Bounded Loads", 2018):

- the prompt's key is the chained hash of its first `key_blocks` blocks (fewer if it is shorter): prompts that
  share those blocks share a key;
- the key and `VNODES` points per replica lie on one hash ring; the key's owner is the first replica clockwise;
- a replica is passed over while it would hold more than `load_factor` x the mean requests in flight (the
  mean counting this one; never less than MIN_BOUND): the next replica clockwise under the bound takes the
  request. The bound is relative to the mean, so it acts at any concurrency: a hot prefix spills to its
  successors, always the same ones, before its owner queues. Where every replica reads as over it (a
  burst between two reads of the replicas' loads), the least loaded takes the request.

What a router pod counts on a replica. Its own requests in flight it knows at once; the other router pods'
it cannot see. Two estimates, each wrong in its own way, and the larger is taken:

- its own x `peers` (it sees about 1/peers of the traffic): right on average, but a pod that happens to hold
  none on a hot prefix's owner reads 0 there whatever the others hold, so with this estimate alone three
  pods each sent it one more and it reached 4 in flight against a bound of 2 (bench/fleet/README.md). This estimate steps in
  peers, so a replica after the owner takes one request of this pod's own more (peers - 1) before the walk
  goes on: without that slack a prefix whose owner and successor each ran one of its requests was copied to
  a third replica;
- the replica's own count (running and waiting in its engine, read from its /metrics every few hundred
  milliseconds: a `Report`), less this pod's requests to it then, plus this pod's now: every pod's requests,
  this pod's fresh and the others' as of the last read. A report older than `report_ttl_s` is not used (a
  replica that stopped answering its /metrics says nothing of its load now), and a lone router pod uses
  none: its own count is exact and has no other pod's to add, while a report, a read's age old, can only
  add requests that are gone (clients that reach a replica past the router are not what it balances).

The mean the bound is taken from sums the replicas' reports where fresh, and the estimates only where not:
the x peers estimate of a pod that holds most of the requests in flight at one moment would raise the mean,
and the bound, for all. Every pod reads the same replicas, so pods agree on the bound within a read's age.

A prompt without blocks (no prompt, or shorter than a block) goes to the least loaded replica.

The record (which blocks were sent where, bounded per replica by what its caches hold and in all by the
router's memory budget) decides nothing: it counts the blocks each request shares with what its replica was
sent before, the metric that tells whether placement keeps locality, and it is what a replica's restart
clears.
"""
from __future__ import annotations

import hashlib
import math
from bisect import bisect_left
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Characters per block of a text prompt: the router does not tokenize, and about 4 characters make a token in
# English text with Llama-family tokenizers, so a block of `block_tokens` tokens is about 4x that many
# characters. Only the boundaries' consistency matters: the same text gives the same blocks.
CHARS_PER_TOKEN = 4
# Points per replica on the ring: with 100 the arcs of 4 replicas are each within about 10% of a quarter
# (the spread of a sum of 100 exponential arcs), as in KubeAI's default replication.
VNODES = 100
DEFAULT_KEY_BLOCKS = 4
DEFAULT_LOAD_FACTOR = 1.25  # KubeAI's and the paper's c: at most 25% above the mean
# The bound is never below 2: two prompts of a prefix on one replica run in one batch (vLLM batches up to
# max_num_seqs), so a bound of 1 at a low total (2 in flight over 4 replicas: 1.25 x 2 / 4 rounds up to 1)
# would split a prefix's first two concurrent prompts, a miss, to save no queue.
MIN_BOUND = 2
# Blocks of a prompt hashed at most: the key's and, beyond it, those the record counts (routing never needs
# more, and a 128K-token prompt then costs what a short one does).
DEFAULT_MAX_BLOCKS = 64
# A replica's report of its load is used this long after it was read, then dropped: a few reads at the
# router's pace (commands/route.py reads every routing.ROUTER_LOAD_POLL_S), so one slow or lost read keeps the
# last one, and a replica whose /metrics stops answering falls back to the router's own estimate.
DEFAULT_REPORT_TTL_S = 2.0
# What one record entry costs in memory: an OrderedDict entry of a 64-bit hash measured 141 bytes with
# tracemalloc (200,000 entries, CPython 3.11), and 224 bytes in a record under eviction churn (deleted slots
# wait for the table's next resize); tests/routing/test_affinity.py checks a full record against its budget.
INDEX_ENTRY_BYTES = 256

DECISION_PREFIX = "prefix"  # the key's owner, which was sent the prompt's leading blocks before
DECISION_NEW = "new"  # the key's owner (or the least loaded, for a prompt without blocks), not sent them before
DECISION_OVERLOADED = "overloaded"  # the owner was above the load bound: the next replica along the ring under it
DECISIONS = (DECISION_PREFIX, DECISION_NEW, DECISION_OVERLOADED)


def _whole(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1; got {value!r}")
    return value


@dataclass(frozen=True)
class AffinitySettings:
    block_tokens: int  # the replicas' --block-size: vLLM caches and offloads whole blocks only
    index_blocks: int  # blocks recorded per replica: what its GPU cache and CPU pool hold together
    index_bytes: int = 256 << 20  # the record's memory budget over all replicas
    key_blocks: int = DEFAULT_KEY_BLOCKS
    load_factor: float = DEFAULT_LOAD_FACTOR
    max_blocks: int = DEFAULT_MAX_BLOCKS
    # Router pods sharing the traffic: each sees only its own requests in flight, about 1/peers of each pod's,
    # so it bounds loads estimated as its own x peers (without, 3 router pods at 5 in flight never saw a
    # hot prefix's owner above the bound: bench/routing/fleet.py).
    peers: int = 1
    report_ttl_s: float = DEFAULT_REPORT_TTL_S

    def __post_init__(self) -> None:
        for name in ("block_tokens", "index_blocks", "index_bytes", "key_blocks", "max_blocks", "peers"):
            _whole(name, getattr(self, name))
        ttl = self.report_ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
            raise ValueError(f"report_ttl_s must be a number of seconds > 0; got {ttl!r}")
        factor = self.load_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) \
                or not 1.0 <= factor <= 100.0:
            raise ValueError(f"load_factor must be a number in [1, 100]; got {factor!r}")
        if self.key_blocks > self.max_blocks:
            raise ValueError(f"key_blocks ({self.key_blocks}) must be at most max_blocks ({self.max_blocks})")

    @property
    def index_entries(self) -> int:
        """Record entries the memory budget holds, over all replicas."""
        return max(1, self.index_bytes // INDEX_ENTRY_BYTES)


@dataclass(frozen=True)
class Report:
    """A replica's own count of the requests in its engine (running and waiting) as one router pod read it,
    less that pod's requests that the count may hold (in flight when the read began, or sent while it ran):
    the other router pods' requests, which this pod sees no other way."""

    others: int
    at: float  # when it was read, on the reading pod's monotonic clock

    @classmethod
    def read(cls, running_and_waiting: float, own_then: int, at: float) -> Report:
        # A request this pod counts may not have reached the engine yet (or has left it and is still being
        # answered): the replica then shows fewer than this pod holds, which says the others hold none.
        return cls(max(0, round(running_and_waiting) - own_then), at)


@dataclass(frozen=True)
class Decision:
    replica: str
    reason: str  # one of DECISIONS
    matched_blocks: int  # leading blocks of the prompt the chosen replica was sent before
    prompt_blocks: int


def _text(part: Any) -> str:
    """A chat content part's text, or its type for a non-text part (an image is named, not read)."""
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping):
        text = part.get("text")
        if isinstance(text, str):
            return text
        kind = part.get("type")
        return kind if isinstance(kind, str) else ""
    return ""


def _prompt_text(body: Mapping[str, Any], tokens: int) -> str | list | None:
    """What an OpenAI request's cacheable prefix is made of, its first `tokens` token ids (or as many tokens'
    characters) at most: a completion's prompt (the first of a batch), or a chat's messages in order; None when the body
    carries neither. Nothing here recurses into the body, whatever its depth."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]
    if isinstance(prompt, (str, list)):
        # Token ids are not checked one by one: whatever a list holds is hashed as it is, and vLLM refuses a
        # prompt that is not token ids itself.
        return prompt[:tokens] if isinstance(prompt, list) else prompt[:tokens * CHARS_PER_TOKEN]
    messages = body.get("messages")
    if isinstance(messages, list):
        # Roles and contents in order, as a chat template lays them out: the same leading messages give the
        # same leading blocks.
        parts, size, chars = [], 0, tokens * CHARS_PER_TOKEN
        for message in messages:
            if not isinstance(message, Mapping):
                return None
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(_text(p) for p in content[:256])
            role = message.get("role")
            part = f"<{role if isinstance(role, str) else ''}>{content if isinstance(content, str) else ''}"
            parts.append(part)
            size += len(part)
            if size >= chars:
                break
        return "".join(parts)[:chars]
    return None


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def prompt_blocks(body: Mapping[str, Any], block_tokens: int, max_blocks: int = DEFAULT_MAX_BLOCKS) -> list[int]:
    """Chained hashes of the prompt's first whole blocks, at most `max_blocks` (a block's hash covers every
    block before it, so equal hashes mean equal prefixes); [] for a request without a prompt or shorter than
    one block. The hashes are the same in every process (no per-process string hash seed), so router pods
    agree on them."""
    source = _prompt_text(body, max_blocks * block_tokens)
    if not source:
        return []
    size = block_tokens if isinstance(source, list) else block_tokens * CHARS_PER_TOKEN
    blocks, parent = [], 0
    try:
        for start in range(0, len(source) - size + 1, size):
            chunk = source[start:start + size]
            if isinstance(chunk, list):
                # A number hashes alike in every process; a str or None (the other hashable values JSON
                # gives) does not, and sum() refuses both, in C: a Python check of each id's type was the
                # costliest step of hashing a long prompt. A float or a bool is hashed as the number it is.
                sum(chunk)
                parent = hash((parent, tuple(chunk)))
            else:
                parent = _digest(parent.to_bytes(8, "big", signed=True) + chunk.encode("utf-8", "surrogatepass"))
                parent -= 1 << 63
            blocks.append(parent)
    except (TypeError, OverflowError):
        return []
    return blocks


def _point(key: int) -> int:
    return _digest(key.to_bytes(8, "big", signed=True))


class Ring:
    """VNODES points per replica on a 64-bit hash ring; walking from a key yields each replica once."""

    def __init__(self, replicas: Iterable[str]) -> None:
        points = sorted((_digest(f"{replica}#{i}".encode()), replica) for replica in replicas for i in range(VNODES))
        self._points = [p for p, _ in points]
        self._owners = [r for _, r in points]

    def owner(self, key: int) -> str:
        """The first replica clockwise from the key (the ring is not empty)."""
        return self._owners[bisect_left(self._points, _point(key)) % len(self._owners)]

    def walk(self, key: int) -> Iterator[str]:
        start = bisect_left(self._points, _point(key))
        seen: set[str] = set()
        count = len(self._owners)
        for i in range(count):
            owner = self._owners[(start + i) % count]
            if owner not in seen:
                seen.add(owner)
                yield owner


class AffinityIndex:
    """The ring over the live replicas, and the record of which blocks each was sent."""

    def __init__(self, settings: AffinitySettings) -> None:
        self.settings = settings
        self._blocks: dict[str, OrderedDict[int, None]] = {}
        self._ring = Ring(())
        self.routed: Counter[str] = Counter()

    @property
    def replicas(self) -> list[str]:
        return list(self._blocks)

    @property
    def per_replica(self) -> int:
        """Blocks recorded per replica: its caches' blocks, within the memory budget's share."""
        return max(1, min(self.settings.index_blocks, self.settings.index_entries // max(1, len(self._blocks))))

    def sync(self, replicas: Iterable[str]) -> tuple[list[str], list[str]]:
        """Follow the live replica set: a new replica starts with an empty record and owns its arcs at once, a
        gone one is forgotten; the others keep theirs. Returns (added, removed)."""
        wanted = list(dict.fromkeys(replicas))
        removed = [r for r in self._blocks if r not in wanted]
        added = [r for r in wanted if r not in self._blocks]
        for replica in removed:
            del self._blocks[replica]
            self.routed.pop(replica, None)
        for replica in added:
            self._blocks[replica] = OrderedDict()
        if added or removed:
            self._ring = Ring(self._blocks)
            for replica in self._blocks:
                self._trim(replica)
        return added, removed

    def forget(self, replica: str) -> None:
        """The replica restarted: its caches are empty, and so is its record."""
        if replica in self._blocks:
            self._blocks[replica] = OrderedDict()

    def matched(self, replica: str, blocks: Sequence[int]) -> int:
        held = self._blocks[replica]
        count = 0
        for block in blocks:  # chained hashes: the first block not held ends the shared prefix
            if block not in held:
                break
            count += 1
        return count

    def order(self, blocks: Sequence[int], live: Sequence[str], load: Mapping[str, int]) -> Iterator[str]:
        """The replicas in the order a prompt tries them: along the ring from its key, or least loaded first."""
        if not blocks:
            return iter(sorted(live, key=lambda r: (load[r], self.routed[r])))
        key = blocks[min(len(blocks), self.settings.key_blocks) - 1]
        wanted = set(live)
        return (r for r in self._ring.walk(key) if r in wanted)

    def loads(self, live: Sequence[str], in_flight: Mapping[str, int], reports: Mapping[str, Report] | None,
              now: float) -> tuple[dict[str, int], dict[str, int], int]:
        """(per replica, this pod's own x peers; per replica with a fresh report, every pod's requests as
        seen; the fleet's requests in flight, from the reports where fresh and the estimate elsewhere)."""
        peers, ttl = self.settings.peers, self.settings.report_ttl_s
        estimated, seen, total = {}, {}, 0
        for replica in live:
            own = in_flight.get(replica, 0)
            estimated[replica] = peers * own
            report = reports.get(replica) if reports else None
            if peers > 1 and report is not None and now - report.at <= ttl:
                seen[replica] = own + report.others
                total += own + report.others
            else:
                total += peers * own
        return estimated, seen, total

    def choose(self, blocks: Sequence[int], in_flight: Mapping[str, int], exclude: Iterable[str] = (),
               reports: Mapping[str, Report] | None = None, now: float = 0.0) -> Decision:
        """The replica for a prompt of these blocks; `in_flight`: this pod's own requests per replica;
        `reports`: the replicas' own counts (read at `now`'s clock), where this pod has them; `exclude`:
        replicas not to use now (a failed attempt, an open circuit), unless no other is left."""
        if not self._blocks:
            raise LookupError("no replica to route to")
        skip = set(exclude)
        live = [r for r in self._blocks if r not in skip] or list(self._blocks) if skip else list(self._blocks)
        peers = self.settings.peers
        estimated, seen, total = self.loads(live, in_flight, reports, now)
        bound = max(MIN_BOUND, math.ceil(self.settings.load_factor * (total + 1) / len(live)))
        if blocks:
            # Most requests go to their key's owner: it is found without walking the ring.
            owner = self._ring.owner(blocks[min(len(blocks), self.settings.key_blocks) - 1])
            if owner not in skip and max(estimated[owner], seen.get(owner, 0)) + 1 <= bound:
                matched = self.matched(owner, blocks)
                return Decision(owner, DECISION_PREFIX if matched else DECISION_NEW, matched, len(blocks))
        load = {r: max(estimated[r], seen.get(r, 0)) for r in live}
        for position, replica in enumerate(self.order(blocks, live, load)):
            # A replica passed a request over (position > 0) takes one more of this pod's own: its own count
            # x peers steps in peers, so one own request there already reads as over a bound of 2, and without
            # the slack a prefix whose owner and successor each run one of this pod's would be copied to a third
            # replica. With 3 router pods that cost 2.4-5.7 points of CPU-pool hit share where the pools hold a
            # prefix on two replicas but not on three (bench/fleet/README.md); the owner's bound is unchanged,
            # so a hot prefix still leaves its owner as early. A replica's own count is exact, so it gets none.
            slack = peers - 1 if position else 0
            if max(estimated[replica] - slack, seen.get(replica, 0)) + 1 <= bound:
                break
        else:
            # Every replica reads as over the bound: the mean is taken from the reports, a replica's load from
            # the larger of its report and this pod's estimate, so in a burst between two reads all can. The
            # least loaded takes it, the first along the ring among equals, as every pod would choose.
            ranked = list(self.order(blocks, live, load))
            replica = min(ranked, key=load.__getitem__)
            position = ranked.index(replica)
        matched = self.matched(replica, blocks)
        if position > 0:
            reason = DECISION_OVERLOADED
        else:
            reason = DECISION_PREFIX if matched else DECISION_NEW
        return Decision(replica, reason, matched, len(blocks))

    def _trim(self, replica: str) -> None:
        held, bound = self._blocks[replica], self.per_replica
        while len(held) > bound:
            held.popitem(last=False)

    def record(self, replica: str, blocks: Sequence[int]) -> None:
        """The replica is sent these blocks: it holds them (most recently used) from now on."""
        held = self._blocks.get(replica)
        if held is None:
            return  # it left while the request was in flight
        self.routed[replica] += 1
        # Deepest block first, so the prefix's first block is the most recent: under pressure a prefix loses
        # its tail before its head, and what stays still matches (chained hashes match from the first block).
        for block in reversed(blocks):
            held[block] = None
            held.move_to_end(block)
        self._trim(replica)

    def route(self, body: Mapping[str, Any], in_flight: Mapping[str, int]) -> Decision:
        blocks = prompt_blocks(body, self.settings.block_tokens, self.settings.max_blocks)
        decision = self.choose(blocks, in_flight)
        self.record(decision.replica, blocks)
        return decision


@dataclass
class _Circuit:
    failures: int = 0
    open_until: float = 0.0


class Breaker:
    """A circuit per replica: `failures` failed attempts in a row open it for `cooldown_s`, during which the
    replica takes no request (its arcs pass to its ring successors); after it one request tries the replica
    again: a success closes the circuit, a failure opens it for another cooldown."""

    def __init__(self, failures: int = 3, cooldown_s: float = 10.0) -> None:
        self.failures, self.cooldown_s = _whole("failures", failures), cooldown_s
        self._circuits: dict[str, _Circuit] = {}

    def open(self, now: float) -> list[str]:
        return [r for r, c in self._circuits.items() if c.open_until > now]

    def failed(self, replica: str, now: float) -> bool:
        """Counts a failure; True when it opens the circuit."""
        circuit = self._circuits.setdefault(replica, _Circuit())
        circuit.failures += 1
        if circuit.failures >= self.failures and circuit.open_until <= now:
            circuit.open_until = now + self.cooldown_s
            return True
        return False

    def succeeded(self, replica: str) -> None:
        self._circuits.pop(replica, None)

    def forget(self, replica: str) -> None:
        self._circuits.pop(replica, None)
