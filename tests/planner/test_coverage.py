"""Every architecture vLLM 0.33 and 0.34 serve by name against vLLM's own answer (tests/planner/coverage/truth.json, made by
`make coverage-truth`): no engine runs here, the truth is data. The recorder that built it is checked against a
real engine in test_groups_vllm.py."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from spillway.adapters.model_config import filled_config
from spillway.core.errors import ModelGeometryUnknown
from spillway.core.geometry import geometry_from_config
from spillway.core.model_facts import UNMODELLED
from spillway.core.vllm_coverage import REFUSED, SIZED

sys.path.insert(0, str(Path(__file__).resolve().parent / "coverage"))
from compare import (
    RELEASES,
    entry_of,
    fallback_statuses,
    load_truth,
    new_statuses,
    planner_answer,
    planner_config,
    statuses,
)
from render import DOC, MODULE, doc_text, module_text

ROWS = {s.arch: s for s in statuses()}
FALLBACK = {s.arch: s for s in fallback_statuses()}  # the causal LMs vLLM serves through the backend's fallback
NEW = {s.arch: s for s in new_statuses()}  # new in a later release, recorded with its own code
RECORDED = sorted(a for a, s in ROWS.items() if s.vllm_offloads)
LATER = {version: {s.arch: s for s in statuses(version)} for version in RELEASES if version != "0.33"}
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


@pytest.mark.parametrize("version", sorted(LATER))
def test_no_architecture_is_mis_sized_on_a_later_release(version):
    """0.34's own sizing on the recorded layers: every architecture the planner sizes for 0.33 it sizes the same
    for 0.34 where 0.34 still serves it, and none differs from 0.34's answer."""
    rows = LATER[version]
    assert [a for a, s in rows.items() if s.status == "mis-sized"] == []
    assert sorted(a for a in RECORDED if a in rows and ROWS[a].status == "sized" and rows[a].status != "sized") == []


@pytest.mark.parametrize("version", sorted(LATER))
def test_a_later_release_is_answered_from_its_own_model_code(version):
    """A later release's answer rests on the layer specs its own model code builds (generate.py add_release); 0.33's
    stand in only where that code does not build on the CPU engine, each saying why."""
    origins = {a: e["releases"][version + ".0"].get("specs_from", "") for a, e in load_truth()["architectures"].items()
               if "vllm" in e.get("releases", {}).get(version + ".0", {})}
    own = [a for a, o in origins.items() if o == f"{version} model code"]
    assert len(own) >= 230, len(own)  # 238 of 247 recorded
    assert all(o == f"{version} model code" or "does not build on the CPU engine: " in o for o in origins.values())


def test_the_registries_are_counted_per_release():
    truth = load_truth()
    assert set(ROWS) | set(FALLBACK) == set(truth["architectures"]) and not set(ROWS) & set(FALLBACK)
    for version, rows in LATER.items():
        assert set(rows) == set(truth["registries"][version + ".0"])
    # the Transformers-backend architectures are rows of their own (vLLM serves them by name)
    assert {s.registry for s in ROWS.values()} == {"text-generation", "multimodal", "transformers-backend"}


RECURRENT_ONLY = ["MambaForCausalLM", "Mamba2ForCausalLM", "FalconMambaForCausalLM"]


@pytest.mark.parametrize("arch", RECURRENT_ONLY)
def test_a_recurrent_only_model_plans_as_vllm_offloads_it(arch):
    """vLLM offloads a model of Mamba layers only with prefix caching on (its truth was taken so, at the block a
    plan renders): the plan sizes its one state group as vLLM does and renders that setting."""
    from spillway.core.planner import NodeFacts, ServingRequest, plan

    entry = load_truth()["architectures"][arch]
    assert entry["requested_block_size"] == 64 and ROWS[arch].status == "sized"
    # the state dtype of the engine that recorded the truth (compare.planner_config)
    made = plan(geometry_from_config(planner_config(entry), arch), ServingRequest(block_size=64),
                NodeFacts(2 << 40, 8))
    assert made.groups is not None and [g.kind for g in made.groups.groups] == ["mamba"]
    assert made.layout.block_bytes == ROWS[arch].theirs["row"]
    assert "--enable-prefix-caching" in made.args


def test_the_issue_families_plan_and_agree_with_vllm():
    assert {arch: ROWS[arch].status for arch in FAMILIES} == dict.fromkeys(FAMILIES, "sized")


def test_nothing_is_sized_without_vllms_answer():
    for arch in SIZED:
        assert {**ROWS, **NEW, **FALLBACK}[arch].status == "sized" and "vllm" in entry_of(arch)
    for arch, reason in REFUSED.items():
        config = entry_of(arch).get("config")
        if config is None:
            continue
        with pytest.raises(ModelGeometryUnknown):
            geometry_from_config(config, arch)
        assert reason


SHIPPED = sorted(a for a, e in load_truth()["architectures"].items() if "shipped" in e)


def test_the_shipped_forms_cover_the_configs_transformers_builds():
    assert len(SHIPPED) >= 150  # 171 of the recorded configs are built by a transformers config class


@pytest.mark.parametrize("arch", SHIPPED)
def test_a_config_as_shipped_sizes_as_vllm_sizes_it(arch):
    """The config without every field transformers fills (shipped.py), filled as the planner fills a user's
    config.json, gets vLLM's answer: a default the reader misses fails here."""
    truth = load_truth()
    entry = truth["architectures"][arch]
    row = {**ROWS, **FALLBACK}[arch]
    filled = {**entry, "config": dict(filled_config(entry["shipped"], arch))}  # (a recorded language model's)
    if row.status != "sized":
        return
    assert planner_answer(filled, arch, truth["pool_bytes"], truth["max_model_len"]) == row.theirs


def test_a_fallback_architecture_the_reading_gets_wrong_is_refused():
    """Reading the layers' attention types alone mis-sizes some fallback architectures (a differing answer is
    recorded for them): each of those, and each without an answer, is refused by the geometry."""
    assert {a for a, s in FALLBACK.items() if s.status == "mis-sized"} <= set(REFUSED)
    assert {a for a, s in FALLBACK.items() if s.status != "sized"} <= set(REFUSED)


@pytest.mark.parametrize("arch", sorted(a for a, s in NEW.items() if s.vllm_offloads))
def test_a_new_architecture_is_sized_as_its_release_sizes_it(arch):
    assert NEW[arch].status == "sized" and NEW[arch].ours == NEW[arch].theirs


def test_the_coverage_table_and_module_are_current():
    rows = list(ROWS.values()) + list(NEW.values()) + list(FALLBACK.values())
    assert MODULE.read_text() == module_text(rows), "python tests/planner/coverage/render.py"
    assert DOC.read_text() == doc_text(rows), "python tests/planner/coverage/render.py"


@pytest.mark.parametrize("change", [{"kv_source_layers": [0, 0]}, {"index_sharing": ["full", "shared"]},
                                    {"fp8_kv_cache": True}])
def test_mistral_large_4_is_sized_only_where_every_layer_keeps_its_own_caches(change):
    """The recorded Mistral Large 4 (every layer its own latent and indexer keys) is sized as vLLM 0.34 sizes it;
    a layer reading another's latent or top-k keeps no cache, and the fp8 latent is another row: not sized."""
    entry = entry_of("MistralLarge4ForCausalLM")
    assert NEW["MistralLarge4ForCausalLM"].status == "sized"
    config = {**entry["config"], "num_hidden_layers": 2, **change}
    with pytest.raises(ModelGeometryUnknown, match="Mistral Large 4"):
        geometry_from_config(config, "MistralLarge4ForCausalLM")


@pytest.mark.parametrize("arch", ["Kolibri1ForCausalLM", "NanbeigeForCausalLM"])
def test_a_checkpoint_of_its_own_code_is_refused_as_vllm_refuses_it(arch):
    """transformers ships neither the class nor the model type: vLLM's Transformers backend builds it from the
    checkpoint's code, which vLLM's config loader refuses to run without --trust-remote-code (a plan never renders
    it); the planner quotes that refusal, on both releases."""
    from configs import REMOTE_CODE
    from transformers import CONFIG_MAPPING

    config = entry_of(arch)["config"]
    assert config["model_type"] == REMOTE_CODE[arch] not in CONFIG_MAPPING and config["auto_map"]
    for rows in (ROWS, *LATER.values()):
        assert rows[arch].vllm_offloads is False and "trust_remote_code=True" in rows[arch].vllm_refusal
        assert rows[arch].vllm_refusal.endswith("(vllm/transformers_utils/config.py)")
    with pytest.raises(ModelGeometryUnknown, match="trust_remote_code=True"):
        geometry_from_config(config, arch)
