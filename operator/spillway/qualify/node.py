"""Patch this pod's own Node with the qualification, through the in-cluster API.

The standard library only, on purpose: the qualification runs in the vLLM image, which carries no
Kubernetes client. Everything else that talks to Kubernetes goes through spillway.adapters.kube.
"""
from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from ..core.errors import SpillwayError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MERGE_PATCH = "application/merge-patch+json"


class NodePatchFailed(SpillwayError):
    reason = "NodePatchFailed"


@dataclass(frozen=True)
class ApiServer:
    url: str  # https://host:port
    token: str | None = None
    ca_file: str | None = None

    @classmethod
    def in_cluster(cls, sa_dir: str = SERVICE_ACCOUNT_DIR) -> ApiServer:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise NodePatchFailed("not running in a pod: KUBERNETES_SERVICE_HOST is not set (use --json only)")
        with open(os.path.join(sa_dir, "token")) as f:
            token = f.read().strip()
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", token, os.path.join(sa_dir, "ca.crt"))


def patch_node(name: str, body: dict[str, Any], api: ApiServer, timeout: float = 30.0) -> dict[str, Any]:
    """JSON-merge-patch Node `name`; returns the Node the API server answers with."""
    url = f"{api.url}/api/v1/nodes/{urllib.parse.quote(name, safe='')}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PATCH",
                                     headers={"Content-Type": MERGE_PATCH, "Accept": "application/json"})
    if api.token:
        request.add_header("Authorization", f"Bearer {api.token}")
    context = ssl.create_default_context(cafile=api.ca_file) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise NodePatchFailed(f"patching node {name} failed: HTTP {exc.code} {detail}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise NodePatchFailed(f"patching node {name} failed: {exc}") from exc
