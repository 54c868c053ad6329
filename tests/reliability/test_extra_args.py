"""spec.extraArgs against vLLM's own parser: every flag that changes what the plan decides (parallelism,
block size, cache dtype, the offload pool, weight offload to CPU, the model config, host/port, API servers) is refused
however vLLM would accept it (underscores, `=`, dotted sub-keys, short aliases, abbreviations, a config
file); what is left, parsed by vLLM, gives exactly the planned values. Reserved environment stays reserved."""
from __future__ import annotations

import json

import pytest
from harness import container_args, modelserver, one_error_line, parse_with_vllm, render

POOL_5TB = json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": {"cpu_bytes_to_use": 5e12}})

HOSTILE = {
    "underscore-transfer-config": [f"--kv_transfer_config={POOL_5TB}"],
    "dotted-sub-key": ["--kv-transfer-config.kv_connector_extra_config.cpu_bytes_to_use=5000000000000"],
    "dotted-sub-key-underscore": ["--kv_transfer_config.kv_connector_extra_config.cpu_bytes_to_use", "5e12"],
    "underscore-offloading-size": ["--kv_offloading_size=5000"],
    "underscore-tp": ["--tensor_parallel_size=8"],
    "underscore-block-size": ["--block_size=128"],
    "abbreviated-block-size": ["--block", "128"],
    "abbreviated-tp": ["--tensor-parallel", "8"],
    "tp-equals": ["-tp=8"],
    "pp-short": ["-pp", "2"],
    "dp-short": ["-dp", "2"],
    "pp-long": ["--pipeline-parallel-size", "2"],
    "dp-long": ["--data-parallel-size=2"],
    "dp-local": ["--data_parallel_size_local", "2"],
    "decode-context-parallel": ["-dcp", "2"],
    "cpu-offload-gb": ["--cpu-offload-gb", "100"],
    "cpu-offload-gb-underscore": ["--cpu_offload_gb=100"],
    "kv-cache-dtype-underscore": ["--kv_cache_dtype", "fp8"],
    "hf-config-path": ["--hf-config-path", "/tmp/other"],
    "port-underscore": ["--port=9999"],
    "host-underscore": ["--host", "127.0.0.1"],
    "api-server-count-underscore": ["--api_server_count=8"],
    "api-server-count-abbreviated": ["--api-server", "8"],
    "api-server-count-short": ["-asc", "8"],
}


def _check(tmp_path, baseline, cases: dict[str, list[str]]) -> None:
    refused, accepted = {}, {}
    for name, extra in cases.items():
        done = render(tmp_path, modelserver(extraArgs=extra))
        if done.returncode == 0:
            accepted[name] = container_args(done)
        else:
            refused[name] = done
    parsed = parse_with_vllm([baseline, *accepted.values()])
    planned, rest = parsed[0], parsed[1:]
    assert "error" not in planned, planned
    defeated = {name: {k: (planned[k], seen.get(k)) for k in planned if seen.get(k) != planned[k]}
                for name, seen in zip(accepted, rest) if "error" not in seen}
    defeated = {name: diff for name, diff in defeated.items() if diff}
    assert not defeated, f"extraArgs that reach vLLM and change the plan: {defeated}"
    for name, done in refused.items():
        one_error_line(done, "spec.extraArgs")


def test_planned_flags_are_refused_in_every_spelling_vllm_accepts(tmp_path, baseline):
    _check(tmp_path, baseline, HOSTILE)


def test_a_config_file_is_refused(tmp_path, baseline):
    config = tmp_path / "engine.yaml"
    config.write_text("tensor-parallel-size: 8\nkv-offloading-size: 5000\n")
    cases = {"config": ["--config", str(config)], "config-equals": [f"--config={config}"]}
    _check(tmp_path, baseline, cases)
    for extra in cases.values():
        one_error_line(render(tmp_path, modelserver(extraArgs=extra)), "--config")


def test_flags_outside_the_plan_still_pass(tmp_path, baseline):
    allowed = [["--max-model-len", "8192"], ["--max_num_seqs=64"], ["--enable-chunked-prefill"],
               ["--gpu-memory-utilization=0.85"], ["--compilation-config.mode", "0"]]
    for extra in allowed:
        args = container_args(render(tmp_path, modelserver(extraArgs=extra)))
        assert args[-len(extra):] == extra


@pytest.mark.parametrize("env", ["VLLM_SERVER_DEV_MODE", "VLLM_API_KEY", "VLLM_KV_CACHE_LAYOUT",
                                 "VLLM_ALLOW_RUNTIME_LORA_UPDATING"])
def test_reserved_environment_is_refused(tmp_path, env):
    one_error_line(render(tmp_path, modelserver(env=[{"name": env, "value": "1"}])), env)
