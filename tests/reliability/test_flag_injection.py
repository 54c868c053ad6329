"""Spec fields that reach vLLM's command line as values (model, revision, servedModelName) against vLLM's own
parser: a flag-shaped value would be read as a flag (`model: --cpu-offload-gb=900` sets the weight offload
and loads no model), so each is refused with a one-line error, or what vLLM parses is exactly the value given.
extraArgs that change what was sized without being a planned value (the KV dtype through --dtype, config
overrides, a draft model, Mamba state dtypes, vLLM's KV groups, host memory) are refused in every spelling;
--max-model-len is planned for."""
from __future__ import annotations

import pytest
from harness import container_args, modelserver, one_error_line, parse_with_vllm, render
from test_extra_args import _check
from test_model_config import LLAMA

FLAG_SHAPED = ["--cpu-offload-gb=900", "-tp=8", "--kv_transfer_config.x=1", " --port=1"]
FIELDS = {"model": "model_tag", "revision": "revision", "servedModelName": "served_model_name"}


def _with(field: str, value: str) -> dict:
    body = modelserver(**{field: value})
    if field == "model":
        body["spec"]["modelConfig"] = {"inline": dict(LLAMA)}
    return body


@pytest.mark.parametrize("field", FIELDS)
def test_flag_shaped_argv_values_never_reach_vllm_as_flags(tmp_path, field):
    accepted, refused = {}, []
    for value in FLAG_SHAPED:
        done = render(tmp_path, _with(field, value))
        if done.returncode == 0:
            accepted[value] = container_args(done)
        else:
            refused.append(done)
    parsed = parse_with_vllm(list(accepted.values()))
    misread = {}
    for (value, _), seen in zip(accepted.items(), parsed):
        got = seen.get(FIELDS[field]) if "error" not in seen else seen
        want = [value] if field == "servedModelName" else value
        if got != want:
            misread[value] = got
    assert not misread, f"spec.{field} values vLLM reads as something else: {misread}"
    for done in refused:
        one_error_line(done, f"spec.{field}", "flag")


def test_plain_argv_values_still_pass(tmp_path):
    body = modelserver(revision="refs/pr/12", servedModelName="llama-8b-chat")
    parsed, = parse_with_vllm([container_args(render(tmp_path, body))])
    assert (parsed["model_tag"], parsed["revision"], parsed["served_model_name"]) == \
        (body["spec"]["model"], "refs/pr/12", ["llama-8b-chat"])


GEOMETRY = {
    "dtype": ["--dtype=float32"],
    "dtype-abbreviated": ["--dty", "float16"],
    "hf-overrides": ["--hf-overrides", '{"num_key_value_heads": 64}'],
    "hf-overrides-dotted": ["--hf_overrides.num_hidden_layers=200"],
    "config-format": ["--config-format", "mistral"],
    "speculative-config": ["--speculative-config", '{"model": "x", "num_speculative_tokens": 4}'],
    "speculative-short": ["-sc", '{"method": "ngram", "num_speculative_tokens": 4}'],
    "mamba-ssm-dtype": ["--mamba_ssm_cache_dtype=float16"],
    "mamba-dtype": ["--mamba-cache-dtype", "float32"],
    "hybrid-manager": ["--disable-hybrid-kv-cache-manager"],
    "sleep-mode": ["--enable-sleep-mode"],
    "mm-cache-large": ["--mm-processor-cache-gb=1000"],
    "mm-cache-underscore": ["--mm_processor_cache_gb", "64"],
    "mm-cache-abbreviated": ["--mm-processor-cache-g", "5"],
}


def test_geometry_and_host_memory_flags_are_refused(tmp_path, baseline):
    _check(tmp_path, baseline, GEOMETRY)


def test_a_smaller_mm_processor_cache_passes(tmp_path):
    extra = ["--mm-processor-cache-gb", "1.5"]
    args = container_args(render(tmp_path, modelserver(extraArgs=extra)))
    parsed, = parse_with_vllm([args])
    assert parsed["mm_processor_cache_gb"] == 1.5


def test_a_max_model_len_vllm_would_refuse_is_refused(tmp_path):
    for value in ("0", "8.5K"):
        one_error_line(render(tmp_path, modelserver(extraArgs=["--max-model-len", value])), "--max-model-len")


def test_max_model_len_reaches_vllm_as_planned(tmp_path):
    cases = {"8k": 8000, "8K": 8192, "auto": -1}
    argvs = [container_args(render(tmp_path, modelserver(extraArgs=[f"--max_model_len={value}"]))) for value in cases]
    assert [parsed["max_model_len"] for parsed in parse_with_vllm(argvs)] == list(cases.values())
