"""The shape every `spillway loadtest <experiment>` shares: a plan, a run, a result, a report.

An experiment module (prefix_groups, preemption, working_set, verify) holds only what is its own: its plan's
fields and rules (an ExperimentPlan), what it sends and what it reads from /metrics (its `run_async`, a
`measure` step under run_experiment), its table rows, a plot where it draws one, and its own flags. It hands
them to an Experiment, which gives it the rest:

* the plan fields they all take (output tokens, token id range, seed, request timeout; concurrency and the
  error budget for the experiments that send many requests at once) and their validation;
* the run: the seed drawn when none is given, the result document (schema, status, error, times, the
  environment with the run's labels, the plan), published after every step and on the way out, whatever ends
  the run (complete, failed, or interrupted by SIGINT/SIGTERM: stopped_by_signals);
* a phase's figures (requests, errors, rates, latency percentiles) and /metrics scraped around it;
* the table's frame (title with status, labels, a grid) and the command line: `spillway loadtest <name> run`
  and `spillway loadtest <name> report RESULT`.

`spillway loadtest run` (ttft and throughput, runner.py) uses the same run skeleton and result sink.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from ..core.errors import InvalidSpec, SpillwayError
from .client import Completion, EndpointError, OpenAIClient
from .http1 import DEFAULT_REQUEST_TIMEOUT_S
from .job import ENV_API_KEY
from .metrics import Snapshot
from .plan import labels_from_args
from .progress import MODES
from .prompts import DEFAULT_ID_RANGE, PromptSource
from .report import grid
from .results import (
    STATUS_COMPLETE,
    STATUS_FAILED,
    STATUS_INTERRUPTED,
    ResultSink,
    check_output,
    load,
    new_result,
    percentiles,
)
from .target import PROBE_TOKENS, check_fits, error_samples

RUN, REPORT = "run", "report"
T = TypeVar("T")


# -- the plan -------------------------------------------------------------------------------------------------

def whole(what: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidSpec(f"{what} must be a whole number >= {minimum}; got {value!r}")


def whole_number(default: int | None, what: str, minimum: int = 1) -> Any:
    """A plan field that must be a whole number >= minimum; `what` names it in the error."""
    return field(default=default, metadata={_WHOLE: (what, minimum)})


_WHOLE = "spillway.loadtest.whole_number"


@dataclass(kw_only=True)
class ExperimentPlan:
    """What every experiment's plan holds; a subclass adds its own fields (whole_number() for its counts) and
    its other rules in check()."""

    output_tokens: int = 1  # max_tokens of each request
    id_range: int = DEFAULT_ID_RANGE  # token ids drawn from [10, 10 + id_range)
    seed: int | None = None  # None: drawn when the run starts, so no run re-reads another's prompts
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S

    def validate(self):
        for f in fields(self):
            if _WHOLE in f.metadata:
                what, minimum = f.metadata[_WHOLE]
                whole(what, getattr(self, f.name), minimum)
        whole("output tokens", self.output_tokens)
        whole("token id range", self.id_range)
        if not (isinstance(self.request_timeout_s, (int, float)) and math.isfinite(self.request_timeout_s)
                and self.request_timeout_s > 0):
            raise InvalidSpec(f"request timeout must be > 0 seconds; got {self.request_timeout_s!r}")
        self.check()
        return self

    def check(self) -> None:
        """The experiment's own rules, beyond its whole numbers."""


@dataclass(kw_only=True)
class ConcurrentPlan(ExperimentPlan):
    """A plan whose phases send many requests at once, and tolerate a share of them failing."""

    concurrency: int = 8
    max_error_rate: float = 0.01

    def validate(self):
        whole("concurrency", self.concurrency)
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise InvalidSpec(f"max error rate {self.max_error_rate:g} is outside 0..1")
        return super().validate()


def check_errors(max_error_rate: float, phases: Iterable[dict[str, Any]], where: str) -> None:
    """End the run, quoting the server's first error, when more of the phases' requests failed than allowed."""
    phases = list(phases)
    failed = sum(p.get("errors", 0) for p in phases)
    sent = sum(p.get("requests", 0) for p in phases)
    if failed > max_error_rate * sent:
        samples = [s for p in phases for s in p.get("error_samples") or []] or ["?"]
        raise EndpointError(f"{failed} of {sent} requests {where} failed (allowed: {max_error_rate:g}); "
                            f"first: {samples[0]}")


# -- the run --------------------------------------------------------------------------------------------------

class Interrupted(SpillwayError):
    reason = "Interrupted"


# Ctrl-C and a deleted Job (SIGTERM) end the run, result kept. Handling SIGINT here too makes an interrupt work
# even where the process inherited SIGINT ignored (commands started in the background by a non-interactive shell).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def stopped_by_signals(coro: Awaitable[T]) -> T:
    """Await `coro` as a task that SIGINT or SIGTERM cancels (the caller keeps what it had measured)."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    installed = []
    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, task.cancel)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    try:
        return await task
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def run_experiment(schema: str, plan, measure: Callable[[ResultSink], Awaitable[None]], *,
                         output: Path | None = None, labels: dict[str, str] | None = None,
                         environment: dict[str, Any] | None = None, emit=None, root: dict | None = None,
                         prepare: Callable[[dict], None] | None = None, **sections: Any) -> dict[str, Any]:
    """Validate the plan, draw its seed, and run `measure` on the result document, which is published (output
    file, `emit` lines) as the run starts, whenever `measure` asks, and once more however the run ends: complete, failed (a
    SpillwayError's message, else the exception's type and message) or interrupted (raised as Interrupted).
    sections: the experiment's own top-level keys, as they start."""
    plan.validate()
    if plan.seed is None:
        plan.seed = random.SystemRandom().randrange(2**32)
    result = new_result(schema, asdict(plan), labels or {}, **sections)
    result["environment"].update(environment or {})
    sink = ResultSink(result, output, emit, root, prepare)
    sink.publish()  # from the start: a run that never gets further still leaves its plan and its seed
    try:
        await measure(sink)
    except SpillwayError as exc:
        sink.finish(STATUS_FAILED, str(exc))
        raise
    except (asyncio.CancelledError, KeyboardInterrupt):
        sink.finish(STATUS_INTERRUPTED, "interrupted")
        raise Interrupted(f"interrupted; partial result kept{f' in {output}' if output else ''}") from None
    except BaseException as exc:
        sink.finish(STATUS_FAILED, f"{type(exc).__name__}: {exc}")
        raise
    sink.finish(STATUS_COMPLETE)
    return sink.result


@asynccontextmanager
async def endpoint(url: str, plan: ExperimentPlan, name: str, *, prompt_len: int, model: str | None = None,
                   api_key: str | None = None, concurrency: int = 1, sink: ResultSink | None = None):
    """A client of one server, its model resolved, the plan's longest prompt checked against its max_model_len,
    a PromptSource in the prompt format the server takes, and what it serves: recorded in the result's
    environment when sink is given (the run's one server), else for the caller to record."""
    async with OpenAIClient(url, api_key=api_key, concurrency=concurrency,
                            request_timeout_s=plan.request_timeout_s) as client:
        entry = await client.resolve_model(model)
        check_fits("prompt length", prompt_len, plan.output_tokens, entry.get("max_model_len"), client.model)
        prompts = PromptSource(plan.seed, plan.id_range)
        prompts.fmt = await client.probe_prompt_format(prompts.token_ids(PROBE_TOKENS, name, "probe"))
        facts = {"endpoint": client.base_url, "model": client.model, "max_model_len": entry.get("max_model_len"),
                 "vllm_version": await client.version(), "prompt_format": prompts.fmt}
        if sink is not None:
            sink.result["environment"].update(facts)
            sink.publish()
        yield client, prompts, facts


async def run_on_endpoint(url: str, plan, schema: str, name: str,
                          measure: Callable[[Any, OpenAIClient, PromptSource, ResultSink], Awaitable[None]], *,
                          model: str | None = None, api_key: str | None = None, output: Path | None = None,
                          labels: dict[str, str] | None = None, **sections: Any) -> dict[str, Any]:
    """run_experiment of an experiment that measures one server (endpoint(), the plan's prompt_len its longest
    prompt), requests one at a time: `measure(plan, client, prompts, sink)`."""

    async def connected(sink: ResultSink) -> None:
        async with endpoint(url, plan, name, prompt_len=plan.prompt_len, model=model, api_key=api_key,
                            sink=sink) as (client, prompts, _):
            await measure(plan, client, prompts, sink)

    return await run_experiment(schema, plan, connected, output=output, labels=labels, **sections)


# -- a phase's figures ----------------------------------------------------------------------------------------

async def scrape(clients: Sequence[OpenAIClient]) -> list[Snapshot | None]:
    """Every client's /metrics at once (None where a server exports none)."""
    texts = await asyncio.gather(*(c.metrics_text() for c in clients))
    return [Snapshot.from_text(t) if t is not None else None for t in texts]


async def around(phase: Awaitable[T], clients: Sequence[OpenAIClient]
                 ) -> tuple[T, list[Snapshot | None], list[Snapshot | None]]:
    """`phase`, with every client's /metrics scraped just before and just after it: the counters' deltas are
    the phase's (as long as nothing else reaches those servers meanwhile)."""
    before = await scrape(clients)
    value = await phase
    return value, before, await scrape(clients)


@asynccontextmanager
async def metrics_clients(urls: Iterable[str], api_key: str | None = None):
    """Clients of servers that are only scraped (replicas behind a route, a router's own /metrics)."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(OpenAIClient(url, api_key=api_key, request_timeout_s=60))
               for url in urls]


def per_second(amount: float, elapsed: float) -> float | None:
    return amount / elapsed if elapsed > 0 else None


def phase_figures(results: list[Completion], elapsed: float, prompt_len: int | None = None) -> dict[str, Any]:
    """What a phase of requests did, as the client saw it. prompt_len: a request's prompt tokens where the
    server does not say (then the prompt token figures are given too)."""
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.completion_tokens or 0 for r in ok)
    figures: dict[str, Any] = {"requests": len(results), "ok": len(ok), "errors": len(results) - len(ok),
                               "error_samples": error_samples(results), "elapsed_s": elapsed}
    if prompt_len is not None:
        prompt_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else prompt_len for r in ok)
        figures.update(prompt_tokens=prompt_tokens, prompt_tokens_per_s=per_second(prompt_tokens, elapsed))
    figures.update(output_tokens=output_tokens, output_tokens_per_s=per_second(output_tokens, elapsed),
                   requests_per_s=per_second(len(ok), elapsed),
                   ttft_s=percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
                   latency_s=percentiles([r.latency_s for r in ok]))
    return figures


# -- the report -----------------------------------------------------------------------------------------------

def table(title: str, result: dict[str, Any], header: list[str], rows: list[list[str]],
          notes: Iterable[str] = ()) -> str:
    """An experiment's report: its title with how the run ended, its labels, a grid of rows, notes under it."""
    error = result.get("error")
    lines = [f"{title} (status {result.get('status')}{'; ' + error if error else ''})"]
    labels = result.get("environment", {}).get("labels") or {}
    if labels:
        lines.append("labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    if rows:
        lines += ["", *grid(header, rows)]
    lines += list(notes)
    return "\n".join(lines)


# -- the command line -----------------------------------------------------------------------------------------

class _RunUnlessNamed(argparse.ArgumentParser):
    """An experiment's parser: without `run` or `report` its arguments are run's, so the form scripts and bench/
    call (`spillway loadtest preemption --endpoint URL ...`) still reads as `... preemption run --endpoint ...`."""

    def parse_known_args(self, args=None, namespace=None):
        if args and args[0] not in (RUN, REPORT, "-h", "--help"):
            args = [RUN, *args]
        return super().parse_known_args(args, namespace)


def _zero(result: dict[str, Any]) -> int:
    return 0


@dataclass(frozen=True)
class Experiment:
    name: str  # its subcommand, and the key its prompts are drawn under
    schema: str
    help: str
    plan: type[ExperimentPlan]
    # its own flags: the servers it measures beyond --endpoint (run's parser) and its plan fields (the "plan"
    # group), named as the plan's fields are (plan_from_args reads each field by its name)
    add_flags: Callable[[argparse.ArgumentParser, Any], None]
    # its run_async: run_async(endpoint, plan, model=, api_key=, output=, labels=), or what `start` passes it
    run_async: Callable[..., Coroutine[Any, Any, dict[str, Any]]]
    table: Callable[[dict[str, Any]], str]
    # the run from the parsed flags, the validated plan and the labels, where it takes more than one --endpoint
    # (its own inputs checked before it starts)
    start: Callable[[argparse.Namespace, ExperimentPlan, dict[str, str]],
                    Coroutine[Any, Any, dict[str, Any]]] | None = None
    endpoint_help: str | None = "base URL of the server"  # None: no --endpoint (start reads its own flags)
    plot: Callable[[dict[str, Any], Path], Path] | None = None
    progress: bool = False  # takes --progress (a bar or log lines while a phase runs)
    run_help: str = "run it against a server"
    exit_code: Callable[[dict[str, Any]], int] = _zero  # of a complete run (a failed one exits 2)
    # report's own flags, and the result as they read it (verify: judged again at another tolerance)
    report_flags: Callable[[argparse.ArgumentParser], None] | None = None
    reread: Callable[[dict[str, Any], argparse.Namespace], dict[str, Any]] | None = None

    def add_parser(self, sub: argparse._SubParsersAction) -> None:
        parser = sub.add_parser(self.name, help=self.help, description=self.help)
        parser.__class__ = _RunUnlessNamed  # add_parser builds the parser itself; this only adds the default
        # run's and report's own parsers take their arguments as given (the default only applies one level up)
        actions = parser.add_subparsers(dest=f"{self.name}_command", required=True,
                                        parser_class=argparse.ArgumentParser)
        run = actions.add_parser(RUN, help=self.run_help)
        defaults = self.plan()
        group = run.add_argument_group("plan")
        if self.endpoint_help:
            run.add_argument("--endpoint", required=True, help=self.endpoint_help)
        self.add_flags(run, group)
        run.add_argument("--model", help="served model id (default: the only one the endpoint serves)")
        run.add_argument("--api-key", default=os.environ.get(ENV_API_KEY),
                         help=f"bearer token (default: ${ENV_API_KEY})")
        group.add_argument("--output-tokens", type=int, default=defaults.output_tokens,
                           help=f"max_tokens of each request (default: {defaults.output_tokens})")
        if isinstance(defaults, ConcurrentPlan):
            group.add_argument("--concurrency", type=int, default=defaults.concurrency, help="requests in flight")
            group.add_argument("--max-error-rate", type=float, default=defaults.max_error_rate,
                               help="failed requests tolerated, a fraction of those sent")
        group.add_argument("--id-range", type=int, default=defaults.id_range, help="token ids drawn from [10, 10+N)")
        group.add_argument("--seed", type=int, help="prompt seed (default: random, so the prompts are never-seen)")
        group.add_argument("--request-timeout-s", type=float, default=defaults.request_timeout_s)
        out = run.add_argument_group("output")
        out.add_argument("--output", "-o", type=Path, default=Path(f"{self.name}.json"),
                         help="result JSON (written after every step)")
        if self.plot is not None:
            out.add_argument("--plot", type=Path, help="PNG (default: the output path with .png)")
            out.add_argument("--no-plot", action="store_true")
        out.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                         help="recorded in the result's environment (repeatable)")
        if self.progress:
            out.add_argument("--progress", choices=MODES, default="auto", help="bar on a terminal, log lines otherwise")
        run.set_defaults(func=self.cmd_run)
        report = actions.add_parser(REPORT, help=f"the table{' (and plot)' if self.plot else ''} of a result")
        report.add_argument("result", type=Path)
        if self.plot is not None:
            report.add_argument("--plot", type=Path, help="write the PNG here")
        if self.report_flags is not None:
            self.report_flags(report)
        report.set_defaults(func=self.cmd_report)

    def plan_from_args(self, args: argparse.Namespace) -> ExperimentPlan:
        return self.plan(**{f.name: getattr(args, f.name) for f in fields(self.plan) if f.init}).validate()

    def load(self, path: Path) -> dict[str, Any]:
        return load(path, self.schema, f"{self.name} result")

    def cmd_run(self, args: argparse.Namespace) -> int:
        plan, labels = self.plan_from_args(args), labels_from_args(args.label)
        check_output(args.output)
        if self.start is not None:
            running = self.start(args, plan, labels)
        else:
            running = self.run_async(args.endpoint, plan, model=args.model, api_key=args.api_key, output=args.output,
                                     labels=labels)
        result = asyncio.run(stopped_by_signals(running))
        print(f"result: {args.output}", file=sys.stderr)
        print(self.table(result))
        if self.plot is not None and not args.no_plot:
            self._draw(result, args.plot or args.output.with_suffix(".png"))
        return self.exit_code(result)

    def cmd_report(self, args: argparse.Namespace) -> int:
        result = self.load(args.result)
        if self.reread is not None:
            result = self.reread(result, args)
        print(self.table(result))
        if self.plot is not None and args.plot:
            self._draw(result, args.plot)
        return 0

    def _draw(self, result: dict[str, Any], path: Path) -> None:
        try:
            self.plot(result, path)
            print(f"plot: {path}", file=sys.stderr)
        except InvalidSpec as exc:
            print(f"spillway: no plot: {exc}", file=sys.stderr)

