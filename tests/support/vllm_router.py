"""The routers in front of VllmServer replicas: the real vllm-router (the vLLM project's Rust router, from its
PyPI wheel; the tests' baseline policies) and `spillway route` (kv-aware mode's own router) as its own process.

    with VllmRouter([a, b], policy="round_robin", binary=...) as router:
        requests.post(router.url("/v1/completions"), ...)
    with SpillwayRouter([a, b], block_size=32) as router:
        router.set_workers([a, b, c])   # as a pod becoming ready: the router follows without a restart

The router runs in its own process group, killed on exit; its log is quoted when the start fails.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from spillway.core import router_api as R
from spillway.core import routing

from .vllm_server import ServerStartError, _die_with_parent, _kill_group, free_port

STARTUP_TIMEOUT_S = 180.0  # the router waits until every worker answers /health


class VllmRouter:
    def __init__(self, worker_urls: Sequence[str], *, policy: str, binary: str,
                 event_sources: Mapping[str, str] | None = None, block_size: int | None = None,
                 model: str | None = None, extra_args: Sequence[str] = ()) -> None:
        self.policy = policy
        self.port = free_port()
        self.metrics_port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}{R.ROUTER_METRICS_PATH}"
        self._workdir = Path(tempfile.mkdtemp(prefix="spillway-router-"))
        self.log_path = self._workdir / "router.log"
        args = [binary, R.FLAG_HOST, "127.0.0.1", R.FLAG_PORT, str(self.port), R.FLAG_POLICY, policy,
                R.FLAG_WORKER_URLS, *worker_urls,
                R.FLAG_PROMETHEUS_HOST, "127.0.0.1", R.FLAG_PROMETHEUS_PORT, str(self.metrics_port),
                R.FLAG_WORKER_STARTUP_CHECK_INTERVAL, "1"]
        for worker, endpoint in (event_sources or {}).items():
            args += [R.FLAG_KV_EVENT_SOURCE, f"{worker}={endpoint}"]
        if block_size is not None:
            args += [R.FLAG_KV_EVENT_BLOCK_SIZE, str(block_size)]
        if model is not None:
            args += [R.FLAG_KV_EVENT_MODEL, model]
        self.args = args + list(extra_args)
        self._proc: subprocess.Popen | None = None
        self._log = None

    health_path = R.ROUTER_HEALTH_PATH
    name = "vllm-router"

    def start(self) -> VllmRouter:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - held until stop()
        self._proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise ServerStartError(f"{self.name} exited with {self._proc.returncode}:\n{self.log_tail()}")
                try:
                    with urllib.request.urlopen(self.url(self.health_path), timeout=2) as response:
                        if response.status == 200:
                            return self
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.5)
            raise ServerStartError(f"{self.name} not healthy after {STARTUP_TIMEOUT_S:.0f}s:\n{self.log_tail()}")
        except BaseException:
            self.close()
            raise

    def url(self, path: str) -> str:
        return self.base_url + path

    def workers(self) -> list[str]:
        """The worker URLs the router routes to now (its /list_workers)."""
        import json

        with urllib.request.urlopen(self.url(R.ROUTER_LIST_WORKERS_PATH), timeout=10) as response:
            return list(json.loads(response.read())["urls"])

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=30) as response:
            return response.read().decode()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill_group(proc, grace_s=10.0)
        if self._log is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self):  # -> VllmRouter
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class SpillwayRouter(VllmRouter):
    """`spillway route` over a workers file this object writes (what DNS gives it in Kubernetes)."""

    health_path = routing.ROUTER_HEALTH_PATH
    name = "spillway route"

    def __init__(self, worker_urls: Sequence[str], *, block_size: int, extra_args: Sequence[str] = ()) -> None:
        import sys

        self.policy = "spillway"
        self.port, self.metrics_port = free_port(), free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}{routing.ROUTER_METRICS_PATH}"
        self._workdir = Path(tempfile.mkdtemp(prefix="spillway-route-"))
        self.log_path = self._workdir / "router.log"
        self.workers_file = self._workdir / "workers"
        self.set_workers(worker_urls)
        self.args = [sys.executable, "-m", "spillway.cli", "route", "--workers-file", str(self.workers_file),
                     "--block-size", str(block_size), "--host", "127.0.0.1", "--port", str(self.port),
                     "--metrics-port", str(self.metrics_port), "--poll-seconds", "0.5", *extra_args]
        self._proc = None
        self._log = None

    def set_workers(self, urls: Sequence[str]) -> None:
        tmp = self.workers_file.with_suffix(".tmp")
        tmp.write_text("".join(f"{u}\n" for u in urls))
        tmp.replace(self.workers_file)  # whole or not at all: the router reads it every half second

    def workers(self) -> list[str]:
        """The workers the router routes to now: those its in-flight gauge lists."""
        import re

        gauge = re.compile(rf'^{routing.ROUTER_METRIC_IN_FLIGHT}{{worker="([^"]+)"}}', re.MULTILINE)
        return sorted(gauge.findall(self.metrics_text()))
