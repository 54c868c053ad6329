"""Render charts/spillway with Helm for the chart tests: scenarios, helpers to find objects."""
from __future__ import annotations

import copy
import functools
import json
import subprocess
import tempfile
from pathlib import Path

import yaml
from spillway.core import k8s_names

from support.tools import require_binary  # noqa: F401 - re-exported for the tests here

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "spillway"
RELEASE = "spillway"
NAMESPACE = "spillway-system"
MONITORING_API = "monitoring.coreos.com/v1"
# The Helm majors the chart supports: `helm` is Helm 4, `helm3` is Helm 3 (make setup installs both).
HELMS = ("helm", "helm3")
# The Kubernetes releases the chart supports (Chart.yaml kubeVersion is the floor).
KUBE_OLDEST, KUBE_NEWEST = "1.30.0", "1.37.0"




MODEL_NAME = "meta-llama/Llama-3.1-8B-Instruct"


def model(name: str, namespace: str | None = None, **spec: object) -> dict:
    """One `models:` entry; its spec names a catalog model and lets the planner size the offload pool."""
    entry: dict = {"name": name, "spec": {"model": MODEL_NAME, **spec}}
    if namespace:
        entry["namespace"] = namespace
    return entry


# name -> (values, --api-versions). Together they reach every template branch.
SCENARIOS: dict[str, tuple[dict, tuple[str, ...]]] = {
    "defaults": ({}, ()),
    "prometheus-operator": ({}, (MONITORING_API,)),
    "monitoring-off": ({"monitoring": {"enabled": False}}, (MONITORING_API,)),
    "models": ({"models": [model("llama-8b"),
                           model("llama-8b-tp2", "serving", tensorParallelSize=2, offload={"size": "auto"})]},
               (MONITORING_API,)),
    "namespaced": (
        {
            "operator": {"watchNamespaces": ["team-a", "team-b"]},
            "models": [model("llama-8b", "team-a")],
            "monitoring": {"labels": {"release": "kube-prometheus-stack"},
                           "dashboards": {"namespace": "monitoring", "annotations": {"grafana_folder": "Spillway"}}},
        },
        (MONITORING_API,),
    ),
    "customized": (
        {
            "fullnameOverride": "llm",
            "operator": {
                "image": {"repository": "registry.example.com/spillway-operator",
                          "digest": "sha256:" + "ab" * 32, "pullPolicy": "Always"},
                "imagePullSecrets": [{"name": "registry"}],
                "hubFetch": {"enabled": True, "endpoint": "https://hub.example.com"},
                "logFormat": "json",
                "verbose": True,
                "healthPort": 9090,
                "extraEnv": [{"name": "SPILLWAY_EXAMPLE", "value": "1"}],
                "podAnnotations": {"example.com/owner": "ml-platform"},
                "podLabels": {"team": "ml"},
                "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
                "priorityClassName": "spillway-critical",
            },
            "serviceAccount": {"create": True, "name": "spillway-op", "annotations": {"example.com/role": "op"}},
            "tests": {"timeoutSeconds": 900},
        },
        (MONITORING_API,),
    ),
}


class RenderError(Exception):
    pass


def helm_command(helm: str, values: dict, api_versions=(), kube_version: str | None = None,
                 extra: tuple[str, ...] = ()) -> list[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, prefix="values-") as values_file:
        yaml.safe_dump(values, values_file)
    command = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds",
               "--values", values_file.name]
    for api in api_versions:
        command += ["--api-versions", api]
    if kube_version:
        command += ["--kube-version", kube_version]
    return command + list(extra)


@functools.cache
def _render_cached(helm: str, values_json: str, api_versions: tuple[str, ...], kube_version: str | None,
                   extra: tuple[str, ...]) -> tuple[str, str, int]:
    command = helm_command(helm, json.loads(values_json), api_versions, kube_version, extra)
    try:
        proc = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    finally:
        Path(command[command.index("--values") + 1]).unlink()
    return proc.stdout, proc.stderr, proc.returncode


def render_text(helm: str, values: dict | None = None, api_versions=(), kube_version: str | None = None,
                extra: tuple[str, ...] = ()) -> str:
    stdout, stderr, code = _render_cached(helm, json.dumps(values or {}, sort_keys=True), tuple(api_versions),
                                          kube_version, tuple(extra))
    if code != 0:
        raise RenderError(stderr.strip())
    return stdout


@functools.cache
def _parse(text: str) -> list[dict]:
    return [doc for doc in yaml.load_all(text, Loader=yaml.CSafeLoader) if doc]


def render(helm: str, values: dict | None = None, api_versions=(), kube_version: str | None = None,
           extra: tuple[str, ...] = ()) -> list[dict]:
    """The rendered objects (a fresh copy: callers may change them)."""
    return copy.deepcopy(_parse(render_text(helm, values, api_versions, kube_version, extra)))


def render_scenario(helm: str, name: str) -> list[dict]:
    values, api_versions = SCENARIOS[name]
    return render(helm, values, api_versions)


def render_failure(helm: str, values: dict | None = None, api_versions=(), **kwargs) -> str:
    """helm template's error message; fails the test when rendering succeeds."""
    try:
        render_text(helm, values, api_versions, **kwargs)
    except RenderError as exc:
        return str(exc)
    raise AssertionError(f"{helm} template accepted {values!r}")


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [doc for doc in of_kind(docs, kind) if name is None or doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def operator_deployment(docs: list[dict]) -> dict:
    return one([d for d in docs if d["metadata"]["labels"].get(k8s_names.LABEL_COMPONENT) == "operator"],
               "Deployment")


def operator_container(docs: list[dict]) -> dict:
    containers = operator_deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_pod(docs: list[dict]) -> dict:
    return one([d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"], "Pod")


test_pod.__test__ = False  # a helper, not a pytest test


def crd_documents() -> list[dict]:
    docs = []
    for path in sorted((CHART / "crds").glob("*.y*ml")):
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def modelserver_crd() -> dict:
    crds = [d for d in crd_documents() if d.get("kind") == "CustomResourceDefinition"
            and d["spec"]["names"]["kind"] == k8s_names.KIND]
    assert len(crds) == 1, f"charts/spillway/crds/ holds {len(crds)} {k8s_names.KIND} CRDs"
    return crds[0]
