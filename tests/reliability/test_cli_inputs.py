"""CLI inputs that used to end in a traceback, a hang or exit 0 with an invalid object: each is one line on
stderr and exit 2 now. One subprocess per case (about 3 s each on a 2-core machine)."""
from __future__ import annotations

import json

import pytest
import yaml
from harness import modelserver, one_error_line, render, spillway
from spillway.cli import build_parser
from spillway.loadtest.http1 import DEFAULT_REQUEST_TIMEOUT_S
from spillway.loadtest.plan import Plan
from spillway.loadtest.preemption import PreemptionPlan
from test_model_config import LLAMA

HUGE = "9" * 5000


def test_a_5000_digit_integer_in_a_config_json_file(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA).replace('"num_hidden_layers": 32', f'"num_hidden_layers": {HUGE}'))
    body = modelserver(model="acme/odd", modelConfig={"configMapRef": {"name": "c"}})
    one_error_line(render(tmp_path, body, "--model-config", str(config)), "too long")


def test_a_5000_digit_integer_inline_in_the_modelserver(tmp_path):
    path = tmp_path / "ms.yaml"
    path.write_text(yaml.safe_dump(modelserver(model="acme/odd", modelConfig={"inline": {**LLAMA, "num_hidden_layers": 1}}))
                    .replace("num_hidden_layers: 1", f"num_hidden_layers: {HUGE}"))
    one_error_line(spillway("render", "-f", str(path), "--node-memory", "2Ti", "--gpus-per-node", "8"), "too long")


def test_a_huge_integer_inline_is_invalid_spec_for_the_operator():
    from spillway.controller.spec import parse_spec
    from spillway.core.errors import InvalidSpec

    with pytest.raises(InvalidSpec, match="bits"):
        parse_spec({"model": "acme/odd", "modelConfig": {"inline": {**LLAMA, "num_hidden_layers": 10**1000}}})


def test_a_yaml_bomb_to_render_is_refused_at_once(tmp_path):
    lines = ["apiVersion: spillway.dev/v1alpha1", "kind: ModelServer", "metadata: {name: a}",
             "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    lines.append("spec: {model: acme/x, extraArgs: *a9}")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    done = spillway("render", "-f", str(path), "--node-memory", "2Ti", "--gpus-per-node", "8", timeout=30)
    one_error_line(done, "values")


def test_route_replicas_of_300_characters():
    done = spillway("route", "--replicas", "x" * 300, "--block-size", "16", timeout=30)
    one_error_line(done, "--replicas", "DNS name")


def test_loadtest_run_output_a_directory(tmp_path):
    done = spillway("loadtest", "run", "--endpoint", "http://127.0.0.1:9", "--output", str(tmp_path), timeout=30)
    one_error_line(done, "--output", "directory")


@pytest.mark.parametrize("content", [bytes(range(256)) * 8, b"[" * 100000 + b"]" * 100000])
def test_binary_or_deeply_nested_result_files(tmp_path, content):
    path = tmp_path / "result.json"
    path.write_bytes(content)
    one_error_line(spillway("loadtest", "report", str(path)), str(path))
    one_error_line(spillway("loadtest", "run", "--endpoint", "http://127.0.0.1:9", "--output",
                            str(tmp_path / "out.json"), "--baseline", str(path)), str(path))


@pytest.mark.parametrize("args", [
    ["loadtest", "job", "--modelserver", "Bad_Name", "--render"],
    ["loadtest", "job", "--modelserver", "ok", "--job-name", "j" * 70, "--render"],
    ["loadtest", "job", "--modelserver", "ok", "--namespace", "a.b", "--render"],
    ["qualify", "--render", "daemonset", "--namespace", "Bad_NS"],
    ["qualify", "--render", "job", "--node", "UPPER..node"],
])
def test_invalid_object_names_are_refused(args):
    one_error_line(spillway(*args), "must")


def test_the_default_request_timeout_is_minutes_not_an_hour():
    """A completion that never answers fails its request in minutes (a run waited an hour by default)."""
    assert DEFAULT_REQUEST_TIMEOUT_S <= 600
    assert Plan().request_timeout_s == PreemptionPlan().request_timeout_s == DEFAULT_REQUEST_TIMEOUT_S
    parsed = build_parser().parse_args(["loadtest", "run", "--endpoint", "http://127.0.0.1:9"])
    assert parsed.request_timeout_s == DEFAULT_REQUEST_TIMEOUT_S
