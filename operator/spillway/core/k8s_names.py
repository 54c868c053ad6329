"""Spillway's own Kubernetes names: API group, kinds, labels, annotations."""
from __future__ import annotations

import re

GROUP = "spillway.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ModelServer"
PLURAL = "modelservers"
SHORT_NAME = "ms"

GPU_RESOURCE = "nvidia.com/gpu"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_MODELSERVER = f"{GROUP}/modelserver"

# Written by `spillway qualify` on a GPU node: measured GPU<->pinned-CPU copy rate (GB/s, 1e9 B/s)
# at 2 MiB blocks, one direction (CPU->GPU, the reload path), and the JSON of the full table.
ANNOTATION_QUALIFIED_DMA_GBPS = f"{GROUP}/qualified-dma-gbps"
ANNOTATION_QUALIFICATION = f"{GROUP}/qualification"
# Set with them; the qualification DaemonSet only schedules on GPU nodes without this label.
LABEL_QUALIFIED = f"{GROUP}/qualified"
# Gauge (label `node`) carrying ANNOTATION_QUALIFIED_DMA_GBPS to Prometheus, meant to be exported by the
# operator. The DMA alert compares against it where present and against a fixed floor elsewhere.
METRIC_NODE_QUALIFIED_DMA_GBPS = "spillway_node_qualified_dma_gbps"
# Gauge (labels modelserver_namespace, modelserver): 1 while the ModelServer's last plan succeeded, 0 while it fails
# (bad spec, nodes that no longer fit it); the SpillwayModelServerNotPlanned alert watches it.
METRIC_MODELSERVER_PLANNED = "spillway_modelserver_planned"

DEFAULT_VLLM_IMAGE = "ghcr.io/spillway-dev/spillway-vllm:0.1.0-vllm0.34.0"
DEFAULT_OPERATOR_IMAGE = "ghcr.io/spillway-dev/spillway-operator:0.1.0"
# The router pods run `spillway route`, which the operator image carries.
DEFAULT_ROUTER_IMAGE = DEFAULT_OPERATOR_IMAGE

# -- what the operator writes for a ModelServer ---------------------------------------------------
APP_NAME = "spillway"  # app.kubernetes.io/name of every object the operator writes
MANAGED_BY = "spillway-operator"  # app.kubernetes.io/managed-by
FIELD_MANAGER = "spillway-operator"  # server-side apply field manager
COMPONENT_VLLM = "vllm"  # app.kubernetes.io/component of the vLLM pods (the chart's PodMonitor selects it)
COMPONENT_LOADTEST = "loadtest"  # app.kubernetes.io/component of `spillway loadtest job` pods
CONTAINER_VLLM = "vllm"
PORT_NAME_HTTP = "http"  # the vLLM pods' OpenAI + /metrics port name
PORT_NAME_KV_EVENTS = "kv-events"  # the vLLM pods' ZMQ KV event publisher (routing.mode kv-aware, llm-d)
PORT_NAME_METRICS = "metrics"  # the router's Prometheus port
COMPONENT_ROUTER = "router"  # app.kubernetes.io/component of the kv-aware router pods
CONTAINER_ROUTER = "router"
VOLUME_SHM = "dshm"
HUGEPAGES_2MI_RESOURCE = "hugepages-2Mi"  # a node's allocatable 2 MiB huge pages; the pool's request where it is on them
# The pool on huge pages: a hugepages-2Mi emptyDir (hugetlbfs), its file placed there by the connector
# (spillway_connector/hugetlb_pool.py, told by vllm_api.ENV_POOL_HUGEPAGES_DIR); /dev/shm stays tmpfs.
VOLUME_POOL_HUGEPAGES = "pool-hugepages"
POOL_HUGEPAGES_MOUNT = "/var/lib/spillway/pool-hugepages"
HUGEPAGES_2MI_MEDIUM = "HugePages-2Mi"
# vLLM's cache root (torch.compile artifacts, CUDA graphs' compiled code): an emptyDir, so a restarted container
# finds its compile cache; below it one directory per (model, revision, vLLM release, TP, image).
VOLUME_VLLM_CACHE = "vllm-cache"
VLLM_CACHE_MOUNT = "/var/cache/spillway-vllm"
# spec.compileCache's claim, shared by every replica: the image's compile_cache.py seeds the emptyDir above from the
# newest snapshot there before vLLM starts, and publishes the emptyDir as a snapshot once the server is healthy and
# from the preStop hook; one directory per the same key.
VOLUME_COMPILE_CACHE = "compile-cache"
COMPILE_CACHE_MOUNT = "/var/cache/spillway-compile-cache"
VLLM_IMAGE_LIB = "/usr/local/lib/spillway"  # the vLLM image's entrypoint and its helpers (images/vllm/Dockerfile)
COMPILE_CACHE_COPIER = f"{VLLM_IMAGE_LIB}/compile_cache.py"
FINALIZER = f"{GROUP}/finalizer"
# On objects the operator applies: a hash of what it applied (an unchanged hash skips the write).
ANNOTATION_APPLIED_HASH = f"{GROUP}/applied-hash"
# On a ModelServer: set by the operator's Node watcher when the eligible nodes' facts change (triggers a re-plan).
ANNOTATION_NODES_CHANGED = f"{GROUP}/nodes-fingerprint"
# On the Deployment: the ModelServer generation its plan was made for. A plan of that same generation that
# no longer fits (the nodes shrank) scales the Deployment to 0 instead of leaving pods that cannot fit.
ANNOTATION_PLANNED_GENERATION = f"{GROUP}/planned-generation"
# Pods that may call every vLLM server of their namespace (the router); the NetworkPolicy admits them.
LABEL_ROLE = f"{GROUP}/role"
ROLE_ROUTER = "router"
# Spillway's own vLLM image (repository): pods of it run under the restricted Pod Security profile.
VLLM_IMAGE_REPOSITORY = "ghcr.io/spillway-dev/spillway-vllm"
VLLM_IMAGE_UID = 65532  # the user images/vllm/Dockerfile creates
# The image's entrypoint presets VLLM_KV_CACHE_LAYOUT=BLHNC when the variable is unset; "auto" tells it to
# leave the layout to the attention backend (images/vllm/entrypoint.sh).
VLLM_IMAGE_LAYOUT_BACKEND_CHOICE = "auto"
VLLM_IMAGE_HOME = "/home/spillway"  # its HOME: caches (Hugging Face, vLLM, torch, triton) live below
# kopf's own bookkeeping annotations on ModelServers start with this prefix.
KOPF_ANNOTATION_PREFIX = f"operator.{GROUP}"

PODMONITOR_GROUP = "monitoring.coreos.com"
PODMONITOR_VERSION = "v1"
PODMONITOR_PLURAL = "podmonitors"
PODMONITOR_KIND = "PodMonitor"

# Gateway API Inference Extension (routing.mode llm-d)
INFERENCEPOOL_GROUP = "inference.networking.k8s.io"
INFERENCEPOOL_VERSION = "v1"
INFERENCEPOOL_KIND = "InferencePool"
INFERENCEPOOL_PLURAL = "inferencepools"

# The claim a disk tier names (spec.offload.disk.volume.persistentVolumeClaim): read to see that it exists, is
# writable by the replicas that share it and holds the capacity the tier was sized from.
PVC_PLURAL = "persistentvolumeclaims"
ACCESS_READ_WRITE_ONCE = "ReadWriteOnce"
ACCESS_READ_WRITE_ONCE_POD = "ReadWriteOncePod"
ACCESS_READ_ONLY_MANY = "ReadOnlyMany"
CLAIM_PHASE_LOST = "Lost"

# Operator settings (environment of the operator process).
ENV_ALLOW_HUB_FETCH = "SPILLWAY_ALLOW_HUB_FETCH"  # "true": fetch config.json of unknown model ids from the hub
ENV_POD_MONITORS = "SPILLWAY_POD_MONITORS"  # "auto" (when the CRD exists, default) | "false"
ENV_METRICS_PORT = "SPILLWAY_METRICS_PORT"  # serve the operator's /metrics on this port (unset: off)
ENV_RETRY_SECONDS = "SPILLWAY_RETRY_SECONDS"  # wait before retrying API errors and missing ConfigMaps (30)
ENV_RESYNC_SECONDS = "SPILLWAY_RESYNC_SECONDS"  # each ModelServer reconciled again this often, event or not (300)
ENV_API_TIMEOUT_SECONDS = "SPILLWAY_API_TIMEOUT_SECONDS"  # one API request's connect+read timeout (30)
ENV_ROUTER_IMAGE = "SPILLWAY_ROUTER_IMAGE"  # the kv-aware router's image (the chart sets it from its values)
# The node directories a disk tier's hostPath may be (or be under): a JSON list of absolute paths (unset: none);
# the chart sets it from operator.diskTier.hostPathPrefixes.
ENV_DISK_HOST_PATH_PREFIXES = "SPILLWAY_DISK_HOST_PATH_PREFIXES"
CHART_VALUE_DISK_HOST_PATH_PREFIXES = "operator.diskTier.hostPathPrefixes"


# -- name rules (RFC 1123) -----------------------------------------------------------------------------------
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63  # namespaces, Services, Jobs, label values
DNS_SUBDOMAIN_MAX = 253  # Nodes and most other object names


def name_problem(value: str, subdomain: bool = False) -> str | None:
    """Why `value` cannot name a Kubernetes object (a DNS label, or a DNS subdomain of labels), or None."""
    limit = DNS_SUBDOMAIN_MAX if subdomain else DNS_LABEL_MAX
    if not value or len(value) > limit:
        return f"must be 1 to {limit} characters, got {len(value)}"
    parts = value.split(".") if subdomain else [value]
    if not all(len(part) <= DNS_LABEL_MAX and _DNS_LABEL.match(part) for part in parts):
        return ("must be lowercase letters, digits and '-', starting and ending with a letter or digit"
                + (" (labels between dots)" if subdomain else ""))
    return None


def require_name(value: str, flag: str, subdomain: bool = False) -> str:
    """`value` if it can name a Kubernetes object; else InvalidSpec naming the flag or field."""
    from .errors import InvalidSpec

    problem = name_problem(value, subdomain)
    if problem is not None:
        raise InvalidSpec(f"{flag} {value[:80]!r}{'...' if len(value) > 80 else ''} {problem}")
    return value
