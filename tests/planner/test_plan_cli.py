"""The `spillway plan` command-line contract, run as a real process."""
from __future__ import annotations

import json
import subprocess

import pytest
from spillway.adapters.model_config import catalog_config
from spillway.core import vllm_api as api
from spillway.core.options import Connector, EvictionPolicy, Layout, choices
from support.forked import spillway_cli


def spillway(*args: str) -> subprocess.CompletedProcess:
    return spillway_cli(*args, timeout=60)


def test_json_output_holds_the_plan_sections():
    out = spillway("plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-memory", "512Gi",
                   "--gpus-per-node", "8", "--offload-size", "auto", "--output", "json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["geometry"]["block_bytes"] == 8 * 2**20  # 64-token blocks, the planner's default
    assert plan["geometry"]["layer_page_bytes"] == 128 * 1024
    assert plan["geometry"]["bytes_per_token"] == 128 * 1024
    for key in ("bytes", "blocks", "tokens"):
        assert plan["pool"][key] > 0
    for key in ("memory_request_bytes", "memory_limit_bytes", "shm_bytes"):
        assert plan["pod"][key] > 0
    assert isinstance(plan["vllm"]["args"], list) and isinstance(plan["vllm"]["env"], dict)
    assert isinstance(plan["warnings"], list)


def test_geometry_only_from_a_config_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(catalog_config("Qwen/Qwen3-32B")))
    out = spillway("plan", "--model-config", str(tmp_path / "config.json"), "--tensor-parallel-size", "2", "-o", "json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["geometry"]["block_bytes"] == 8 * 2**20 and "pool" not in plan


def test_text_output_is_a_table():
    out = spillway("plan", "--model", "deepseek-ai/DeepSeek-V2-Lite-Chat", "--block-size", "64",
                   "--node-memory", "1Ti", "--gpus-per-node", "8")
    assert out.returncode == 0, out.stderr
    for heading in ("Model  deepseek-ai/DeepSeek-V2-Lite-Chat", "CPU offload pool", "Pod", "KV block", "/dev/shm"):
        assert heading in out.stdout


@pytest.mark.parametrize("args,message", [
    (["--model-config", "/nonexistent/config.json"], "cannot read"),
    (["--model", "acme/unknown"], "not in Spillway's catalog"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-memory", "1Ti", "--gpus-per-node", "8",
      "--offload-size", "500Gi"], "largest pool that fits"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-memory", "512Gi", "--gpus-per-node", "0"], "0 GPUs"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-memory", "lots", "--gpus-per-node", "8"],
     "--node-memory"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-memory", "1Ti", "--gpus-per-node", "8",
      "--node-cpus", "many"], "--node-cpus: expected a CPU quantity"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-memory", "1Ti", "--gpus-per-node", "8",
      "--node-cpus", "0"], "--node-cpus: must be more than 0"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-memory", "1Ti", "--gpus-per-node", "8",
      "--node-cpus", "1e999990"], "--node-cpus: must be more than 0 and at most int64 millicores"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-cpus", "16"], "give --node-memory"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    out = spillway("plan", *args)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_node_cpus_set_the_api_servers():
    base = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-memory", "1Ti", "--gpus-per-node", "1"]
    planned = json.loads(spillway(*base, "--node-cpus", "15900m", "-o", "json").stdout)
    assert planned["engine"]["api_servers"] == 4
    assert planned["vllm"]["args"][-2:] == [api.FLAG_API_SERVER_COUNT, "4"]
    text = spillway(*base, "--node-cpus", "8", "--no-offload")
    assert text.returncode == 0, text.stderr
    assert "API servers  2: 8 CPU cores per replica" in text.stdout and f"{api.FLAG_API_SERVER_COUNT} 2" in text.stdout
    unknown = json.loads(spillway(*base, "-o", "json").stdout)
    assert unknown["engine"]["api_servers"] == 1 and api.FLAG_API_SERVER_COUNT not in unknown["vllm"]["args"]


def test_malformed_json_exits_2(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"architectures": [')
    out = spillway("plan", "--model-config", str(bad))
    assert out.returncode == 2 and "malformed JSON" in out.stderr


def test_plan_from_args_is_what_the_command_prints():
    """bench/gpu takes its plans from plan_from_args(); they are the command's own, byte for byte."""
    import argparse

    from spillway.commands import plan as plan_command

    argv = ["plan", "--model", "Qwen/Qwen3-32B", "--tensor-parallel-size", "2", "--node-memory", "1Ti",
            "--gpus-per-node", "8", "--layout", "default", "--connector", "native", "--eviction-policy", "arc",
            "-o", "json"]
    parser = argparse.ArgumentParser(prog="spillway")
    plan_command.add_parser(parser.add_subparsers(dest="command"))
    printed = spillway(*argv)
    assert printed.returncode == 0, printed.stderr
    assert plan_command.plan_from_args(parser.parse_args(argv)).to_json() + "\n" == printed.stdout


@pytest.mark.parametrize("flag, kind", [("--layout", Layout), ("--connector", Connector),
                                        ("--eviction-policy", EvictionPolicy)])
def test_choices_come_from_the_core_enums(flag, kind):
    out = spillway("plan", "--model", "Qwen/Qwen3-32B", flag, "bogus")
    assert out.returncode == 2 and "invalid choice: 'bogus'" in out.stderr
    offered = out.stderr.split("choose from", 1)[1]
    assert sorted(w.strip(" '()\n") for w in offered.split(",")) == sorted(choices(kind))


def test_node_hugepages_put_the_pool_on_them_and_say_so():
    out = spillway("plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-memory", "512Gi",
                   "--gpus-per-node", "8", "--offload-size", "32Gi", "--node-hugepages", "320Gi")
    assert out.returncode == 0, out.stderr
    assert "2 MiB huge pages: 32.00 GiB of node" in out.stdout
    assert "hugepages-2Mi" in out.stdout and "(request = limit: the pool)" in out.stdout
    out = spillway("plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--node-memory", "512Gi",
                   "--gpus-per-node", "8", "--offload-size", "32Gi", "--node-hugepages", "320Gi", "-o", "json")
    plan = json.loads(out.stdout)
    assert plan["pod"]["hugepages_bytes"] == 32 * 2**30 and plan["pages"]["huge_pages"]
    assert plan["vllm"]["env"][api.ENV_POOL_HUGEPAGES_DIR]


def test_auto_says_which_share_sized_the_pool():
    base = ("plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpus-per-node", "8")
    memory = spillway(*base, "--node-memory", "2Ti", "--node-hugepages", "400Gi")
    assert memory.returncode == 0, memory.stderr
    assert "pages        4 KiB pages: auto sized the pool from the replica's memory share, 227.73 GiB; its 50.00 GiB" \
        in memory.stdout
    huge = spillway(*base, "--node-memory", "400Gi", "--node-hugepages", "1600Gi")
    assert huge.returncode == 0, huge.stderr
    assert "size         200.0 GiB (--kv-offloading-size 200.000 GiB, asked: auto)" in huge.stdout
    assert "hugepages-2Mi    200.0 GiB (request = limit: the pool)" in huge.stdout


def test_a_size_only_the_huge_pages_hold_is_planned_on_them_and_one_neither_holds_names_both():
    base = ("plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpus-per-node", "8", "--node-memory", "400Gi",
            "--node-hugepages", "1600Gi")
    huge = spillway(*base, "--offload-size", "200Gi")
    assert huge.returncode == 0, huge.stderr
    assert "size         200.0 GiB (--kv-offloading-size 200.000 GiB, asked: 200Gi)" in huge.stdout
    assert "hugepages-2Mi    200.0 GiB (request = limit: the pool)" in huge.stdout
    assert "more than the 32.41 GiB its memory share holds" in huge.stdout
    node = json.loads(spillway(*base, "--offload-size", "200Gi", "-o", "json").stdout)["node"]
    assert node["max_pool_bytes"] == node["max_hugepage_pool_bytes"] == 200 * 2**30
    assert round(node["max_memory_pool_bytes"] / 2**30, 2) == 32.41
    neither = spillway(*base, "--offload-size", "500Gi")
    assert neither.returncode == 2 and not neither.stdout
    assert neither.stderr.strip().endswith("the largest pool that fits is 32.41 GiB in memory and 200.0 GiB on its "
                                           "hugepages-2Mi (200.0 GiB per replica, whole 2 MiB pages of rows)")
