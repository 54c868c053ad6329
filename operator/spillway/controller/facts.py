"""Facts the planner needs, read from Node objects: GPU nodes -> NodeSummary/NodeFacts, and where a replica may land.

Pure functions over plain dicts (the JSON of Node objects), so the operator, `spillway render`
and the tests share them. A model's geometry comes from adapters.model_config.resolve_geometry.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from ..core import k8s_names as names
from ..core.disk_tier import ANNOTATION_QUALIFIED_DISK_GBPS
from ..core.errors import InvalidSpec, NoEligibleNodes, SpillwayError
from ..core.planner import NodeFacts
from ..core.qualification import qualification_table
from ..core.quantity import format_bytes, parse_bytes, parse_cpu_millis
from .spec import ModelServerSpec

# Taints the node lifecycle controller sets and lifts by itself: a node that is briefly NotReady
# or under pressure stays in the pool (pods tolerate these for a while by default).
LIFECYCLE_TAINT_PREFIX = "node.kubernetes.io/"
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class NodeSummary(NodeFacts):
    """What the eligibility rules read from one Node (its labels and taints) beside what the planner reads (the
    NodeFacts fields, declared once there)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()

    def facts(self) -> NodeFacts:
        """The planner's part alone: hashable, so the planner's memoized steps can key on it."""
        return NodeFacts(**{f.name: getattr(self, f.name) for f in fields(NodeFacts)})


# More GPUs than any one machine holds (NVIDIA's largest single-node systems hold 16): a count above it is a
# device plugin's misreport, and planning for it would split the node's memory that many ways.
MAX_NODE_GPUS = 1024


def _gpu_count(status: Mapping[str, Any]) -> int:
    """The node's GPUs; 0 (the node is not planned for) when unreadable or beyond MAX_NODE_GPUS."""
    for part in ("allocatable", "capacity"):
        value = (status.get(part) or {}).get(names.GPU_RESOURCE)
        if value is not None:
            try:
                count = int(parse_bytes(value, names.GPU_RESOURCE))
            except InvalidSpec:
                return 0
            return count if count <= MAX_NODE_GPUS else 0
    return 0


def _cpu_millis(status: Mapping[str, Any]) -> int | None:
    """Allocatable CPU in millicores; None when absent or unreadable (the plan then keeps vLLM's defaults)."""
    value = (status.get("allocatable") or {}).get("cpu")
    if value is None:
        return None
    try:
        return parse_cpu_millis(value, "node cpu")
    except InvalidSpec:
        return None


def _ephemeral_storage(status: Mapping[str, Any]) -> int | None:
    """Allocatable ephemeral storage in bytes; None when absent or unreadable (an emptyDir disk tier then refuses)."""
    value = (status.get("allocatable") or {}).get("ephemeral-storage")
    if value is None:
        return None
    try:
        return parse_bytes(value, "node ephemeral-storage")
    except InvalidSpec:
        return None


def _hugepages_2mi(status: Mapping[str, Any]) -> int | None:
    """Allocatable 2 MiB huge pages in bytes; None when absent or unreadable (the pool stays on 4 KiB pages)."""
    value = (status.get("allocatable") or {}).get(names.HUGEPAGES_2MI_RESOURCE)
    if value is None:
        return None
    try:
        return parse_bytes(value, f"node {names.HUGEPAGES_2MI_RESOURCE}")
    except InvalidSpec:
        return None


def _positive(value: Any) -> float | None:
    try:
        number = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and math.isfinite(number) and number > 0 else None


def summarize_node(node: Mapping[str, Any]) -> NodeSummary | None:
    """A Node's summary, or None when it has no GPUs or no readable allocatable memory."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    gpus = _gpu_count(status)
    memory = (status.get("allocatable") or {}).get("memory") or (status.get("capacity") or {}).get("memory")
    if gpus < 1 or memory is None:
        return None
    try:
        memory_bytes = parse_bytes(memory, "node memory")
    except InvalidSpec:
        return None
    dma = (meta.get("annotations") or {}).get(names.ANNOTATION_QUALIFIED_DMA_GBPS)
    try:
        dma_gbps = float(dma) if dma is not None else None
    except ValueError:
        dma_gbps = None
    if dma_gbps is not None and not (math.isfinite(dma_gbps) and dma_gbps > 0):
        dma_gbps = None  # "nan", "inf" or "-1" measure nothing (and NaN is no JSON for the status)
    taints = tuple(t for t in ((node.get("spec") or {}).get("taints") or []) if isinstance(t, Mapping))
    table = qualification_table((meta.get("annotations") or {}).get(names.ANNOTATION_QUALIFICATION))
    return NodeSummary(allocatable_memory=memory_bytes, gpus=gpus, name=str(meta.get("name", "node")),
                       dma_gbps=dma_gbps, dma_table=table, cpu_millis=_cpu_millis(status),
                       ephemeral_storage=_ephemeral_storage(status),
                       disk_read_gbps=_positive((meta.get("annotations") or {}).get(ANNOTATION_QUALIFIED_DISK_GBPS)),
                       hugepages_2mi=_hugepages_2mi(status), labels=dict(meta.get("labels") or {}), taints=taints)


def synthetic_node(memory: str, gpus: int, name: str = "described-node", labels: Mapping[str, str] | None = None,
                   cpu: str | None = None, ephemeral_storage: str | None = None,
                   hugepages_2mi: str | None = None) -> dict:
    """A Node object with the given allocatable memory, GPUs, CPU, ephemeral storage and hugepages-2Mi, if given
    (`spillway render`)."""
    allocatable = {"memory": memory, names.GPU_RESOURCE: str(gpus), **({"cpu": cpu} if cpu is not None else {}),
                   **({"ephemeral-storage": ephemeral_storage} if ephemeral_storage is not None else {}),
                   **({names.HUGEPAGES_2MI_RESOURCE: hugepages_2mi} if hugepages_2mi is not None else {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable}}


# -- scheduling rules (the subset that decides where a replica may land) -------------------------------

def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator", "Equal") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def tolerated(node: NodeSummary, tolerations: Iterable[Mapping[str, Any]]) -> bool:
    tolerations = list(tolerations)
    for taint in node.taints:
        if taint.get("effect") not in SCHEDULING_EFFECTS:
            continue
        if str(taint.get("key", "")).startswith(LIFECYCLE_TAINT_PREFIX):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _expression_matches(expr: Mapping[str, Any], values_of: Callable[[str], str | None]) -> bool:
    value = values_of(str(expr.get("key", "")))
    operator = expr.get("operator")
    wanted = [str(v) for v in (expr.get("values") or [])]
    if operator == "In":
        return value is not None and value in wanted
    if operator == "NotIn":
        return value is None or value not in wanted
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        try:
            number, bound = int(value or ""), int(wanted[0])
        except (ValueError, IndexError):
            return False
        return number > bound if operator == "Gt" else number < bound
    raise InvalidSpec(f"spec.affinity: node selector operator {operator!r} is not one of In, NotIn, Exists, "
                      "DoesNotExist, Gt, Lt")


def affinity_allows(node: NodeSummary, affinity: Mapping[str, Any] | None) -> bool:
    required = (((affinity or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    for term in terms:
        labels_ok = all(_expression_matches(e, node.labels.get) for e in term.get("matchExpressions") or [])
        fields = {"metadata.name": node.name}
        fields_ok = all(_expression_matches(e, fields.get) for e in term.get("matchFields") or [])
        if labels_ok and fields_ok and (term.get("matchExpressions") or term.get("matchFields")):
            return True
    return False


def eligible_nodes(nodes: Iterable[NodeSummary], spec: ModelServerSpec) -> list[NodeSummary]:
    """GPU nodes a replica of `spec` may be scheduled on, sorted by name; NoEligibleNodes when none."""
    gpu_nodes = list(nodes)
    selected = [n for n in gpu_nodes if all(n.labels.get(k) == v for k, v in spec.node_selector.items())]
    allowed = [n for n in selected if tolerated(n, spec.tolerations) and affinity_allows(n, spec.affinity)]
    tp = spec.request.tensor_parallel_size
    big_enough = [n for n in allowed if n.gpus >= tp]
    if big_enough:
        return sorted(big_enough, key=lambda n: n.name)
    if not gpu_nodes:
        why = f"no node has {names.GPU_RESOURCE} capacity"
    elif not selected:
        why = (f"none of the {len(gpu_nodes)} GPU nodes matches nodeSelector "
               f"{json.dumps(dict(spec.node_selector), sort_keys=True)}")
    elif not allowed:
        why = (f"{len(selected)} GPU nodes match nodeSelector but none is allowed by the tolerations and "
               "node affinity (untolerated NoSchedule/NoExecute taints or required affinity)")
    else:
        most = max(n.gpus for n in allowed)
        why = (f"tensorParallelSize {tp} needs {tp} GPUs on one node; the {len(allowed)} eligible nodes "
               f"have at most {most}")
    raise NoEligibleNodes(why)


def nodes_fingerprint(nodes: Iterable[NodeSummary]) -> str:
    """A short hash of the facts planning reads: it changes exactly when a re-plan could change."""
    facts = sorted((n.name, n.allocatable_memory, n.gpus, n.dma_gbps, n.dma_table, n.cpu_millis)
                   + ((n.ephemeral_storage, n.disk_read_gbps) if n.ephemeral_storage or n.disk_read_gbps else ())
                   + ((n.hugepages_2mi,) if n.hugepages_2mi is not None else ())
                   for n in nodes)
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Eligibility:
    """The nodes a spec may use, found once per reconcile, or why there are none."""

    nodes: tuple[NodeSummary, ...] = ()
    error: SpillwayError | None = None

    def require(self) -> tuple[NodeSummary, ...]:
        if self.error is not None:
            raise self.error
        return self.nodes

    @cached_property
    def fingerprint(self) -> str | None:
        """nodes_fingerprint of the eligible nodes ([] when none); None when the rules themselves are bad."""
        if self.error is None:
            return nodes_fingerprint(self.nodes)
        return nodes_fingerprint([]) if isinstance(self.error, NoEligibleNodes) else None


def eligibility(nodes: Iterable[NodeSummary], spec: ModelServerSpec) -> Eligibility:
    try:
        return Eligibility(tuple(eligible_nodes(nodes, spec)))
    except SpillwayError as exc:
        return Eligibility(error=exc)


def scheduling_key(spec: ModelServerSpec) -> str:
    """What of a spec decides its eligible nodes: specs with one key have one eligibility on the same nodes."""
    return json.dumps([spec.node_selector, spec.tolerations, spec.affinity, spec.request.tensor_parallel_size],
                      sort_keys=True, default=str)


class NodeView:
    """The GPU nodes at one moment, each distinct set of scheduling rules worked out once: a fleet's
    ModelServers mostly share a few node pools, so a node event costs one eligibility per pool, not one per
    ModelServer."""

    def __init__(self, nodes: Iterable[NodeSummary]):
        self.nodes = tuple(nodes)
        self._found: dict[str, Eligibility] = {}

    def eligibility(self, spec: ModelServerSpec) -> Eligibility:
        key = scheduling_key(spec)
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = eligibility(self.nodes, spec)
        return found


def describe(node: NodeSummary) -> str:
    return f"{node.name} ({format_bytes(node.allocatable_memory)} allocatable, {node.gpus} GPUs)"
