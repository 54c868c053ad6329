"""Bad input ends in one clear line and exit code 2, before or without any load."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def loadtest(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", *args], check=False, capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("rates, message", [
    ("0,50", "hit rate 50 is outside 0..1 (hit rates are fractions: 0.5 means 50%)"),
    ("-0.1", "hit rate -0.1 is outside 0..1"),
    ("0.2,101", "hit rate 101 is outside 0..1"),
])
def test_hit_rate_outside_0_1(tmp_path, rates, message):
    out = loadtest("run", "--endpoint", "http://127.0.0.1:9", "--hit-rates", rates, "-o", str(tmp_path / "r.json"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == f"spillway: error: {message}"


def test_unreachable_endpoint_keeps_a_failed_result(tmp_path):
    port = closed_port()
    result = tmp_path / "r.json"
    out = loadtest("run", "--endpoint", f"http://127.0.0.1:{port}", "-o", str(result), "--no-plot")
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"spillway: error: cannot reach http://127.0.0.1:{port}/v1/models")
    import json

    document = json.loads(result.read_text())
    assert document["status"] == "failed" and "cannot reach" in document["error"]


def test_unknown_experiment(tmp_path):
    out = loadtest("run", "--endpoint", "http://127.0.0.1:9", "--experiment", "latency", "-o", str(tmp_path / "r"))
    assert out.returncode == 2
    assert "experiments must be among ttft, throughput; got latency" in out.stderr


def test_report_of_a_file_that_is_no_result(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"a": 1}')
    out = loadtest("report", str(path))
    assert out.returncode == 2
    assert out.stderr.strip() == f"spillway: error: {path} is not a load test result (spillway.loadtest/v1)"


def test_bad_label(tmp_path):
    out = loadtest("run", "--endpoint", "http://127.0.0.1:9", "--label", "gpu", "-o", str(tmp_path / "r.json"))
    assert out.returncode == 2
    assert "--label expects KEY=VALUE, got 'gpu'" in out.stderr
