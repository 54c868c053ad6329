"""KV-aware routing in front of the replicas: what the vLLM pods publish and what the router assumes (pure).

A router sends a request to the replica that already holds its prefix: kv-aware mode's own router by where
it sent each prefix (core/affinity.py), llm-d's by the replicas' KV events (GPU and, with offloading,
CPU-medium blocks). Two numbers come from the plan:

- the host-tier credit (0..1; llm-d's weight of its index's CPU tier): how much of a prefix's prefill a CPU-pool
  hit saves. Reloading t tokens costs t / reload_rate, recomputing them t / recompute_rate, so a hit saves
  1 - recompute_rate / reload_rate of the recompute (nothing when reloading is slower than recomputing).
- the blocks each replica holds, which bound the router's index (kv-aware: `spillway route --index-blocks`;
  llm-d: its in-memory index size): the planned pool's blocks.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from . import vllm_api as api

MODE_NONE = "none"
MODE_KV_AWARE = "kv-aware"
MODE_LLM_D = "llm-d"
MODES = (MODE_NONE, MODE_KV_AWARE, MODE_LLM_D)
# Modes whose router reads the pods' KV events: llm-d's indexer. kv-aware's own router records where it sent
# each prefix and reads none, so its pods publish none (no per-block events in the engine core, no port).
EVENT_MODES = (MODE_LLM_D,)

KV_EVENTS_PORT = 5557  # the vLLM pods' ZMQ publisher (container port name: names.PORT_NAME_KV_EVENTS)
ROUTER_PORT = 8000  # the router's OpenAI endpoint: the port clients already use
ROUTER_METRICS_PORT = 29000  # the router's Prometheus endpoint (NetworkPolicy admits Prometheus to it)
ROUTER_HEALTH_PATH = "/health"  # 200 while the router has a ready pod to route to, else 503 (readiness)
ROUTER_METRICS_PATH = "/metrics"

# `spillway route`'s metrics (labels worker, and decision: core/affinity.py DECISIONS)
ROUTER_METRIC_REQUESTS = "spillway_router_requests_total"
ROUTER_METRIC_MATCHED_BLOCKS = "spillway_router_matched_blocks_total"  # prompt blocks the chosen pod was sent before
ROUTER_METRIC_PROMPT_BLOCKS = "spillway_router_prompt_blocks_total"
ROUTER_METRIC_UPSTREAM_ERRORS = "spillway_router_upstream_errors_total"  # requests a pod did not answer (502)
ROUTER_METRIC_IN_FLIGHT = "spillway_router_in_flight"
ROUTER_METRIC_WORKERS = "spillway_router_workers"
ROUTER_METRIC_PREFIX = "spillway_router_"
ROUTER_LABEL_WORKER = "worker"  # the worker's URL, http://<pod IP>:8000
ROUTER_LABEL_DECISION = "decision"
ROUTER_METRIC_RETRIES = "spillway_router_retries_total"  # attempts whose connection failed before any byte came back
ROUTER_METRIC_RESTARTS = "spillway_router_worker_restarts_total"  # restarts seen on a worker's /metrics
# Blocks the router records per pod when no plan says (`spillway route` outside the operator): a 512 GiB pool
# of 2 MiB blocks.
DEFAULT_INDEX_BLOCKS = 262_144

# -- the router as a public endpoint --------------------------------------------------------------------------
# What it forwards: the OpenAI routes, nothing else (vLLM's API key guards /v1 only; /invocations, /tokenize,
# /pooling, /score, ... answer without one). Its own /health it answers itself.
ROUTER_FORWARDED = (("POST", api.COMPLETIONS_PATH), ("POST", api.CHAT_COMPLETIONS_PATH), ("GET", api.MODELS_PATH))
ROUTER_MAX_BODY_BYTES = 16 << 20  # a 128K-token prompt as JSON token ids is about 0.8 MB
ROUTER_BODY_BUDGET_BYTES = 256 << 20  # request bodies held at once, over all connections (503 beyond)
ROUTER_PARSE_BYTES = 256 << 10  # a body's leading bytes read for routing: far more than DEFAULT_MAX_BLOCKS need
ROUTER_MAX_CONNECTIONS = 1024
ROUTER_HEADER_TIMEOUT_S = 10.0  # a request's headers, from the connection's start or the previous answer
ROUTER_BODY_TIMEOUT_S = 30.0
ROUTER_CONNECT_TIMEOUT_S = 3.0  # a pod on the cluster network answers a SYN in milliseconds
ROUTER_FIRST_BYTE_TIMEOUT_S = 300.0  # a long prompt queued behind others: minutes at most
ROUTER_READ_TIMEOUT_S = 60.0  # between two chunks of an answer (a token is milliseconds)
ROUTER_WRITE_TIMEOUT_S = 30.0  # for a client to take the next piece of an answer (a slow or stopped reader)
# What one answer in passage may hold in the router, each way: the kernel send buffer of a client's socket and
# the receive buffer of a pod's (fixed, where the kernel would grow each to megabytes for a reader that stops),
# and the bytes queued in the process above each.
ROUTER_STREAM_BUFFER_BYTES = 16 << 10
# The kernel receive buffer of a client's socket, fixed too: a request body flows in at this much per round
# trip (256 KiB per 50 ms is 5 MB/s), where the kernel would grow it to tens of megabytes per connection.
ROUTER_RECEIVE_BUFFER_BYTES = 256 << 10
# How often the router reads each pod's /metrics: its restart marks, and the requests running and waiting in its
# engine, which bound a hot prefix's pod for every router pod (core/affinity.py Report). llm-d's endpoint picker
# reads the same gauges every 50 ms; a quarter second is a fraction of a request's life on a GPU. vLLM renders
# its whole /metrics for each read (79 KB for one model, bench/fleet/README.md).
ROUTER_LOAD_POLL_S = 0.25
ROUTER_ATTEMPTS = 3  # a request whose connection failed before any byte came back goes on to the next pod
# The router's memory: its process (46 MiB peak RSS after 200 requests, tests/routing/upstreams.py's
# RouterProcess.peak_rss_bytes, with room for a body's copy while it is joined and parsed), the request
# bodies it may hold, and the record's budget; the rendered memory request and limit are their sum.
ROUTER_BASE_BYTES = 128 << 20
ROUTER_MAX_INDEX_BYTES = 1 << 30
ROUTER_MIN_INDEX_BYTES = 16 << 20
# llm-d's prefix producers (llm-d-router v0.10.0 plugin types): precise indexes the pods' KV events (both
# tiers, every pod publishing); approximate records where llm-d sent each prompt (no events, no port).
PRODUCER_PRECISE = "precise"
PRODUCER_APPROXIMATE = "approximate"
PRODUCERS = (PRODUCER_PRECISE, PRODUCER_APPROXIMATE)
LLM_D_PRODUCER_PLUGINS = {PRODUCER_PRECISE: "precise-prefix-cache-producer",
                          PRODUCER_APPROXIMATE: "approx-prefix-cache-producer"}
EPP_PORT = 9002  # llm-d-router's endpoint picker (gRPC ext-proc): endpointPickerRef.port.number
# llm-d-router v0.10.0 apix/config/v1alpha1 (GroupName llm-d.ai); the older inference.networking.x-k8s.io is deprecated
EPP_CONFIG_API_VERSION = "llm-d.ai/v1alpha1"
# The CPU tier's weight in llm-d's index (kvCacheBackendConfigs): a CPU hit is worth what the router's host-tier
# credit says when it is known; this is vllm-router's own default credit.
LLM_D_CPU_TIER_WEIGHT = 0.8
LLM_D_GPU_TIER, LLM_D_CPU_TIER = "gpu", "cpu"  # llm-d lower-cases an event's medium (GPU, CPU) into its tier
# llm-d's KV-event subscriber reads "kv@<pod>@<model>" topics (llm-d-kv-cache engineadapter parseTopic) under its
# default filter "kv@"; vllm-router 0.1.17 drops any message with a topic, so only llm-d mode sets one.
LLM_D_TOPIC_FILTER = "kv@"
# The pod's IP, from the downward API: Kubernetes expands $(VAR) in args, so each pod's topic names its own
# address:port, the identity llm-d gives the endpoint it scores.
ENV_POD_IP = "SPILLWAY_POD_IP"
KV_EVENTS_TOPIC_KEY = "topic"  # vllm/config/kv_events.py KVEventsConfig.topic (default "")

# Recompute rate anchor: Llama-3.1-8B-Instruct prefilled 41,391 prompt tokens/s on one H200 with nothing cached
# (bench/routing/results/gpu-no-offload-v026.json, hit rate 0).
# Prefill is compute-bound, so other models scale by their weights per token (about 2 FLOPs per weight).
ANCHOR_RECOMPUTE_TOKENS_PER_S = 41_391.0
ANCHOR_CONFIG = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "intermediate_size": 14336}  # Llama-3.1-8B's config.json
MLP_RATIO = 3.5  # intermediate_size / hidden_size of Llama-family models, where a config.json leaves it out
MAX_HOST_TIER_CREDIT = 0.95  # a reload is never free: the copy still queues behind the step it feeds


def kv_events_config(port: int = KV_EVENTS_PORT, topic: str = "") -> dict[str, Any]:
    """--kv-events-config for a pod: publish over ZMQ, bound on every interface of the pod."""
    out = {api.KV_EVENTS_ENABLE_KEY: True, api.KV_EVENTS_PUBLISHER_KEY: api.KV_EVENTS_PUBLISHER_ZMQ,
           api.KV_EVENTS_ENDPOINT_KEY: f"tcp://*:{port}"}
    if topic:
        out[KV_EVENTS_TOPIC_KEY] = topic
    return out


def kv_events_flag_value(port: int = KV_EVENTS_PORT, topic: str = "") -> str:
    return json.dumps(kv_events_config(port, topic), sort_keys=True, separators=(",", ":"))


def llm_d_topic(pod: str, model: str) -> str:
    """The topic llm-d's subscriber parses into (pod, model): the model must be the requests' model name, the
    name under which llm-d hashes the prompt's blocks."""
    return f"{LLM_D_TOPIC_FILTER}{pod}@{model}"


def llm_d_index_capacity(replicas: int, pool_blocks: int, gpu_blocks: int = 0) -> tuple[int, int]:
    """(keys, pod entries per key) for llm-d's in-memory block index: every block any replica's pool or GPU
    holds, and one entry per replica and tier, so the index never evicts what the pools still hold."""
    return max(1, replicas) * (pool_blocks + gpu_blocks), 2 * max(1, replicas)


def estimated_weights(config: Mapping[str, Any]) -> float | None:
    """Weights one prompt token passes through in the decoder layers (active experts only), from config.json's
    dimensions; None if unknown. The LM head is left out: a prefill computes logits for its last token only."""
    try:
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        experts = int(config.get("num_experts_per_tok") or 1)
        intermediate = int(config.get("moe_intermediate_size") or config.get("intermediate_size")
                           or MLP_RATIO * hidden)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * intermediate * experts
    return float(layers * (attention + mlp))


def recompute_tokens_per_s(config: Mapping[str, Any] | None, tensor_parallel_size: int) -> float | None:
    """One replica's prefill rate, scaled from the H200 anchor by weights per token and TP; None if unknown."""
    weights = estimated_weights(config) if config else None
    if not weights:
        return None
    return ANCHOR_RECOMPUTE_TOKENS_PER_S * ANCHOR_WEIGHTS / weights * tensor_parallel_size


def host_tier_credit(reload_tokens_per_s: float, recompute_rate: float) -> float:
    """The share of a prefix's recompute that a CPU-pool hit saves, 0..MAX_HOST_TIER_CREDIT."""
    if reload_tokens_per_s <= 0 or recompute_rate <= 0:
        return 0.0
    return round(max(0.0, min(MAX_HOST_TIER_CREDIT, 1.0 - recompute_rate / reload_tokens_per_s)), 3)


ANCHOR_WEIGHTS = estimated_weights(ANCHOR_CONFIG)  # the anchor's weights by the same estimate: its errors cancel
