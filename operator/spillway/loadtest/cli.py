"""`spillway loadtest`: run | job | report. Every knob is a flag; no prompts; JSON output path flag."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..core.errors import InvalidSpec
from .http1 import DEFAULT_REQUEST_TIMEOUT_S
from .plan import (
    AUTO,
    DEFAULT_CONCURRENCY,
    DEFAULT_HIT_RATES,
    DEFAULT_NUM_PROMPTS,
    DEFAULT_PROMPT_LEN,
    DEFAULT_TTFT_LENGTHS,
    DEFAULT_TTFT_REPETITIONS,
    EVICT_METHODS,
    EXPERIMENTS,
    LONGEST,
    Plan,
    ThroughputPlan,
    TtftPlan,
    labels_from_args,
)
from .progress import MODES

DEFAULT_OUTPUT = "loadtest.json"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("loadtest", help="measure what offloading buys: TTFT from CPU vs recompute, "
                                               "throughput vs CPU hit rate")
    sub = p.add_subparsers(dest="loadtest_command", required=True)
    add_subcommands(sub)


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run against an OpenAI-compatible endpoint (laptop, CI, or inside a Job)")
    run.add_argument("--endpoint", required=True, help="base URL, e.g. http://localhost:8000")
    run.add_argument("--baseline-endpoint", help="a second endpoint without offloading: the same plan runs there")
    run.add_argument("--api-key", default=os.environ.get(_api_key_env()),
                     help=f"bearer token (default: ${_api_key_env()})")
    run.add_argument("--emit-result", action="store_true",
                     help="print the result after every point as one stdout line (how a Job hands it back)")
    _add_model(run)
    _add_plan(run)
    _add_outputs(run)
    run.set_defaults(func=cmd_run)

    job = sub.add_parser("job", help="run as a Kubernetes Job against a ModelServer's Service")
    job.add_argument("--modelserver", required=True, help="ModelServer name (its Service is <name>:8000)")
    job.add_argument("--baseline-modelserver", help="a ModelServer without offloading, measured after the first")
    job.add_argument("-n", "--namespace", help="namespace of the ModelServer and the Job (default: kubeconfig's)")
    job.add_argument("--context", help="kubeconfig context")
    job.add_argument("--job-name", help="default: <modelserver>-loadtest")
    job.add_argument("--image", default=None, help="image holding the spillway package (default: the operator image)")
    job.add_argument("--cpu", default="2", help="CPU request of the load generator")
    job.add_argument("--memory", default="2Gi", help="memory request and limit of the load generator")
    job.add_argument("--deadline-s", type=int, help="activeDeadlineSeconds of the Job")
    job.add_argument("--api-key-secret", metavar="SECRET:KEY", help="Secret key holding the endpoint's bearer token")
    job.add_argument("--render", action="store_true", help="print the Job manifest (YAML) and exit")
    _add_model(job)
    _add_plan(job)
    _add_outputs(job)
    job.set_defaults(func=cmd_job)

    report = sub.add_parser("report", help="table (and plot) of a result file or of a saved Job log")
    report.add_argument("result", type=Path)
    report.add_argument("--baseline", type=Path, help="result of the same plan without offloading")
    report.add_argument("--plot", type=Path, help="write the PNG here")
    report.add_argument("--json", action="store_true", help="print the result JSON (e.g. extracted from a log)")
    report.set_defaults(func=cmd_report)

    from . import preemption, prefix_groups, verify, working_set

    for experiment in (prefix_groups, preemption, working_set, verify):  # each `run` and `report` (experiment.py)
        experiment.COMMAND.add_parser(sub)


def _api_key_env() -> str:
    from .job import ENV_API_KEY

    return ENV_API_KEY


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="served model id (default: the only one the endpoint serves)")


def _csv(cast):
    def parse(text: str) -> list:
        try:
            return [cast(item) for item in text.split(",") if item.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {cast.__name__}: {text!r}") from None
    parse.__name__ = f"list of {cast.__name__}"
    return parse


def _length(text: str) -> int | str:
    return LONGEST if text.strip() == LONGEST else int(text)


_length.__name__ = f"whole numbers or '{LONGEST}'"


def _auto_int(text: str) -> int | str:
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected '{AUTO}' or a whole number: {text!r}") from None


def _add_plan(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan")
    g.add_argument("--experiment", type=_csv(str), default=list(EXPERIMENTS),
                   help=f"comma-separated: {', '.join(EXPERIMENTS)} (default: both)")
    g.add_argument("--ttft-lengths", type=_csv(_length), default=list(DEFAULT_TTFT_LENGTHS),
                   help=f"prompt lengths, tokens; '{LONGEST}': the longest whole-block prompt the server takes "
                        "(default: 1024,2048,4096,8192,16384,32768,max)")
    g.add_argument("--ttft-repetitions", type=int, default=DEFAULT_TTFT_REPETITIONS)
    g.add_argument("--num-prompts", type=int, default=DEFAULT_NUM_PROMPTS, help="unique prompts per hit-rate point")
    g.add_argument("--prompt-len", type=int, default=DEFAULT_PROMPT_LEN, help="tokens per throughput prompt")
    g.add_argument("--hit-rates", type=_csv(float), default=list(DEFAULT_HIT_RATES),
                   help="target CPU hit rates, fractions 0..1 (default: 0,0.25,0.5,0.8,1)")
    g.add_argument("--evict-gpu", choices=EVICT_METHODS, default=AUTO,
                   help="how GPU copies are evicted before re-reads: reset (POST /reset_prefix_cache, vLLM with "
                        "VLLM_SERVER_DEV_MODE=1), flush (never-seen prompts), none; auto: none without GPU prefix "
                        "caching, else reset where offered, else flush")
    g.add_argument("--flush-tokens", type=_auto_int, default=AUTO,
                   help="size of a flush (auto: 1.25x the server's GPU KV capacity)")
    g.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="requests in flight")
    g.add_argument("--output-tokens", type=int, default=1, help="max_tokens of each request")
    g.add_argument("--prompt-format", choices=[AUTO, "ids", "text"], default=AUTO,
                   help="token ids where the server takes them (auto), or random text")
    g.add_argument("--id-range", type=int, default=1000, help="token ids drawn from [10, 10+N): keep inside the vocabulary")
    g.add_argument("--seed", type=int, help="prompt seed (default: random, so no run re-reads another's prompts)")
    g.add_argument("--settle-s", type=float, default=1.0, help="pause after warm-ups and flushes (async stores)")
    g.add_argument("--block-size", type=_auto_int, default=AUTO, help="tokens per KV block (auto: the server's)")
    g.add_argument("--gpu-kv-tokens", type=_auto_int, default=AUTO,
                   help="the server's GPU KV capacity, tokens (auto: from /metrics vllm:cache_config_info)")
    g.add_argument("--max-error-rate", type=float, default=0.01, help="failed requests tolerated per point")
    g.add_argument("--request-timeout-s", type=float, default=DEFAULT_REQUEST_TIMEOUT_S)


def _add_outputs(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--output", "-o", type=Path, default=Path(DEFAULT_OUTPUT), help="result JSON (written after every point)")
    g.add_argument("--plot", type=Path, help="PNG (default: the output path with .png)")
    g.add_argument("--no-plot", action="store_true")
    g.add_argument("--baseline", type=Path, help="a no-offload result of the same plan, shown beside")
    g.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="recorded in the environment, e.g. gpu=H200 offload=200GiB (repeatable)")
    g.add_argument("--progress", choices=MODES, default="auto", help="bar on a terminal, log lines otherwise")


def plan_from_args(args: argparse.Namespace) -> Plan:
    return Plan(
        experiments=list(args.experiment),
        ttft=TtftPlan(lengths=list(args.ttft_lengths), repetitions=args.ttft_repetitions),
        throughput=ThroughputPlan(num_prompts=args.num_prompts, prompt_len=args.prompt_len,
                                  hit_rates=list(args.hit_rates)),
        evict_gpu=args.evict_gpu,
        flush_tokens=args.flush_tokens,
        concurrency=args.concurrency,
        output_tokens=args.output_tokens,
        prompt_format=args.prompt_format,
        id_range=args.id_range,
        seed=args.seed,
        settle_s=args.settle_s,
        block_size=args.block_size,
        gpu_kv_tokens=args.gpu_kv_tokens,
        max_error_rate=args.max_error_rate,
        request_timeout_s=args.request_timeout_s,
    ).validate()


def plan_to_args(plan: Plan) -> list[str]:
    """Flags that make `spillway loadtest run` build this plan (for the Job)."""
    args = [
        "--experiment", ",".join(plan.experiments),
        "--ttft-lengths", ",".join(str(x) for x in plan.ttft.lengths),
        "--ttft-repetitions", str(plan.ttft.repetitions),
        "--num-prompts", str(plan.throughput.num_prompts),
        "--prompt-len", str(plan.throughput.prompt_len),
        "--hit-rates", ",".join(f"{x:g}" for x in plan.throughput.hit_rates),
        "--evict-gpu", plan.evict_gpu,
        "--flush-tokens", str(plan.flush_tokens),
        "--concurrency", str(plan.concurrency),
        "--output-tokens", str(plan.output_tokens),
        "--prompt-format", plan.prompt_format,
        "--id-range", str(plan.id_range),
        "--settle-s", f"{plan.settle_s:g}",
        "--block-size", str(plan.block_size),
        "--gpu-kv-tokens", str(plan.gpu_kv_tokens),
        "--max-error-rate", f"{plan.max_error_rate:g}",
        "--request-timeout-s", f"{plan.request_timeout_s:g}",
    ]
    if plan.seed is not None:
        args += ["--seed", str(plan.seed)]
    return args


def _load_baseline(args: argparse.Namespace) -> dict | None:
    if not args.baseline:
        return None
    from .results import load

    return load(args.baseline)


def _finish(result: dict, args: argparse.Namespace, baseline: dict | None) -> None:
    from .report import table

    print(table(result, baseline or result.get("baseline")))
    if args.no_plot:
        return
    from .plot import plot

    path = args.plot or args.output.with_suffix(".png")
    try:
        plot(result, path, baseline or result.get("baseline"))
        print(f"plot: {path}", file=sys.stderr)
    except InvalidSpec as exc:
        print(f"spillway: no plot: {exc}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from .results import STATUS_COMPLETE, check_output
    from .runner import run_endpoint

    plan = plan_from_args(args)
    labels = labels_from_args(args.label)
    check_output(args.output)
    baseline = _load_baseline(args)
    emit = sys.stdout if args.emit_result else None
    common = {"model": args.model, "api_key": args.api_key, "emit": emit, "progress": args.progress}
    result = run_endpoint(args.endpoint, plan, output=args.output, labels=labels, **common)
    if args.baseline_endpoint:
        from dataclasses import replace

        run_endpoint(args.baseline_endpoint, replace(plan), output=args.output, labels={**labels, "role": "baseline"},
                     root=result, **common)
    elif baseline is not None:
        result["baseline"] = baseline
        from .results import write_atomic

        write_atomic(args.output, json.dumps(result, indent=1))
    print(f"result: {args.output}", file=sys.stderr)
    _finish(result, args, None)
    return 0 if result["status"] == STATUS_COMPLETE else 2


def cmd_job(args: argparse.Namespace) -> int:
    from . import job as jobs

    plan = plan_from_args(args)
    labels_from_args(args.label)
    for flag, value in (("--modelserver", args.modelserver), ("--baseline-modelserver", args.baseline_modelserver),
                        ("--job-name", args.job_name), ("--namespace", args.namespace)):
        if value is not None:
            jobs.names.require_name(value, flag)
    namespace = args.namespace or jobs.default_namespace(args.context)
    run_args = plan_to_args(plan)
    if args.model:
        run_args += ["--model", args.model]
    for item in args.label:
        run_args += ["--label", item]
    run_args += ["--label", f"modelserver={args.modelserver}"]
    if args.baseline_modelserver:
        run_args += ["--baseline-endpoint", jobs.modelserver_url(args.baseline_modelserver, namespace)]
    secret = None
    if args.api_key_secret:
        name, sep, key = args.api_key_secret.partition(":")
        if not sep or not name or not key:
            raise InvalidSpec(f"--api-key-secret expects SECRET:KEY, got {args.api_key_secret!r}")
        secret = (name, key)
    manifest = jobs.manifest(
        name=args.job_name or jobs.job_name(args.modelserver), namespace=namespace, modelserver=args.modelserver,
        run_args=run_args, image=args.image or jobs.names.DEFAULT_OPERATOR_IMAGE, cpu=args.cpu, memory=args.memory,
        deadline_s=args.deadline_s, api_key_secret=secret)
    if args.render:
        import yaml

        print(yaml.safe_dump(manifest, sort_keys=False), end="")
        return 0
    check = [args.modelserver] + ([args.baseline_modelserver] if args.baseline_modelserver else [])
    result = jobs.run_job(manifest, output=args.output, context=args.context, check=check)
    if result is None:
        raise InvalidSpec(f"the Job's log held no result; see `kubectl logs job/{manifest['metadata']['name']} "
                          f"-n {namespace}`")
    print(f"result: {args.output}", file=sys.stderr)
    _finish(result, args, _load_baseline(args))
    from .results import STATUS_COMPLETE

    if result.get("status") != STATUS_COMPLETE:
        raise InvalidSpec(f"the load test ended {result.get('status')}: {result.get('error')}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import table
    from .results import load

    result = load(args.result)
    baseline = load(args.baseline) if args.baseline else result.get("baseline")
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(table(result, baseline))
    if args.plot:
        from .plot import plot

        plot(result, args.plot, baseline)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0
