"""A small JSON client over the official Kubernetes client: raw paths in, dicts out.

`apply()` is idempotent: an object whose live fields already hold what is applied is not written;
otherwise it is server-side applied (field manager spillway-operator, forced). A server that
answers 404 to an apply of a missing object (API emulators) gets a create instead.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import kubernetes

from ..core import k8s_names as names
from ..core.errors import InvalidSpec
from ..core.quantity import parse_bytes

PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    names.PODMONITOR_KIND: names.PODMONITOR_PLURAL,
    names.KIND: names.PLURAL,
    "ConfigMap": "configmaps",
    "Secret": "secrets",
}
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
DISCOVERY_TTL_SECONDS = 60.0


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str):
        self.status = status
        detail = body
        try:
            detail = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            pass
        super().__init__(f"{method} {path}: {status} {detail}"[:2000])


def path(api_version: str, kind_or_plural: str, namespace: str | None = None, name: str | None = None,
         subresource: str | None = None) -> str:
    plural = PLURALS.get(kind_or_plural, kind_or_plural)
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base] + (["namespaces", namespace] if namespace else []) + [plural]
    parts += [name] if name else []
    parts += [subresource] if subresource else []
    return "/".join(parts)


def holds(live: Any, wanted: Any) -> bool:
    """Whether the live object carries every field of `wanted` with its value (fields the API server adds,
    such as defaults and status, do not count; quantities compare by value: the server canonicalises them)."""
    if isinstance(wanted, Mapping):
        return isinstance(live, Mapping) and all(k in live and holds(live[k], v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(live, list) and len(live) == len(wanted) and all(map(holds, live, wanted))
    if isinstance(wanted, str) and isinstance(live, str) and live != wanted:
        try:
            return parse_bytes(live) == parse_bytes(wanted)
        except InvalidSpec:
            return False
    return live == wanted


def object_path(obj: Mapping[str, Any], with_name: bool = True) -> str:
    meta = obj["metadata"]
    return path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"] if with_name else None)


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient | None = None, timeout: float = 30.0):
        self.client = api_client or kubernetes.client.ApiClient()
        self.timeout = timeout
        self._discovery: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def request(self, method: str, url_path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
                content_type: str | None = None) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        method_, url, headers, body_, post = self.client.param_serialize(
            method=method, resource_path=url_path, query_params=query or [], header_params=headers, body=body,
            auth_settings=["BearerToken"])
        response = self.client.call_api(method_, url, headers, body_, post, _request_timeout=self.timeout)
        data = response.read()
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        if response.status >= 400:
            raise ApiError(response.status, method, url_path, text)
        return json.loads(text) if text.strip() else {}

    def get(self, url_path: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", url_path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def merge_patch(self, url_path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", url_path, body=patch, content_type=MERGE_PATCH)

    def apply(self, obj: Mapping[str, Any]) -> str:
        """'created', 'updated' or 'unchanged'. A live object that already holds every field of `obj` is left
        alone; any other (a hand edit of a planned field included) is server-side applied again, so the
        plan wins on the next reconcile. `obj` must be this owner's (see conflict())."""
        url = object_path(obj)
        existing = self.get(url)
        if existing is not None and holds(existing, obj):
            return "unchanged"
        query = [("fieldManager", names.FIELD_MANAGER), ("force", "true")]
        try:
            self.request("PATCH", url, body=obj, query=query, content_type=APPLY_PATCH)
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.request("POST", object_path(obj, with_name=False), body=obj)
        return "created" if existing is None else "updated"

    def conflict(self, obj: Mapping[str, Any]) -> str | None:
        """Why `obj` may not be written: an object of its name exists that its owner does not control."""
        existing = self.get(object_path(obj))
        if existing is None:
            return None
        wanted = {ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or []}
        controllers = [ref for ref in (existing.get("metadata") or {}).get("ownerReferences") or []
                       if isinstance(ref, Mapping) and ref.get("controller")]
        if any(ref.get("uid") in wanted for ref in controllers):
            return None
        owner = (f"controlled by {controllers[0].get('kind')} {controllers[0].get('name')}" if controllers
                 else "not created by the operator")
        return f"{obj['kind']} {obj['metadata']['name']} exists and is {owner}; rename one of them"

    def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server serves group/version/plural (cached for a minute)."""
        key = f"{group}/{version}/{plural}"
        with self._lock:
            cached = self._discovery.get(key)
            if cached is not None and time.monotonic() - cached[0] < DISCOVERY_TTL_SECONDS:
                return cached[1]
        found = self.get(f"/apis/{group}/{version}")
        served = bool(found) and any(r.get("name") == plural for r in found.get("resources") or [])
        with self._lock:
            self._discovery[key] = (time.monotonic(), served)
        return served
