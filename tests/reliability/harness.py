"""What the reliability tests share: the `spillway` CLI as a subprocess, and the real operator over the
emulated Kubernetes API (the operator suites' harness) with a small client for one test's namespace."""
from __future__ import annotations

import functools
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
from spillway.core import k8s_names as names
from support.forked import Forked
from support.ms_api import Api
from support.ms_cluster import EmulatedCluster, Operator, eventually
from support.ms_examples import LLAMA_8B, gpu_node, modelserver

__all__ = [
    "LLAMA_8B",
    "Api",
    "EmulatedCluster",
    "Operator",
    "container_args",
    "eventually",
    "gpu_node",
    "modelserver",
    "names",
    "one_error_line",
    "parse_with_vllm",
    "render",
    "spillway",
]

# The CLI and vLLM's parser run in children forked from one process that imported them (support/forked.py):
# a process of their own per call, without a fresh interpreter's imports each time.
_CLI_IMPORTS = ["spillway.cli", "spillway.commands.plan", "spillway.commands.render", "spillway.loadtest.cli"]
_VLLM_IMPORTS = ["vllm.entrypoints.launchers.cli_args", "vllm.utils.argparse_utils"]


@functools.cache
def _forked(*preload: str) -> Forked:
    return Forked(list(preload))


def spillway(*args: str, stdin: str | None = None, timeout: float = 120, env: dict | None = None,
             rlimits: dict[str, int] | None = None) -> subprocess.CompletedProcess:
    """`python -m spillway.cli ARGS`; `rlimits` ({"RLIMIT_AS": bytes}) are set in its process before it runs."""
    return _forked(*_CLI_IMPORTS).run("spillway.cli", *args, stdin=stdin, env=env, timeout=timeout, rlimits=rlimits)


def one_error_line(done: subprocess.CompletedProcess, *words: str) -> str:
    """The CLI refused the input the way the project promises: exit 2 and one line on stderr."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("spillway: error: "), done.stderr[-3000:]
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def render(tmp: Path, body: dict[str, Any], *extra: str, memory: str = "2Ti", gpus: int = 8
           ) -> subprocess.CompletedProcess:
    path = tmp / f"ms-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(body))
    return spillway("render", "-f", str(path), "--node-memory", memory, "--gpus-per-node", str(gpus),
                    "-o", "json", *extra)


def rendered(done: subprocess.CompletedProcess) -> dict[str, dict[str, Any]]:
    assert done.returncode == 0, done.stderr[-3000:]
    return {item["kind"]: item for item in json.loads(done.stdout)["items"]}


def memory_limit(deployment: dict) -> str:
    container, = deployment["spec"]["template"]["spec"]["containers"]
    return container["resources"]["limits"]["memory"]


def parse_with_vllm(argvs: list[list[str]]) -> list[dict]:
    """What vLLM's own parser reads from each command line (vllm_parse.py, the CPU build)."""
    done = _forked(*_VLLM_IMPORTS).run(str(Path(__file__).with_name("vllm_parse.py")), stdin=json.dumps(argvs),
                                       timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def container_args(done: subprocess.CompletedProcess) -> list[str]:
    container, = rendered(done)["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert "command" not in container  # our image's entrypoint passes them to `vllm serve`
    return container["args"]
