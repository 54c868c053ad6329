"""`spillway route`: run vllm-router's kv_aware policy over a ModelServer's ready vLLM pods.

vllm-router takes each worker's KV event source as a static WORKER_URL=tcp://HOST:PORT pair, and pod IPs
change. The ModelServer's headless Service <name>-replicas answers DNS with the IPs of its ready pods, so this
supervisor needs no Kubernetes API access: it resolves that name, starts vllm-router with one worker URL and
one event source per ready pod, and follows changes through the router's own worker API (/add_worker,
/remove_worker) so the index of the pods that stay is kept. vllm-router 0.1.17 subscribes to a worker's KV
events only for the --kv-event-source pairs it starts with: /add_worker starts no subscription, whatever the
worker serves (a worker answering /get_server_info with its block size was not indexed either; measured,
docs/routing.md). An added pod takes requests at once, and its blocks join the index when the router next
starts (a removed one leaves nothing behind). The router is started again only when it exits or when its API
does not answer. Without a ready pod no router
runs: the router pod is then not ready (its readiness probe fails), which is the truth, and nothing
crash-loops.

The workers' API key (spec.apiKeySecretRef) comes from $VLLM_API_KEY or --api-key-file and reaches the
router through a pipe, never a command line (which every process on the node can read).

    spillway route --replicas llama-replicas.team-a.svc --model NAME --block-size 64 [--host-tier-credit 0.9]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from ..core import router_api as R
from ..core import routing
from ..core import vllm_api as api
from ..core.errors import InvalidSpec

POLL_SECONDS = 5.0
STOP_GRACE_SECONDS = 10.0
ADMIN_TIMEOUT_S = 10.0


def resolve_ips(host: str) -> list[str]:
    """The addresses DNS gives for `host`, sorted (the router's worker order is then stable); [] when the name
    has none (a headless Service without a ready pod). Other resolver failures raise OSError."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return []
        raise
    return sorted({info[4][0] for info in infos})


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def worker_url(ip: str) -> str:
    return f"http://{_host(ip)}:{api.SERVER_PORT}"


def router_args(ips: Sequence[str], *, model: str, block_size: int, host_tier_credit: float | None,
                port: int = routing.ROUTER_PORT, metrics_port: int = routing.ROUTER_METRICS_PORT,
                events_port: int = routing.KV_EVENTS_PORT) -> list[str]:
    """vllm-router's arguments for these worker pods (no secret among them)."""
    urls = [worker_url(ip) for ip in ips]
    args = [R.FLAG_HOST, "0.0.0.0", R.FLAG_PORT, str(port), R.FLAG_POLICY, R.POLICY_KV_AWARE,
            *R.KV_AWARE_SETTINGS, R.FLAG_WORKER_URLS, *urls]
    for ip, url in zip(ips, urls):
        args += [R.FLAG_KV_EVENT_SOURCE, f"{url}=tcp://{_host(ip)}:{events_port}"]
    args += [R.FLAG_KV_EVENT_BLOCK_SIZE, str(block_size), R.FLAG_KV_EVENT_MODEL, model,
             R.FLAG_PROMETHEUS_HOST, "0.0.0.0", R.FLAG_PROMETHEUS_PORT, str(metrics_port)]
    if host_tier_credit is not None:
        args += [R.FLAG_KV_PENALTY_HOST, f"{host_tier_credit:g}"]
    return args


def launch_router(args: Sequence[str], api_key: str | None, python: str = sys.executable) -> subprocess.Popen:
    """vllm-router in a child Python (the package's own launcher) that reads its arguments and the key from
    stdin: `ps` shows `-m spillway.commands.router_child` and nothing else."""
    proc = subprocess.Popen([python, "-m", "spillway.commands.router_child"], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"args": list(args), "api_key": api_key}).encode())
    proc.stdin.close()
    return proc


class RouterWorkers:
    """The running router's worker API on this pod."""

    def __init__(self, port: int = routing.ROUTER_PORT) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def _post(self, path: str, url: str) -> None:
        query = urllib.parse.urlencode({"url": url})
        request = urllib.request.Request(f"{self.base}{path}?{query}", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=ADMIN_TIMEOUT_S) as response:
            response.read()

    def add(self, url: str) -> None:
        self._post(R.ROUTER_ADD_WORKER_PATH, url)

    def remove(self, url: str) -> None:
        self._post(R.ROUTER_REMOVE_WORKER_PATH, url)


class Supervisor:
    """Keeps one vllm-router process running for the current set of ready pods, changing its workers in
    place."""

    def __init__(self, discover: Callable[[], list[str]], launch: Callable[[list[str]], subprocess.Popen],
                 workers=None, poll_s: float = POLL_SECONDS, log=print, url: Callable[[str], str] = worker_url) -> None:
        self.discover, self.launch, self.workers, self.poll_s, self.log = discover, launch, workers, poll_s, log
        self.url = url
        self.ips: list[str] | None = None
        self.proc: subprocess.Popen | None = None
        self.stopped = threading.Event()

    def step(self) -> None:
        try:
            ips = self.discover()
        except OSError as exc:  # the resolver's trouble: keep the router we have, retry
            self.log(f"spillway route: cannot resolve the replicas ({exc}); keeping the current router")
            return
        exited = self.proc is not None and self.proc.poll() is not None
        if ips == self.ips and not exited:
            return
        if exited:
            self.log(f"spillway route: vllm-router exited with {self.proc.returncode}; starting it again")
        elif self.proc is not None and ips and self._change_in_place(ips):
            return
        self.stop_router()
        self.ips = ips
        if not ips:
            self.log("spillway route: no ready vLLM pod; no router until one is ready")
            return
        self.log(f"spillway route: routing over {len(ips)} ready pods: {', '.join(ips)}")
        self.proc = self.launch(ips)

    def _change_in_place(self, ips: list[str]) -> bool:
        """Add and remove workers through the router's API; False (restart it) when that API fails."""
        if self.workers is None or self.ips is None:
            return False
        old, new = set(self.ips), set(ips)
        try:
            for ip in sorted(old - new):
                self.workers.remove(self.url(ip))
            for ip in sorted(new - old):
                self.workers.add(self.url(ip))
        except (OSError, urllib.error.URLError) as exc:
            self.log(f"spillway route: the router's worker API failed ({exc}); starting it again")
            return False
        self.log(f"spillway route: now routing over {len(ips)} ready pods (added {sorted(new - old)}, "
                 f"removed {sorted(old - new)}; the router kept its index)")
        self.ips = ips
        return True

    def stop_router(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.step()
            self.stopped.wait(self.poll_s)
        self.stop_router()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("route", help="run vllm-router (kv_aware) over a ModelServer's ready vLLM pods "
                                            "(the kv-aware router pod's entry point)")
    p.add_argument("--replicas", required=True, help="DNS name of the replicas' headless Service")
    p.add_argument("--model", required=True, help="the served model name (the router's KV event model)")
    p.add_argument("--block-size", type=int, required=True, help="the pods' --block-size")
    p.add_argument("--host-tier-credit", type=float, help="vllm-router --kv-penalty-host (default: the router's)")
    p.add_argument("--api-key-file", type=Path,
                   help=f"a file holding the workers' API key (default: ${api.ENV_API_KEY}, if set)")
    p.add_argument("--poll-seconds", type=float, default=POLL_SECONDS)
    p.set_defaults(func=cmd_route)


def read_api_key(path: Path | None) -> str | None:
    """The key from the file when one is named, else from the environment; None when neither has one."""
    if path is not None:
        try:
            key = path.read_text().strip()
        except OSError as exc:
            raise SystemExit(f"spillway route: cannot read --api-key-file {path}: {exc.strerror}") from None
        if not key:
            raise SystemExit(f"spillway route: --api-key-file {path} is empty")
        return key
    return os.environ.get(api.ENV_API_KEY) or None


DNS_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?$")
MAX_DNS_NAME = 253


def check_dns_name(value: str, flag: str) -> str:
    """A name the resolver can look up (RFC 1123: labels of 1 to 63 characters, 253 in all), else InvalidSpec."""
    name = value.rstrip(".")
    if not name or len(name) > MAX_DNS_NAME or not all(DNS_LABEL.match(label) for label in name.split(".")):
        raise InvalidSpec(f"{flag} {value[:80]!r}{'...' if len(value) > 80 else ''} is not a DNS name (labels of "
                          f"letters, digits and '-' up to 63 characters, {MAX_DNS_NAME} in all)")
    return value


def cmd_route(args: argparse.Namespace) -> int:
    check_dns_name(args.replicas, "--replicas")
    api_key = read_api_key(args.api_key_file)  # the workers' bearer token (spec.apiKeySecretRef)
    supervisor = Supervisor(lambda: resolve_ips(args.replicas),
                            lambda ips: launch_router(router_args(ips, model=args.model, block_size=args.block_size,
                                                                  host_tier_credit=args.host_tier_credit), api_key),
                            workers=RouterWorkers(), poll_s=args.poll_seconds,
                            log=lambda m: print(m, file=sys.stderr, flush=True))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: supervisor.stopped.set())
    supervisor.run()
    return 0
