"""A real Prometheus on 127.0.0.1 for tests: tmp storage, 1 s scrape and rule intervals.

    with PrometheusServer(binary, targets=[("127.0.0.1:8000", {"pod": "vllm-0"})], rule_files=[...]) as prom:
        prom.query('up')

Runs in its own process group, killed on exit.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import yaml

JOB = "vllm"
INTERVAL = "1s"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _epoch(rfc3339: str) -> float:
    """Prometheus's nanosecond RFC 3339 time as epoch seconds (datetime reads at most microseconds)."""
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", rfc3339).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).timestamp()


class PrometheusError(RuntimeError):
    pass


class PrometheusServer:
    def __init__(self, binary: str, targets: list[tuple[str, dict[str, str]]], rule_files: list[Path],
                 metrics_path: str = "/metrics", startup_timeout_s: float = 60.0) -> None:
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="spillway-prometheus-"))
        config = {
            "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{
                "job_name": JOB,
                "metrics_path": metrics_path,
                "static_configs": [{"targets": [address], "labels": labels} for address, labels in targets],
            }],
        }
        (self._dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.args = [
            binary,
            f"--config.file={self._dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self._dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
        ]
        self.log_path = self._dir / "prometheus.log"
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen | None = None
        self._log = None

    def __enter__(self):
        self._log = open(self.log_path, "wb")
        self._proc = subprocess.Popen(self.args, cwd=self._dir, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise PrometheusError(f"prometheus not ready after {self.startup_timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- HTTP API -----------------------------------------------------------------
    def api(self, path: str, **params: str | list[str]) -> object:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.base_url}/api/v1/{path}?{query}", timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:  # 400 on a bad query: say which
            raise PrometheusError(f"{path} {params}: {error.read().decode(errors='replace')}") from error
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant query now; the result vector (or a scalar's single sample, as a one-item list)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            return data["result"]
        return [{"metric": {}, "value": data["result"]}]

    def label_values(self, label: str, match: str) -> list[str]:
        return self.api(f"label/{label}/values", **{"match[]": match})

    def rules(self) -> list[dict]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def wait_for_evaluation(self, since: float, timeout_s: float = 60.0) -> None:
        """Wait until every target was scraped after `since` (time.time()) and every rule group evaluated
        after those scrapes were queryable, so queries and rules see all that came before `since`."""
        deadline = time.monotonic() + timeout_s
        queryable = None  # when the scrapes were seen in a query: an evaluation that starts later sees them
        while time.monotonic() < deadline:
            if queryable is None:
                scrapes = [float(sample["value"][1]) for sample in self.query(f'timestamp(up{{job="{JOB}"}})')]
                if scrapes and min(scrapes) > since:
                    queryable = time.time()
            elif all(_epoch(group["lastEvaluation"]) > queryable for group in self.api("rules")["groups"]):
                return
            time.sleep(0.2)
        raise PrometheusError(f"no scrape and rule evaluation after {since:.1f} in {timeout_s:.0f}s")

    def wait_for(self, expr: str, timeout_s: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.5)
