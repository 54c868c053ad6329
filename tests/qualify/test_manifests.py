"""Rendered DaemonSet/Job + RBAC: valid for Kubernetes 1.30 and 1.37 (strict), and wired as designed."""
from __future__ import annotations

import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from spillway.core import k8s_names as names
from spillway.qualify import manifests
from spillway.qualify.measure import MiB

VERSIONS = ["1.30.0", "1.37.0"]


def spillway(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "spillway.cli", "qualify", *args], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def daemonset_docs():
    return list(yaml.safe_load_all(spillway("--render", "daemonset", "--namespace", "gpu-ops")))


@pytest.fixture(scope="module")
def job_docs():
    return list(yaml.safe_load_all(spillway("--render", "job", "--node", "gpu-node-7", "--host-memory", "shm",
                                            "--block-sizes", "2Mi,16Mi")))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("which", ["daemonset_docs", "job_docs"])
def test_manifests_validate_strictly(request, which, version):
    for doc in request.getfixturevalue(which):
        kubernetes_validate.validate(doc, version, strict=True)


def by_kind(docs):
    return {d["kind"]: d for d in docs}


def test_rbac_lets_the_pod_patch_nodes_and_nothing_else(daemonset_docs):
    k = by_kind(daemonset_docs)
    assert k["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    subject = k["ClusterRoleBinding"]["subjects"][0]
    assert subject == {"kind": "ServiceAccount", "name": k["ServiceAccount"]["metadata"]["name"],
                       "namespace": "gpu-ops"}
    assert k["DaemonSet"]["spec"]["template"]["spec"]["serviceAccountName"] == subject["name"]


def test_daemonset_skips_qualified_nodes_and_holds_a_gpu_only_while_measuring(daemonset_docs):
    ds = by_kind(daemonset_docs)["DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": names.LABEL_QUALIFIED, "operator": "DoesNotExist"} in terms[0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]} in terms[0]["matchExpressions"]
    c = spec["containers"][0]
    assert c["resources"]["limits"][names.GPU_RESOURCE] == "1"
    cmd = c["command"]
    assert cmd[:3] == ["python3", "-m", "spillway.qualify"]
    assert cmd[cmd.index("--annotate-node") + 1] == "$(NODE_NAME)" and "--hold" in cmd
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert ds["spec"]["selector"]["matchLabels"] == ds["spec"]["template"]["metadata"]["labels"]


def test_the_rendered_command_is_one_this_cli_accepts(daemonset_docs):
    cmd = by_kind(daemonset_docs)["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["command"]
    from spillway.cli import build_parser

    args = build_parser().parse_args(["qualify", *cmd[3:]])
    assert args.annotate_node == "$(NODE_NAME)" and args.hold and args.host_memory == "alloc"
    assert args.block_sizes == "64Ki,256Ki,1024Ki,2048Ki,4096Ki,8192Ki"


def test_job_runs_once_on_the_named_node_with_memory_for_its_pool(job_docs):
    jb = by_kind(job_docs)["Job"]
    spec = jb["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-7"}
    assert "--hold" not in spec["containers"][0]["command"]
    # 16 MiB blocks: a 1000-block pool of 16000 MiB, held in /dev/shm and counted in the memory limit
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm["medium"] == "Memory" and shm["sizeLimit"] == f"{16000 + 64}Mi"
    # host pool (16000 MiB) + the same again in /dev/shm (+64 MiB slack) + 6 GiB for the process
    assert spec["containers"][0]["resources"]["limits"]["memory"] == f"{16000 + 16064 + 6144}Mi"


def test_job_needs_a_node_and_labels_need_a_value():
    out = subprocess.run([sys.executable, "-m", "spillway.cli", "qualify", "--render", "job"], capture_output=True, check=False,
                         text=True)
    assert out.returncode == 2 and "--node" in out.stderr
    out = subprocess.run([sys.executable, "-m", "spillway.cli", "qualify", "--render", "daemonset",
                          "--gpu-node-label", "nolabel"], capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "KEY=VALUE" in out.stderr


def test_default_render_sizes_reach_the_annotated_copy_size_in_an_8000_mib_pool():
    from spillway.core.qualification import PLAN_BLOCK_BYTES
    from spillway.qualify.measure import pool_bytes

    assert max(manifests.RENDER_BLOCK_SIZES) == PLAN_BLOCK_BYTES == 8 * MiB
    assert pool_bytes(manifests.RENDER_BLOCK_SIZES) == 8000 * MiB
