"""`spillway plan`'s disk-tier flags, run as a real process: the same tier the operator plans from
spec.offload.disk, the root directory an engine outside a pod writes to, and every bad input as one line."""
from __future__ import annotations

import json
import subprocess

import pytest
from spillway.controller.facts import summarize_node
from spillway.controller.manifests import desired
from spillway.core import disk_tier as dt
from spillway.core import vllm_api as api
from support.forked import spillway_cli
from support.ms_examples import gpu_node, modelserver

LLAMA = ["--model", "meta-llama/Llama-3.1-8B-Instruct"]
NODE = ["--node-memory", "2Ti", "--gpus-per-node", "8"]


def spillway(*args: str) -> subprocess.CompletedProcess:
    return spillway_cli("plan", *args, timeout=60)


def planned(*args: str) -> dict:
    out = spillway(*LLAMA, *NODE, "-o", "json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def operator_disk(disk: dict, ephemeral: str | None = "28Ti") -> dt.DiskTierPlan:
    node = gpu_node("gpu-a", "2Ti", 8)
    if ephemeral is not None:
        node["status"]["allocatable"]["ephemeral-storage"] = ephemeral
    return desired(modelserver(offload={"disk": {"enabled": True, **disk}}), [summarize_node(node)]).plan.disk


def secondary_tiers(plan: dict) -> list[dict] | None:
    args = plan["vllm"]["args"]
    config = json.loads(args[args.index(api.FLAG_KV_TRANSFER_CONFIG) + 1])
    return config[api.KV_CONNECTOR_EXTRA_CONFIG_KEY].get("secondary_tiers")


@pytest.mark.parametrize(("flags", "disk", "ephemeral"), [
    (["--node-ephemeral-storage", "28Ti"], {}, "28Ti"),
    (["--node-ephemeral-storage", "28Ti", "--disk-size", "0.5"], {"size": "0.5"}, "28Ti"),
    (["--disk-volume", "hostPath", "--disk-path", "/mnt/nvme/kv", "--disk-capacity", "8Ti"],
     {"volume": {"hostPath": {"path": "/mnt/nvme/kv", "capacity": "8Ti"}}}, None),
    (["--disk-volume", "persistentVolumeClaim", "--disk-claim", "kv", "--disk-capacity", "10Ti", "--disk-size", "1Ti"],
     {"size": "1Ti", "volume": {"persistentVolumeClaim": {"claimName": "kv", "capacity": "10Ti"}}}, None),
])
def test_the_flags_plan_the_tier_the_operator_plans_from_the_spec(flags, disk, ephemeral):
    plan = planned("--disk-tier", *flags)
    want = operator_disk(disk, ephemeral)
    for key in ("tier_bytes", "bound_bytes", "chunks", "tokens", "share_bytes", "volume", "ephemeral_request_bytes"):
        assert plan["disk"][key] == getattr(want, key), key
    tier, = secondary_tiers(plan)
    assert tier["root_dir"] == dt.MOUNT_PATH and plan["vllm"]["env"][api.ENV_PYTHONHASHSEED] == "0"


def test_an_engine_outside_a_pod_writes_where_root_dir_says(tmp_path):
    out = spillway(*LLAMA, "--node-memory", "128Gi", "--gpus-per-node", "1", "-o", "json", "--disk-tier",
                   "--disk-volume", "hostPath", "--disk-path", str(tmp_path), "--disk-capacity", "32Gi",
                   "--disk-root-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    tier, = secondary_tiers(plan)
    assert tier["root_dir"] == str(tmp_path) == plan["disk"]["root_dir"]
    assert plan["disk"]["tier_bytes"] == 32 * 2**30  # the hostPath's capacity, one replica on the node
    text = spillway(*LLAMA, *NODE, "--disk-tier", "--node-ephemeral-storage", "28Ti")
    assert text.returncode == 0, text.stderr
    assert "Disk tier (one replica)" in text.stdout and "not judged: runs as asked" in text.stdout


def test_a_node_disk_too_slow_to_pay_leaves_the_tier_off():
    plan = planned("--disk-tier", "--node-ephemeral-storage", "28Ti", "--qualified-disk-gbps", "0.5")
    assert plan["disk"]["pays"] is False and plan["disk"]["active"] is False
    assert secondary_tiers(plan) is None and api.ENV_PYTHONHASHSEED not in plan["vllm"]["env"]
    assert any("disk tier left off" in w and "does not pay" in w for w in plan["warnings"])
    fast = planned("--disk-tier", "--node-ephemeral-storage", "28Ti", "--qualified-disk-gbps", "50")
    assert fast["disk"]["pays"] is True and secondary_tiers(fast)


@pytest.mark.parametrize(("args", "message"), [
    ([*NODE, "--disk-tier", "--node-ephemeral-storage", "28Ti", "--disk-size", "5Ti"],
     "offload.disk.size 5Ti (5.00 TiB) exceeds the replica's share of 3.32 TiB"),
    ([*NODE, "--disk-tier"], "reports no allocatable ephemeral-storage"),
    ([*NODE, "--disk-tier", "--node-ephemeral-storage", "28Ti", "--vllm-version", "0.26.0"], "vLLM 0.32 or newer"),
    ([*NODE, "--disk-tier", "--node-ephemeral-storage", "28Ti", "--connector", "native"],
     "offload.connector spillway"),
    ([*NODE, "--disk-size", "1Ti"], "--disk-size sets the disk tier: give --disk-tier too"),
    ([*NODE, "--disk-tier", "--disk-volume", "hostPath", "--disk-claim", "kv", "--disk-capacity", "1Ti"],
     "--disk-claim is for --disk-volume persistentVolumeClaim, not hostPath"),
    ([*NODE, "--disk-tier", "--disk-volume", "hostPath", "--disk-path", "/mnt/kv"], "hostPath.capacity is required"),
    ([*NODE, "--disk-tier", "--node-ephemeral-storage", "28Ti", "--disk-root-dir", "kv"], "must be an absolute path"),
    ([*NODE, "--disk-tier", "--node-ephemeral-storage", "lots"], "--node-ephemeral-storage"),
    ([*NODE, "--disk-tier", "--node-ephemeral-storage", "28Ti", "--qualified-disk-gbps", "0"],
     "--qualified-disk-gbps must be a measured rate > 0 GB/s"),
    (["--disk-tier"], "--disk-tier is sized from the node: give --node-memory and --gpus-per-node"),
    (["--node-ephemeral-storage", "28Ti"], "--node-ephemeral-storage describes a node"),
])
def test_bad_disk_input_exits_2_with_one_line(args, message):
    out = spillway(*LLAMA, *args)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
