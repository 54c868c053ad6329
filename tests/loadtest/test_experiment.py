"""The shape the four experiments share (spillway.loadtest.experiment), through their command lines: each `run`
keeps a result with the same frame whatever ends it, each `report` reads its own result and refuses another's,
and the form without `run` that scripts call still runs."""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spillway.loadtest import preemption, prefix_groups, verify, working_set
from spillway.loadtest.cli import add_subcommands

EXPERIMENTS = (prefix_groups, preemption, working_set, verify)


def loadtest(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", *args], check=False, capture_output=True,
                          text=True, timeout=timeout)


def target_args(module, url: str) -> list[str]:
    if module is prefix_groups:
        return ["--route", f"a={url}", "--replica", url, "--no-plot"]
    return ["--endpoint", url]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("module", EXPERIMENTS, ids=lambda m: m.EXPERIMENT)
def test_a_failed_run_keeps_the_common_frame_and_its_report_reads_it(module, tmp_path: Path):
    url = f"http://127.0.0.1:{closed_port()}"
    path = tmp_path / "r.json"
    done = loadtest(module.EXPERIMENT, "run", *target_args(module, url), "--seed", "5", "--label", "gpu=none",
                    "-o", str(path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"spillway: error: cannot reach {url}/v1/models")
    result = json.loads(path.read_text())
    assert result["schema"] == module.SCHEMA and result["status"] == "failed" and "cannot reach" in result["error"]
    assert result["started_at"] <= result["finished_at"]
    assert result["environment"]["labels"] == {"gpu": "none"} and result["environment"]["client"]["spillway"]
    assert result["plan"]["seed"] == 5 and result["plan"]["output_tokens"] >= 1

    report = loadtest(module.EXPERIMENT, "report", str(path))
    assert report.returncode == 0, report.stderr
    first = report.stdout.splitlines()[0]
    assert first.endswith(f"(status failed; {result['error']})") and "labels: gpu=none" in report.stdout

    other = EXPERIMENTS[(EXPERIMENTS.index(module) + 1) % len(EXPERIMENTS)]
    refused = loadtest(other.EXPERIMENT, "report", str(path))
    assert refused.returncode == 2
    assert refused.stderr.strip() == (f"spillway: error: {path} is not a {other.EXPERIMENT} result "
                                      f"({other.SCHEMA})")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spillway.loadtest")
    add_subcommands(p.add_subparsers(dest="loadtest_command", required=True))
    return p


@pytest.mark.parametrize("module", EXPERIMENTS, ids=lambda m: m.EXPERIMENT)
def test_without_run_the_arguments_are_runs(module):
    """bench/gpu/serve_bench.py and older docs call `spillway loadtest preemption --endpoint URL ...`."""
    args = [*target_args(module, "http://127.0.0.1:9"), "--seed", "3", "-o", "x.json"]
    bare, named = parser().parse_args([module.EXPERIMENT, *args]), parser().parse_args([module.EXPERIMENT, "run", *args])
    assert vars(bare) == vars(named) and bare.func == module.COMMAND.cmd_run


def test_a_stop_signal_ends_an_experiment_interrupted_with_its_result_kept(tmp_path: Path):
    """A server that accepts and never answers: SIGINT (Ctrl-C; SIGTERM for a deleted Job) ends the run, and the
    result says so."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        path = tmp_path / "p.json"
        proc = subprocess.Popen([sys.executable, "-m", "spillway.cli", "loadtest", "preemption", "run", "--endpoint",
                                 url, "-o", str(path), "--progress", "none"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:  # the result exists from the run's start
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2, stderr
    assert stderr.strip().splitlines()[-1] == f"spillway: error: interrupted; partial result kept in {path}"
    result = json.loads(path.read_text())
    assert (result["status"], result["error"]) == ("interrupted", "interrupted") and result["runs"] == []
