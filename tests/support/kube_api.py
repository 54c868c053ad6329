"""An emulated Kubernetes API (kmock) on a real HTTP port, with a kubeconfig that points at it.

kmock runs on its own event loop in a background thread; `call(fn)` runs fn there (kmock is not
thread-safe). Subclasses choose the emulator class (`new_emulator`) and the resources it declares.
"""
from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

import kmock
import kubernetes

VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


class EmulatedApi:
    def __init__(self, tmp: Path, resources: Mapping[str, Mapping[str, Any]], namespace: str | None = None):
        self.kubeconfig = tmp / "kubeconfig"
        self._declare = dict(resources)
        self._namespace = namespace
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.emulator: kmock.KubernetesEmulator | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def new_emulator(self) -> kmock.KubernetesEmulator:
        return kmock.KubernetesEmulator()

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("kmock did not start")
        context = {"cluster": "kmock", "user": "test"}
        if self._namespace:
            context["namespace"] = self._namespace
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "kmock", "context": context}],
        }))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with self.new_emulator() as emulator, kmock.Server(emulator) as server:
            for key, info in self._declare.items():
                emulator.resources[key] = kmock.ResourceInfo(verbs=VERBS, **info)
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn() on the emulator's event loop and return its result."""
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def client(self) -> kubernetes.client.ApiClient:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=config)
        return kubernetes.client.ApiClient(config)
