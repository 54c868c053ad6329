"""Structural checks of the parts of a ModelServer spec the operator copies into the pod (affinity,
tolerations) and of the field names themselves.

The CRD's schema describes them, so the API server refuses most bad shapes; objects written before a
schema change, `spillway render` and emulated servers get the same answers here, as InvalidSpec naming
the field, instead of an AttributeError deep in the eligibility rules.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..core import k8s_names as names
from ..core.errors import InvalidSpec

NODE_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
# Every field of ModelServer.spec (charts/spillway/crds/modelservers.spillway.dev.yaml; a test keeps them equal).
SPEC_FIELDS = frozenset({
    "model", "revision", "servedModelName", "modelConfig", "hfTokenSecretRef", "tensorParallelSize", "replicas",
    "replicasPerNode", "blockSize", "kvCacheDtype", "image", "vllmVersion", "imagePullPolicy", "imagePullSecrets",
    "resources", "nodeSelector", "tolerations", "affinity", "extraArgs", "env", "offload", "apiKeySecretRef",
    "networkPolicy", "routing", "autoscaling", "compileCache",
})
OFFLOAD_FIELDS = frozenset({"enabled", "size", "evictionPolicy", "layout", "blockSize", "connector", "disk"})


# What the API server requires of a ConfigMap's, Secret's or claim's name (IsDNS1123Subdomain: 253 characters at
# most, no bound per label); the CRD's pattern is this one (a test keeps them equal).
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN)


def object_name(value: str, where: str, kind: str) -> str:
    """A name the operator puts into an API path (GET .../namespaces/<ns>/<kind>/<name>) or a pod names for the
    kubelet: a DNS-1123 subdomain, as the API server requires of every ConfigMap, Secret and claim. Checked here,
    not only by the CRD's pattern: `../../victim/configmaps/private` would otherwise walk the path out of the
    ModelServer's namespace, and a 10 KB name makes a URL the API server refuses for ever."""
    # fullmatch: a pattern's `$` also matches before a final newline
    if not 0 < len(value) <= names.DNS_SUBDOMAIN_MAX or not _SUBDOMAIN.fullmatch(value):
        shown = f"{value[:80]!r}{'...' if len(value) > 80 else ''}"
        raise InvalidSpec(f"{where} {shown} is not the name of a {kind}: a name is 1 to {names.DNS_SUBDOMAIN_MAX} "
                          "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit")
    return value


# Kubernetes expands $(VAR) in a container's args from its env (a literal one is written $$(VAR)); vLLM's argv
# is parsed by C code (the kernel's execve) that ends each word at a NUL.
ARGV_FORBIDDEN = {"\x00": "a NUL byte, which ends the word where the kernel passes it to vLLM",
                  "$(": "'$(', which Kubernetes expands from the container's environment (the token, the API key)"}


def argv_text(value: str, where: str) -> str:
    """A value the pod's command line carries as written: it may hold no NUL and no $(VAR) reference."""
    for needle, why in ARGV_FORBIDDEN.items():
        if needle in value:
            shown = f"{value[:80]!r}{'...' if len(value) > 80 else ''}"
            raise InvalidSpec(f"{where} {shown} holds {why}")
    return value


def known_fields(obj: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    """An API server prunes unknown fields, so a typo would silently mean the default: refuse it."""
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise InvalidSpec(f"{where} has unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{where} must be an object, got {type(value).__name__} {value!r}"[:300])
    return value


def _objects(value: Any, where: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidSpec(f"{where} must be a list, got {type(value).__name__} {value!r}"[:300])
    return [_object(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _requirement(expr: Mapping[str, Any], where: str) -> None:
    if not isinstance(expr.get("key"), str) or not expr["key"]:
        raise InvalidSpec(f"{where}.key must be a label key, got {expr.get('key')!r}")
    operator = expr.get("operator")
    if operator not in NODE_SELECTOR_OPERATORS:
        raise InvalidSpec(f"{where}.operator must be one of {', '.join(NODE_SELECTOR_OPERATORS)}, got {operator!r}")
    values = expr.get("values")
    if values is not None and (not isinstance(values, list) or not all(isinstance(v, str) for v in values)):
        raise InvalidSpec(f"{where}.values must be a list of strings, got {values!r}"[:300])


def _term(term: Mapping[str, Any], where: str) -> None:
    for part in ("matchExpressions", "matchFields"):
        for i, expr in enumerate(_objects(term.get(part), f"{where}.{part}")):
            _requirement(expr, f"{where}.{part}[{i}]")


def check_affinity(value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    affinity = _object(value, "spec.affinity")
    node = affinity.get("nodeAffinity")
    if node is not None:
        node = _object(node, "spec.affinity.nodeAffinity")
        where = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
        if required is not None:
            for i, term in enumerate(_objects(_object(required, where).get("nodeSelectorTerms"),
                                              f"{where}.nodeSelectorTerms")):
                _term(term, f"{where}.nodeSelectorTerms[{i}]")
        where = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
        for i, preferred in enumerate(_objects(node.get("preferredDuringSchedulingIgnoredDuringExecution"), where)):
            weight = preferred.get("weight")
            if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
                raise InvalidSpec(f"{where}[{i}].weight must be an integer 1..100, got {weight!r}")
            _term(_object(preferred.get("preference"), f"{where}[{i}].preference"), f"{where}[{i}].preference")
    for part in ("podAffinity", "podAntiAffinity"):
        if affinity.get(part) is not None:
            _object(affinity[part], f"spec.affinity.{part}")
    return affinity


def check_tolerations(value: Any) -> tuple[Mapping[str, Any], ...]:
    out = []
    for i, toleration in enumerate(_objects(value, "spec.tolerations")):
        where = f"spec.tolerations[{i}]"
        if toleration.get("operator", "Equal") not in TOLERATION_OPERATORS:
            raise InvalidSpec(f"{where}.operator must be Equal or Exists, got {toleration.get('operator')!r}")
        if toleration.get("effect", "") not in TAINT_EFFECTS:
            raise InvalidSpec(f"{where}.effect must be one of NoSchedule, PreferNoSchedule, NoExecute, "
                              f"got {toleration.get('effect')!r}")
        for key in ("key", "value"):
            if toleration.get(key) is not None and not isinstance(toleration[key], str):
                raise InvalidSpec(f"{where}.{key} must be a string, got {toleration[key]!r}")
        seconds = toleration.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            raise InvalidSpec(f"{where}.tolerationSeconds must be an integer, got {seconds!r}")
        out.append(toleration)
    return tuple(out)


MAX_VALUES = 100_000  # a ModelServer, its config.json or a node list holds a few thousand at most
MAX_INTEGER = 2**63  # beyond what any Kubernetes or config.json field holds (and past it, str() may refuse)


def check_document(value: Any, where: str, limit: int = MAX_VALUES) -> None:
    """A parsed YAML/JSON document of bounded size whose integers fit 64 bits. YAML aliases share objects,
    so a small file can stand for billions of values (a "YAML bomb"): the walk counts every visit and stops
    at `limit`, in milliseconds, before anything else walks it for ever."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > limit:
            raise InvalidSpec(f"{where}: more than {limit:,} values (YAML aliases expand to that many?)")
        if isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, int) and not isinstance(item, bool) and not -MAX_INTEGER <= item < MAX_INTEGER:
            raise InvalidSpec(f"{where}: an integer of {item.bit_length()} bits; no field takes more than 64")
