"""Experiment "prefix-groups": a multi-tenant shared-prefix workload sent through each routing policy.

The shape of llm-d's tiered-prefix-cache benchmark: G prefix groups (tenants, each with its own long system
prompt) x P prompts per group (a short question after the prefix). Each route (an endpoint in front of the same
replicas, e.g. a router with round_robin and one with kv_aware) gets its own never-seen prompts: a warm-up sends
one question per group, all at once (a load-aware router spreads the tenants), so every prefix reaches some
replica's CPU pool, then the timed phase sends all G x P
prompts in a seeded shuffled order, streamed (TTFT), with the plan's concurrency. Each replica's /metrics is
scraped around the timed phase: its CPU-pool hits (vLLM's external prefix cache hits), GPU prefix hits, prompt
tokens and finished requests give the per-replica hit rates and the request balance. A router's own /metrics,
when given, is recorded around the same phase.

Stdlib + aiohttp only, like the rest of the load test; the plot needs matplotlib. The plan's common fields, the
run, the result document and the command line are experiment.py's.
"""
from __future__ import annotations

import argparse
import asyncio
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import routing
from ..core.errors import InvalidSpec
from ..core.vllm_api import METRICS_PATH, Metric
from .client import Completion, OpenAIClient
from .experiment import (
    ConcurrentPlan,
    Experiment,
    around,
    check_errors,
    metrics_clients,
    phase_figures,
    run_experiment,
    whole_number,
)
from .experiment import table as frame
from .metrics import Snapshot
from .progress import Progress, log
from .prompts import PromptSource
from .report import num, pct

SCHEMA = "spillway.loadtest.prefix-groups/v1"
EXPERIMENT = "prefix-groups"
# The router's own metrics, recorded as counter deltas: `spillway route`'s, or vllm-router's where it is compared
ROUTER_METRIC_PREFIXES = (routing.ROUTER_METRIC_PREFIX, "vllm_router_")
SESSION_HEADER = "x-session-id"  # the session key vllm-router's affinity, sticky and hashing policies read first
REPLICA_COUNTERS = (Metric.EXTERNAL_HITS, Metric.EXTERNAL_QUERIES, Metric.PREFIX_HITS, Metric.PREFIX_QUERIES,
                    Metric.PROMPT_TOKENS, Metric.REQUEST_SUCCESS)


@dataclass(kw_only=True)
class PrefixGroupsPlan(ConcurrentPlan):
    groups: int = whole_number(32, "groups")
    prompts_per_group: int = whole_number(8, "prompts per group")
    prefix_len: int = whole_number(2048, "prefix length")  # tokens of each group's shared prefix
    question_len: int = whole_number(128, "question length")  # tokens of each prompt's own part
    warmup: bool = True
    tenant_session: bool = False  # each prompt names its group in an x-session-id header (a router's session key)
    settle_s: float = 1.0  # pause after the warm-up: offload stores and KV events are asynchronous

    def check(self) -> None:
        if self.settle_s < 0:
            raise InvalidSpec(f"settle time must be >= 0 seconds; got {self.settle_s:g}")


@dataclass(frozen=True)
class Route:
    name: str  # the routing policy (or any label) this endpoint stands for
    endpoint: str
    router_metrics: str | None = None  # the router's own /metrics URL, if it has one


def parse_named(items: list[str], what: str) -> list[tuple[str, str]]:
    """NAME=URL pairs, names unique."""
    pairs, seen = [], set()
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise InvalidSpec(f"{what} expects NAME=http(s)://..., got {item!r}")
        if name in seen:
            raise InvalidSpec(f"{what} names {name!r} twice")
        seen.add(name)
        pairs.append((name, url.rstrip("/")))
    return pairs


# -- one route -------------------------------------------------------------------------------------------

def _delta(before: Snapshot | None, after: Snapshot | None, name: str) -> float | None:
    if before is None or after is None:
        return None
    a = after.counter(name)
    return None if a is None else a - (before.counter(name) or 0.0)


def replica_figures(url: str, before: Snapshot | None, after: Snapshot | None) -> dict[str, Any]:
    """One replica's share of the timed phase, from its own counters."""
    d = {name: _delta(before, after, name) for name in REPLICA_COUNTERS}
    prompt = d[Metric.PROMPT_TOKENS]

    def rate(hits: float | None) -> float | None:
        return hits / prompt if hits is not None and prompt else None

    return {
        "url": url,
        "requests": d[Metric.REQUEST_SUCCESS],
        "prompt_tokens": prompt,
        "cpu_hit_tokens": d[Metric.EXTERNAL_HITS],
        "gpu_hit_tokens": d[Metric.PREFIX_HITS],
        "cpu_hit_rate": rate(d[Metric.EXTERNAL_HITS]),
        "gpu_hit_rate": rate(d[Metric.PREFIX_HITS]),
    }


def _sum(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) if values else None


def totals(replicas: list[dict]) -> dict[str, Any]:
    """Hit rates over all replicas' prompt tokens, and how evenly the requests were spread (min/max)."""
    prompt = _sum(replicas, "prompt_tokens")
    cpu, gpu = _sum(replicas, "cpu_hit_tokens"), _sum(replicas, "gpu_hit_tokens")
    requests = [r["requests"] for r in replicas if r.get("requests") is not None]
    return {
        "cpu_hit_rate": cpu / prompt if cpu is not None and prompt else None,
        "gpu_hit_rate": gpu / prompt if gpu is not None and prompt else None,
        "request_balance": min(requests) / max(requests) if requests and max(requests) > 0 else None,
        # the busiest replica's requests over an even share: 1.0 is even, N means one replica took them all
        "max_share": max(requests) * len(requests) / sum(requests) if requests and sum(requests) > 0 else None,
    }


def router_deltas(before: Snapshot | None, after: Snapshot | None) -> dict[str, float]:
    """Counter-like samples of the router's /metrics (name{labels} -> after - before)."""
    if before is None or after is None:
        return {}

    def keyed(snapshot: Snapshot) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in snapshot.samples:
            if s.name.startswith(ROUTER_METRIC_PREFIXES) and not s.name.endswith(("_bucket", "_sum")):
                key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
                                if s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
        return out

    b, a = keyed(before), keyed(after)
    return {k: v - b.get(k, 0.0) for k, v in sorted(a.items()) if v - b.get(k, 0.0) != 0}


async def run_route(route: Route, plan: PrefixGroupsPlan, replicas: list[str], *, model: str | None,
                    api_key: str | None, progress: str = "auto") -> dict[str, Any]:
    """Warm-up and timed phase through one route; figures from every replica's /metrics."""
    prompts = PromptSource(plan.seed, plan.id_range)
    # --router-metrics names the router's /metrics URL; the client appends the path itself
    metrics_base = route.router_metrics.removesuffix("/").removesuffix(METRICS_PATH) if route.router_metrics else None
    # The connection pool admits the warm-up's burst (one request per group) as well as the timed phase.
    async with OpenAIClient(route.endpoint, api_key=api_key, concurrency=max(plan.concurrency, plan.groups),
                            request_timeout_s=plan.request_timeout_s) as client, \
            metrics_clients(replicas, api_key) as replica_clients, \
            metrics_clients([metrics_base] if metrics_base else []) as router:
        await client.resolve_model(model)
        client.prompt_format = "ids"  # the prefix groups share token ids; text would blur the prefixes

        def prefix(g: int) -> list[int]:
            return prompts.token_ids(plan.prefix_len, EXPERIMENT, route.name, g, "prefix")

        def body(g: int, i: int, stream: bool) -> bytes:
            question = prompts.token_ids(plan.question_len, EXPERIMENT, route.name, g, i, "question")
            return client.body(prefix(g) + question, plan.output_tokens, stream)

        def session(g: int) -> dict[str, str] | None:
            return {SESSION_HEADER: f"tenant-{g}"} if plan.tenant_session else None

        async def send(label: str, requests: list[tuple[int, int]], stream: bool,
                       concurrency: int = plan.concurrency) -> tuple[list[Completion], float]:
            bodies = [body(g, i, stream) for g, i in requests]  # encoded before the clock starts
            return await client.send_phase(bodies, concurrency, Progress(label, len(bodies), progress), stream,
                                           [session(g) for g, _ in requests])

        warmup: dict[str, Any] = {"requests": 0, "errors": 0}
        if plan.warmup:
            # All tenants arrive at once: a load-aware router spreads them over the replicas.
            (results, elapsed), before, after = await around(
                send(f"{route.name} warm-up", [(g, -1) for g in range(plan.groups)], False, concurrency=plan.groups),
                replica_clients)
            # Where the tenants landed decides what each pool must hold in the timed phase.
            warmup = {**phase_figures(results, elapsed),
                      "requests_per_replica": [_delta(b, a, Metric.REQUEST_SUCCESS) for b, a in zip(before, after)]}
            await asyncio.sleep(plan.settle_s)
        order = [(g, i) for g in range(plan.groups) for i in range(plan.prompts_per_group)]
        random.Random(repr((plan.seed, EXPERIMENT, route.name, "order"))).shuffle(order)
        (results, elapsed), before, after = await around(send(f"{route.name} timed", order, True),
                                                         replica_clients + router)

    per_replica = [replica_figures(url, b, a) for url, b, a in zip(replicas, before, after)]
    return {
        "name": route.name,
        "endpoint": route.endpoint,
        "warmup": warmup,
        **phase_figures(results, elapsed, plan.prefix_len + plan.question_len),
        "replicas": per_replica,
        **totals(per_replica),
        "router": router_deltas(before[-1], after[-1]) if router else {},
    }


# -- the whole run -----------------------------------------------------------------------------------------

async def run_async(routes: list[Route], plan: PrefixGroupsPlan, replicas: list[str], *, model: str | None = None,
                    api_key: str | None = None, output: Path | None = None, labels: dict[str, str] | None = None,
                    progress: str = "auto") -> dict[str, Any]:
    """Every route in turn on the same replicas; the result file is rewritten after each route."""
    if not routes:
        raise InvalidSpec("give at least one route (NAME=URL)")
    if not replicas:
        raise InvalidSpec("give every replica's base URL: the hit rates come from each replica's /metrics")

    async def measure(sink) -> None:
        for route in routes:
            log(f"route {route.name}: {route.endpoint}, {plan.groups} groups x {plan.prompts_per_group} prompts, "
                f"prefix {plan.prefix_len} + question {plan.question_len} tokens")
            figures = await run_route(route, plan, replicas, model=model, api_key=api_key, progress=progress)
            sink.result["routes"].append(figures)
            sink.publish()
            check_errors(plan.max_error_rate, (figures, figures["warmup"]), f"through {route.name}")

    return await run_experiment(SCHEMA, plan, measure, output=output, labels=labels,
                                environment={"replicas": list(replicas)}, routes=[])


# -- report and plot -------------------------------------------------------------------------------------

def table(result: dict[str, Any]) -> str:
    plan = result.get("plan", {})
    title = (f"Prefix groups: {plan.get('groups')} groups x {plan.get('prompts_per_group')} prompts, prefix "
             f"{plan.get('prefix_len')} + question {plan.get('question_len')} tokens, concurrency "
             f"{plan.get('concurrency')}, {len(result.get('environment', {}).get('replicas', []))} replicas")
    header = ["route", "CPU hit", "GPU hit", "prompt tok/s", "TTFT p50 ms", "TTFT p90 ms", "errors",
              "busiest/even", "requests per replica", "CPU hit per replica"]
    rows = []
    for r in result.get("routes", []):
        ttft = r.get("ttft_s") or {}
        rows.append([
            r["name"], pct(r.get("cpu_hit_rate")), pct(r.get("gpu_hit_rate")),
            num(r.get("prompt_tokens_per_s"), "{:.0f}"),
            num(ttft.get("p50") and ttft["p50"] * 1e3, "{:.1f}"), num(ttft.get("p90") and ttft["p90"] * 1e3, "{:.1f}"),
            str(r.get("errors")), num(totals(r.get("replicas", []))["max_share"], "{:.2f}x"),
            "/".join(num(x.get("requests"), "{:.0f}") for x in r.get("replicas", [])),
            "/".join(pct(x.get("cpu_hit_rate")) for x in r.get("replicas", [])),
        ])
    return frame(title, result, header, rows)


def plot(result: dict[str, Any], path: Path) -> Path:
    from .plot import pyplot, save

    plt = pyplot(f"spillway loadtest {EXPERIMENT} report")
    routes = [r for r in result.get("routes", []) if r.get("prompt_tokens_per_s")]
    if not routes:
        raise InvalidSpec("the result holds no measured route to plot")
    names = [r["name"] for r in routes]
    x = range(len(routes))
    fig, (hit_ax, tps_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    plan = result.get("plan", {})
    fig.suptitle(f"prefix groups: {plan.get('groups')} x {plan.get('prompts_per_group')}, prefix "
                 f"{plan.get('prefix_len')} tokens, {len(result['environment']['replicas'])} replicas"
                 + "".join(f" · {k}={v}" for k, v in sorted((result['environment'].get('labels') or {}).items())),
                 fontsize=10)
    hit_ax.bar(x, [(r.get("cpu_hit_rate") or 0) * 100 for r in routes], color="tab:blue", label="all replicas")
    for i, r in enumerate(routes):
        per = [p["cpu_hit_rate"] * 100 for p in r["replicas"] if p.get("cpu_hit_rate") is not None]
        hit_ax.plot([i] * len(per), per, "k_", markersize=18, label="one replica" if i == 0 else None)
    hit_ax.set_xticks(list(x), names)
    hit_ax.set_ylabel("CPU-pool hit rate, % of prompt tokens")
    hit_ax.set_title("CPU-pool hit rate by routing policy")
    hit_ax.set_ylim(0, 100)
    hit_ax.legend(fontsize=8)
    tps_ax.bar(x, [r["prompt_tokens_per_s"] for r in routes], color="tab:green")
    for i, r in enumerate(routes):
        p50 = (r.get("ttft_s") or {}).get("p50")
        if p50 is not None:
            tps_ax.annotate(f"TTFT p50 {p50 * 1e3:.0f} ms", (i, r["prompt_tokens_per_s"]), textcoords="offset points",
                            xytext=(0, 4), ha="center", fontsize=8)
    tps_ax.set_xticks(list(x), names)
    tps_ax.set_ylabel("prompt tokens/s")
    tps_ax.set_title("Throughput by routing policy")
    for ax in (hit_ax, tps_ax):
        ax.grid(True, axis="y", alpha=0.3)
    return save(fig, path)


# -- command line ------------------------------------------------------------------------------------------

def _add_flags(run: argparse.ArgumentParser, plan: Any) -> None:
    run.add_argument("--route", action="append", default=[], required=True, metavar="NAME=URL",
                     help="an endpoint and the policy it routes by, e.g. kv_aware=http://router:8000 (repeatable)")
    run.add_argument("--replica", action="append", default=[], required=True, metavar="URL",
                     help="base URL of one replica behind the routes; its /metrics gives its hit rate (repeatable)")
    run.add_argument("--router-metrics", action="append", default=[], metavar="NAME=URL",
                     help="the /metrics URL of a route's router, recorded around the timed phase (repeatable)")
    defaults = PrefixGroupsPlan()
    plan.add_argument("--groups", type=int, default=defaults.groups, help="prefix groups (tenants)")
    plan.add_argument("--prompts-per-group", type=int, default=defaults.prompts_per_group)
    plan.add_argument("--prefix-len", type=int, default=defaults.prefix_len, help="tokens of each group's prefix")
    plan.add_argument("--question-len", type=int, default=defaults.question_len,
                      help="tokens of each prompt's own part")
    plan.add_argument("--no-warmup", dest="warmup", action="store_false", help="start timing with cold pools")
    plan.add_argument("--tenant-session", action="store_true",
                      help=f"each prompt names its group in an {SESSION_HEADER} header, as a multi-tenant client may "
                           "(routers with session affinity key on it)")
    plan.add_argument("--settle-s", type=float, default=defaults.settle_s, help="pause after the warm-up")


def routes_from_args(args: argparse.Namespace) -> list[Route]:
    metrics = dict(parse_named(args.router_metrics, "--router-metrics"))
    routes = parse_named(args.route, "--route")
    unknown = sorted(set(metrics) - {name for name, _ in routes})
    if unknown:
        raise InvalidSpec(f"--router-metrics names no --route: {', '.join(unknown)}")
    return [Route(name, url, metrics.get(name)) for name, url in routes]


def _start(args: argparse.Namespace, plan: PrefixGroupsPlan, labels: dict[str, str]):
    routes, replicas = routes_from_args(args), [url.rstrip("/") for url in args.replica]
    return run_async(routes, plan, replicas, model=args.model, api_key=args.api_key, output=args.output,
                     labels=labels, progress=args.progress)


COMMAND = Experiment(
    name=EXPERIMENT, schema=SCHEMA, plan=PrefixGroupsPlan, add_flags=_add_flags, run_async=run_async, start=_start,
    table=table, plot=plot, endpoint_help=None,
    progress=True, help="shared-prefix tenants through each routing policy: CPU hit rate per replica, throughput, TTFT",
    run_help="run against one endpoint per routing policy, in front of the same replicas")
