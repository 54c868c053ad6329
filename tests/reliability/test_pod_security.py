"""The vLLM pods the operator writes: Pod Security "restricted" for our image, no ServiceAccount token,
a NetworkPolicy on port 8000, an optional API key from a Secret."""
from __future__ import annotations

import re

import pytest
from harness import REPO, modelserver, names, one_error_line, render, rendered
from pss import violations

OUR_IMAGE = names.DEFAULT_VLLM_IMAGE


def _pod(objects: dict) -> dict:
    return objects["Deployment"]["spec"]["template"]


def _image_user() -> int:
    found = re.findall(r"^USER\s+(\d+)", (REPO / "images" / "vllm" / "Dockerfile").read_text(), re.MULTILINE)
    return int(found[-1])


def test_the_checker_catches_each_restricted_control():
    bare = {"containers": [{"name": "c", "image": "x"}]}
    found = "\n".join(violations(bare))
    for control in ("Privilege Escalation", "Running as Non-root", "Seccomp", "Capabilities"):
        assert control in found
    hostile = {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
               "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
                                   "sysctls": [{"name": "kernel.msgmax", "value": "1"}]},
               "containers": [{"name": "c", "securityContext": {
                   "privileged": True, "allowPrivilegeEscalation": False, "runAsUser": 0,
                   "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}, "ports": [{"hostPort": 80}]}]}
    found = "\n".join(violations(hostile))
    for control in ("Host Namespaces", "HostPath Volumes", "Volume Types", "Sysctls", "Privileged", "Host Ports",
                    "runAsUser 0", "SYS_ADMIN"):
        assert control in found, control


def test_a_rendered_vllm_pod_passes_pod_security_restricted(tmp_path):
    pod = _pod(rendered(render(tmp_path, modelserver())))
    assert violations(pod["spec"], pod["metadata"].get("annotations")) == []
    container, = pod["spec"]["containers"]
    assert container["image"] == OUR_IMAGE
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    uid = pod["spec"]["securityContext"].get("runAsUser", security.get("runAsUser"))
    assert uid == _image_user(), "the pod runs as the user the image creates"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/tmp", names.VLLM_IMAGE_HOME} <= mounts, mounts
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_another_image_keeps_the_controls_that_do_not_depend_on_its_user(tmp_path):
    pod = _pod(rendered(render(tmp_path, modelserver(image="vllm/vllm-openai:v0.33.0"))))
    container, = pod["spec"]["containers"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]
    assert pod["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_a_network_policy_admits_the_router_prometheus_and_the_chosen_namespaces(tmp_path):
    clients = {"matchLabels": {"team": "search"}}
    objects = rendered(render(tmp_path, modelserver(networkPolicy={"namespaceSelector": clients})))
    policy = objects["NetworkPolicy"]
    deployment = objects["Deployment"]
    assert policy["spec"]["podSelector"] == {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rule, = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    peers = rule["from"]
    assert {"podSelector": {"matchLabels": {names.LABEL_ROLE: names.ROLE_ROUTER}}} in peers
    assert {"namespaceSelector": {}, "podSelector": {"matchLabels": {names.LABEL_NAME: "prometheus"}}} in peers
    assert {"namespaceSelector": clients} in peers


def test_the_network_policy_can_be_left_out(tmp_path):
    assert "NetworkPolicy" not in rendered(render(tmp_path, modelserver(networkPolicy={"enabled": False})))


def test_an_api_key_from_a_secret(tmp_path):
    objects = rendered(render(tmp_path, modelserver(apiKeySecretRef={"name": "llama-key"})))
    container, = _pod(objects)["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "llama-key", "key": "api-key"}}
    assert not any("--api-key" in a for a in container["args"]), "the key never appears in the pod's args"


@pytest.mark.parametrize("arg", ["--api-key=x", "--api_key", "--api-key"])
def test_flags_that_weaken_the_server_are_refused(tmp_path, arg):
    one_error_line(render(tmp_path, modelserver(extraArgs=[arg])), "spec.extraArgs")


# checkov's checks of the controls above (privileged, host namespaces, escalation, root, UID, capabilities,
# NET_RAW, seccomp, read-only root, ServiceAccount token).
CHECKOV_POD_SECURITY = {"CKV_K8S_16", "CKV_K8S_17", "CKV_K8S_18", "CKV_K8S_19", "CKV_K8S_20", "CKV_K8S_22",
                        "CKV_K8S_23", "CKV_K8S_28", "CKV_K8S_31", "CKV_K8S_37", "CKV_K8S_38", "CKV_K8S_40"}
# What checkov flags that is the site's policy, not the pod's security: CPU comes from spec.resources, the
# release process pins the image by digest, the pull policy is spec.imagePullPolicy.
CHECKOV_SITE_POLICY = {"CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_43", "CKV_K8S_15"}


def test_checkov_finds_the_rendered_vllm_pod_confined(tmp_path):
    import json
    import subprocess

    import yaml
    from support.tools import require_binary

    checkov = REPO / ".venv" / "checkov" / "bin" / "checkov"
    objects = rendered(render(tmp_path, modelserver(namespace="serving")))
    scan = tmp_path / "scan"
    scan.mkdir()
    (scan / "vllm.yaml").write_text(yaml.safe_dump_all(list(objects.values())))
    done = subprocess.run([str(checkov) if checkov.exists() else require_binary("checkov"), "--directory", str(scan),
                           "--framework", "kubernetes", "--output", "json"],
                          capture_output=True, text=True, timeout=600, check=False)
    results = json.loads(done.stdout)["results"]
    failed = {c["check_id"] for c in results["failed_checks"]}
    passed = {c["check_id"] for c in results["passed_checks"]}
    assert CHECKOV_POD_SECURITY <= passed, CHECKOV_POD_SECURITY - passed
    assert failed <= CHECKOV_SITE_POLICY, failed - CHECKOV_SITE_POLICY
