"""adapters.kube: the one kubeconfig loading of the operator and `spillway loadtest job`."""
from __future__ import annotations

import pytest
import yaml
from spillway.adapters import kube
from spillway.core.errors import InvalidSpec


def kubeconfig(tmp_path, namespace: str | None) -> str:
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "here", "context": context},
                     {"name": "there", "context": {"cluster": "c", "user": "u", "namespace": "team-b"}}],
    }))
    return str(path)


def test_a_missing_configuration_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(InvalidSpec, match="no Kubernetes configuration"):
        kube.load_config()
    assert kube.kubeconfig_namespace() is None


def test_a_named_kubeconfig_wins_over_the_pods_service_account(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", kubeconfig(tmp_path, "team-a"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # no service account files here: would fail
    kube.load_config()
    assert kube.kubeconfig_namespace() == "team-a" and kube.kubeconfig_namespace("there") == "team-b"


def test_in_a_pod_without_a_kubeconfig_the_service_account_is_used(monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(InvalidSpec, match="no Kubernetes configuration: Service (host/port|token file)"):
        kube.load_config()  # the service account's files are absent outside a pod


def test_paths_name_the_plural_of_each_kind():
    assert kube.path("batch/v1", "Job", "ns") == "/apis/batch/v1/namespaces/ns/jobs"
    assert kube.path("v1", "Pod", "ns", "p", "log") == "/api/v1/namespaces/ns/pods/p/log"
