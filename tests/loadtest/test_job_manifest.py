"""The Job that `spillway loadtest job --render` prints is valid Kubernetes (strict) and runs the plan."""
from __future__ import annotations

import argparse
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from spillway.core import k8s_names
from spillway.core.vllm_api import SERVER_PORT
from spillway.loadtest import job as jobs
from spillway.loadtest.cli import add_subcommands, plan_from_args, plan_to_args
from spillway.loadtest.plan import Plan, ThroughputPlan, TtftPlan

KUBE_VERSIONS = ["1.30.0", "1.37.0"]  # the oldest and newest Kubernetes the chart supports


def loadtest_parser() -> argparse.ArgumentParser:
    """The parser of `spillway loadtest` (the pod runs `spillway loadtest run ...`)."""
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="cmd", required=True))
    return parser


def render(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", "job", "--render", *args],
                         capture_output=True, text=True, check=True)
    return yaml.safe_load(out.stdout)


@pytest.fixture(scope="module")
def manifest() -> dict:
    return render("--modelserver", "llama", "-n", "inference", "--hit-rates", "0,0.5,1", "--num-prompts", "500",
                  "--experiment", "throughput", "--label", "gpu=H200", "--baseline-modelserver", "llama-nooffload",
                  "--api-key-secret", "vllm-token:key", "--deadline-s", "7200")


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_job_is_valid_for_supported_kubernetes(manifest, kube_version):
    kubernetes_validate.validate(manifest, kube_version, strict=True)


def test_job_targets_the_modelserver_service(manifest):
    assert manifest["kind"] == "Job" and manifest["metadata"]["namespace"] == "inference"
    assert manifest["metadata"]["labels"][k8s_names.LABEL_MODELSERVER] == "llama"
    container, = manifest["spec"]["template"]["spec"]["containers"]
    assert container["image"] == k8s_names.DEFAULT_OPERATOR_IMAGE
    args = container["args"]
    assert args[:4] == ["loadtest", "run", "--endpoint", f"http://llama.inference.svc:{SERVER_PORT}"]
    assert args[args.index("--baseline-endpoint") + 1] == f"http://llama-nooffload.inference.svc:{SERVER_PORT}"
    assert "--emit-result" in args and "--no-plot" in args
    assert manifest["spec"]["backoffLimit"] == 0
    assert manifest["spec"]["activeDeadlineSeconds"] == 7200
    env = {e["name"]: e for e in container["env"]}
    assert env[jobs.ENV_API_KEY]["valueFrom"]["secretKeyRef"] == {"name": "vllm-token", "key": "key"}


def test_job_arguments_rebuild_the_same_plan(manifest):
    """The pod parses the args the CLI wrote; the plan it builds is the one asked for."""
    container, = manifest["spec"]["template"]["spec"]["containers"]
    args = loadtest_parser().parse_args(container["args"][1:])
    plan = plan_from_args(args)
    assert plan.experiments == ["throughput"]
    assert plan.throughput.hit_rates == [0.0, 0.5, 1.0]
    assert plan.throughput.num_prompts == 500
    assert plan.seed is None  # each run of the applied manifest draws fresh prompts


def test_plan_round_trips_through_flags():
    plan = Plan(experiments=["ttft"], ttft=TtftPlan(lengths=[128, 4096], repetitions=3),
                throughput=ThroughputPlan(num_prompts=7, prompt_len=96, hit_rates=[0.25]),
                evict_gpu="flush", flush_tokens=5000,
                concurrency=9, output_tokens=2, prompt_format="ids", id_range=500, seed=42, settle_s=0.5,
                block_size=16, gpu_kv_tokens=1024, max_error_rate=0.1, request_timeout_s=60.0)
    args = loadtest_parser().parse_args(["run", "--endpoint", "http://x", *plan_to_args(plan)])
    assert plan_from_args(args) == plan


def test_service_rule():
    assert jobs.modelserver_url("m", "ns") == f"http://m.ns.svc:{SERVER_PORT}"
