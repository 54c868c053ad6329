"""The operator image, built from images/operator/Dockerfile, runs the way the chart runs it and reconciles.

The container gets what the chart's rendered Deployment gives it: its command and environment, the pod's
user, a read-only root filesystem with a writable /tmp, every capability dropped, no privilege
escalation, the memory and CPU limits. It talks over the host's loopback to an emulated Kubernetes API
that refuses whatever the chart's RBAC does not grant (tests/chart/test_operator_rbac.py), with a
kubeconfig in place of the ServiceAccount token (the emulator speaks plain HTTP). The chart's own
`helm test` check must find it healthy, and it must plan ModelServers into Deployments and Services
and follow their readiness. The chart pins the image by its digest (operator.image.digest).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import container
import pytest
from spillway.core.quantity import parse_bytes

TESTS = Path(__file__).resolve().parents[1]
from support.chart_render import CHART, NAMESPACE, operator_container, operator_deployment, render, require_binary
from support.rbac_cluster import AuthorizingCluster, Policy, exercise, free_port

KUBECONFIG = "/etc/spillway/kubeconfig"
pytestmark = pytest.mark.timeout(container.BUILD_TIMEOUT_S + 300)  # a cold build makes the Python base too


@pytest.fixture(scope="module")
def image() -> str:
    container.build("operator")
    return container.names()["operator"]


def run_options(docs: list[dict], kubeconfig: Path, health_port: int, metrics_port: int) -> tuple[list, list]:
    """podman/docker run options and the command line, from the chart's rendered operator Deployment."""
    pod = operator_deployment(docs)["spec"]["template"]["spec"]
    spec = operator_container(docs)
    security = {**pod["securityContext"], **spec["securityContext"]}
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["runAsNonRoot"]
    options = ["--network", "host", "--user", f"{security['runAsUser']}:{security['runAsGroup']}",
               "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
               "--memory", str(parse_bytes(spec["resources"]["limits"]["memory"])),
               "--cpus", str(spec["resources"]["limits"]["cpu"]),
               "--volume", f"{kubeconfig}:{KUBECONFIG}:ro", "--env", f"KUBECONFIG={KUBECONFIG}"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in spec["volumeMounts"]:
        assert "emptyDir" in volumes[mount["name"]], mount
        options += ["--tmpfs", mount["mountPath"]]
    for variable in spec["env"]:
        if "value" in variable:
            value = variable["value"]
            if variable["name"] == "SPILLWAY_METRICS_PORT":
                value = str(metrics_port)  # the host's network: a free port instead of the chart's
        else:
            assert variable["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
            value = NAMESPACE
        options += ["--env", f"{variable['name']}={value}"]
    command = list(spec["command"])
    liveness = [i for i, arg in enumerate(command) if arg.startswith("--liveness=")]
    assert len(liveness) == 1
    command[liveness[0]] = f"--liveness=http://127.0.0.1:{health_port}/healthz"
    return options + ["--entrypoint", command[0]], command[1:]


def test_operator_image_runs_as_the_chart_runs_it_and_reconciles(image, tmp_path):
    # Pinned by digest, as docs/chart.md tells users to: the chart names the image repository@sha256:...
    # (podman records a local image's digest; docker only a pushed one's, so there the tag pins it.)
    repository, tag = image.rsplit(":", 1)
    inspect = container.run(["image", "inspect", "--format", "{{.Digest}}", image], check=False)
    digest = inspect.stdout.strip() if inspect.returncode == 0 and inspect.stdout.startswith("sha256:") else ""
    pin = {"digest": digest} if digest else {"tag": tag}
    docs = render(require_binary("helm"), {"operator": {"image": {"repository": repository, **pin}}})
    pinned = operator_container(docs)["image"]
    assert pinned == (f"{repository}@{digest}" if digest else image)
    if container.engine() == "podman":
        assert digest, "podman records the digest of every image it builds"
    health_port = free_port()
    with AuthorizingCluster(tmp_path, Policy(docs)) as cluster:
        options, args = run_options(docs, cluster.operator_kubeconfig, health_port, free_port())
        with container.Container(pinned, args, options) as operator:
            try:
                check = subprocess.run([sys.executable, "-c", (CHART / "scripts" / "helm_test.py").read_text(),
                                        f"--operator=http://127.0.0.1:{health_port}/healthz", "--timeout=90"],
                                       check=False, capture_output=True, text=True, timeout=150)
                assert check.returncode == 0, check.stdout + check.stderr
                exercise(cluster, "team-a", None)
                assert operator.running(), "the operator exited"

                status = operator.exec("cat", "/proc/1/status").stdout
                fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
                assert fields["Uid"].split()[:2] == ["65532", "65532"]
                assert int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0
                assert fields["NoNewPrivs"].strip() == "1"
                write = operator.exec("sh", "-c", "touch /probe")
                assert write.returncode != 0 and "Read-only file system" in write.stderr
                assert operator.exec("sh", "-c", "touch /tmp/probe").returncode == 0
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n--- operator log ---\n{operator.logs()[-5000:]}") from exc
        refused = {(g, r, v, ns) for g, r, v, ns, allowed in cluster.operator_requests() if not allowed}
    assert not refused, f"the operator image asked for what the chart does not grant: {refused}"


def test_operator_image_carries_the_source_it_was_built_from(image):
    # A rebuilt image must hold the package as it stands in the tree (a layer cache keyed on a step's text
    # once served an old install): every module's bytes, compared by digest.
    package = TESTS.parent / "operator" / "spillway"
    expected = {str(p.relative_to(package)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(package.rglob("*.py"))}
    script = ("import hashlib, json, pathlib, spillway; root = pathlib.Path(spillway.__file__).parent; "
              "print(json.dumps({str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() "
              "for p in sorted(root.rglob('*.py'))}))")
    done = container.run(["run", "--rm", "--entrypoint", "python", image, "-c", script])
    assert json.loads(done.stdout) == expected
