"""Table, JSON document, the Node patch and reading the annotation back."""
from __future__ import annotations

import json

import pytest
from spillway.adapters.model_config import resolve_geometry
from spillway.controller.facts import summarize_node, synthetic_node
from spillway.core import k8s_names as names
from spillway.core.planner import OffloadRequest, ServingRequest, plan
from spillway.core.qualification import SCHEMA, Row, node_patch, summary
from spillway.qualify.measure import KiB, MiB
from spillway.qualify.report import document, format_table

META = {"gpu": "NVIDIA H200", "measured_at": "2026-11-30T10:00:00Z"}


def rows():
    out = []
    for b, c2g, g2c in ((64 * KiB, 16.0, 19.0), (1 * MiB, 47.0, 49.0), (4 * MiB, 53.0, 54.0)):
        out += [Row("dma", "c2g", b, 1000, samples=[c2g, c2g - 1, c2g + 1]),
                Row("dma", "g2c", b, 1000, samples=[g2c]),
                Row("dma", "bidir", b, 1000, samples=[c2g + g2c])]
    out.append(Row("kernel", "c2g", 1 * MiB, 1000, error="ImportError: no triton"))
    return out


def test_table_has_one_line_per_block_size_and_a_column_per_method_and_direction():
    text = format_table(rows())
    lines = text.splitlines()
    assert lines[0].split() == ["block", "dma", "G2C", "dma", "C2G", "dma", "bidir", "kernel", "C2G"]
    assert lines[2].startswith("64 KiB") and "16.0 ±12%" in lines[2]
    assert lines[3].startswith("1 MiB") and "failed" in lines[3]
    assert lines[4].startswith("4 MiB") and "107.0" in lines[4]


def test_document_names_the_annotated_figure_and_keeps_every_row():
    doc = document(rows(), META)
    assert doc["schema"] == SCHEMA and doc["gpu"] == "NVIDIA H200"
    # 8 MiB, the default block of Llama-3.1-8B: past the largest size measured, whose rate holds
    assert doc["annotated"] == {"method": "dma", "direction": "c2g", "block_bytes": 8 * MiB, "gbps": 53.0}
    at_2_mib = document(rows(), META, 2 * MiB)["annotated"]
    assert at_2_mib["block_bytes"] == 2 * MiB and at_2_mib["gbps"] == 50.0  # between 1 and 4 MiB in log2
    assert len(doc["rows"]) == 10
    json.dumps(doc)  # serialisable


def test_node_patch_sets_label_rate_and_compact_table():
    patch = node_patch(rows(), META)
    meta = patch["metadata"]
    assert meta["labels"] == {names.LABEL_QUALIFIED: "true"}
    ann = meta["annotations"]
    assert ann[names.ANNOTATION_QUALIFIED_DMA_GBPS] == "53.0"
    assert node_patch(rows(), META, 2 * MiB)["metadata"]["annotations"][names.ANNOTATION_QUALIFIED_DMA_GBPS] == "50.0"
    table = json.loads(ann[names.ANNOTATION_QUALIFICATION])
    assert table["sizes"] == [64 * KiB, 1 * MiB, 4 * MiB]
    assert table["c2g"] == [16.0, 47.0, 53.0] and table["method"] == "dma"
    assert len(ann[names.ANNOTATION_QUALIFICATION]) < 1024  # annotations share a 256 KiB budget per object


def _transfer(annotations: dict, block_size: int = 16, **offload):
    node = synthetic_node("2Ti", 8, name="qualified")
    node["metadata"]["annotations"] = annotations
    facts = summarize_node(node).facts()
    return plan(resolve_geometry("meta-llama/Llama-3.1-8B-Instruct"),
                ServingRequest(block_size=block_size, offload=OffloadRequest(**offload)), facts).transfer


def test_the_operator_reads_the_rate_at_its_own_copy_size_back():
    ann = node_patch(rows(), META)["metadata"]["annotations"]
    assert _transfer(ann).qualified_gbps == pytest.approx(50.0)  # 2 MiB blocks: between 1 and 4 MiB
    assert _transfer(ann, block_size=64).qualified_gbps == 53.0  # 8 MiB blocks: the largest size measured holds
    assert _transfer(ann, layout="default").qualified_gbps == 16.0  # per-layer 64 KiB copies
    assert _transfer({names.ANNOTATION_QUALIFIED_DMA_GBPS: "41.5"}).qualified_gbps == 41.5
    damaged = {names.ANNOTATION_QUALIFICATION: "not json", names.ANNOTATION_QUALIFIED_DMA_GBPS: "x"}
    assert _transfer(damaged) is None
    assert _transfer({}) is None


def test_summary_of_a_vllm_run_prefers_the_vllm_rows():
    rs = rows() + [Row("vllm", "c2g", 2 * MiB, 1000, samples=[51.3])]
    s = summary(rs, {**META, "vllm": "0.26.0"})
    assert s["method"] == "vllm" and s["c2g"] == [51.3] and s["vllm"] == "0.26.0"
