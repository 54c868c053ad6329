"""Parse vLLM command lines with vLLM's own parser (the CPU build in the test environment) and print
what each sets among the values the plan decides. stdin: a JSON list of argument lists (after
`vllm serve`); stdout: a JSON list, one object (or {"error": ...}) per list."""
from __future__ import annotations

import contextlib
import io
import json
import sys

PLANNED = ("model_tag", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
           "data_parallel_size_local", "decode_context_parallel_size", "prefill_context_parallel_size",
           "nnodes", "block_size", "kv_cache_dtype", "kv_offloading_size", "kv_offloading_backend",
           "cpu_offload_gb", "offload_backend", "hf_config_path", "host", "port", "revision",
           "served_model_name", "model", "api_server_count", "dtype", "hf_overrides", "config_format",
           "speculative_config", "mamba_cache_dtype", "mamba_ssm_cache_dtype", "disable_hybrid_kv_cache_manager",
           "enable_sleep_mode", "mm_processor_cache_gb", "max_model_len")


def _plain(value):
    if hasattr(value, "kv_connector_extra_config"):  # KVTransferConfig: its engine_id is random
        return {"connector": value.kv_connector, "role": value.kv_role, "extra": value.kv_connector_extra_config}
    return value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else repr(value)


def main() -> None:
    with contextlib.redirect_stderr(io.StringIO()):
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    out = []
    for argv in json.load(sys.stdin):
        parser = make_arg_parser(FlexibleArgumentParser())
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                ns = parser.parse_args(argv)
        except (SystemExit, Exception) as exc:  # noqa: BLE001 - reported back to the test
            out.append({"error": repr(exc)})
            continue
        seen = vars(ns)
        out.append({k: _plain(seen.get(k)) for k in PLANNED} | {"kv_transfer_config": _plain(seen.get("kv_transfer_config"))})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
