"""Spillway's own Kubernetes names: API group, kinds, labels, annotations."""
from __future__ import annotations

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

DEFAULT_VLLM_IMAGE = "ghcr.io/spillway-dev/spillway-vllm:0.1.0-vllm0.33.0"
DEFAULT_OPERATOR_IMAGE = "ghcr.io/spillway-dev/spillway-operator:0.1.0"
