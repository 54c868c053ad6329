"""spec.routing -> RoutingSpec: how requests reach the replicas (checked again here, as the whole spec is)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import routing
from ..core import vllm_api as api
from ..core.errors import InvalidSpec
from ..core.quantity import format_bytes, parse_bytes
from .spec_checks import known_fields

ROUTING_FIELDS = frozenset({"mode", "hostTierCredit", "router", "producer"})
ROUTER_FIELDS = frozenset({"replicas", "image", "resources"})
MAX_ROUTER_REPLICAS = 16


@dataclass(frozen=True)
class RoutingSpec:
    mode: str = routing.MODE_NONE
    host_tier_credit: float | None = None  # None: derived from the plan
    router_replicas: int = 1
    router_image: str | None = None  # None: the operator's default router image
    router_resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    producer: str = routing.PRODUCER_PRECISE  # llm-d: how its index learns where prefixes are

    @property
    def enabled(self) -> bool:
        return self.mode != routing.MODE_NONE

    @property
    def publishes_events(self) -> bool:
        return self.mode in routing.EVENT_MODES and self.producer == routing.PRODUCER_PRECISE


def _resources(value: Any, where: str) -> dict[str, dict[str, str]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{where} must be an object, got {value!r}")
    known_fields(value, frozenset({"requests", "limits"}), where)
    out: dict[str, dict[str, str]] = {}
    for part, quantities in value.items():
        if not isinstance(quantities, Mapping):
            raise InvalidSpec(f"{where}.{part} must be an object, got {quantities!r}")
        for name, quantity in quantities.items():
            if isinstance(quantity, bool) or not isinstance(quantity, (str, int, float)):
                raise InvalidSpec(f"{where}.{part}.{name} must be a quantity, got {quantity!r}")
        out[part] = {k: str(v) for k, v in quantities.items()}
    return out


def parse_routing(spec: Mapping[str, Any]) -> RoutingSpec:
    where = "spec.routing"
    value = spec.get("routing")
    if value is None:
        return RoutingSpec()
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{where} must be an object, got {value!r}")
    known_fields(value, ROUTING_FIELDS, where)
    mode = value.get("mode", routing.MODE_NONE)
    if mode not in routing.MODES:
        raise InvalidSpec(f"{where}.mode must be one of {', '.join(routing.MODES)}; got {mode!r}")
    credit = value.get("hostTierCredit")
    if credit is not None:
        if isinstance(credit, bool) or not isinstance(credit, (int, float)) or not 0 <= credit <= 1:
            raise InvalidSpec(f"{where}.hostTierCredit must be a number in [0, 1], got {credit!r}")
        if mode != routing.MODE_LLM_D:
            raise InvalidSpec(f"{where}.hostTierCredit weighs llm-d's CPU tier; mode is {mode}")
    producer = value.get("producer", routing.PRODUCER_PRECISE)
    if producer not in routing.PRODUCERS:
        raise InvalidSpec(f"{where}.producer must be one of {', '.join(routing.PRODUCERS)}; got {producer!r}")
    if "producer" in value and mode != routing.MODE_LLM_D:
        raise InvalidSpec(f"{where}.producer chooses llm-d's prefix index; mode is {mode}")
    router = value.get("router")
    if router is not None and mode != routing.MODE_KV_AWARE:
        raise InvalidSpec(f"{where}.router configures the kv-aware router; mode is {mode}")
    router = router or {}
    if not isinstance(router, Mapping):
        raise InvalidSpec(f"{where}.router must be an object, got {router!r}")
    known_fields(router, ROUTER_FIELDS, f"{where}.router")
    replicas = router.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_ROUTER_REPLICAS:
        raise InvalidSpec(f"{where}.router.replicas must be a whole number in 1..{MAX_ROUTER_REPLICAS}, "
                          f"got {replicas!r}")
    image = router.get("image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise InvalidSpec(f"{where}.router.image must name an image, got {image!r}")
    resources = _resources(router.get("resources"), f"{where}.router.resources")
    limit = resources.get("limits", {}).get("memory")
    if limit is not None:
        least = routing.ROUTER_BASE_BYTES + routing.ROUTER_BODY_BUDGET_BYTES + routing.ROUTER_MIN_INDEX_BYTES
        if parse_bytes(limit, f"{where}.router.resources.limits.memory") < least:
            raise InvalidSpec(f"{where}.router.resources.limits.memory {limit} is below the router's least "
                              f"{format_bytes(least)} (its process, the request bodies it holds, the smallest "
                              f"record)")
    return RoutingSpec(mode=mode, host_tier_credit=float(credit) if credit is not None else None,
                       router_replicas=replicas, router_image=image, router_resources=resources,
                       producer=producer)


def _events_flag(arg: str, following: str | None) -> tuple[bool, str | None]:
    """(whether arg is --kv-events-config, its value)."""
    name, sep, value = arg.partition("=")
    if name.replace("_", "-") != api.FLAG_KV_EVENTS_CONFIG:
        return False, None
    return True, value if sep else following


def check_events_args(extra_args: tuple[str, ...], mode: str) -> None:
    """Where the mode's router reads KV events the operator writes --kv-events-config; elsewhere, a user's own
    may not take a port the pod already serves on."""
    for i, arg in enumerate(extra_args):
        found, value = _events_flag(arg, extra_args[i + 1] if i + 1 < len(extra_args) else None)
        if not found:
            continue
        if mode in routing.EVENT_MODES:
            raise InvalidSpec(f"spec.extraArgs sets {api.FLAG_KV_EVENTS_CONFIG}, which routing.mode {mode} writes "
                              f"(a ZMQ publisher on port {routing.KV_EVENTS_PORT})")
        try:
            endpoint = str(json.loads(value or "{}").get(api.KV_EVENTS_ENDPOINT_KEY, ""))
        except (ValueError, AttributeError):
            continue  # vLLM reports a malformed value itself, at start
        port = endpoint.rsplit(":", 1)[-1]
        if port == str(api.SERVER_PORT):
            raise InvalidSpec(f"spec.extraArgs: the {api.FLAG_KV_EVENTS_CONFIG} endpoint {endpoint} takes port "
                              f"{api.SERVER_PORT}, the pod's HTTP port")
