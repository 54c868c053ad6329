"""`spillway render`: the operator's objects, offline, through the same code path."""
from __future__ import annotations

import json
import subprocess

import yaml
from spillway.controller.facts import summarize_node, synthetic_node
from spillway.controller.manifests import desired
from spillway.core import k8s_names as names
from support.crd_schema import REPO
from support.forked import spillway_cli
from support.ms_examples import gpu_node, modelserver

EXAMPLE = REPO / "docs" / "examples" / "modelserver.yaml"


def spillway(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return spillway_cli("render", *args, stdin=stdin, timeout=120)


def test_renders_the_example_like_the_operator():
    done = spillway("-f", str(EXAMPLE), "--node-memory", "2Ti", "--gpus-per-node", "8")
    assert done.returncode == 0, done.stderr
    docs = list(yaml.safe_load_all(done.stdout))
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "NetworkPolicy"]
    body = yaml.safe_load(EXAMPLE.read_text())
    node = summarize_node(synthetic_node("2Ti", 8, labels=body["spec"]["nodeSelector"]))
    assert docs == [json.loads(json.dumps(o)) for o in desired(body, [node]).objects]
    assert done.stdout.startswith(f"# {names.KIND} default/llama-8b: offload pool")


def test_described_node_cpus_set_the_api_servers_like_a_node_with_that_cpu():
    done = spillway("-f", str(EXAMPLE), "--node-memory", "2Ti", "--gpus-per-node", "8", "--node-cpus", "128")
    assert done.returncode == 0, done.stderr
    deployment = next(yaml.safe_load_all(done.stdout))
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--api-server-count") + 1] == "4"  # 16 cores per replica of 8
    body = yaml.safe_load(EXAMPLE.read_text())
    node = summarize_node(synthetic_node("2Ti", 8, labels=body["spec"]["nodeSelector"], cpu="128"))
    assert deployment == json.loads(json.dumps(desired(body, [node]).objects[0]))
    bad = spillway("-f", str(EXAMPLE), "--node-memory", "2Ti", "--gpus-per-node", "8", "--node-cpus", "lots")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--node-cpus" in bad.stderr


def test_described_node_hugepages_render_the_pool_on_them_like_a_node_with_them():
    done = spillway("-f", str(EXAMPLE), "--node-memory", "400Gi", "--gpus-per-node", "8", "--node-hugepages", "1600Gi")
    assert done.returncode == 0, done.stderr
    deployment = next(yaml.safe_load_all(done.stdout))
    pod = deployment["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    # auto on 200 GiB of huge pages a replica: the memory share alone held 32.41 GiB
    assert resources["limits"][names.HUGEPAGES_2MI_RESOURCE] == resources["requests"][names.HUGEPAGES_2MI_RESOURCE] \
        == "204800Mi"
    assert {"name": names.VOLUME_POOL_HUGEPAGES, "emptyDir": {"medium": "HugePages-2Mi"}} in pod["volumes"]
    assert "200.0 GiB of hugepages-2Mi" in done.stdout.splitlines()[0]
    body = yaml.safe_load(EXAMPLE.read_text())
    node = summarize_node(synthetic_node("400Gi", 8, labels=body["spec"]["nodeSelector"], hugepages_2mi="1600Gi"))
    assert deployment == json.loads(json.dumps(desired(body, [node]).objects[0]))
    bad = spillway("-f", str(EXAMPLE), "--node-memory", "400Gi", "--gpus-per-node", "8", "--node-hugepages", "lots")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--node-hugepages" in bad.stderr


def test_nodes_file_json_output_and_pod_monitor(tmp_path):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        gpu_node("big", "2Ti", 8), gpu_node("small", "1Ti", 8)]}))
    ms = tmp_path / "ms.yaml"
    ms.write_text(yaml.safe_dump(modelserver()))
    done = spillway("-f", str(ms), "--nodes", str(nodes), "--pod-monitor", "-o", "json")
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    assert [i["kind"] for i in items] == ["Deployment", "Service", "NetworkPolicy", names.PODMONITOR_KIND]
    small = desired(modelserver(), [summarize_node(gpu_node("small", "1Ti", 8))])
    assert items[0] == small.objects[0]


def test_config_map_geometry_from_a_file(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
                                  "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 1024}))
    ms = yaml.safe_dump(modelserver(model="/models/tiny", modelConfig={"configMapRef": {"name": "tiny"}}))
    done = spillway("-f", "-", "--node-memory", "512Gi", "--gpus-per-node", "4", "--model-config", str(config),
                    stdin=ms)
    assert done.returncode == 0, done.stderr
    without = spillway("-f", "-", "--node-memory", "512Gi", "--gpus-per-node", "4", stdin=ms)
    assert without.returncode == 2 and "--model-config" in without.stderr


def test_bad_input_is_one_line_and_exit_code_2(tmp_path):
    ms = tmp_path / "ms.yaml"
    ms.write_text(yaml.safe_dump(modelserver(offload={"size": "3Ti"})))
    done = spillway("-f", str(ms), "--node-memory", "2Ti", "--gpus-per-node", "8")
    assert done.returncode == 2 and done.stdout == ""
    line, = done.stderr.strip().splitlines()
    assert line.startswith("spillway: error: offload size 3Ti fits neither the memory nor the huge pages of one "
                           "replica's share of node")
    assert spillway("-f", str(ms)).returncode == 2
    other = tmp_path / "other.yaml"
    other.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    assert "holds no spillway.dev/v1alpha1 ModelServer" in spillway("-f", str(other), "--node-memory", "1Ti",
                                                                     "--gpus-per-node", "8").stderr
