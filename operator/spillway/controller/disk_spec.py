"""spec.offload.disk: the node-disk tier under the CPU pool, read from a ModelServer into a DiskTierRequest.

    disk:
      enabled: false                  # default
      size: auto | "0.5" | 500Gi      # default auto
      volume:                         # one of; default emptyDir: {}
        emptyDir: {}                                  # the node's ephemeral storage
        ephemeral: {storageClassName, capacity}       # a generic ephemeral volume per pod
        hostPath: {path, capacity}                    # a node directory the administrator names
        persistentVolumeClaim: {claimName, capacity}  # a claim all replicas share
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import disk_tier as dt
from ..core.errors import InvalidSpec

WHERE = "spec.offload.disk"
DISK_FIELDS = frozenset({"enabled", "size", "volume"})
VOLUME_FIELDS = {
    dt.EMPTY_DIR: frozenset(),
    dt.EPHEMERAL: frozenset({"storageClassName", "capacity"}),
    dt.HOST_PATH: frozenset({"path", "capacity"}),
    dt.PVC: frozenset({"claimName", "capacity"}),
}
EPHEMERAL_STORAGE = "ephemeral-storage"


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{where} must be an object, got {type(value).__name__} {value!r}")
    return value


def _text(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidSpec(f"{where}.{key} must be a string, got {value!r}")
    return str(value).strip()


def _volume(value: Any) -> dt.DiskVolume:
    where = f"{WHERE}.volume"
    obj = _object(value, where)
    if not obj:
        return dt.DiskVolume()
    if len(obj) != 1 or next(iter(obj)) not in VOLUME_FIELDS:
        raise InvalidSpec(f"{where} takes exactly one of {', '.join(VOLUME_FIELDS)}, got {', '.join(obj) or 'none'}")
    kind, body = next(iter(obj.items()))
    inner = _object(body, f"{where}.{kind}")
    unknown = sorted(set(inner) - VOLUME_FIELDS[kind])
    if unknown:
        raise InvalidSpec(f"{where}.{kind} has unknown field(s) {', '.join(unknown)}")
    at = f"{where}.{kind}"
    return dt.DiskVolume(kind, capacity=_text(inner, "capacity", at), storage_class=_text(inner, "storageClassName", at),
                         host_path=_text(inner, "path", at), claim_name=_text(inner, "claimName", at))


def parse_disk(value: Any, replicas: int, resources: Mapping[str, Mapping[str, Any]]) -> dt.DiskTierRequest:
    """The disk tier a spec asks for (off when absent); InvalidSpec on a malformed field."""
    obj = _object(value, WHERE)
    unknown = sorted(set(obj) - DISK_FIELDS)
    if unknown:
        raise InvalidSpec(f"{WHERE} has unknown field(s) {', '.join(unknown)}; it takes {', '.join(sorted(DISK_FIELDS))}")
    enabled = obj.get("enabled", False)
    if not isinstance(enabled, bool):
        raise InvalidSpec(f"{WHERE}.enabled must be true or false, got {enabled!r}")
    size = obj.get("size", "auto")
    if isinstance(size, bool) or not isinstance(size, (str, int, float)):
        raise InvalidSpec(f"{WHERE}.size must be auto, a fraction like \"0.5\" or a quantity like 500Gi; got {size!r}")
    request = dt.DiskTierRequest(enabled, str(size).strip(), _volume(obj.get("volume")), max(1, replicas))
    if enabled:
        dt.check_volume(request.volume)
        if request.volume.kind == dt.EMPTY_DIR:
            planned = [part for part in ("requests", "limits") if EPHEMERAL_STORAGE in resources.get(part, {})]
            if planned:
                raise InvalidSpec(f"spec.resources.{planned[0]} sets {EPHEMERAL_STORAGE}: with an emptyDir disk tier "
                                  "Spillway plans it (the replica's share of the node's ephemeral storage)")
    return request
