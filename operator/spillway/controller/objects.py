"""What every object the operator renders shares: the vLLM pods' labels and selector, the owner reference, the
applied-hash annotation, and names derived from the ModelServer's that stay valid however long it is.

manifests.py (the vLLM Deployment, Service, ...) and routing_objects.py (what routing adds) both build on
this module and on nothing of each other's.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..core import k8s_names as names

MAX_NAME = 63  # a DNS-1035 label: what a Service's name must be, and the safe bound for every other kind
NAME_HASH_CHARS = 8


def labels(name: str) -> dict[str, str]:
    return {
        names.LABEL_NAME: names.APP_NAME,
        names.LABEL_INSTANCE: name,
        names.LABEL_COMPONENT: names.COMPONENT_VLLM,
        names.LABEL_MANAGED_BY: names.MANAGED_BY,
        names.LABEL_MODELSERVER: name,
    }


def selector(name: str) -> dict[str, str]:
    return {names.LABEL_MODELSERVER: name, names.LABEL_COMPONENT: names.COMPONENT_VLLM}


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any] | None:
    meta = body.get("metadata") or {}
    if not meta.get("uid"):
        return None
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def metadata(body: Mapping[str, Any], name: str | None = None,
             object_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The metadata of an object written for the ModelServer `body`: `name` (the ModelServer's own unless given)
    in its namespace, `object_labels` (the ModelServer's unless given), owned by it once it has a uid."""
    meta = body.get("metadata") or {}
    out: dict[str, Any] = {"name": name or meta["name"], "namespace": meta.get("namespace") or "default",
                           "labels": labels(meta["name"]) if object_labels is None else object_labels}
    owner = owner_reference(body)
    if owner is not None:
        out["ownerReferences"] = [owner]
    return out


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """Stamp the object with a hash of its content (what was applied, for a reader; drift is found by
    comparing the live fields, adapters.kube.holds)."""
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
    obj["metadata"].setdefault("annotations", {})[names.ANNOTATION_APPLIED_HASH] = digest
    return obj


def derived_name(name: str, suffix: str) -> str:
    """`<name>-<suffix>`, or, where that passes 63 characters, the name cut short and a hash of the whole name
    before the suffix: still unique per ModelServer, still a DNS label (the name starts with a letter)."""
    plain = f"{name}-{suffix}"
    if len(plain) <= MAX_NAME:
        return plain
    digest = hashlib.sha256(name.encode()).hexdigest()[:NAME_HASH_CHARS]
    head = name[:MAX_NAME - len(suffix) - NAME_HASH_CHARS - 2].rstrip("-")
    return f"{head}-{digest}-{suffix}"
