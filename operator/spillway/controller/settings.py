"""The operator's settings: the environment the chart gives its pod, read once by the startup handler
(handlers.configure, not when kopf imports the module) and passed down, so that nothing below reads the
environment and `spillway render` depends on its inputs only."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ..core import k8s_names as names
from ..core.disk_tier import check_host_path_prefixes
from ..core.errors import SpillwayError


@dataclass(frozen=True)
class OperatorSettings:
    retry_seconds: float = 30.0  # before retrying API errors and a ModelServer's missing ConfigMap
    # A status nobody's event follows (a hand-written, forged one) is replaced by the next resync's reconcile.
    resync_seconds: float = 300.0
    api_timeout_seconds: float = 30.0  # a request of a slow API server fails after this and is retried
    metrics_port: int | None = None  # the operator's own /metrics; None: not served
    allow_hub_fetch: bool = False  # fetch config.json of a model id the catalog lacks from the hub
    pod_monitors: bool = True  # render PodMonitors when the cluster serves them (False: never)
    router_image: str = names.DEFAULT_ROUTER_IMAGE  # the kv-aware router's image unless spec.routing names one
    disk_host_path_prefixes: tuple[str, ...] = ()  # node directories a hostPath disk tier may use (none)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> OperatorSettings:
        """The settings of these variables (unset or empty: the default); a bad value is one line naming it."""
        def value(name: str) -> str | None:
            return environ.get(name) or None

        retry = value(names.ENV_RETRY_SECONDS)
        resync = value(names.ENV_RESYNC_SECONDS)
        timeout = value(names.ENV_API_TIMEOUT_SECONDS)
        port = value(names.ENV_METRICS_PORT)
        pod_monitors = (value(names.ENV_POD_MONITORS) or "auto").lower()
        if pod_monitors not in ("auto", "false"):
            raise SpillwayError(f"{names.ENV_POD_MONITORS}={pod_monitors!r}: auto or false")
        return cls(
            retry_seconds=_number(names.ENV_RETRY_SECONDS, retry, float) if retry else cls.retry_seconds,
            resync_seconds=_positive(names.ENV_RESYNC_SECONDS, resync) if resync else cls.resync_seconds,
            api_timeout_seconds=(_positive(names.ENV_API_TIMEOUT_SECONDS, timeout) if timeout
                                 else cls.api_timeout_seconds),
            metrics_port=_number(names.ENV_METRICS_PORT, port, int) if port else None,
            allow_hub_fetch=(value(names.ENV_ALLOW_HUB_FETCH) or "").lower() == "true",
            pod_monitors=pod_monitors == "auto",
            router_image=value(names.ENV_ROUTER_IMAGE) or cls.router_image,
            disk_host_path_prefixes=_host_path_prefixes(value(names.ENV_DISK_HOST_PATH_PREFIXES)),
        )


def _host_path_prefixes(text: str | None) -> tuple[str, ...]:
    name = names.ENV_DISK_HOST_PATH_PREFIXES
    if text is None:
        return ()
    try:
        prefixes = json.loads(text)
    except ValueError:
        prefixes = None
    if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
        raise SpillwayError(f"{name}={text!r}: a JSON list of absolute directories, e.g. [\"/mnt/nvme/spillway\"]")
    try:
        return check_host_path_prefixes(prefixes, name)
    except SpillwayError as exc:
        raise SpillwayError(str(exc)) from None


def _number(name: str, text: str, kind: type) -> float | int:
    try:
        number = kind(text)
    except ValueError:
        number = -1
    if number < 0:
        raise SpillwayError(f"{name}={text!r}: a non-negative {'integer' if kind is int else 'number'}")
    return number


def _positive(name: str, text: str) -> float:
    number = _number(name, text, float)
    if not 0 < number < float("inf"):  # also NaN
        raise SpillwayError(f"{name}={text!r}: a number of seconds > 0")
    return number
