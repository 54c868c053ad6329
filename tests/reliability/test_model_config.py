"""Malformed config.json files and degenerate block sizes: one clear error each, never a traceback,
never an unbounded read."""
from __future__ import annotations

import json

import pytest
from harness import LLAMA_8B, modelserver, one_error_line, render, spillway

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "torch_dtype": "bfloat16"}


def _plan(path) -> object:
    # 2 GiB of address space: an unbounded read fails fast, not the machine
    return spillway("plan", "--model-config", str(path), "--node-memory", "2Ti", "--gpus-per-node", "8",
                    timeout=60, rlimits={"RLIMIT_AS": 2 << 30})


BROKEN = {
    "not-utf8": b'{"architectures": ["Llama\xff\xfeForCausalLM"]}',
    "utf16": json.dumps(LLAMA).encode("utf-16"),
    "deep-nesting": b"[" * 100_000 + b"]" * 100_000,
    "deep-object": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "nested-architectures": json.dumps({**LLAMA, "architectures": [["LlamaForCausalLM"]]}).encode(),
    "architectures-object": json.dumps({**LLAMA, "architectures": [{"x": 1}]}).encode(),
    "bool-head-dim": json.dumps({**LLAMA, "head_dim": True}).encode(),
    "not-an-object": b"[1, 2, 3]",
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_config_file_is_one_error(tmp_path, case):
    path = tmp_path / "config.json"
    path.write_bytes(BROKEN[case])
    one_error_line(_plan(path))


def test_an_endless_file_is_not_read_without_bound():
    one_error_line(_plan("/dev/zero"), "/dev/zero")


@pytest.mark.parametrize("architectures", [[["LlamaForCausalLM"]], [{"name": "LlamaForCausalLM"}], "Llama"])
def test_inline_model_config_with_odd_architectures_is_one_error(tmp_path, architectures):
    body = modelserver(model="acme/odd", modelConfig={"inline": {**LLAMA, "architectures": architectures}})
    one_error_line(render(tmp_path, body), "architectures")


def test_block_size_zero_is_one_error():
    one_error_line(spillway("plan", "--model", LLAMA_8B, "--block-size", "0", "--offload-block-size", "0",
                            "--node-memory", "2Ti", "--gpus-per-node", "8"), "block size")


def test_offload_block_size_zero_is_one_error():
    one_error_line(spillway("plan", "--model", LLAMA_8B, "--offload-block-size", "0",
                            "--node-memory", "2Ti", "--gpus-per-node", "8"), "block size")


def test_unknown_spec_fields_are_refused_by_render(tmp_path):
    # The API server prunes unknown fields, so a typo would silently fall back to a default.
    one_error_line(render(tmp_path, modelserver(offload={"sise": "200Gi"})), "sise")
    one_error_line(render(tmp_path, modelserver(tensorParalelSize=2)), "tensorParalelSize")


def test_the_parser_knows_exactly_the_crds_spec_fields():
    from spillway.controller.spec_checks import OFFLOAD_FIELDS, SPEC_FIELDS
    from support.crd_schema import version_schema

    spec = version_schema()["properties"]["spec"]["properties"]
    assert set(spec) == SPEC_FIELDS
    assert set(spec["offload"]["properties"]) == OFFLOAD_FIELDS
