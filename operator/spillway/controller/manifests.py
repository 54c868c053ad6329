"""A ModelServer + node facts + model geometry -> the plan and the objects the operator applies.

`desired()` is the one code path shared by the operator (handlers.py) and `spillway render`:
check the spec, find the eligible GPU nodes, plan for the smallest of them with the pure
planner, and render a Deployment, a Service and (optionally) a PodMonitor.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..adapters.model_config import ConfigMapReader, HubFetcher, resolve_geometry
from ..core import disk_tier
from ..core import k8s_names as names
from ..core import vllm_api as api
from ..core.errors import InvalidSpec, PoolDoesNotFit
from ..core.planner import Plan, replica_share_bytes, with_disk, with_engine
from ..core.quantity import format_bytes, to_quantity
from . import autoscaling, disk_objects, hardening, plan_cache
from .facts import Eligibility, NodeSummary, describe, eligibility
from .objects import labels, metadata, selector, with_hash
from .routing_objects import routed
from .spec import ModelServerSpec, parse_spec

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
TERMINATION_GRACE_SECONDS = 60


@dataclass(frozen=True)
class Desired:
    spec: ModelServerSpec
    plan: Plan
    node: NodeSummary  # the node the plan was made for: the smallest eligible one
    eligible: tuple[NodeSummary, ...]
    objects: tuple[dict[str, Any], ...]
    autoscaling: autoscaling.Choice | None = None  # which autoscaler spec.autoscaling got, and why

    def summary(self) -> str:
        """One line for conditions and events."""
        pool, pod = self.plan.pool, self.plan.pod
        assert pod is not None
        offload = (f"offload pool {format_bytes(pool.bytes)} ({pool.tokens:,} tokens) per replica"
                   if pool is not None else "offload disabled")
        others = len(self.eligible) - 1
        where = f"node {describe(self.node)}" + (f", the smallest of {len(self.eligible)} eligible nodes"
                                                 if others else "")
        huge = f", {format_bytes(pod.hugepages_bytes)} of hugepages-2Mi" if pod.hugepages_bytes else ""
        return (f"{offload}, memory limit {format_bytes(pod.memory_limit_bytes)}{huge}, /dev/shm "
                f"{format_bytes(pod.shm_bytes)}; planned for {where}")


def plan_for_nodes(geometry, spec: ModelServerSpec, eligible: Iterable[NodeSummary]) -> tuple[Plan, NodeSummary]:
    """Plan one replica for every eligible node and keep the smallest pod: it fits wherever it lands.

    A node the request does not fit on fails the whole plan (its error names that node's numbers); nodes
    are tried from the smallest replica share up (the planner's own), so the error names the node that
    limits the pool.
    The API servers are the fewest any of the nodes' CPU allows, for the same reason, and the disk tier is the
    smallest node class's under the most doubtful class's verdict (disk_tier.across_classes).
    Nodes of one shape plan alike, so each shape is planned once, for its first node by name (the one the
    smallest-first order and the tie-break by name would pick), through the plan cache.
    """
    request = spec.request
    by_shape: dict[tuple, list[NodeSummary]] = {}
    for node in sorted(eligible, key=lambda n: n.name):
        by_shape.setdefault(plan_cache.shape(node.facts()), []).append(node)
    smallest_first = sorted(by_shape.values(), key=lambda c: (replica_share_bytes(c[0].facts(), request), c[0].name))
    key = plan_cache.geometry_key(geometry)
    plans = [(plan_cache.cached_plan(geometry, key, request, c[0].facts()), c[0]) for c in smallest_first]
    huge = [n.name for p, n in plans if p.pages is not None and p.pages.huge_pages]
    if huge and len(huge) < len(plans):
        # A pool on huge pages asks for hugepages-2Mi, which a node without them cannot give: where not every node
        # class holds it, every class plans it on 4 KiB pages, so the pod still fits wherever it lands.
        plans = [(_on_4k_pages(geometry, key, request, c[0], [n.name for _, n in plans if n.name not in huge])
                  if c[0].name in huge else p, n) for (p, n), c in zip(plans, smallest_first, strict=True)]
    # The fewest huge pages first: where every class holds the pool on them, an auto pool is sized from each class's
    # own share of them, and a pod with less memory but more huge pages would stay pending on the class with fewer.
    chosen, node = min(plans, key=lambda p: (p[0].pod.hugepages_bytes, p[0].pod.memory_limit_bytes, p[1].name))
    if huge and len(huge) < len(plans) and chosen.pages is not None:
        others = [n.name for _, n in plans if n.name not in huge]
        chosen = replace(chosen, pages=replace(chosen.pages, huge_pages=False, hugepages_bytes=0, chunks=0, why=(
            f"4 KiB pages: the hugepages-2Mi of node(s) {', '.join(huge)} would hold the pool, those of "
            f"{', '.join(others)} would not, and the pod may land on any of them")))
    if chosen.disk is not None:
        disk = disk_tier.across_classes([(p.disk, [n.name for n in c]) for (p, _), c in zip(plans, smallest_first)
                                         if p.disk is not None])
        chosen = with_disk(chosen, disk, request)
    fewest = min((p.engine for p, _ in plans), key=lambda e: e.api_servers)
    if fewest.api_servers < chosen.engine.api_servers:
        chosen = with_engine(chosen, fewest, geometry)
    return chosen, node


def _on_4k_pages(geometry, key, request, node: NodeSummary, without: list[str]) -> Plan:
    """`node`'s plan with its huge pages left out; a size only they hold is refused, and the refusal says why."""
    try:
        return plan_cache.cached_plan(geometry, key, request, replace(node.facts(), hugepages_2mi=None))
    except PoolDoesNotFit as exc:
        raise PoolDoesNotFit(f"node {node.name} holds the pool only on its hugepages-2Mi, which node(s) "
                             f"{', '.join(without)} lack, and the pod may land on any of them; planned on 4 KiB "
                             f"pages: {exc}") from None


def check_name(body: Mapping[str, Any]) -> None:
    name = (body.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not DNS_LABEL.match(name) or len(name) > 63:
        raise InvalidSpec(f"metadata.name {name!r} must be a DNS label (lowercase letters, digits, '-', "
                          "at most 63 characters): it names the Service")


def desired(body: Mapping[str, Any], nodes: Iterable[NodeSummary], read_config_map: ConfigMapReader | None = None,
            fetch_hub: HubFetcher | None = None, pod_monitor: bool = False,
            router_image: str = names.DEFAULT_ROUTER_IMAGE, keda_served: Callable[[], bool] | None = None) -> Desired:
    """Everything the operator applies for one ModelServer; raises a SpillwayError on bad input."""
    check_name(body)
    spec = parse_spec(body.get("spec"))
    return desired_for(body, spec, eligibility(nodes, spec), read_config_map, fetch_hub, pod_monitor, router_image,
                       keda_served)


def desired_for(body: Mapping[str, Any], spec: ModelServerSpec, eligible: Eligibility,
                read_config_map: ConfigMapReader | None = None, fetch_hub: HubFetcher | None = None,
                pod_monitor: bool = False, router_image: str = names.DEFAULT_ROUTER_IMAGE,
                keda_served: Callable[[], bool] | None = None) -> Desired:
    """desired() for a spec already parsed and its eligible nodes already found (the operator's reconcile).
    keda_served: whether the API server serves KEDA's ScaledObjects, asked only for spec.autoscaling's
    provider choice (autoscaling.choose)."""
    check_name(body)
    geometry = resolve_geometry(spec.model_source(), read_config_map, fetch_hub)
    if spec.max_model_len is not None:
        geometry = replace(geometry, max_model_len=spec.max_model_len)
    nodes = eligible.require()
    result, node = plan_for_nodes(geometry, spec, nodes)
    objects = render(body, spec, result, pod_monitor, router_image)
    scaling = autoscaling.parse_autoscaling(body.get("spec") or {})
    choice = None
    if scaling is not None:
        hostable = autoscaling.hostable_replicas((n.gpus for n in nodes), spec.request.tensor_parallel_size,
                                                 spec.request.replicas_per_node)
        bounds = autoscaling.replica_bounds(scaling, hostable)
        choice = autoscaling.choose(scaling, body["metadata"]["name"], keda_served)
        if choice.provider is not None:
            objects = [*autoscaling.autoscaled(list(objects), body["metadata"]["name"]),
                       with_hash(autoscaling.autoscaler(body, scaling, bounds, choice.provider))]
    return Desired(spec, result, node, nodes, tuple(objects), choice)


# -- objects ---------------------------------------------------------------------------------------

def vllm_args(spec: ModelServerSpec, result: Plan) -> list[str]:
    args = [spec.model, *result.args, api.FLAG_HOST, "0.0.0.0", api.FLAG_PORT, str(api.SERVER_PORT)]
    if spec.revision:
        args += [api.FLAG_REVISION, spec.revision]
    if spec.served_model_name:
        args += [api.FLAG_SERVED_MODEL_NAME, spec.served_model_name]
    if spec.api_key_secret is not None and hardening.ours(spec.image):  # its connector package holds the guard
        args += [api.FLAG_MIDDLEWARE, api.API_KEY_MIDDLEWARE]
    return args + list(spec.extra_args)


def vllm_env(spec: ModelServerSpec, result: Plan) -> list[dict[str, Any]]:
    planned = dict(result.env)
    if hardening.ours(spec.image):
        # Our entrypoint presets the contiguous layout when none is set: a plan that chose none must say so.
        planned.setdefault(api.ENV_KV_CACHE_LAYOUT, names.VLLM_IMAGE_LAYOUT_BACKEND_CHOICE)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(planned.items())]
    if spec.hf_token_secret is not None:
        ref = spec.hf_token_secret
        env.append({"name": api.ENV_HF_TOKEN,
                    "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    # Triton's kernels below the root too: on vLLM 0.34's AOT path they would go to ~/.triton/cache, which the
    # compiling start leaves empty, so the first start over the loaded graphs built them again (253 files; memory
    # profile and graph capture 9.6 s and 15.9 s against 1.1 s and 6.4 s: bench/compile-cache). Below the root, the
    # compiling start writes them where every later start, and a compileCache snapshot, finds them.
    root = vllm_cache_root(spec)
    env += [{"name": api.ENV_CACHE_ROOT, "value": root},
            {"name": api.ENV_TRITON_CACHE_DIR, "value": f"{root}/{api.TRITON_CACHE_BELOW_ROOT}"}]
    if spec.compile_cache is not None:
        env += [{"name": api.ENV_COMPILE_CACHE_DIR, "value": compile_cache_dir(spec)},
                {"name": api.ENV_COMPILE_CACHE_READY_URL, "value": READY_URL}]
    return env + hardening.api_key_env(spec) + [dict(item) for item in spec.env]


# The server's own health, asked from inside the pod: up means every compile-cache file it used is whole.
READY_URL = f"http://127.0.0.1:{api.SERVER_PORT}{api.HEALTH_PATH}"


def cache_key(spec: ModelServerSpec) -> str:
    """One directory per model, revision, vLLM release, TP and image, on the pod's cache volume and on the
    compile-cache claim: a changed model or release never lands among another's compiled graphs, on a claim that
    many ModelServers share. vLLM keys its own torch.compile cache by config, code, torch, Triton and GPU below it
    (vllm/compilation/backends.py, compiler_interface.py), so a directory only ever gains entries it could reuse."""
    key = json.dumps([spec.model, spec.revision, spec.request.vllm_version, spec.request.tensor_parallel_size,
                      spec.image])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def vllm_cache_root(spec: ModelServerSpec) -> str:
    """vLLM's cache root on the pod's cache volume, an emptyDir: it outlives a container restart (crash, liveness),
    not the pod. A pod outlives its compile cache only through spec.compileCache's claim, which the image's
    entrypoint seeds this directory from and publishes it to (images/vllm/compile_cache.py)."""
    return f"{names.VLLM_CACHE_MOUNT}/{cache_key(spec)}"


def compile_cache_dir(spec: ModelServerSpec) -> str:
    """This pod's directory on spec.compileCache's claim."""
    return f"{names.COMPILE_CACHE_MOUNT}/{cache_key(spec)}"


def compile_cache_volume(spec: ModelServerSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of spec.compileCache's claim: vLLM never reads it, only the entrypoint's copies do."""
    if spec.compile_cache is None:
        return [], []
    return ([{"name": names.VOLUME_COMPILE_CACHE,
              "persistentVolumeClaim": {"claimName": spec.compile_cache.claim_name}}],
            [{"name": names.VOLUME_COMPILE_CACHE, "mountPath": names.COMPILE_CACHE_MOUNT}])


def _probe(period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {"httpGet": {"path": api.HEALTH_PATH, "port": names.PORT_NAME_HTTP}, "periodSeconds": period,
            "timeoutSeconds": timeout, "failureThreshold": failures}


def container(spec: ModelServerSpec, result: Plan) -> dict[str, Any]:
    pod = result.pod
    assert pod is not None
    memory = to_quantity(pod.memory_limit_bytes, "Mi")
    gpus = str(pod.gpus)
    # The pool on huge pages: hugepages-2Mi, request = limit (Kubernetes allows no overcommit of them); they are the
    # hugetlb cgroup's, not memory's, so the memory limit above no longer holds the pool.
    huge = {names.HUGEPAGES_2MI_RESOURCE: to_quantity(pod.hugepages_bytes, "Mi")} if pod.hugepages_bytes else {}
    requests = {**spec.resources.get("requests", {}), "memory": to_quantity(pod.memory_request_bytes, "Mi"),
                names.GPU_RESOURCE: gpus, **disk_objects.ephemeral_storage(result), **huge}
    limits = {**spec.resources.get("limits", {}), "memory": memory, names.GPU_RESOURCE: gpus,
              **disk_objects.ephemeral_storage(result), **huge}
    out: dict[str, Any] = {
        "name": names.CONTAINER_VLLM,
        "image": spec.image,
        "args": vllm_args(spec, result),
        "env": vllm_env(spec, result),
        "ports": [{"name": names.PORT_NAME_HTTP, "containerPort": api.SERVER_PORT, "protocol": "TCP"}],
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": [{"name": names.VOLUME_SHM, "mountPath": api.SHM_DIR}, *hardening.writable_volumes(spec)[1],
                         *disk_objects.mounts(result), {"name": names.VOLUME_VLLM_CACHE, "mountPath": names.VLLM_CACHE_MOUNT},
                         *compile_cache_volume(spec)[1],
                         *([{"name": names.VOLUME_POOL_HUGEPAGES, "mountPath": names.POOL_HUGEPAGES_MOUNT}]
                           if pod.hugepages_bytes else [])],
        "securityContext": hardening.container_security_context(spec),
        "startupProbe": _probe(10, math.ceil(pod.startup_seconds / 10)),
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(10, 6),
    }
    if spec.compile_cache is not None:
        # What the server wrote while serving is carried too: a snapshot once more as the pod stops, within the
        # termination grace, only while the server answers (a root vLLM is still compiling into is never
        # published; compile_cache.py never fails a stop).
        out["lifecycle"] = {"preStop": {"exec": {"command": [
            "python3", names.COMPILE_CACHE_COPIER, "publish", compile_cache_dir(spec), vllm_cache_root(spec),
            "--after-ready", READY_URL, "--wait-s", "0"]}}}
    if not hardening.ours(spec.image):
        # Our image's entrypoint must run (it removes pool files a restarted container left in the pod's
        # /dev/shm before vLLM starts); another image gets vLLM's server by name, whatever its entrypoint.
        out["command"] = list(api.SERVE_COMMAND)
    if spec.image_pull_policy:
        out["imagePullPolicy"] = spec.image_pull_policy
    return out


def deployment(body: Mapping[str, Any], spec: ModelServerSpec, result: Plan) -> dict[str, Any]:
    name = body["metadata"]["name"]
    pod = result.pod
    assert pod is not None
    engine = container(spec, result)
    engine["env"] += disk_objects.share_env(body, result)
    pod_spec: dict[str, Any] = {
        "containers": [engine],
        # The offload pool lives in /dev/shm (an mmap pinned for DMA): a memory-backed emptyDir sized by the
        # plan, whose pages count against the container's memory limit. On huge pages the pool is a file on a
        # hugetlbfs emptyDir instead (the connector's hugetlb_pool.py) and /dev/shm holds the message queues only.
        "volumes": [{"name": names.VOLUME_SHM, "emptyDir": {"medium": "Memory",
                                                            "sizeLimit": to_quantity(pod.shm_bytes, "Mi")}},
                    *hardening.writable_volumes(spec)[0], *disk_objects.volumes(spec, result),
                    # vLLM's compile cache (vllm_cache_root): a restarted container skips torch.compile
                    {"name": names.VOLUME_VLLM_CACHE, "emptyDir": {}}, *compile_cache_volume(spec)[0],
                    *([{"name": names.VOLUME_POOL_HUGEPAGES, "emptyDir": {"medium": names.HUGEPAGES_2MI_MEDIUM}}]
                      if pod.hugepages_bytes else [])],
        "securityContext": {**hardening.pod_security_context(), **hardening.volume_group(pod.hugepages_bytes, spec)},
        **hardening.host_namespaces(),
        # vLLM never calls the Kubernetes API: no ServiceAccount token in its pods.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.affinity:
        pod_spec["affinity"] = dict(spec.affinity)
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    return with_hash({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(body),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector(name)},
            # Replace pods one at a time without a surge: a surge pod would need GPUs and memory nobody has.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {"metadata": {"labels": labels(name)}, "spec": pod_spec},
        },
    })


def service(body: Mapping[str, Any]) -> dict[str, Any]:
    name = body["metadata"]["name"]
    return with_hash({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(body),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(name),
            "ports": [{"name": names.PORT_NAME_HTTP, "port": api.SERVER_PORT, "targetPort": names.PORT_NAME_HTTP,
                       "protocol": "TCP"}],
        },
    })


def pod_monitor(body: Mapping[str, Any]) -> dict[str, Any]:
    name = body["metadata"]["name"]
    return with_hash({
        "apiVersion": f"{names.PODMONITOR_GROUP}/{names.PODMONITOR_VERSION}",
        "kind": names.PODMONITOR_KIND,
        "metadata": metadata(body),
        "spec": {
            "selector": {"matchLabels": selector(name)},
            "podMetricsEndpoints": [{"port": names.PORT_NAME_HTTP, "path": api.METRICS_PATH}],
        },
    })


def network_policy(body: Mapping[str, Any], spec: ModelServerSpec) -> dict[str, Any]:
    name = body["metadata"]["name"]
    return with_hash({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(body),
        "spec": hardening.network_policy_spec(name, spec, selector(name)),
    })


def render(body: Mapping[str, Any], spec: ModelServerSpec, result: Plan, with_pod_monitor: bool,
           router_image: str = names.DEFAULT_ROUTER_IMAGE) -> list[dict]:
    objects = [deployment(body, spec, result), service(body)]
    if spec.network_policy:
        objects.append(network_policy(body, spec))
    if with_pod_monitor:
        objects.append(pod_monitor(body))
    return routed(body, spec, result, objects, router_image)
