"""The one place that names vllm-router's flags, endpoints and log lines (the vLLM project's Rust router, PyPI
`vllm-router`; names as its 0.1.17 `vllm-router --help` prints them).

Spillway's own router (`spillway route`) does not run it: the routing tests and bench/routing/routing_policies.py
run vllm-router's policies as the baselines it is measured against, with the names from here.
"""
from __future__ import annotations

ROUTER_VERSION = "0.1.17"  # the vllm-router release the flags below were read from (requirements-test.txt pins it)
ROUTER_COMMAND = "vllm-router"

# -- flags ----------------------------------------------------------------------------------------------
FLAG_HOST = "--host"
FLAG_PORT = "--port"
FLAG_POLICY = "--policy"
FLAG_WORKER_URLS = "--worker-urls"
FLAG_KV_EVENT_SOURCE = "--kv-event-source"  # WORKER_URL=tcp://HOST:PORT, one per worker (static sources)
FLAG_KV_EVENT_BLOCK_SIZE = "--kv-event-block-size"  # must equal the workers' --block-size
FLAG_KV_EVENT_MODEL = "--kv-event-model"  # the workers' served model name
FLAG_ROUTER_TEMPERATURE = "--router-temperature"  # kv_aware: softmax temperature over the workers' costs (0: the minimum)
FLAG_KV_PENALTY_HOST = "--kv-penalty-host"  # host-tier (CPU) KV credit, 0..1: a CPU hit counts this much of a GPU hit
# kv_aware: a request carrying a session key (an x-session-id / x-user-id / x-tenant-id header, or the OpenAI
# `user` field) goes where that key's previous request went while the key was used within this many seconds.
FLAG_KV_AWARE_SESSION_AFFINITY_TTL = "--kv-aware-session-affinity-ttl-secs"
# cache_aware: shortest queue when (max - min in-flight) > abs AND max > rel x min, else its own prefix tree.
FLAG_BALANCE_ABS_THRESHOLD = "--balance-abs-threshold"
FLAG_BALANCE_REL_THRESHOLD = "--balance-rel-threshold"
FLAG_PROMETHEUS_HOST = "--prometheus-host"
FLAG_PROMETHEUS_PORT = "--prometheus-port"
FLAG_WORKER_STARTUP_CHECK_INTERVAL = "--worker-startup-check-interval"  # seconds between start-up health checks (30)
FLAG_LOG_LEVEL = "--log-level"  # debug: one "KV prefix decision" line per kv_aware request (below)
# The bearer token it sends to the workers: set on the launcher's RouterArgs.api_key, never as --api-key.

POLICY_ROUND_ROBIN = "round_robin"
POLICY_KV_AWARE = "kv_aware"
POLICY_CACHE_AWARE = "cache_aware"
POLICY_STICKY_LEAST_LOADED = "sticky_least_loaded"  # a session key's first request to the least loaded worker, then sticky
POLICY_CONSISTENT_HASH = "consistent_hash"  # the session key (else the whole request) hashed onto a ring of workers

# The kv_aware settings the baselines run: the best of kv_aware in bench/routing/results/kv-aware-settings.json
# (docs/routing.md). A temperature above 0 samples among workers of equal cost instead of always taking the
# first, so a new prefix no longer lands where the others are; at 0.1 a cached prefix still wins.
ROUTER_TEMPERATURE = "0.1"
KV_AWARE_SETTINGS = (FLAG_ROUTER_TEMPERATURE, ROUTER_TEMPERATURE)

# -- endpoints --------------------------------------------------------------------------------------------
ROUTER_HEALTH_PATH = "/health"
ROUTER_METRICS_PATH = "/metrics"
ROUTER_LIST_WORKERS_PATH = "/list_workers"

# -- debug log (--log-level debug) -------------------------------------------------------------------------
# kv_aware's line per routed request (src/policies/kv_aware.rs in 0.1.17): the worker it chose, and how many of
# the prompt's tokens it credited to that worker's indexed blocks (a CPU-medium block counts kv-penalty-host
# of its tokens).
LOG_KV_DECISION = "KV prefix decision"
LOG_CREDITED_PREFIX_TOKENS = "credited_prefix_tokens"
