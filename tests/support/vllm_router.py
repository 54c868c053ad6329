"""The real vllm-router (the vLLM project's Rust router, from its PyPI wheel) in front of VllmServer replicas.

    with VllmRouter([a, b], policy="kv_aware", event_sources={a.base_url: a.kv_events_endpoint, ...}) as router:
        requests.post(router.url("/v1/completions"), ...)

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

    def start(self) -> VllmRouter:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - held until stop()
        self._proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise ServerStartError(f"vllm-router exited with {self._proc.returncode}:\n{self.log_tail()}")
                try:
                    with urllib.request.urlopen(self.url(R.ROUTER_HEALTH_PATH), timeout=2) as response:
                        if response.status == 200:
                            return self
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.5)
            raise ServerStartError(f"vllm-router not healthy after {STARTUP_TIMEOUT_S:.0f}s:\n{self.log_tail()}")
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
