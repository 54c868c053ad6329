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

Stdlib + aiohttp only, like the rest of the load test; the plot needs matplotlib.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core import routing
from ..core.errors import InvalidSpec, SpillwayError
from ..core.vllm_api import METRICS_PATH, Metric
from .client import Completion, EndpointError, OpenAIClient
from .http1 import DEFAULT_REQUEST_TIMEOUT_S
from .job import ENV_API_KEY
from .metrics import Snapshot, parse
from .plan import labels_from_args
from .progress import Progress, log
from .prompts import DEFAULT_ID_RANGE, PromptSource
from .results import percentiles, write_atomic

SCHEMA = "spillway.loadtest.prefix-groups/v1"
EXPERIMENT = "prefix-groups"
# The router's own metrics, recorded as counter deltas: `spillway route`'s, or vllm-router's where it is compared
ROUTER_METRIC_PREFIXES = (routing.ROUTER_METRIC_PREFIX, "vllm_router_")
ERROR_SAMPLES = 5
SESSION_HEADER = "x-session-id"  # the session key vllm-router's affinity, sticky and hashing policies read first
REPLICA_COUNTERS = (Metric.EXTERNAL_HITS, Metric.EXTERNAL_QUERIES, Metric.PREFIX_HITS, Metric.PREFIX_QUERIES,
                    Metric.PROMPT_TOKENS, Metric.REQUEST_SUCCESS)


@dataclass
class PrefixGroupsPlan:
    groups: int = 32
    prompts_per_group: int = 8
    prefix_len: int = 2048  # tokens of each group's shared prefix
    question_len: int = 128  # tokens of each prompt's own part
    output_tokens: int = 1
    concurrency: int = 8
    warmup: bool = True
    tenant_session: bool = False  # each prompt names its group in an x-session-id header (a router's session key)
    id_range: int = DEFAULT_ID_RANGE
    seed: int | None = None  # None: drawn when the run starts
    settle_s: float = 1.0  # pause after the warm-up: offload stores and KV events are asynchronous
    max_error_rate: float = 0.01
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S

    def validate(self) -> PrefixGroupsPlan:
        for what, value in (("groups", self.groups), ("prompts per group", self.prompts_per_group),
                            ("prefix length", self.prefix_len), ("question length", self.question_len),
                            ("output tokens", self.output_tokens), ("concurrency", self.concurrency),
                            ("token id range", self.id_range)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidSpec(f"{what} must be a whole number >= 1; got {value!r}")
        if self.settle_s < 0:
            raise InvalidSpec(f"settle time must be >= 0 seconds; got {self.settle_s:g}")
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise InvalidSpec(f"max error rate {self.max_error_rate:g} is outside 0..1")
        return self


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

async def _scrape(clients: list[OpenAIClient]) -> list[Snapshot | None]:
    texts = await asyncio.gather(*(c.metrics_text() for c in clients))
    return [Snapshot.from_text(t) if t is not None else None for t in texts]


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


def router_deltas(before: str | None, after: str | None) -> dict[str, float]:
    """Counter-like samples of the router's /metrics (name{labels} -> after - before)."""
    if before is None or after is None:
        return {}

    def keyed(text: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in parse(text):
            if s.name.startswith(ROUTER_METRIC_PREFIXES) and not s.name.endswith(("_bucket", "_sum")):
                key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
                                if s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
        return out

    b, a = keyed(before), keyed(after)
    return {k: v - b.get(k, 0.0) for k, v in sorted(a.items()) if v - b.get(k, 0.0) != 0}


def _errors(results: list[Completion]) -> list[str]:
    return [r.error for r in results if not r.ok][:ERROR_SAMPLES]


async def run_route(route: Route, plan: PrefixGroupsPlan, replicas: list[str], *, model: str | None,
                    api_key: str | None, progress: str = "auto") -> dict[str, Any]:
    """Warm-up and timed phase through one route; figures from every replica's /metrics."""
    prompts = PromptSource(plan.seed, plan.id_range)
    timeout = plan.request_timeout_s
    # The connection pool admits the warm-up's burst (one request per group) as well as the timed phase.
    async with OpenAIClient(route.endpoint, api_key=api_key, concurrency=max(plan.concurrency, plan.groups),
                            request_timeout_s=timeout) as client:
        replica_clients = [OpenAIClient(url, api_key=api_key, request_timeout_s=60) for url in replicas]
        # --router-metrics names the router's /metrics URL; the client appends the path itself
        metrics_base = route.router_metrics.removesuffix("/").removesuffix(METRICS_PATH) if route.router_metrics else None
        router = OpenAIClient(metrics_base, request_timeout_s=60) if metrics_base else None
        for c in replica_clients + ([router] if router else []):
            await c.__aenter__()
        try:
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
                warmup_before = await _scrape(replica_clients)
                results, elapsed = await send(f"{route.name} warm-up",
                                              [(g, -1) for g in range(plan.groups)], False,
                                              concurrency=plan.groups)
                warmup_after = await _scrape(replica_clients)
                # Where the tenants landed decides what each pool must hold in the timed phase.
                warmup = {"requests": len(results), "errors": sum(not r.ok for r in results),
                          "elapsed_s": elapsed, "error_samples": _errors(results),
                          "requests_per_replica": [_delta(b, a, Metric.REQUEST_SUCCESS)
                                                   for b, a in zip(warmup_before, warmup_after)]}
                await asyncio.sleep(plan.settle_s)
            order = [(g, i) for g in range(plan.groups) for i in range(plan.prompts_per_group)]
            random.Random(repr((plan.seed, EXPERIMENT, route.name, "order"))).shuffle(order)
            before = await _scrape(replica_clients)
            router_before = await router.metrics_text() if router else None
            results, elapsed = await send(f"{route.name} timed", order, True)
            after = await _scrape(replica_clients)
            router_after = await router.metrics_text() if router else None
        finally:
            for c in replica_clients + ([router] if router else []):
                await c.__aexit__(None, None, None)

    ok = [r for r in results if r.ok]
    prompt_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else plan.prefix_len + plan.question_len
                        for r in ok)
    per_replica = [replica_figures(url, b, a) for url, b, a in zip(replicas, before, after)]
    return {
        "name": route.name,
        "endpoint": route.endpoint,
        "warmup": warmup,
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_samples": _errors(results),
        "elapsed_s": elapsed,
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_per_s": prompt_tokens / elapsed if elapsed > 0 else None,
        "requests_per_s": len(ok) / elapsed if elapsed > 0 else None,
        "ttft_s": percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        "latency_s": percentiles([r.latency_s for r in ok]),
        "replicas": per_replica,
        **totals(per_replica),
        "router": router_deltas(router_before, router_after),
    }


# -- the whole run -----------------------------------------------------------------------------------------

def new_result(plan: PrefixGroupsPlan, replicas: list[str], labels: dict[str, str]) -> dict[str, Any]:
    return {"schema": SCHEMA, "status": "running", "error": None,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "finished_at": None,
            "environment": {"replicas": list(replicas), "labels": dict(labels)}, "plan": asdict(plan), "routes": []}


async def run_async(routes: list[Route], plan: PrefixGroupsPlan, replicas: list[str], *, model: str | None = None,
                    api_key: str | None = None, output: Path | None = None, labels: dict[str, str] | None = None,
                    progress: str = "auto") -> dict[str, Any]:
    """Every route in turn on the same replicas; the result file is rewritten after each route."""
    plan.validate()
    if not routes:
        raise InvalidSpec("give at least one route (NAME=URL)")
    if not replicas:
        raise InvalidSpec("give every replica's base URL: the hit rates come from each replica's /metrics")
    if plan.seed is None:
        plan.seed = random.SystemRandom().randrange(2**32)
    result = new_result(plan, replicas, labels or {})

    def publish(status: str | None = None, error: str | None = None) -> None:
        if status is not None:
            result.update(status=status, error=error, finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        if output is not None:
            write_atomic(output, json.dumps(result, indent=1))

    try:
        for route in routes:
            log(f"route {route.name}: {route.endpoint}, {plan.groups} groups x {plan.prompts_per_group} prompts, "
                f"prefix {plan.prefix_len} + question {plan.question_len} tokens")
            figures = await run_route(route, plan, replicas, model=model, api_key=api_key, progress=progress)
            result["routes"].append(figures)
            publish()
            sent = figures["requests"] + figures["warmup"]["requests"]
            failed = figures["errors"] + figures["warmup"]["errors"]
            if failed > plan.max_error_rate * sent:
                samples = figures["error_samples"] or figures["warmup"].get("error_samples") or ["?"]
                raise EndpointError(f"{failed} of {sent} requests through {route.name} failed "
                                    f"(allowed: {plan.max_error_rate:g}); first: {samples[0]}")
    except SpillwayError as exc:
        publish("failed", str(exc))
        raise
    except (asyncio.CancelledError, KeyboardInterrupt):
        publish("interrupted", "interrupted")
        raise
    publish("complete")
    return result


def load(path: Path) -> dict[str, Any]:
    try:
        result = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InvalidSpec(f"cannot read result {path}: {exc.strerror}") from None
    except ValueError:
        raise InvalidSpec(f"{path} is not JSON") from None
    if not isinstance(result, dict) or result.get("schema") != SCHEMA:
        raise InvalidSpec(f"{path} is not a prefix-groups result ({SCHEMA})")
    return result


# -- report and plot -------------------------------------------------------------------------------------

def _pct(value: float | None) -> str:
    return f"{value * 100:.1f}%" if value is not None else "-"


def _num(value: float | None, fmt: str) -> str:
    return fmt.format(value) if value is not None else "-"


def table(result: dict[str, Any]) -> str:
    plan = result.get("plan", {})
    lines = [(f"Prefix groups: {plan.get('groups')} groups x {plan.get('prompts_per_group')} prompts, prefix "
             f"{plan.get('prefix_len')} + question {plan.get('question_len')} tokens, concurrency "
             f"{plan.get('concurrency')}, {len(result.get('environment', {}).get('replicas', []))} replicas "
             f"(status {result.get('status')}{'; ' + result['error'] if result.get('error') else ''})")]
    labels = result.get("environment", {}).get("labels") or {}
    if labels:
        lines.append("labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    header = ["route", "CPU hit", "GPU hit", "prompt tok/s", "TTFT p50 ms", "TTFT p90 ms", "errors",
              "busiest/even", "requests per replica", "CPU hit per replica"]
    rows = []
    for r in result.get("routes", []):
        ttft = r.get("ttft_s") or {}
        rows.append([
            r["name"], _pct(r.get("cpu_hit_rate")), _pct(r.get("gpu_hit_rate")),
            _num(r.get("prompt_tokens_per_s"), "{:.0f}"),
            _num(ttft.get("p50") and ttft["p50"] * 1e3, "{:.1f}"), _num(ttft.get("p90") and ttft["p90"] * 1e3, "{:.1f}"),
            str(r.get("errors")), _num(totals(r.get("replicas", []))["max_share"], "{:.2f}x"),
            "/".join(_num(x.get("requests"), "{:.0f}") for x in r.get("replicas", [])),
            "/".join(_pct(x.get("cpu_hit_rate")) for x in r.get("replicas", [])),
        ])
    if rows:
        widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
        fmt = "  ".join(f"{{:>{w}}}" for w in widths)
        lines += ["", fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*row) for row in rows]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidSpec("plotting needs matplotlib (pip install matplotlib); the JSON result is complete "
                          "without it") from None
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
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# -- command line ------------------------------------------------------------------------------------------

DEFAULT_OUTPUT = "prefix-groups.json"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(EXPERIMENT, help="shared-prefix tenants through each routing policy: CPU hit rate per "
                                         "replica, throughput, TTFT")
    actions = p.add_subparsers(dest="prefix_groups_command", required=True)
    run = actions.add_parser("run", help="run against one endpoint per routing policy, in front of the same replicas")
    run.add_argument("--route", action="append", default=[], required=True, metavar="NAME=URL",
                     help="an endpoint and the policy it routes by, e.g. kv_aware=http://router:8000 (repeatable)")
    run.add_argument("--replica", action="append", default=[], required=True, metavar="URL",
                     help="base URL of one replica behind the routes; its /metrics gives its hit rate (repeatable)")
    run.add_argument("--router-metrics", action="append", default=[], metavar="NAME=URL",
                     help="the /metrics URL of a route's router, recorded around the timed phase (repeatable)")
    run.add_argument("--model", help="served model id (default: the only one the endpoint serves)")
    run.add_argument("--api-key", default=os.environ.get(ENV_API_KEY), help=f"bearer token (default: ${ENV_API_KEY})")
    defaults = PrefixGroupsPlan()
    g = run.add_argument_group("plan")
    g.add_argument("--groups", type=int, default=defaults.groups, help="prefix groups (tenants)")
    g.add_argument("--prompts-per-group", type=int, default=defaults.prompts_per_group)
    g.add_argument("--prefix-len", type=int, default=defaults.prefix_len, help="tokens of each group's prefix")
    g.add_argument("--question-len", type=int, default=defaults.question_len, help="tokens of each prompt's own part")
    g.add_argument("--output-tokens", type=int, default=defaults.output_tokens)
    g.add_argument("--concurrency", type=int, default=defaults.concurrency)
    g.add_argument("--no-warmup", action="store_true", help="start timing with cold pools")
    g.add_argument("--tenant-session", action="store_true",
                   help=f"each prompt names its group in an {SESSION_HEADER} header, as a multi-tenant client may "
                        "(routers with session affinity key on it)")
    g.add_argument("--id-range", type=int, default=defaults.id_range, help="token ids drawn from [10, 10+N)")
    g.add_argument("--seed", type=int, help="prompt seed (default: random)")
    g.add_argument("--settle-s", type=float, default=defaults.settle_s)
    g.add_argument("--max-error-rate", type=float, default=defaults.max_error_rate)
    g.add_argument("--request-timeout-s", type=float, default=defaults.request_timeout_s)
    o = run.add_argument_group("output")
    o.add_argument("--output", "-o", type=Path, default=Path(DEFAULT_OUTPUT), help="result JSON")
    o.add_argument("--plot", type=Path, help="PNG (default: the output path with .png)")
    o.add_argument("--no-plot", action="store_true")
    o.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="recorded with the result")
    o.add_argument("--progress", choices=("auto", "bar", "log", "none"), default="auto")
    run.set_defaults(func=cmd_run)
    report = actions.add_parser("report", help="table (and plot) of a prefix-groups result")
    report.add_argument("result", type=Path)
    report.add_argument("--plot", type=Path, help="write the PNG here")
    report.set_defaults(func=cmd_report)


def plan_from_args(args: argparse.Namespace) -> PrefixGroupsPlan:
    return PrefixGroupsPlan(
        groups=args.groups, prompts_per_group=args.prompts_per_group, prefix_len=args.prefix_len,
        question_len=args.question_len, output_tokens=args.output_tokens, concurrency=args.concurrency,
        warmup=not args.no_warmup, tenant_session=args.tenant_session, id_range=args.id_range, seed=args.seed,
        settle_s=args.settle_s,
        max_error_rate=args.max_error_rate, request_timeout_s=args.request_timeout_s,
    ).validate()


def routes_from_args(args: argparse.Namespace) -> list[Route]:
    metrics = dict(parse_named(args.router_metrics, "--router-metrics"))
    routes = parse_named(args.route, "--route")
    unknown = sorted(set(metrics) - {name for name, _ in routes})
    if unknown:
        raise InvalidSpec(f"--router-metrics names no --route: {', '.join(unknown)}")
    return [Route(name, url, metrics.get(name)) for name, url in routes]


def _draw(result: dict[str, Any], path: Path) -> None:
    try:
        plot(result, path)
        print(f"plot: {path}", file=sys.stderr)
    except InvalidSpec as exc:
        print(f"spillway: no plot: {exc}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from .runner import stopped_by_signals

    plan, routes, labels = plan_from_args(args), routes_from_args(args), labels_from_args(args.label)
    replicas = [url.rstrip("/") for url in args.replica]
    result = asyncio.run(stopped_by_signals(run_async(routes, plan, replicas, model=args.model, api_key=args.api_key,
                                                       output=args.output, labels=labels, progress=args.progress)))
    print(f"result: {args.output}", file=sys.stderr)
    print(table(result))
    if not args.no_plot:
        _draw(result, args.plot or args.output.with_suffix(".png"))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    result = load(args.result)
    print(table(result))
    if args.plot:
        _draw(result, args.plot)
    return 0
