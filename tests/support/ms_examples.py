"""ModelServer and Node objects shared by the operator tests."""
from __future__ import annotations

import copy
from typing import Any

from spillway.controller.facts import summarize_node, synthetic_node
from spillway.controller.manifests import desired
from spillway.core import k8s_names as names

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def modelserver(name: str = "llama", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": names.API_VERSION, "kind": names.KIND,
            "metadata": {"name": name, "namespace": namespace}, "spec": {"model": LLAMA_8B}}
    body["spec"].update(copy.deepcopy(spec))
    return body


def gpu_node(name: str, memory: str = "2Ti", gpus: int = 8, labels: dict | None = None,
             taints: list | None = None, dma: str | None = None, cpu: str | None = None) -> dict[str, Any]:
    node = synthetic_node(memory, gpus, name=name, labels=labels, cpu=cpu)
    if taints:
        node["spec"] = {"taints": taints}
    if dma is not None:
        node["metadata"]["annotations"] = {names.ANNOTATION_QUALIFIED_DMA_GBPS: dma}
    return node


def rendered_deployment(**spec: Any) -> dict[str, Any]:
    """The Deployment the operator renders for a ModelServer of this spec, planned for one 8-GPU node of 1 TiB."""
    body = modelserver(**spec)
    body["metadata"]["uid"] = "0b8f5f5e-0000-4000-8000-000000000000"
    return next(o for o in desired(body, [summarize_node(gpu_node("g", "1Ti", 8))]).objects
                if o["kind"] == "Deployment")


def cpu_node(name: str, memory: str = "64Gi") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}},
            "status": {"capacity": {"memory": memory, "cpu": "16"}, "allocatable": {"memory": memory, "cpu": "16"}}}
