"""What one tenant (or one broken device plugin) can put in front of the operator, through `spillway render`
(the operator's own parse and plan, offline): NUL bytes and $(VAR) references in the command line's fields, a node
reporting 10^18 GPUs, a claim whose size cannot be read."""
from __future__ import annotations

import json

import pytest
import yaml
from harness import gpu_node, modelserver, one_error_line, render, rendered, spillway
from spillway.controller.facts import MAX_NODE_GPUS, summarize_node
from spillway.core import disk_tier as dt

ARGV_FIELDS = {"model": "x/y{}", "revision": "main{}", "servedModelName": "llama{}"}


@pytest.mark.parametrize("inject, why", [("\x00--port=1", "NUL"), ("$(HF_TOKEN)", "$(")])
def test_nul_and_variable_references_in_argv_fields_are_refused(tmp_path, inject, why):
    """Kubernetes expands $(VAR) in args from the container's env (the API key, the token), and the kernel ends
    an argv word at a NUL: neither reaches vLLM's command line."""
    bodies = [modelserver(**{field: value.format(inject)}) for field, value in ARGV_FIELDS.items()]
    bodies.append(modelserver(extraArgs=["--chat-template", f"t{inject}"]))
    bodies.append(modelserver(extraArgs=[f"--api-key={inject}"]))
    for body in bodies:
        where = next(iter(k for k in body["spec"] if k != "model"), "model")
        one_error_line(render(tmp_path, body), f"spec.{where}", why)


def test_plain_dollar_signs_still_pass(tmp_path):
    args = rendered(render(tmp_path, modelserver(extraArgs=["--chat-template", "price: $5 (USD)"])))
    assert "price: $5 (USD)" in args["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_node_reporting_10_to_the_18_gpus_is_not_planned_for(tmp_path):
    liar = gpu_node("liar", "2Ti", 8)
    liar["status"]["allocatable"]["nvidia.com/gpu"] = liar["status"]["capacity"]["nvidia.com/gpu"] = str(10**18)
    honest = gpu_node("honest", "2Ti", 8)
    assert summarize_node(liar) is None and summarize_node(honest) is not None
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [liar, honest]}))
    body = tmp_path / "ms.yaml"
    body.write_text(yaml.safe_dump(modelserver()))
    done = spillway("render", "-f", str(body), "--nodes", str(nodes), "-o", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["items"], done.stdout[:500]
    edge = gpu_node("edge", "2Ti", MAX_NODE_GPUS)
    assert summarize_node(edge).gpus == MAX_NODE_GPUS


@pytest.mark.parametrize("size", ["lots", "1Zi", "-1Ti", ""])
def test_a_claim_whose_size_cannot_be_read_is_said_not_skipped(size):
    request = dt.DiskTierRequest(enabled=True, volume=dt.DiskVolume(dt.PVC, capacity="1Ti", claim_name="data"))
    claim = {"spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}},
             "status": {"phase": "Bound", "capacity": {"storage": size}}}
    with pytest.raises(dt.DiskTierDoesNotFit, match="no readable quantity"):
        dt.check_claim(request, claim, "tenant")


def test_a_readable_claim_still_passes():
    request = dt.DiskTierRequest(enabled=True, volume=dt.DiskVolume(dt.PVC, capacity="1Ti", claim_name="data"))
    dt.check_claim(request, {"spec": {"resources": {"requests": {"storage": "2Ti"}}}}, "tenant")
