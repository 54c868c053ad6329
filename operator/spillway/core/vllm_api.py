"""The one place that names vLLM's flags, environment variables, connector classes and metrics.

Everything that writes a vLLM command line (planner, manifests, GPU runs) or reads
vLLM's /metrics (dashboards, alerts, load test) takes the names from here.
"""
from __future__ import annotations

from spillway_connector.transfer_config import (  # noqa: F401 - re-exported: the names live with the builder
    EXTRA_CPU_BYTES,
    EXTRA_EVICTION_POLICY,
    EXTRA_OFFLOAD_BLOCK_SIZE,
    EXTRA_SPEC_MODULE_PATH,
    EXTRA_SPEC_NAME,
    FLAG_KV_TRANSFER_CONFIG,
    HOST_OFFLOADING_SPEC,
    HOST_OFFLOADING_SPEC_MODULE,
    KV_CONNECTOR_EXTRA_CONFIG_KEY,
    KV_CONNECTOR_KEY,
    KV_CONNECTOR_MODULE_PATH_KEY,
    KV_ROLE_BOTH,
    KV_ROLE_KEY,
    OFFLOADING_CONNECTOR,
    SCHEDULER_CLS,
    SPILLWAY_CONNECTOR,
    SPILLWAY_CONNECTOR_MODULE,
    SPILLWAY_OFFLOADING_SPEC,
    SPILLWAY_SPEC_MODULE,
    SPILLWAY_TIERING_OFFLOADING_SPEC,
    flag_value,
    kv_transfer_config,
)

# -- engine flags -------------------------------------------------------------
FLAG_TENSOR_PARALLEL_SIZE = "--tensor-parallel-size"
FLAG_TENSOR_PARALLEL_SIZE_SHORT = "-tp"
FLAG_BLOCK_SIZE = "--block-size"
FLAG_KV_CACHE_DTYPE = "--kv-cache-dtype"
FLAG_DTYPE = "--dtype"  # the weights' and activations' dtype (the KV cache follows it under --kv-cache-dtype auto)
FLAG_KV_OFFLOADING_BACKEND = "--kv-offloading-backend"
FLAG_KV_OFFLOADING_SIZE = "--kv-offloading-size"  # GiB, total across TP ranks
FLAG_PORT = "--port"
FLAG_HOST = "--host"
FLAG_SERVED_MODEL_NAME = "--served-model-name"
FLAG_REVISION = "--revision"
FLAG_LOAD_FORMAT = "--load-format"
FLAG_SKIP_TOKENIZER_INIT = "--skip-tokenizer-init"
FLAG_KV_CACHE_MEMORY_BYTES = "--kv-cache-memory-bytes"
FLAG_NUM_GPU_BLOCKS_OVERRIDE = "--num-gpu-blocks-override"
FLAG_MAX_MODEL_LEN = "--max-model-len"
FLAG_API_KEY = "--api-key"
# An ASGI middleware by import path (vllm/entrypoints/serve/middleware/register.py, 0.26 to 0.34); the image's
# connector package guards every route with the API key (spillway_connector/api_guard.py), where vLLM's own
# check guards /v1, /v2, /inference and /cohere only.
FLAG_MIDDLEWARE = "--middleware"
API_KEY_MIDDLEWARE = "spillway_connector.api_guard.require_api_key"
FLAG_CONFIG = "--config"  # a YAML file of flags, read inside the pod: refused in extraArgs
FLAG_API_SERVER_COUNT = "--api-server-count"  # processes that tokenize, detokenize and serve HTTP
FLAG_API_SERVER_COUNT_SHORT = "-asc"  # vllm/entrypoints/common/cli_args.py (0.33)

# Flags that change what the plan decides (GPUs per replica, KV bytes per block, the CPU pool, weights
# kept in CPU memory, API servers per replica, the model config, where the server listens) or that would put
# a secret into the pod's args. extraArgs may not set them in any spelling vLLM's FlexibleArgumentParser accepts: `_` for `-`,
# `--flag=value`, dotted sub-keys `--flag.key value`, unique prefixes (argparse allow_abbrev), short
# aliases. Names from vllm/engine/arg_utils.py and vllm/entrypoints/openai/cli_args.py (vLLM 0.33).
PLAN_FLAGS = (
    FLAG_TENSOR_PARALLEL_SIZE, "--pipeline-parallel-size", "--data-parallel-size", "--data-parallel-size-local",
    "--decode-context-parallel-size", "--prefill-context-parallel-size", "--nnodes", "--node-rank",
    FLAG_BLOCK_SIZE, FLAG_KV_CACHE_DTYPE, "--kv-cache-dtype-skip-layers", FLAG_KV_OFFLOADING_BACKEND,
    FLAG_KV_OFFLOADING_SIZE, FLAG_KV_TRANSFER_CONFIG, "--cpu-offload-gb", "--cpu-offload-params",
    "--offload-backend", "--offload-group-size", "--offload-num-in-group", "--offload-prefetch-step",
    "--offload-params", "--hf-config-path", "--model", FLAG_PORT, FLAG_HOST, FLAG_REVISION,
    FLAG_SERVED_MODEL_NAME, FLAG_API_KEY, FLAG_CONFIG, "--uds", FLAG_API_SERVER_COUNT,
)
# Flags that change what was sized without being a planned value: the model's geometry (KV dtype follows
# --dtype under `--kv-cache-dtype auto`; config overrides; a draft model's own KV cache; Mamba state dtypes;
# vLLM's KV-cache groups) or host memory outside the pool (weights slept to CPU memory). Refused in extraArgs
# in the same spellings. Names from vllm/engine/arg_utils.py (vLLM 0.33).
GEOMETRY_FLAGS = (
    FLAG_DTYPE, "--hf-overrides", "--config-format", "--speculative-config", "--mamba-cache-dtype",
    "--mamba-ssm-cache-dtype", "--disable-hybrid-kv-cache-manager", "--enable-sleep-mode",
)
GEOMETRY_SHORT_FLAGS = ("-sc",)  # --speculative-config
# The multimodal processor cache lives in host memory, one per API server: the plan reserves vLLM's default
# (planner.MM_PROCESSOR_CACHE_BYTES), so extraArgs may lower it, not raise it.
FLAG_MM_PROCESSOR_CACHE_GB = "--mm-processor-cache-gb"
MM_PROCESSOR_CACHE_GB_DEFAULT = 4.0  # vllm/config/multimodal.py
# Their single-dash aliases (-tp, -pp, -dp, ...) and the ones of flags that share a prefix with them.
PLAN_SHORT_FLAGS = (FLAG_TENSOR_PARALLEL_SIZE_SHORT, "-pp", "-dp", "-dpl", "-dcp", "-pcp", "-n", "-r",
                    FLAG_API_SERVER_COUNT_SHORT)
FLAG_MAX_NUM_SEQS = "--max-num-seqs"
FLAG_MAX_NUM_BATCHED_TOKENS = "--max-num-batched-tokens"
FLAG_ENFORCE_EAGER = "--enforce-eager"
FLAG_NO_ENABLE_PREFIX_CACHING = "--no-enable-prefix-caching"
# Mamba hybrids: the offloading connector needs prefix caching to align their block sizes (build_offloading_config)
FLAG_ENABLE_PREFIX_CACHING = "--enable-prefix-caching"
LOAD_FORMAT_DUMMY = "dummy"

# -- KV cache events (ZMQ), which a KV-aware router indexes ----------------------------------------------------
FLAG_KV_EVENTS_CONFIG = "--kv-events-config"  # JSON of vllm/config/kv_events.py KVEventsConfig
KV_EVENTS_ENABLE_KEY = "enable_kv_cache_events"
KV_EVENTS_PUBLISHER_KEY = "publisher"
KV_EVENTS_PUBLISHER_ZMQ = "zmq"
KV_EVENTS_ENDPOINT_KEY = "endpoint"  # tcp://*:PORT binds (vllm/distributed/kv_events.py _is_bind_endpoint)
# kv_connector_extra_config key: offloaded (CPU-medium) BlockStored events carry token ids, parent hash and
# block size (vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py; in 0.26, 0.32 and 0.33).
EXTRA_SELF_DESCRIBING_KV_EVENTS = "self_describing_kv_events"
# No topic key: vllm-router 0.1.17 drops every message published under a topic (measured with its wheel);
# vLLM's default topic is "".
# vLLM's block hashes (the events' keys) are roots of a chain seeded from PYTHONHASHSEED (NONE_HASH): a fixed
# seed makes a prefix carry the same hashes on every replica and across restarts.
ENV_PYTHONHASHSEED = "PYTHONHASHSEED"
PYTHONHASHSEED_VALUE = "0"

NATIVE_BACKEND = "native"

IMAGE_VLLM_VERSION = "0.34.0"
BLOCK_LAYOUT_ENV_SINCE = (0, 32)  # VLLM_KV_CACHE_LAYOUT accepts block-outermost layouts (BLHNC) from here

# -- environment --------------------------------------------------------------
ENV_KV_CACHE_LAYOUT = "VLLM_KV_CACHE_LAYOUT"
# "0" keeps vLLM 0.26 on the V1 model runner: its V2 runner has no cross-layer KV blocks (per-layer copies)
ENV_USE_V2_MODEL_RUNNER = "VLLM_USE_V2_MODEL_RUNNER"
ENV_HF_TOKEN = "HF_TOKEN"  # read by vLLM's Hugging Face downloads
CONTIGUOUS_LAYOUT = "BLHNC"  # block-outermost: one region holds a block's KV of all layers
ENV_CPU_KVCACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"  # CPU platform, legacy: whole GiB, overrides --kv-cache-memory-bytes
ENV_API_KEY = "VLLM_API_KEY"  # the server's bearer token (vllm/envs.py), from spec.apiKeySecretRef
# Threads that pre-fault the CPU pool, the replica's CPU cores: read by Spillway's offloading spec
# (spillway_connector/spec.py) on the releases whose region it pre-faults (0.33+); others ignore the variable.
ENV_PREFAULT_THREADS = "SPILLWAY_PREFAULT_THREADS"
PREFAULT_SINCE = (0, 33)
# The hugetlbfs directory (the pod's hugepages-2Mi emptyDir) the connector puts the pool's file on
# (spillway_connector/hugetlb_pool.py); absent, the pool is on 4 KiB pages in /dev/shm.
ENV_POOL_HUGEPAGES_DIR = "SPILLWAY_POOL_HUGEPAGES_DIR"
# The replicas whose disk-tier slots an engine reads besides its own (spillway_connector/disk_namespace.py): the
# operator sets the ModelServer's <namespace>/<name>, so one ModelServer's replicas on a shared volume read each
# other's chunks and another's never (the share is in the namespace digest); reserved, so a spec cannot claim one.
ENV_DISK_TIER_SHARE = "SPILLWAY_DISK_TIER_SHARE"
# vLLM's cache root (vllm/envs.py): torch.compile's cache is VLLM_CACHE_ROOT/torch_compile_cache/<hash> (0.34:
# vllm/compilation/backends.py, decorators.py)
ENV_CACHE_ROOT = "VLLM_CACHE_ROOT"
# The image's entrypoint (images/vllm/compile_cache.py): this pod's directory on spec.compileCache's claim, and the
# URL whose answer says the server is up (every compile-cache entry it used is whole then).
ENV_COMPILE_CACHE_DIR = "SPILLWAY_COMPILE_CACHE_DIR"
ENV_COMPILE_CACHE_READY_URL = "SPILLWAY_COMPILE_CACHE_READY_URL"
# Triton's binary cache (triton/runtime/cache.py), ~/.triton/cache unless set: the operator puts it below the cache
# root, where the compiling start's kernels stay for the next start and a compileCache snapshot carries them (vLLM
# keeps a caller's choice: compiler_interface.py).
ENV_TRITON_CACHE_DIR = "TRITON_CACHE_DIR"
TRITON_CACHE_BELOW_ROOT = "triton"  # its directory under VLLM_CACHE_ROOT
# vLLM's --scheduler-cls (vllm/engine/arg_utils.py) with Spillway's scheduler (SCHEDULER_CLS, from the connector's
# transfer_config) on releases before SCHEDULER_CLS_BEFORE: from 0.34 vLLM remembers the reservation itself.
FLAG_SCHEDULER_CLS = "--scheduler-cls"
SCHEDULER_CLS_BEFORE = (0, 34)
# Environment spec.env may not set: the operator writes these, or they open the server (dev endpoints such
# as /reset_prefix_cache and /collective_rpc, runtime LoRA loading, pickle deserialization) or change its
# memory (vllm/envs.py, vLLM 0.33).
RESERVED_ENV = (ENV_KV_CACHE_LAYOUT, ENV_USE_V2_MODEL_RUNNER, ENV_CPU_KVCACHE_SPACE, ENV_API_KEY, ENV_PREFAULT_THREADS,
                ENV_CACHE_ROOT, ENV_COMPILE_CACHE_DIR, ENV_COMPILE_CACHE_READY_URL, ENV_TRITON_CACHE_DIR,
                ENV_POOL_HUGEPAGES_DIR, ENV_DISK_TIER_SHARE,
                "VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_ALLOW_INSECURE_SERIALIZATION")

# -- connectors ---------------------------------------------------------------
# The --kv-transfer-config object: its keys, the connector classes and its one builder live in the
# dependency-free spillway_connector.transfer_config (the connector's CPU backend builds it too).

# -- the pool's backing file ---------------------------------------------------
SHM_DIR = "/dev/shm"

# -- server endpoints ----------------------------------------------------------
SERVER_PORT = 8000
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
MODELS_PATH = "/v1/models"
COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
RESET_PREFIX_CACHE_PATH = "/reset_prefix_cache"  # POST; served only with ENV_SERVER_DEV_MODE=1
ENV_SERVER_DEV_MODE = "VLLM_SERVER_DEV_MODE"
SERVE_COMMAND = ("vllm", "serve")  # the OpenAI server of any vLLM image


class Metric:
    """vLLM's own Prometheus metric names (as exported, without _total/_bucket suffixes)."""

    OFFLOAD_LOAD_BYTES = "vllm:kv_offload_load_bytes"
    OFFLOAD_STORE_BYTES = "vllm:kv_offload_store_bytes"
    OFFLOAD_LOAD_TIME = "vllm:kv_offload_load_time"
    OFFLOAD_STORE_TIME = "vllm:kv_offload_store_time"
    OFFLOAD_CPU_USAGE = "vllm:kv_offload_cpu_cache_usage_perc"
    OFFLOAD_ALLOCATION_FAILURE = "vllm:kv_offload_allocation_failure"
    OFFLOAD_CONFIG_INFO = "vllm:kv_offload_config_info"
    EXTERNAL_HITS = "vllm:external_prefix_cache_hits"
    EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries"
    PREFIX_HITS = "vllm:prefix_cache_hits"
    PREFIX_QUERIES = "vllm:prefix_cache_queries"
    PREEMPTIONS = "vllm:num_preemptions"
    TTFT = "vllm:time_to_first_token_seconds"
    # A request's phases on the engine's own clocks (histograms observed when it finishes, vllm/v1/metrics/stats.py
    # update_from_finished_request): queued -> first scheduled (a load from the pool waits in between), then
    # scheduled -> first token. TTFT runs from the API server's arrival to the first token.
    REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"
    REQUEST_PREFILL_TIME = "vllm:request_prefill_time_seconds"
    PROMPT_TOKENS = "vllm:prompt_tokens"
    # prometheus_client's process collector (the API server's process): it changes when the server restarts
    PROCESS_START_TIME = "process_start_time_seconds"
    # Prefix-cache hit tokens by the tier that supplied them, label CacheHitSource.LABEL (vLLM 0.32+:
    # vllm/v1/metrics/loggers.py, counter_prompt_tokens_cached_by_source).
    PROMPT_TOKENS_CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source"
    GENERATION_TOKENS = "vllm:generation_tokens"
    REQUESTS_RUNNING = "vllm:num_requests_running"
    REQUESTS_WAITING = "vllm:num_requests_waiting"  # the engine's queue: requests not yet scheduled
    REQUEST_SUCCESS = "vllm:request_success"  # finished requests (label finished_reason)
    GPU_CACHE_USAGE = "vllm:kv_cache_usage_perc"
    CACHE_CONFIG_INFO = "vllm:cache_config_info"  # labels: num_gpu_blocks, block_size, enable_prefix_caching, ...


class CacheHitSource:
    """The `source` label of vllm:prompt_tokens_cached_by_source (vllm/v1/metrics/cache_hit_source.py)."""

    LABEL = "source"
    HOST = "host"  # the CPU pool (OffloadingConnector's CPU manager)
    DISK = "disk"
    P2P = "p2p"  # another vLLM instance
    DEVICE = "device"  # the GPU prefix cache
    OFFLOADED = (HOST, DISK, P2P)  # the tiers outside the GPU


class OffloadConfigInfoLabel:
    """Labels of vllm:kv_offload_config_info for the CPU tier (vLLM 0.33+: CPUOffloadingInfo)."""

    NUM_CHUNKS = "cpu_num_chunks"
    BLOCKS_PER_CHUNK = "cpu_blocks_per_chunk"
    SIZE_BYTES = "cpu_kv_cache_size_bytes"
    SIZE_TOKENS = "cpu_kv_cache_size_tokens"  # KV tokens the pool holds for requests of max_model_len


class TieringMetric:
    """vLLM's tiered-offloading metrics, labelled by tier "<position>:<type>" (vllm/v1/kv_offload/tiering/spec.py
    and metrics.py, 0.32 and 0.33): "0:primary" is the CPU pool, "1:fs" the disk tier under it."""

    LABEL = "tier"
    PRIMARY = "0:primary"
    DISK_FS = "1:fs"  # the node-disk tier, the one secondary tier the planner renders
    CHUNK_QUERIES = "vllm:kv_offload_tiering_chunk_queries"
    CHUNK_HITS = "vllm:kv_offload_tiering_chunk_hits"
    READ_BYTES = "vllm:kv_offload_tiering_read_bytes"
    READ_TIME = "vllm:kv_offload_tiering_read_time"
    WRITE_BYTES = "vllm:kv_offload_tiering_write_bytes"
    # Failed jobs by tier (tiering/metrics.py _observe_finished_job_stats): a promotion reads chunks of a secondary
    # tier into the pool (a disk load), a cascade writes the pool's chunks to it (a disk store).
    PROMOTION_JOB_FAILURES = "vllm:kv_offload_tiering_promotion_job_failures"
    CASCADE_JOB_FAILURES = "vllm:kv_offload_tiering_cascade_job_failures"
