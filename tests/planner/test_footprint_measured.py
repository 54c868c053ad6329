"""The footprint rule against the H200 measurements it cites (bench/footprint/results/footprint.json):
for every measured vLLM 0.26 pool the rule predicts the pool tensors vLLM pinned (count, row, rows) and a cost
at least the shared memory the kernel counted, and at most half a GiB more."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from spillway.adapters.model_config import catalog_config
from spillway.core.footprint import footprint, pinned_tensors
from spillway.core.groups import MLA, kv_groups

REPO = Path(__file__).resolve().parents[2]
MEASURED = json.loads((REPO / "bench/footprint/results/footprint.json").read_text())["cases"]
CONFIGS = {
    "llama-3.1-8b": catalog_config("meta-llama/Llama-3.1-8B-Instruct"),
    "deepseek-v2-lite-dense": json.loads((REPO / "bench/gpu/deepseek-v2-lite-dense/config.json").read_text()),
    "nemotron-h-8b": json.loads((REPO / "bench/gpu/nemotron-h-8b/config.json").read_text()),
}
CASES = [case for case in MEASURED if case.get("rc") == 0 and case.get("model") in CONFIGS]
RELEASE = (0, 26)


@pytest.mark.parametrize("case", CASES, ids=[case["case"] for case in CASES])
def test_the_rule_covers_what_vllm_026_pinned(case):
    groups = kv_groups(CONFIGS[case["model"]], RELEASE, block_size=16)
    # vLLM 0.26's auto runner was V2 for MLA, V1 for the Mamba hybrid (footprint.md); V1 gives the cross-layer block
    cross_layer = case["runner_env"] == "v1" or (case["runner_env"] == "auto" and len(groups.groups) > 1)
    counts = pinned_tensors(RELEASE, len(groups.groups) == 1, cross_layer, groups.groups[0].kind == MLA,
                            sum(g.layers for g in groups.groups), max(g.layers for g in groups.groups))
    assert case["tensors"] in counts
    chunk = groups.chunk_bytes()
    assert chunk == case["tensor_row_bytes"] * case["tensors"]  # one row of every pool tensor
    assert case["asked_bytes"] // chunk == case["tensor_rows"]
    cost = footprint(RELEASE, case["tensor_rows"] * chunk, 1, counts)
    measured = max(case["d_meminfo_Shmem"], case["cgroup_pinned"]["shmem"])
    assert measured <= cost.charged_bytes <= measured + 2**29
    assert cost.shm_bytes == case["d_dev_shm_used"] == 0  # 0.26's pinned pool is not in /dev/shm
