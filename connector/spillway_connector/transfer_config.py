"""The --kv-transfer-config object that turns on KV offloading, built in this one place (dependency-free).

The keys are vLLM's KVTransferConfig fields and the extra-config keys its OffloadingConnector reads
(vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py, vllm/v1/kv_offload/cpu.py).
The operator's planner (through spillway.core.vllm_api, which re-exports these names) and the CPU-platform
backend (host_backend.py) both build the object with `kv_transfer_config()`.
"""
from __future__ import annotations

import json
from typing import Any

FLAG_KV_TRANSFER_CONFIG = "--kv-transfer-config"

# Keys of the --kv-transfer-config JSON object.
KV_CONNECTOR_KEY = "kv_connector"
KV_CONNECTOR_MODULE_PATH_KEY = "kv_connector_module_path"
KV_ROLE_KEY = "kv_role"
KV_ROLE_BOTH = "kv_both"
KV_CONNECTOR_EXTRA_CONFIG_KEY = "kv_connector_extra_config"

# Keys of kv_connector_extra_config.
EXTRA_CPU_BYTES = "cpu_bytes_to_use"
EXTRA_EVICTION_POLICY = "eviction_policy"
EXTRA_OFFLOAD_BLOCK_SIZE = "block_size"
# Spillway's own (vLLM ignores it): a CPU hit shorter than this many tokens is recomputed, not loaded (0: never).
EXTRA_RECOMPUTE_BELOW_TOKENS = "spillway_recompute_below_tokens"
# Spillway's own (vLLM ignores it): the bound in bytes the connector's evictor keeps the "fs" tier under.
EXTRA_DISK_TIER_BYTES = "spillway_disk_tier_bytes"
# ... and the disk read rate (GB/s) below which a disk hit costs more than recompute, exported for the alerts.
EXTRA_DISK_TIER_BREAK_EVEN_GBPS = "spillway_disk_tier_break_even_gbps"
# ... and what the operator knows of the model's identity (its revision): part of the tier's namespace digest.
EXTRA_MODEL_IDENTITY = "spillway_model_identity"
EXTRA_SECONDARY_TIERS = "secondary_tiers"  # vllm/v1/kv_offload/tiering/spec.py (0.32+)
TIERING_OFFLOADING_SPEC = "TieringOffloadingSpec"  # registered in vllm/v1/kv_offload/factory.py (0.32+)
EXTRA_SPEC_NAME = "spec_name"  # out-of-tree OffloadingSpec class ...
EXTRA_SPEC_MODULE_PATH = "spec_module_path"  # ... and its module

# Connector classes.
OFFLOADING_CONNECTOR = "OffloadingConnector"  # vLLM's own
SPILLWAY_CONNECTOR = "SpillwayOffloadingConnector"
SPILLWAY_CONNECTOR_MODULE = "spillway_connector.connector"
# Spillway's offloading specs (spec.py): vLLM's, with the connector's probes. kv_transfer_config names them for
# SPILLWAY_CONNECTOR in place of vLLM's CPUOffloadingSpec (the default) and TieringOffloadingSpec.
SPILLWAY_OFFLOADING_SPEC = "SpillwayOffloadingSpec"
SPILLWAY_TIERING_OFFLOADING_SPEC = "SpillwayTieringOffloadingSpec"
SPILLWAY_SPEC_MODULE = "spillway_connector.spec"
SPILLWAY_SPECS = {None: SPILLWAY_OFFLOADING_SPEC, "CPUOffloadingSpec": SPILLWAY_OFFLOADING_SPEC,
                  TIERING_OFFLOADING_SPEC: SPILLWAY_TIERING_OFFLOADING_SPEC}
# vLLM's scheduler with the in-flight reservation remembered (scheduler.py), for releases before 0.34.
SCHEDULER_CLS = "spillway_connector.scheduler.SpillwayScheduler"
# Host-memory transfer backend for the CPU platform (host_backend.py).
HOST_OFFLOADING_SPEC = "HostOffloadingSpec"
HOST_OFFLOADING_SPEC_MODULE = "spillway_connector.host_backend"


def kv_transfer_config(cpu_bytes: int, eviction_policy: str = "lru", *, connector: str = SPILLWAY_CONNECTOR,
                       offload_block_size: int | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The object for a `cpu_bytes` CPU pool served by `connector` (SPILLWAY_CONNECTOR or OFFLOADING_CONNECTOR).
    SPILLWAY_CONNECTOR runs on Spillway's subclass of the spec vLLM would pick (SPILLWAY_SPECS), which carries the
    connector's probes; an out-of-tree spec (spec_module_path given) is kept as is."""
    extra_config: dict[str, Any] = {EXTRA_CPU_BYTES: int(cpu_bytes), EXTRA_EVICTION_POLICY: eviction_policy}
    if offload_block_size is not None:
        extra_config[EXTRA_OFFLOAD_BLOCK_SIZE] = offload_block_size
    config: dict[str, Any] = {
        KV_CONNECTOR_KEY: connector,
        KV_ROLE_KEY: KV_ROLE_BOTH,
        KV_CONNECTOR_EXTRA_CONFIG_KEY: {**extra_config, **(extra or {})},
    }
    if connector == SPILLWAY_CONNECTOR:
        config[KV_CONNECTOR_MODULE_PATH_KEY] = SPILLWAY_CONNECTOR_MODULE
        extra_config = config[KV_CONNECTOR_EXTRA_CONFIG_KEY]
        if EXTRA_SPEC_MODULE_PATH not in extra_config and extra_config.get(EXTRA_SPEC_NAME) in SPILLWAY_SPECS:
            extra_config[EXTRA_SPEC_NAME] = SPILLWAY_SPECS[extra_config.get(EXTRA_SPEC_NAME)]
            extra_config[EXTRA_SPEC_MODULE_PATH] = SPILLWAY_SPEC_MODULE
    return config


def flag_value(config: dict[str, Any]) -> str:
    """The object as the flag's value: compact JSON with sorted keys, so equal configs render equal."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


# The "fs" secondary tier's keys (vllm/v1/kv_offload/tiering/fs/manager.py FileSystemTierManager, 0.32 and 0.33).
FS_TIER_TYPE = "fs"
FS_ROOT_DIR = "root_dir"
FS_READ_THREADS = "n_read_threads"
FS_WRITE_THREADS = "n_write_threads"


def disk_tier_extra(root_dir: str, bound_bytes: int, read_threads: int, write_threads: int,
                    spec_name: str = TIERING_OFFLOADING_SPEC, spec_module_path: str | None = None,
                    break_even_gbps: float | None = None) -> dict[str, Any]:
    """kv_connector_extra_config keys that put vLLM's fs tier under the CPU pool, bounded by the connector."""
    extra: dict[str, Any] = {
        EXTRA_SPEC_NAME: spec_name,
        EXTRA_SECONDARY_TIERS: [{"type": FS_TIER_TYPE, FS_ROOT_DIR: root_dir, FS_READ_THREADS: int(read_threads),
                                 FS_WRITE_THREADS: int(write_threads)}],
        EXTRA_DISK_TIER_BYTES: int(bound_bytes),
    }
    if spec_module_path is not None:
        extra[EXTRA_SPEC_MODULE_PATH] = spec_module_path
    if break_even_gbps is not None:
        extra[EXTRA_DISK_TIER_BREAK_EVEN_GBPS] = round(float(break_even_gbps), 3)
    return extra
