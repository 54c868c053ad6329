"""`spillway loadtest job` against an emulated Kubernetes API: lookups, the Job it creates, the result it
takes from the pod's log. The log is real output of `spillway loadtest run --emit-result`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kube_emulator import KubeEmulator, job_pod, modelserver

NS = "ns"


@pytest.fixture
def cluster(tmp_path: Path):
    with KubeEmulator(tmp_path) as emulated:
        yield emulated


def spillway(*args: str, kubeconfig: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run([sys.executable, "-m", "spillway.cli", *args], check=False, capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def test_missing_modelserver(cluster: KubeEmulator, tmp_path: Path):
    out = spillway("loadtest", "job", "--modelserver", "llama", kubeconfig=cluster.kubeconfig, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == "spillway: error: ModelServer 'llama' not found in namespace 'ns'"
    assert cluster.jobs(NS) == []


def test_job_already_there(cluster: KubeEmulator, tmp_path: Path):
    cluster.create(modelserver("llama", NS))
    cluster.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llama-loadtest", "namespace": NS},
                    "spec": {"template": {"spec": {"containers": [], "restartPolicy": "Never"}}}})
    out = spillway("loadtest", "job", "--modelserver", "llama", kubeconfig=cluster.kubeconfig, cwd=tmp_path)
    assert out.returncode == 2
    assert "Job ns/llama-loadtest already exists" in out.stderr.strip().splitlines()[-1]


def test_result_of_a_failed_run_comes_back(cluster: KubeEmulator, tmp_path: Path):
    """The pod's run could not reach its endpoint: its (real) log ends in a failed result, kept locally."""
    pod_log = spillway("loadtest", "run", "--endpoint", "http://127.0.0.1:9", "--emit-result", "--progress", "log",
                       "--no-plot", "-o", str(tmp_path / "pod.json"), kubeconfig=cluster.kubeconfig, cwd=tmp_path)
    assert pod_log.returncode == 2 and "SPILLWAY_LOADTEST_RESULT " in pod_log.stdout
    cluster.create(modelserver("llama", NS))
    cluster.create(job_pod("llama-loadtest", NS))
    cluster.serve_log(NS, "llama-loadtest-x1", pod_log.stderr + pod_log.stdout)
    out = spillway("loadtest", "job", "--modelserver", "llama", "-o", str(tmp_path / "r.json"), "--no-plot",
                   kubeconfig=cluster.kubeconfig, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(
        "spillway: error: the load test ended failed: cannot reach http://127.0.0.1:9/v1/models")
    job, = cluster.jobs(NS)
    assert job.spec.template.spec.containers[0].args[:4] == [
        "loadtest", "run", "--endpoint", "http://llama.ns.svc:8000"]
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "failed"
