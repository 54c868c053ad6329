"""Every architecture of vLLM 0.33's registry against vLLM's own answer (tests/planner/coverage/truth.json, made by
`make coverage-truth`): no engine runs here, the truth is data. The recorder that built it is checked against a
real engine in test_groups_vllm.py."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from spillway.core.errors import ModelGeometryUnknown
from spillway.core.geometry import geometry_from_config
from spillway.core.model_facts import UNMODELLED
from spillway.core.vllm_coverage import REFUSED, SIZED

sys.path.insert(0, str(Path(__file__).resolve().parent / "coverage"))
from compare import load_truth, statuses
from render import DOC, MODULE, doc_text, module_text

ROWS = {s.arch: s for s in statuses()}
RECORDED = sorted(a for a, s in ROWS.items() if s.vllm_offloads)
# The families vLLM 0.33 offloads that an allow-list once refused or mis-sized.
FAMILIES = ["Cohere2ForCausalLM", "MiniMaxM2ForCausalLM", "Mistral3ForConditionalGeneration",
            "Qwen2_5_VLForConditionalGeneration", "DeepseekV32ForCausalLM", "FalconH1ForCausalLM", "JambaForCausalLM"]


@pytest.mark.parametrize("arch", RECORDED)
def test_the_planner_sizes_what_vllm_offloads_exactly(arch):
    row = ROWS[arch]
    if row.status == "refused":
        # the one way not to size a recorded architecture: a cache the planner names as unmodelled
        assert any(f"model_type {t!r}" in row.reason for t in UNMODELLED), row.reason
        return
    assert row.ours == row.theirs


def test_the_issue_families_plan_and_agree_with_vllm():
    assert {arch: ROWS[arch].status for arch in FAMILIES} == dict.fromkeys(FAMILIES, "sized")


def test_nothing_is_sized_without_vllms_answer():
    truth = load_truth()["architectures"]
    for arch in SIZED:
        assert ROWS[arch].status == "sized" and "vllm" in truth[arch]
    for arch, reason in REFUSED.items():
        config = truth[arch].get("config")
        if config is None:
            continue
        with pytest.raises(ModelGeometryUnknown):
            geometry_from_config(config, arch)
        assert reason


def test_the_coverage_table_and_module_are_current():
    rows = list(ROWS.values())
    assert MODULE.read_text() == module_text(rows), "python tests/planner/coverage/render.py"
    assert DOC.read_text() == doc_text(rows), "python tests/planner/coverage/render.py"
