"""A fleet's traffic on the routing tests' real vLLM CPU replicas (routing/replicas.py): prefixes of Zipf
popularity (optionally one hot prefix on top), each request to one of the router pods at random (as a Service
picks one), streamed for TTFT; per-replica figures from the replicas' own /metrics. Shared by
tests/routing/test_fleet_engines.py and bench/fleet/engines.py, which differ only in how much they send.

`spillway loadtest prefix-groups` sends every prefix equally often through one endpoint; a fleet's front door
sees a few prefixes most of the time, through several router pods, while replicas come and go.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import aiohttp
from routing.replicas import BLOCK, MODEL, QUESTION_LEN, spillway_router
from spillway.core import affinity as A
from spillway.core import routing
from spillway.core import vllm_api as V
from spillway_connector import names as connector_names
from support import SERVED_MODEL_NAME, VllmServer
from support.disk_slots import slots_released
from support.promtext import total
from support.vllm_router import SpillwayRouter
from support.vllm_server import FIRST_TOKEN_ID

REQUEST_TIMEOUT_S = 120.0
# How often each router pod reads the replicas' load: a request here lives a few hundred milliseconds (a tiny
# model on 2 shared cores), a GPU replica's for seconds, so the router's default quarter second would be as
# stale here as 2-3 s is there.
LOAD_POLL_S = 0.1


@dataclass(frozen=True)
class Workload:
    """`prefixes` prefixes of `prefix_blocks` blocks, drawn with Zipf(`zipf`) popularity; with `hot` > 0 that
    share of the requests goes to prefix 0 and the rest are drawn as before. `name` keys the token ids: each
    scenario's prompts are new to every pool."""

    name: str
    prefixes: int = 12
    prefix_blocks: int = 3
    zipf: float = 1.1
    hot: float = 0.0
    seed: int = 1
    # Tokens each answer generates. One measures TTFT alone; a hot prefix's test wants requests that stay in
    # their engine's batch while they decode, as on a GPU, where the replica's own count of them is what the
    # router pods read (with one token a request is scheduled and finished in one engine step, between two
    # of vLLM's updates of num_requests_running).
    output_tokens: int = 1

    def __post_init__(self) -> None:
        if self.prefixes < 1 or self.prefix_blocks < 1 or self.zipf <= 0 or not 0.0 <= self.hot < 1.0:
            raise ValueError(f"a workload needs prefixes >= 1, prefix blocks >= 1, zipf > 0 and hot in [0, 1): "
                             f"{self}")

    def _ids(self, n: int, *key: object) -> list[int]:
        rng = random.Random(repr((self.name, self.seed, *key)))
        return [rng.randrange(FIRST_TOKEN_ID, MODEL.vocab_size) for _ in range(n)]

    def prefix(self, p: int) -> list[int]:
        return self._ids(self.prefix_blocks * BLOCK, "prefix", p)

    def prompt(self, p: int, i: int) -> list[int]:
        """The prefix, then a question shorter than a block: only the prefix is offloaded."""
        return self.prefix(p) + self._ids(QUESTION_LEN, "question", i)

    def weights(self) -> list[float]:
        """Each prefix's share of the requests."""
        zipf = [1 / (k ** self.zipf) for k in range(1, self.prefixes + 1)]
        norm = sum(zipf)
        shares = [(1 - self.hot) * w / norm for w in zipf]
        shares[0] += self.hot
        return shares

    def requests(self, start: int = 0) -> Iterator[tuple[int, int]]:
        """(prefix, request number) for ever, the same sequence for the same workload."""
        rng = random.Random(repr((self.name, self.seed, "draw")))
        weights = self.weights()
        for i in range(10**9):
            p = rng.choices(range(self.prefixes), weights=weights)[0]
            if i >= start:
                yield p, i

    def best_hit(self, n: int) -> float:
        """The CPU-pool hit share if every prefix's first prompt missed and every later one read the whole
        prefix, over the first n requests."""
        seen, hit = set(), 0
        for p, _ in zip_n(self.requests(), n):
            hit += p in seen
            seen.add(p)
        prefix = self.prefix_blocks * BLOCK
        return hit * prefix / (n * (prefix + QUESTION_LEN))

    def owners(self, urls: Sequence[str]) -> list[str]:
        """Each prefix's owner on the router's ring over these replicas (core/affinity.py): placement is a
        function of the prompt's leading blocks and the replica set alone."""
        ring = A.Ring(urls)
        out = []
        for p in range(self.prefixes):
            blocks = A.prompt_blocks({"prompt": self.prefix(p)}, BLOCK)
            out.append(next(ring.walk(blocks[min(len(blocks), A.DEFAULT_KEY_BLOCKS) - 1])))
        return out

    def owned_shares(self, urls: Sequence[str]) -> list[float]:
        """Each replica's share of the requests its ring arcs draw (before the load bound moves any)."""
        owners = self.owners(urls)
        weights = self.weights()
        return [sum(w for o, w in zip(owners, weights) if o == url) for url in urls]


def zip_n(it: Iterator, n: int) -> Iterator:
    for _, item in zip(range(n), it):
        yield item


def balanced_seed(name: str, urls: Sequence[str], least: float, **kwargs) -> int:
    """The first seed under which every replica's arcs draw at least `least` of the requests. The replicas'
    ports, and with them the ring, are drawn at random; 12 Zipf prefixes over 3 replicas leave one replica
    with a tenth of the traffic in some draws, and a share measured against an even one would then measure
    the ring's luck. Balance is the ring's business (tests/routing/test_affinity.py)."""
    for seed in range(1, 1000):
        if min(Workload(name, seed=seed, **kwargs).owned_shares(urls)) >= least:
            return seed
    raise AssertionError(f"no seed below 1000 gives every replica {least:.0%} of {name}'s requests")


@dataclass
class Outcome:
    prefix: int
    router: int
    ok: bool
    ttft_s: float | None = None
    error: str = ""


@dataclass
class Load:
    """What was sent: every request's outcome, in order of completion."""

    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [o.error for o in self.outcomes if not o.ok]

    def ttft_ms(self) -> dict[str, float | None]:
        times = sorted(o.ttft_s for o in self.outcomes if o.ok and o.ttft_s is not None)
        if not times:
            return {"p50": None, "p90": None}
        pick = lambda q: round(1000 * times[min(len(times) - 1, int(q * len(times)))], 1)
        return {"p50": pick(0.5), "p90": pick(0.9)}


async def _one(session: aiohttp.ClientSession, url: str, ids: list[int],
               output_tokens: int = 1) -> tuple[float | None, str]:
    """(TTFT, "" or the error) of one streamed completion of `output_tokens` tokens (whatever the random
    weights make of the end-of-sequence token)."""
    body = {"model": SERVED_MODEL_NAME, "prompt": ids, "max_tokens": output_tokens, "stream": True,
            **({"ignore_eos": True} if output_tokens > 1 else {})}
    start = time.perf_counter()
    ttft = None
    try:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            if response.status != 200:
                return None, f"HTTP {response.status}: {(await response.text())[:200]}"
            text = b""
            async for chunk in response.content.iter_any():
                if ttft is None:
                    ttft = time.perf_counter() - start
                text += chunk
            if b"[DONE]" not in text or b'"error"' in text:
                return None, f"incomplete or failed stream: {text[-200:]!r}"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return None, f"{exc.__class__.__name__}: {str(exc)[:200]}"
    return ttft, ""


async def drive(routers: Sequence[str], workload: Workload, requests: Iterator[tuple[int, int]], *,
                concurrency: int, count: int, load: Load | None = None) -> Load:
    """Send the next `count` requests, `concurrency` at a time, each to a router pod chosen at random."""
    load = load or Load()
    rng = random.Random(repr((workload.name, workload.seed, "routers", len(routers))))
    sent = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while sent < count:
            try:
                p, i = next(requests)
            except StopIteration:
                return
            sent += 1
            r = rng.randrange(len(routers))
            ttft, error = await _one(session, routers[r], workload.prompt(p, i), workload.output_tokens)
            load.outcomes.append(Outcome(p, r, not error, ttft, error))

    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return load


# -- the replicas' own figures ---------------------------------------------------------------------------------

def scrape(server: VllmServer) -> dict[str, float]:
    """The replica's counters: requests finished, prompt tokens, CPU-pool hit tokens, queue time (sum, count),
    and its process start (the counters start again with a new process)."""
    text = server.metrics_text()
    return {
        "requests": total(text, f"{V.Metric.REQUEST_SUCCESS}_total"),
        "prompt_tokens": total(text, f"{V.Metric.PROMPT_TOKENS}_total"),
        "cpu_hit_tokens": total(text, f"{V.Metric.EXTERNAL_HITS}_total"),
        "queue_s": total(text, f"{V.Metric.REQUEST_QUEUE_TIME}_sum"),
        "queued": total(text, f"{V.Metric.REQUEST_QUEUE_TIME}_count"),
        "start": total(text, V.Metric.PROCESS_START_TIME),
        # chunks the node-disk tier served into the pool, and of those read from another replica's slot (0
        # without a tier): where a restarted or joining replica's hits came from
        "disk_hit_chunks": total(text, f"{V.TieringMetric.CHUNK_HITS}_total",
                                 **{V.TieringMetric.LABEL: V.TieringMetric.DISK_FS}),
        "sibling_chunks": total(text, connector_names.exported(connector_names.TIER_SIBLING_LOADED_CHUNKS)),
    }


async def scrape_all(servers: Sequence[VllmServer]) -> list[dict[str, float]]:
    loop = asyncio.get_running_loop()
    return list(await asyncio.gather(*(loop.run_in_executor(None, scrape, s) for s in servers)))


def figures(before: Sequence[dict], after: Sequence[dict], load: Load | None = None) -> dict:
    """Hit share over all replicas' prompt tokens, each replica's share of the requests and mean queue wait,
    between two scrapes (a replica that restarted in between counts from its new start)."""
    rows = []
    for b, a in zip(before, after):
        base = b if b["start"] == a["start"] else dict.fromkeys(b, 0.0)
        rows.append({k: a[k] - base[k] for k in ("requests", "prompt_tokens", "cpu_hit_tokens", "queue_s", "queued",
                                                 "sibling_chunks")})
    requests = sum(r["requests"] for r in rows) or 1
    prompt = sum(r["prompt_tokens"] for r in rows) or 1
    out = {
        "requests": int(sum(r["requests"] for r in rows)),
        "cpu_hit_share": round(sum(r["cpu_hit_tokens"] for r in rows) / prompt, 4),
        "replica_requests": [int(r["requests"]) for r in rows],
        "replica_shares": [round(r["requests"] / requests, 3) for r in rows],
        "replica_hit_shares": [round(r["cpu_hit_tokens"] / r["prompt_tokens"], 3) if r["prompt_tokens"] else None
                               for r in rows],
        "queue_wait_ms": [round(1000 * r["queue_s"] / r["queued"], 1) if r["queued"] else None for r in rows],
        "sibling_chunks": [int(r["sibling_chunks"]) for r in rows],
    }
    if load is not None:
        out["client_errors"] = len(load.errors)
        out["error_samples"] = load.errors[:3]
        out["ttft_ms"] = load.ttft_ms()
    return out


def router_count(routers: Sequence[SpillwayRouter], metric: str, **labels: str) -> float:
    """A router counter summed over every router pod."""
    return sum(total(r.metrics_text(), metric, **labels) for r in routers)


@contextlib.contextmanager
def router_pods(servers: Sequence[VllmServer], count: int, extra: Sequence[str] = ()) -> Iterator[list[SpillwayRouter]]:
    """`count` `spillway route` processes over these replicas, each told how many share the traffic, as the
    operator runs them for routing.router.replicas (controller/routing_objects.py)."""
    peers = ["--router-pods", str(count)] if count > 1 else []
    loads = ["--load-poll-seconds", str(LOAD_POLL_S)] if LOAD_POLL_S else []
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(spillway_router(list(servers), [*peers, *loads, *extra])) for _ in range(count)]


def overloaded(routers: Sequence[SpillwayRouter]) -> int:
    """Requests the load bound passed from their owner to the next replica along the ring, over all pods."""
    return int(router_count(routers, routing.ROUTER_METRIC_REQUESTS, **{routing.ROUTER_LABEL_DECISION:
                                                                         A.DECISION_OVERLOADED}))


def _overloaded_to(routers: Sequence[SpillwayRouter], servers: Sequence[VllmServer]) -> dict[str, int]:
    """Per replica, requests it took because the bound (or a failure) passed them over from their owner."""
    return {s.base_url: int(router_count(routers, routing.ROUTER_METRIC_REQUESTS, **{
        routing.ROUTER_LABEL_WORKER: s.base_url, routing.ROUTER_LABEL_DECISION: A.DECISION_OVERLOADED}))
        for s in servers}


# -- the scenarios -------------------------------------------------------------------------------------------

async def zipf(servers: Sequence[VllmServer], pods: int, workload: Workload, *, requests: int,
               concurrency: int) -> dict:
    """`requests` of the workload through `pods` router pods over every replica."""
    with router_pods(servers, pods) as routers:
        _LIVE_ROUTERS[:] = routers
        urls = [r.base_url for r in routers]
        try:
            before = await scrape_all(servers)
            load = await drive(urls, workload, workload.requests(), concurrency=concurrency, count=requests)
            after = await scrape_all(servers)
            spilled = overloaded(routers)
        finally:
            _LIVE_ROUTERS.clear()
    owners = workload.owners([s.base_url for s in servers])
    return {"scenario": workload.name, "routers": pods, "concurrency": concurrency,
            "best_hit_share": round(workload.best_hit(requests), 4), **figures(before, after, load),
            "overloaded": spilled, "ring_shares": [round(x, 3) for x in workload.owned_shares([s.base_url for s in servers])],
            "hot_owner": next(i for i, s in enumerate(servers) if s.base_url == owners[0])}


async def scale_up(servers: Sequence[VllmServer], pods: int, workload: Workload, *, requests: int,
                   concurrency: int) -> dict:
    """Half the requests over all replicas but the last, then the last joins every router pod (as a pod
    becoming ready reaches them through DNS) and the other half is sent."""
    with router_pods(servers[:-1], pods) as routers:
        urls = [r.base_url for r in routers]
        stream = workload.requests()
        first = await drive(urls, workload, stream, concurrency=concurrency, count=requests // 2)
        for router in routers:
            router.set_workers([s.base_url for s in servers])
        await asyncio.sleep(POLL_WAIT_S)
        before = await scrape_all(servers)
        spilled_before = _overloaded_to(routers, servers)
        started = time.monotonic()
        second = await drive(urls, workload, stream, concurrency=concurrency, count=requests - requests // 2)
        elapsed = time.monotonic() - started
        after = await scrape_all(servers)
        spilled = _overloaded_to(routers, servers)
        spilled = {url: n - spilled_before.get(url, 0) for url, n in spilled.items()}
    owners = workload.owners([s.base_url for s in servers])
    joined = servers[-1].base_url
    # The requests of the window whose prefix the joined replica owns on the ring: its share before the load
    # bound moves any (the ring's draw in this window, not the weights' expectation).
    drawn = [owners[o.prefix] == joined for o in second.outcomes]
    result = figures(before, after, second)
    return {"scenario": workload.name, "routers": pods, "concurrency": concurrency,
            "first_half_errors": len(first.errors), **result,
            "joined_share": result["replica_shares"][-1], "window_s": round(elapsed, 1),
            "joined_drawn_share": round(sum(drawn) / max(1, len(drawn)), 3),
            "overloaded_to": [spilled[s.base_url] for s in servers],
            "ring_shares": [round(x, 3) for x in workload.owned_shares([s.base_url for s in servers])]}


async def restart(servers: Sequence[VllmServer], pods: int, workload: Workload, *, restarted: int,
                  before_requests: int, down_requests: int, after_requests: int, concurrency: int) -> dict:
    """Requests through `pods` router pods; then, between requests (none in flight), the replica
    `restarted` is stopped and started again on its port, and `down_requests` are sent one at a time while
    it starts (the replica still listed, as in the seconds before DNS drops a pod: each request its arcs draw
    meets a refused connection); from its Ready on, `after_requests` more. Its share of those, and every
    client error throughout, are the figures.

    The requests while it starts are few on purpose: the engines' OpenMP threads spin while they serve, on
    the cores every engine binds, and on 2 cores an engine starting beside two serving ones took 6-8 minutes
    instead of about one."""
    target = servers[restarted]
    loop = asyncio.get_running_loop()
    with router_pods(servers, pods) as routers:
        urls = [r.base_url for r in routers]
        stream = workload.requests()
        start = await scrape_all(servers)
        first = await drive(urls, workload, stream, concurrency=concurrency, count=before_requests)
        mid = await scrape_all(servers)
        await loop.run_in_executor(None, target.stop)
        stopped_at = time.monotonic()
        await loop.run_in_executor(None, gone, target, len(servers) - 1)
        target.launch()  # from this thread: the server dies with the thread that launched it
        down = await drive(urls, workload, stream, concurrency=1, count=down_requests)
        await loop.run_in_executor(None, target.wait_started)
        down_s = time.monotonic() - stopped_at
        ready = await scrape_all(servers)
        timeline: list[tuple[float, int]] = []
        sampling = asyncio.ensure_future(_sample(target, timeline))
        started = time.monotonic()
        # The phase in slices, scraped between them: when the restarted replica's own hit share is back
        # (its pool starts empty; a prefix its arcs draw misses there once) is read from the slices.
        after, marks = Load(), [(0.0, ready)]
        for size in _slices(after_requests, RESTART_SLICES):
            await drive(urls, workload, stream, concurrency=concurrency, count=size, load=after)
            marks.append((time.monotonic() - started, await scrape_all(servers)))
        window = time.monotonic() - started
        sampling.cancel()
        end = marks[-1][1]
        restarts = int(router_count(routers, routing.ROUTER_METRIC_RESTARTS))
        retries = int(router_count(routers, routing.ROUTER_METRIC_RETRIES))
    owners = workload.owners([s.base_url for s in servers])
    # As scale_up's: the requests after Ready whose prefix the restarted replica owns on the ring, its share
    # before the load bound moves any (the ring's draw in this phase, not the weights' expectation).
    drawn = [owners[o.prefix] == target.base_url for o in after.outcomes]
    return {"scenario": workload.name, "routers": pods, "concurrency": concurrency, "restarted": restarted,
            "before": figures(start, mid, first), "down": {"requests": len(down.outcomes),
                                                            "client_errors": len(down.errors),
                                                            "error_samples": down.errors[:3],
                                                            "seconds": round(down_s, 1)},
            "after": figures(ready, end, after), "window_s": round(window, 1),
            "restarted_drawn_share": round(sum(drawn) / max(1, len(drawn)), 3),
            "warm": warmth(marks, restarted),
            "restarted_first_request_s": next((t for t, n in timeline if n > 0), None),
            "restarts_seen": restarts, "retries": retries,
            "ring_shares": [round(x, 3) for x in workload.owned_shares([s.base_url for s in servers])]}


def gone(server: VllmServer, running: int) -> None:
    """Until the stopped `server`'s last process is gone, as a pod's is before its restart: where the replicas
    share a node-disk tier, until its slot is free (the others hold `running`), so that the restart takes it."""
    root = getattr(server, "disk_root", None)
    deadline = time.monotonic() + SLOT_RELEASE_S
    while root is not None and not slots_released(root, running):
        if time.monotonic() > deadline:
            raise AssertionError(f"a stopped replica's disk slot still held after {SLOT_RELEASE_S} s")
        time.sleep(0.1)


SLOT_RELEASE_S = 60
RESTART_SLICES = 4  # slices of the phase after a restarted replica's Ready
WARM_FRACTION = 0.9  # issue 39's goal: the restarted replica at 90% of the fleet's steady hit share


def _slices(count: int, parts: int) -> list[int]:
    return [n for n in (count * (i + 1) // parts - count * i // parts for i in range(parts)) if n]


def warmth(marks: Sequence[tuple[float, list[dict]]], restarted: int) -> dict:
    """The restarted replica's hit share per slice of the phase after its Ready, against the fleet's steady
    share (the other replicas' over the whole phase: their pools kept their prefixes); `warm_after_s`: the end
    of the first slice from which on each slice's share is at least WARM_FRACTION of the steady one."""
    first, last = marks[0][1], marks[-1][1]
    others = [i for i in range(len(first)) if i != restarted]
    hit = sum(last[i]["cpu_hit_tokens"] - first[i]["cpu_hit_tokens"] for i in others)
    steady = hit / (sum(last[i]["prompt_tokens"] - first[i]["prompt_tokens"] for i in others) or 1)
    slices = []
    for (_, before), (t, after) in itertools.pairwise(marks):
        f = figures(before, after)
        slices.append({"end_s": round(t, 1), "requests": f["replica_requests"][restarted],
                       "hit_share": f["replica_hit_shares"][restarted],
                       "disk_hit_chunks": int(after[restarted]["disk_hit_chunks"] - before[restarted]["disk_hit_chunks"])})
    warm_from = len(slices)
    while warm_from > 0 and (slices[warm_from - 1]["hit_share"] or 0) >= WARM_FRACTION * steady:
        warm_from -= 1
    return {"steady_hit_share": round(steady, 4), "slices": slices,
            "second_half_hit_share": figures(marks[len(marks) // 2][1], marks[-1][1])["replica_hit_shares"][restarted],
            "warm_after_s": None if warm_from == len(slices) else (slices[warm_from - 1]["end_s"] if warm_from else 0.0)}


async def die(servers: Sequence[VllmServer], pods: int, workload: Workload, *, died: int, listed_requests: int,
              after_requests: int, concurrency: int) -> dict:
    """Requests through `pods` router pods; between requests (none in flight) the replica `died` is stopped
    for good. `listed_requests` are sent while it is still listed (as in the seconds before DNS drops a pod
    that is gone: each request its arcs draw meets a refused connection until its circuit opens), then it
    leaves every router pod's worker set and `after_requests` more are sent. The caller starts it again."""
    target = servers[died]
    loop = asyncio.get_running_loop()
    alive = [s for s in servers if s is not target]
    with router_pods(servers, pods) as routers:
        urls = [r.base_url for r in routers]
        stream = workload.requests()
        await drive(urls, workload, stream, concurrency=concurrency, count=listed_requests // 2)
        await loop.run_in_executor(None, target.stop)
        start = await scrape_all(alive)
        listed = await drive(urls, workload, stream, concurrency=concurrency, count=listed_requests)
        mid = await scrape_all(alive)
        retries = int(router_count(routers, routing.ROUTER_METRIC_RETRIES))
        for router in routers:
            router.set_workers([s.base_url for s in alive])
        await asyncio.sleep(POLL_WAIT_S)
        after = await drive(urls, workload, stream, concurrency=concurrency, count=after_requests)
        end = await scrape_all(alive)
        dropped = all(target.base_url not in r.metrics_text() for r in routers)
    return {"scenario": workload.name, "routers": pods, "concurrency": concurrency, "died": died,
            "listed": figures(start, mid, listed), "after": figures(mid, end, after), "retries": retries,
            "forgotten": dropped}


async def _sample(server: VllmServer, timeline: list[tuple[float, int]]) -> None:
    """(seconds since the call, requests the server finished since) every half second."""
    loop = asyncio.get_running_loop()
    began = time.monotonic()
    base = (await loop.run_in_executor(None, scrape, server))["requests"]
    while True:
        now = (await loop.run_in_executor(None, scrape, server))["requests"]
        timeline.append((round(time.monotonic() - began, 1), int(now - base)))
        await asyncio.sleep(0.5)


# The router pods of the scenario running now, for the sampler below (zipf() starts them).
_LIVE_ROUTERS: list[SpillwayRouter] = []


async def _in_flight(workers: Sequence[str], samples: list[list[float]]) -> None:
    """The requests the router pods together hold in flight to each worker, read from their gauges every 50 ms
    (one read of each pod per sample, so a sample can count a request that one pod finished and another's
    that started meanwhile: a sample is at most one request above the truth per pod)."""
    loop = asyncio.get_running_loop()
    while True:
        routers = list(_LIVE_ROUTERS)
        if routers:
            texts = await asyncio.gather(*(loop.run_in_executor(None, r.metrics_text) for r in routers))
            samples.append([sum(total(t, routing.ROUTER_METRIC_IN_FLIGHT, **{routing.ROUTER_LABEL_WORKER: w})
                                for t in texts) for w in workers])
        await asyncio.sleep(0.05)


async def hot(servers: Sequence[VllmServer], pods: int, workload: Workload, *, requests: int,
              concurrency: int) -> dict:
    """The workload with a hot prefix: how many of the requests the hot prefix's owner's arcs draw it passed
    on to other replicas, each replica's queue wait, and each replica's requests in flight (peak, and the
    share of samples in which it held more than the bound one router pod keeps at this concurrency)."""
    urls = [s.base_url for s in servers]
    owners = workload.owners(urls)
    samples: list[list[float]] = []
    sampling = asyncio.ensure_future(_in_flight(urls, samples))
    try:
        result = await zipf(servers, pods, workload, requests=requests, concurrency=concurrency)
    finally:
        sampling.cancel()
    owner = result["hot_owner"]
    bound = max(A.MIN_BOUND, math.ceil(A.DEFAULT_LOAD_FACTOR * concurrency / len(servers)))
    result["bound"] = bound
    result["in_flight_peaks"] = [int(max((x[i] for x in samples), default=0)) for i in range(len(servers))]
    result["in_flight_means"] = [round(sum(x[i] for x in samples) / max(1, len(samples)), 2)
                                 for i in range(len(servers))]
    result["above_bound_shares"] = [round(sum(x[i] > bound for x in samples) / max(1, len(samples)), 3)
                                    for i in range(len(servers))]
    result["in_flight_samples"] = len(samples)
    result["owner_in_flight_peak"] = result["in_flight_peaks"][owner]
    drawn = sum(1 for p, _ in zip_n(workload.requests(), requests) if owners[p] == servers[owner].base_url)
    result["owner_drawn"] = drawn
    result["owner_served"] = result["replica_requests"][owner]
    result["owner_passed_on"] = drawn - result["owner_served"]
    return result


POLL_WAIT_S = 1.5  # three of the routers' --poll-seconds 0.5: each has read the workers file again
