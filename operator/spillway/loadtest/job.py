"""In-cluster load tests: a Kubernetes Job running `spillway loadtest run` against a ModelServer's Service.

`spillway loadtest job --render` prints the Job for `kubectl apply`; without it the Job is created, its
log followed, and the result (the last RESULT_MARKER line of the log) written locally. The same result
is readable with `kubectl logs job/NAME | grep SPILLWAY_LOADTEST_RESULT | tail -1 | cut -d' ' -f2-`.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core import k8s_names as names
from ..core.errors import InvalidSpec, SpillwayError
from ..core.vllm_api import SERVER_PORT
from .progress import log
from .results import RESULT_MARKER, write_atomic

COMPONENT = names.COMPONENT_LOADTEST  # the vLLM pods' NetworkPolicy admits these pods
CONTAINER = "loadtest"
MANAGED_BY = "spillway-cli"
TTL_AFTER_FINISHED_S = 86_400  # keep the finished Job (and its log) a day for `kubectl logs`
RUN_AS = 65532  # the operator image's unprivileged user
POD_START_TIMEOUT_S = 600
ENV_API_KEY = "SPILLWAY_API_KEY"


def modelserver_url(name: str, namespace: str) -> str:
    """The OpenAI endpoint of a ModelServer: its Service has the ModelServer's name, on vLLM's port."""
    return f"http://{name}.{namespace}.svc:{SERVER_PORT}"


def job_name(modelserver: str) -> str:
    return f"{modelserver}-loadtest"[:63].rstrip("-")


def manifest(*, name: str, namespace: str, modelserver: str, run_args: list[str], image: str = names.DEFAULT_OPERATOR_IMAGE,
             cpu: str = "2", memory: str = "2Gi", deadline_s: int | None = None,
             api_key_secret: tuple[str, str] | None = None) -> dict[str, Any]:
    """The Job. run_args: everything after `spillway loadtest run` but the endpoint (added here)."""
    labels = {
        names.LABEL_NAME: names.APP_NAME,
        names.LABEL_COMPONENT: COMPONENT,
        names.LABEL_MANAGED_BY: MANAGED_BY,
        names.LABEL_MODELSERVER: modelserver,
    }
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["spillway"],
        "args": ["loadtest", "run", "--endpoint", modelserver_url(modelserver, namespace), *run_args,
                 "--progress", "log", "--emit-result", "--no-plot", "--output", "/tmp/loadtest.json"],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "MPLCONFIGDIR", "value": "/tmp"}],
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    if api_key_secret is not None:
        secret, key = api_key_secret
        container["env"].append({"name": ENV_API_KEY, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    spec: dict[str, Any] = {
        "backoffLimit": 0,  # a retried load test would measure a server the first attempt already warmed
        "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container],
                "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
            },
        },
    }
    if deadline_s is not None:
        spec["activeDeadlineSeconds"] = deadline_s
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


# -- running it -----------------------------------------------------------------------------------

def _client(context: str | None):
    try:
        from ..adapters import kube
    except ImportError:
        raise InvalidSpec("in-cluster load tests need the kubernetes package (pip install kubernetes)") from None
    kube.load_config(context)
    return kube


def default_namespace(context: str | None = None) -> str:
    try:
        from ..adapters.kube import kubeconfig_namespace
    except ImportError:
        return "default"
    return kubeconfig_namespace(context) or "default"


def _unreachable(exc: Exception) -> SpillwayError:
    return SpillwayError(f"cannot reach the Kubernetes API: {exc}")


def check_modelserver(kube, client, name: str, namespace: str) -> dict:
    try:
        found = client.get(kube.path(names.API_VERSION, names.PLURAL, namespace, name))
    except kube.ApiError as exc:
        raise SpillwayError(f"cannot read {names.KIND} {namespace}/{name}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - urllib3 connection errors
        raise _unreachable(exc) from None
    if found is None:
        raise InvalidSpec(f"{names.KIND} {name!r} not found in namespace {namespace!r}")
    return found


def run_job(job: dict, *, output: Path | None, context: str | None = None, check: list[str] = (),
            on_result: Callable[[dict], None] | None = None, poll_s: float = 2.0) -> dict | None:
    """Create the Job, follow its pod's log, keep the last result line; returns the last result."""
    kube = _client(context)
    client = kube.Kube()
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    for modelserver in check:
        check_modelserver(kube, client, modelserver, namespace)
    try:
        client.request("POST", kube.path("batch/v1", "Job", namespace), body=job)
    except kube.ApiError as exc:
        if exc.status == 409:
            raise InvalidSpec(f"Job {namespace}/{name} already exists: read it with `kubectl logs job/{name} -n "
                              f"{namespace}`, delete it, or pass --job-name") from None
        raise SpillwayError(f"cannot create Job {namespace}/{name}: {exc}") from None
    log(f"created Job {namespace}/{name}; `kubectl logs -f job/{name} -n {namespace}` follows it too")
    pod = _wait_for_pod(kube, client, namespace, name, poll_s)
    result = None
    try:
        lines = client.stream_lines(kube.path("v1", "Pod", namespace, pod, "log"),
                                    query=[("container", CONTAINER), ("follow", "true")])
        for line in lines:
            _, marker, rest = line.partition(RESULT_MARKER + " ")
            if marker:
                result = json.loads(rest)
                if output is not None:
                    write_atomic(output, json.dumps(result, indent=1))
                if on_result is not None:
                    on_result(result)
            else:
                print(line, file=sys.stderr, flush=True)  # the pod's progress; stdout gets the table
    except KeyboardInterrupt:
        raise SpillwayError(f"stopped following; the Job keeps running: `kubectl logs job/{name} -n {namespace}`"
                            + (f"; partial result in {output}" if result is not None and output else "")) from None
    return result


def _wait_for_pod(kube, client, namespace: str, job: str, poll_s: float) -> str:
    deadline = time.monotonic() + POD_START_TIMEOUT_S
    last_state = ""
    while time.monotonic() < deadline:
        listed = client.request("GET", kube.path("v1", "Pod", namespace), query=[("labelSelector", f"job-name={job}")])
        for pod in listed.get("items") or []:
            pod_name = (pod.get("metadata") or {}).get("name")
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Running", "Succeeded", "Failed"):
                return pod_name
            waiting = _waiting_reason(pod)
            if waiting in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"):
                raise SpillwayError(f"load test pod {pod_name} cannot start: {waiting}")
            state = f"pod {pod_name} {phase}{f' ({waiting})' if waiting else ''}"
            if state != last_state:
                log(state)
                last_state = state
        time.sleep(poll_s)
    raise SpillwayError(f"the load test pod of Job {namespace}/{job} did not start within {POD_START_TIMEOUT_S}s")


def _waiting_reason(pod: dict) -> str | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting")
        if waiting:
            return waiting.get("reason")
    return None
