"""The GPU engine sets (bench/<question>/engines*.json; bench/<question>/results/*engines*.json as run) plan and
render here, before a device call spends minutes on them.

A GPU session has 30 minutes; an engine whose plan flags the planner refuses, or whose connector setting vLLM does
not read, would cost a machine start and a call to find out. serve_bench.py builds each engine's argv the way these
tests do (spillway_plan, then extra_args and connector_extra_config).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "bench" / "gpu"
sys.path.insert(0, str(GPU))

import serve_bench  # bench/gpu is not a package: found through sys.path above
from spillway.core import vllm_api as api
from spillway_connector.connector import ShortHitFloor
from spillway_connector.transfer_config import EXTRA_RECOMPUTE_BELOW_TOKENS
from support.tools import skip_or_fail
from support.vllm_trees import vllm_tree

NODE_MEMORY = "131961788Ki"  # the H200 machine's MemTotal, 125 GiB (bench/headline/README.md)
# the sets a GPU call runs, and the sets earlier calls ran (beside their results): every one still plans
BENCH = REPO / "bench"
SPECS = sorted(BENCH.glob("*/engines*.json")) + sorted(BENCH.glob("*/results/*engines*.json"))
ENGINES = [pytest.param(path, engine, id=f"{path.relative_to(BENCH)}:{engine['name']}")
           for path in SPECS for engine in json.loads(path.read_text())["engines"]]


def engine_args(spec: dict, engine: dict) -> tuple[dict, list[str]]:
    plan, args, _ = serve_bench.engine_argv(spec["common"], engine, NODE_MEMORY, 16)
    return plan, args


def kv_transfer_config(args: list[str]) -> dict:
    return json.loads(args[args.index(api.FLAG_KV_TRANSFER_CONFIG) + 1])


def test_there_are_engine_sets():
    assert len(ENGINES) >= 10, [p.name for p in SPECS]


@pytest.mark.parametrize("path, engine", ENGINES)
def test_every_engine_plans(path, engine):
    spec = json.loads(path.read_text())
    plan, args = engine_args(spec, engine)
    assert plan["vllm"]["args"], plan
    if "stock_args" in engine:  # the peer: vLLM's own flags only, nothing of the plan's
        assert args == engine["stock_args"] and not plan["vllm"]["env"] and not engine.get("plan_flags"), engine
        assert not {"vllm_patches", "connector_extra_config", "extra_args"} & set(engine), engine
        assert not serve_bench.wants_plugin(engine), f"{engine['name']}: a stock engine runs without our plugin"
    native = api.FLAG_KV_OFFLOADING_SIZE in args  # --connector native: vLLM's own flags, no transfer config
    assert args.count(api.FLAG_KV_TRANSFER_CONFIG) == (plan.get("pool") is not None and not native), args
    names = [e["name"] for e in spec["engines"]]
    assert names.count(engine["name"]) == 1, f"{path.name}: {engine['name']} twice (--only picks by name)"
    if engine.get("vllm_patches") or engine.get("spillway_plugin") or engine.get("connector_extra_config"):
        # both act on the offload path; on a no-offload engine they would measure nothing
        assert plan.get("pool") is not None, f"{engine['name']}: offload settings on an engine without a pool"


@pytest.mark.parametrize("path, engine", [p for p in ENGINES if p.values[1].get("connector_extra_config")])
def test_connector_settings_join_the_planned_ones(path, engine):
    spec = json.loads(path.read_text())
    plan, args = engine_args(spec, engine)
    planned = kv_transfer_config(plan["vllm"]["args"])
    merged = kv_transfer_config(args)
    extra = merged[api.KV_CONNECTOR_EXTRA_CONFIG_KEY]
    assert extra == {**planned[api.KV_CONNECTOR_EXTRA_CONFIG_KEY], **engine["connector_extra_config"]}
    assert {k: v for k, v in merged.items() if k != api.KV_CONNECTOR_EXTRA_CONFIG_KEY} == \
        {k: v for k, v in planned.items() if k != api.KV_CONNECTOR_EXTRA_CONFIG_KEY}
    assert args.count(api.FLAG_KV_TRANSFER_CONFIG) == 1


def test_connector_settings_refuse_an_engine_without_a_connector():
    planned = serve_bench.spillway_plan("meta-llama/Llama-3.1-8B-Instruct", NODE_MEMORY,
                                        ["--vllm-version", "0.33.0", "--no-offload"])
    with pytest.raises(ValueError, match="no connector"):
        serve_bench.with_connector_extra_config(planned["plan"]["vllm"]["args"], {"sync_load_budget_bytes": 1})


@pytest.mark.parametrize("path, engine", [p for p in ENGINES if p.values[1].get("connector_extra_config")])
def test_connector_settings_are_read_by_that_vllm(path, engine):
    """Each key the bench adds is one the engine's vLLM release reads from kv_connector_extra_config, or the
    Spillway connector's own, with a value the connector accepts."""
    extra = dict(engine["connector_extra_config"])
    if EXTRA_RECOMPUTE_BELOW_TOKENS in extra:
        assert ShortHitFloor.from_extra_config(extra).tokens == extra.pop(EXTRA_RECOMPUTE_BELOW_TOKENS)
    if not extra:
        return
    version = engine["plan_flags"][engine["plan_flags"].index("--vllm-version") + 1]
    tree = vllm_tree(version)
    if tree is None:
        skip_or_fail(f"SPILLWAY_VLLM_TREES has no {version} tree (make vllm-src)")
    offloading = tree / "vllm/distributed/kv_transfer/kv_connector/v1/offloading"
    source = "".join(p.read_text() for p in sorted(offloading.glob("*.py")))
    for key in extra:
        assert f'extra_config.get("{key}"' in source, f"vLLM {version} does not read {key}"


@pytest.mark.parametrize("path, engine", [p for p in ENGINES if {"loadtest", "preemption"} & set(p.values[1])])
def test_load_test_arguments_parse(path, engine, capsys):
    """serve_bench.py hands these to `python -m spillway.loadtest`; a typo there is found here, not on the GPU."""
    import argparse

    from spillway.loadtest.cli import add_subcommands

    parser = argparse.ArgumentParser(prog="python -m spillway.loadtest")
    add_subcommands(parser.add_subparsers(dest="loadtest_command", required=True))
    common = ["--endpoint", "http://127.0.0.1:8000", "-o", "out.json", "--progress", "log"]
    for command, key, extra in (("run", "loadtest", ["--no-plot"]), ("preemption", "preemption", [])):
        if key in engine:
            try:
                parser.parse_args([command, *common, *extra, *engine[key]])
            except SystemExit:
                pytest.fail(f"{path.name}:{engine['name']}: {key} arguments: {capsys.readouterr().err.strip()}")


TO_RUN = [p for p in ENGINES if "loadtest" in p.values[1] and p.values[0].parent.name != "results"]


@pytest.mark.parametrize("path, engine", TO_RUN)
def test_ttft_prompts_fit_the_engines_context(path, engine):
    """A TTFT length needs one output token beside it: 32,768 on a 32,768-token engine was refused on the GPU
    (bench/pool-setup, as run). The sets to run, not those that ran."""
    spec = json.loads(path.read_text())
    args = engine["loadtest"]
    if "--ttft-lengths" not in args:
        return
    limit = engine.get("max_model_len", spec["common"].get("max_model_len"))
    lengths = [int(n) for n in args[args.index("--ttft-lengths") + 1].split(",") if n.isdigit()]
    assert limit is None or all(n + 1 <= limit for n in lengths), (lengths, limit)
