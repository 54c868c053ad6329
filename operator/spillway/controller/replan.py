"""Node events -> re-plans, coalesced, in a lane of their own.

A burst of node events (a pool scaling up, every kubelet's status at once) must cost each ModelServer one
re-plan per change of its eligible nodes' facts, and must never wait behind the reconciles of a burst of new
ModelServers (kopf's handler pool is first come, first served). So a node event only hands over a snapshot of
the nodes and the ModelServers (taken in kopf's event loop, where the indexes live); one thread waits for the
burst to settle, works out each distinct set of scheduling rules' eligibility once (facts.NodeView) and
re-plans, on a few threads of its own, the ModelServers whose fingerprint moved since both their status and
the last re-plan it started (the index lags behind the status writes).

Its own threads are not enough: a re-plan is a handful of API requests (7 for a plain ModelServer), and while a
burst of creates runs, each of them queues at the API server behind the requests of every kopf handler thread
(min(32, CPUs + 4) of them): at a 120 burst on 2 cores, 48 other requests were answered during a tenant's 7.
ApiLane gives the re-plans their turn first: while one runs, kopf's handlers keep at most HANDLER_REQUESTS
requests in flight between them (they still progress, never starved); with no re-plan running they are not held.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..adapters.kube import Kube
from .facts import NodeSummary, NodeView
from .spec import ModelServerSpec

SETTLE_SECONDS = 0.3  # events closer than this are one change
MAX_SETTLE_SECONDS = 2.0  # ... but a steady stream of events (kubelet heartbeats) still re-plans this often

REPLAN_THREADS = 4
# kopf handlers' requests in flight while a re-plan runs: a re-plan's request waits behind one, not behind six
# (kopf's pool on 2 cores; 32 on a large node), and the handlers still progress meanwhile.
HANDLER_REQUESTS = 1

Key = tuple[str, str]
# (namespace, name, fingerprint, nodes): re-plan that ModelServer for these nodes
Replan = Callable[[str, str, str, tuple[NodeSummary, ...]], None]


class ApiLane:
    """Who goes first at the API server: the re-plan threads' requests are never held; other threads' requests
    (kopf's handlers) are held to `handler_requests` in flight while any re-plan runs."""

    def __init__(self, handler_requests: int = HANDLER_REQUESTS):
        self._limit = handler_requests
        self._replans = self._in_flight = 0
        self._changed = threading.Condition()
        self._local = threading.local()

    @contextlib.contextmanager
    def replanning(self) -> Iterator[None]:
        """Around one re-plan, on the thread that runs it."""
        self._local.replanning = True
        with self._changed:
            self._replans += 1
        try:
            yield
        finally:
            self._local.replanning = False
            with self._changed:
                self._replans -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Around one API request of any thread."""
        if getattr(self._local, "replanning", False):
            yield
            return
        with self._changed:
            self._changed.wait_for(lambda: self._replans == 0 or self._in_flight < self._limit)
            self._in_flight += 1
        try:
            yield
        finally:
            with self._changed:
                self._in_flight -= 1
                self._changed.notify_all()


class LanedKube(Kube):
    """The operator's API client, each request taking its turn through the lane."""

    def __init__(self, lane: ApiLane):
        super().__init__()
        self.lane = lane

    def request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        with self.lane.request():
            return super().request(*args, **kwargs)


class Replanner:
    def __init__(self, replan: Replan, logger: logging.Logger, settle: float = SETTLE_SECONDS,
                 lane: ApiLane | None = None):
        self._replan, self._logger, self._settle = replan, logger, settle
        self.lane = lane or ApiLane()
        self._latest: tuple[tuple[NodeSummary, ...], dict[Key, Mapping[str, Any]]] | None = None
        self._context = contextvars.copy_context()
        self._pool = ThreadPoolExecutor(REPLAN_THREADS, thread_name_prefix="spillway-replan")
        self._wake = threading.Event()
        self._sent: dict[Key, str] = {}
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def offer(self, nodes: tuple[NodeSummary, ...], modelservers: dict[Key, Mapping[str, Any]]) -> None:
        """The nodes and ModelServers after a node event; the latest offer wins. Called from a kopf handler:
        its context (kopf's event posting) goes with the re-plans."""
        with self._guard:
            self._latest = (nodes, modelservers)
            self._context = contextvars.copy_context()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="spillway-replan", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            deadline = time.monotonic() + MAX_SETTLE_SECONDS
            while self._wake.is_set() and time.monotonic() < deadline:  # a burst's later events replace the snapshot
                self._wake.clear()
                self._wake.wait(self._settle)
            self._wake.clear()
            with self._guard:
                latest, self._latest = self._latest, None
            if latest is not None:
                self.changed(*latest)

    def changed(self, nodes: tuple[NodeSummary, ...], modelservers: dict[Key, Mapping[str, Any]]) -> int:
        """Re-plan every ModelServer whose eligible nodes' fingerprint moved; how many were started."""
        view = NodeView(nodes)
        self._sent = {key: fp for key, fp in self._sent.items() if key in modelservers}
        stamped = 0
        for (namespace, name), entry in modelservers.items():
            try:
                spec = entry["spec"]
                if entry["fingerprint"] is None:
                    continue  # never reconciled yet: its first reconcile reads the nodes as they are then
                fingerprint = view.eligibility(spec).fingerprint if isinstance(spec, ModelServerSpec) else None
                if fingerprint is None or fingerprint in (entry["fingerprint"], entry["trigger"],
                                                          self._sent.get((namespace, name))):
                    continue
                self._logger.info(f"eligible GPU nodes of {namespace}/{name} changed: re-planning")
                self._sent[(namespace, name)] = fingerprint
                self._pool.submit(self._context.copy().run, self._one, namespace, name, fingerprint, nodes)
                stamped += 1
            except Exception as exc:  # noqa: BLE001 - one ModelServer's failure never stops the others' re-plans
                self._logger.error(f"re-plan trigger of {namespace}/{name} failed: {type(exc).__name__}: {exc}")
        return stamped

    def _one(self, namespace: str, name: str, fingerprint: str, nodes: tuple[NodeSummary, ...]) -> None:
        try:
            with self.lane.replanning():
                self._replan(namespace, name, fingerprint, nodes)
        except Exception as exc:  # noqa: BLE001 - the next node change tries again
            self._sent.pop((namespace, name), None)
            self._logger.error(f"re-plan of {namespace}/{name} failed: {type(exc).__name__}: {exc}")
