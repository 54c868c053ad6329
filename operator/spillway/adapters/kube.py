"""The one way Spillway talks to Kubernetes (the operator and `spillway loadtest job`): raw paths in, dicts out.

A small JSON client over the official client's ApiClient (its auth, TLS and kubeconfig handling);
`load_config()` is the one kubeconfig/in-cluster loading. The qualification pod alone keeps its own
stdlib patch of its Node (qualify/node.py): its image carries no Kubernetes client.

`apply()` is idempotent: an object whose live fields already hold what is applied is not written;
otherwise it is server-side applied (field manager spillway-operator, forced). A server that
answers 404 to an apply of a missing object (API emulators) gets a create instead.
"""
from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import kubernetes

from ..core import k8s_names as names
from ..core.errors import InvalidSpec
from ..core.quantity import parse_bytes

PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "NetworkPolicy": "networkpolicies",
    names.PODMONITOR_KIND: names.PODMONITOR_PLURAL,
    names.KIND: names.PLURAL,
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Pod": "pods",
    "ServiceAccount": "serviceaccounts",
    "RoleBinding": "rolebindings",
    names.INFERENCEPOOL_KIND: names.INFERENCEPOOL_PLURAL,
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",  # spec.autoscaling
    "ScaledObject": "scaledobjects",  # spec.autoscaling, provider keda (KEDA's keda.sh/v1alpha1)
    "Job": "jobs",
}
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
DISCOVERY_TTL_SECONDS = 60.0


def load_config(context: str | None = None) -> None:
    """Configure the official client: a kubeconfig when one is named ($KUBECONFIG or a context), else in a pod
    its service account, else ~/.kube/config. InvalidSpec when there is none."""
    try:
        in_pod = os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG")
        if context is None and in_pod:
            kubernetes.config.load_incluster_config()
        else:
            kubernetes.config.load_kube_config(os.environ.get("KUBECONFIG"), context=context)
    except (kubernetes.config.ConfigException, OSError, TypeError) as exc:
        raise InvalidSpec(f"no Kubernetes configuration: {exc}") from None


def kubeconfig_namespace(context: str | None = None) -> str | None:
    """The namespace of the kubeconfig's current (or named) context; None without a kubeconfig."""
    try:
        contexts, active = kubernetes.config.list_kube_config_contexts(os.environ.get("KUBECONFIG"))
    except (kubernetes.config.ConfigException, OSError, TypeError):
        return None
    if context:
        active = next((c for c in contexts if c["name"] == context), active)
    return (active or {}).get("context", {}).get("namespace")


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str):
        self.status = status
        detail = body
        try:
            detail = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            pass
        super().__init__(f"{method} {path}: {status} {detail}"[:2000])


def segment(value: str) -> str:
    """One path segment, percent-encoded whole: a '/' or '?' in a name stays in its segment. A segment of dots
    alone would be resolved by the HTTP client (RFC 3986 removes dot segments: `x/../victim` is `victim`), so
    it is refused; no Kubernetes object is named '.' or '..'."""
    if value in ("", ".", ".."):
        raise InvalidSpec(f"{value!r} cannot name a Kubernetes object (an API path segment)")
    return urllib.parse.quote(value, safe="")


def path(api_version: str, kind_or_plural: str, namespace: str | None = None, name: str | None = None,
         subresource: str | None = None) -> str:
    """The API path of a kind (its collection) or of one object; every caller-given segment quoted."""
    plural = PLURALS.get(kind_or_plural, kind_or_plural)
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base] + (["namespaces", segment(namespace)] if namespace else []) + [segment(plural)]
    parts += [segment(name)] if name else []
    parts += [segment(subresource)] if subresource else []
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


def _controllers(existing: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [ref for ref in (existing.get("metadata") or {}).get("ownerReferences") or []
            if isinstance(ref, Mapping) and ref.get("controller")]


def controlled_by(existing: Mapping[str, Any], owner_uids: set[Any]) -> bool:
    """Whether the live object's controller owner reference is one of `owner_uids` (a uid, never a name: a
    ModelServer deleted and created again under its name is another owner)."""
    return any(ref.get("uid") in owner_uids for ref in _controllers(existing) if ref.get("uid"))


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient | None = None, timeout: float = 30.0):
        self.client = api_client or kubernetes.client.ApiClient()
        self.timeout = timeout
        self._discovery: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def _call(self, method: str, url_path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
              content_type: str | None = None, timeout: float | None = None) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        method_, url, headers, body_, post = self.client.param_serialize(
            method=method, resource_path=url_path, query_params=query or [], header_params=headers, body=body,
            auth_settings=["BearerToken"])
        response = self.client.call_api(method_, url, headers, body_, post, _request_timeout=timeout)
        if response.status >= 400:
            data = response.read()
            raise ApiError(response.status, method, url_path, data.decode(errors="replace") if data else "")
        return response

    def request(self, method: str, url_path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
                content_type: str | None = None) -> dict[str, Any]:
        data = self._call(method, url_path, body, query, content_type, self.timeout).read()
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        return json.loads(text) if text.strip() else {}

    def stream_lines(self, url_path: str, query: list[tuple[str, str]] | None = None) -> Iterator[str]:
        """GET a streaming endpoint (a followed pod log) line by line, without a read timeout."""
        response = self._call("GET", url_path, query=query).response
        buffer = b""
        for chunk in response.stream(amt=65536, decode_content=True):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                yield line.decode(errors="replace")
        if buffer:
            yield buffer.decode(errors="replace")

    def get(self, url_path: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", url_path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def merge_patch(self, url_path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", url_path, body=patch, content_type=MERGE_PATCH)

    def apply(self, obj: Mapping[str, Any], existing: Any = ...) -> str:
        """'created', 'updated' or 'unchanged'. A live object that already holds every field of `obj` is left
        alone; any other (a hand edit of a planned field included) is server-side applied again, so the
        plan wins on the next reconcile. `obj` must be this owner's (see conflict()). `existing`: the live
        object, when the caller has just read it (None: absent)."""
        return self.apply_live(obj, existing)[0]

    def apply_live(self, obj: Mapping[str, Any], existing: Any = ...) -> tuple[str, dict[str, Any] | None]:
        """apply(), and the live object after it (as the API server answered the write)."""
        url = object_path(obj)
        if existing is ...:
            existing = self.get(url)
        if existing is not None and holds(existing, obj):
            return "unchanged", existing
        query = [("fieldManager", names.FIELD_MANAGER), ("force", "true")]
        try:
            live = self.request("PATCH", url, body=obj, query=query, content_type=APPLY_PATCH)
        except ApiError as exc:
            if exc.status != 404:
                raise
            live = self.request("POST", object_path(obj, with_name=False), body=obj)
        return ("created" if existing is None else "updated"), live or None

    def conflict(self, obj: Mapping[str, Any]) -> str | None:
        """Why `obj` may not be written: an object of its name exists that its owner does not control."""
        return self.conflict_live(obj)[0]

    def conflict_live(self, obj: Mapping[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
        """conflict(), and the live object it read (None: absent), for apply() to reuse."""
        existing = self.get(object_path(obj))
        if existing is None:
            return None, None
        wanted = {ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or []}
        if controlled_by(existing, wanted):
            return None, existing
        controllers = _controllers(existing)
        owner = (f"controlled by {controllers[0].get('kind')} {controllers[0].get('name')}" if controllers
                 else "not created by the operator")
        return f"{obj['kind']} {obj['metadata']['name']} exists and is {owner}; rename one of them", existing

    def delete_controlled(self, url_path: str, owner_uid: str) -> str:
        """'deleted', 'absent', or 'not controlled' (left alone: a user's object, or another owner's, of that name).
        Background propagation: the garbage collector removes its dependents (a Deployment's ReplicaSets) after."""
        existing = self.get(url_path)
        if existing is None:
            return "absent"
        if not controlled_by(existing, {owner_uid}):
            return "not controlled"
        try:
            self.request("DELETE", url_path, query=[("propagationPolicy", "Background")])
        except ApiError as exc:
            if exc.status != 404:
                raise
            return "absent"
        return "deleted"

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
