"""The pure planning core: (offload request, node facts, model geometry) -> Plan.

No I/O. The operator, the CLI and the chart tests all call `plan()`.

Memory model of one replica (one pod, `tensor_parallel_size` GPUs):

    pool        = what vLLM allocates for offloaded KV: whole chunk rows of its KV-cache groups
                  (groups.py: the largest group's block x host copies x blocks_per_chunk, page aligned)
    footprint   = what the pool costs the pod's memory cgroup, per vLLM release (footprint.py:
                  0.26 rounds each pinned tensor up to a power of two; 0.32/0.33 map it in /dev/shm, ~1.0x)
    shm         = what the pool holds in /dev/shm + SHM_EXTRA_BYTES (NCCL, vLLM's message queues)
    huge pages  = where the node's hugepages-2Mi hold the pool (footprint.pool_pages): the pool's rows rounded down
                  to whole 2 MiB pages, requested as hugepages-2Mi (request = limit) on a hugetlbfs emptyDir; the
                  footprint is then its page tables only and /dev/shm holds none of it. `auto` (a fraction: that
                  fraction of each share) takes the huge-page share's pool where it holds at least the memory
                  share's; a quantity beyond the memory share goes on them where they hold it (footprint.place_pool)
    reserve     = PROCESS_RESERVE_BASE + PROCESS_RESERVE_PER_RANK x TP
                  (API server, engine core, one worker per rank: Python, torch, CUDA context,
                  model loading buffers, NCCL; #53042 saw ~8.75 GiB anonymous memory per rank)
    limit       = request = footprint + SHM_EXTRA_BYTES + reserve   (/dev/shm pages are charged to the pod)

A node runs `replicas_per_node` such pods next to its daemons: NODE_RESERVE is held back
from allocatable memory, and the sum of the pods' limits never exceeds allocatable.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from spillway_connector.versions import UnsupportedVLLMVersion, require_supported

from . import disk_tier
from . import k8s_names as names
from . import vllm_api as api
from .deepseek_v4 import own_block_size
from .errors import InvalidSpec, NoEligibleNodes, PoolDoesNotFit
from .footprint import (
    MAX_PIN_CALL_BYTES,
    Footprint,
    PoolPages,
    footprint,
    huge_page_footprint,
    huge_page_rows,
    huge_pool_limit,
    largest_pin_call,
    largest_pool,
    pinned_tensors,
    pins,
    place_pool,
    pool_pages,
)
from .geometry import DEFAULT_BLOCK_SIZE, KVLayout, ModelGeometry, kv_layout
from .groups import MAMBA, MLA, KVGroups, clear_group_caches
from .model_facts import cached_hash
from .options import Connector, EvictionPolicy, Layout, choices
from .quantity import GiB, MiB, format_bytes, parse_size
from .rates import interpolate_log2

SHM_EXTRA_BYTES = 1 * GiB
PROCESS_RESERVE_BASE = 8 * GiB
PROCESS_RESERVE_PER_RANK = 6 * GiB
# Each API server beyond the first is another process (0.6 GiB RSS measured, reserved at 1 GiB), with its own
# multimodal processor cache for vision/audio models (vllm/config/multimodal.py): docs/planning.md#api-servers.
PROCESS_RESERVE_PER_EXTRA_API_SERVER = 1 * GiB
MM_PROCESSOR_CACHE_BYTES = 4 * GiB
NODE_RESERVE_MIN = 4 * GiB
NODE_RESERVE_FRACTION = 0.05
DEFAULT_MAX_MODEL_LEN = 131072  # the request length tokens_held assumes when the config names none
SMALL_BLOCK_WARNING = 1 * MiB  # below this DMA runs well under the link's speed
SLOW_LINK_GBPS = 10.0  # a qualified rate under this rarely beats recomputing the prefill
ROUNDING_SLACK = 2 * MiB  # limits are rounded up to MiB; keep that inside the share
# One API server per 4 cores of a replica's share, at most the 4 measured best on 16 cores (215.4K vs 183.6K prompt
# tok/s at 100% CPU hits): docs/planning.md#api-servers, bench/api-servers/README.md.
CORES_PER_API_SERVER = 4
MAX_API_SERVERS = 4
# --max-num-batched-tokens is left to vLLM: 4096 and 16384 gained nothing
# (docs/planning.md#batched-tokens-vllms-default-measured).

# The startup probe's budget: a large model's load plus the pool, which vLLM sets up before /health, at half the
# slowest measured rate: 0.84 GiB/s from one thread (vLLM's own pre-fault; bench/pool-setup), at
# most 4.0 GiB/s from the image's 16 pre-faulting threads (64 GiB pre-faulted and registered in 16 s in a real
# engine, the slowest of its starts: bench/pool-setup/). docs/planning.md#memory-of-one-replica.
ENGINE_START_SECONDS = 1800
POOL_SETUP_BYTES_PER_S_PER_THREAD = 0.84 * GiB
POOL_SETUP_BYTES_PER_S_MAX = 4.0 * GiB
# On 2 MiB huge pages the kernel neither zeroes nor maps 4 KiB at a time: 64 GiB pre-faulted by 16 threads and
# registered in 3.0-3.2 s (20.1-21.2 GiB/s) on the H200 (bench/pool-setup/results/pool_setup.json and
# pool_setup-fresh-machine.json, "hugetlbfs"); at most 16 threads are planned, so the slowest rate is the figure.
POOL_SETUP_HUGE_BYTES_PER_S = 20.0 * GiB
# Threads that pre-fault the pool, at most: 16 took a 64 GiB pool from 41 s to 7.2-7.8 s on the H200's 16 cores
# (bench/pool-setup/results/pool_setup.json), and from 39 s to 5.5-8.9 s in an engine
# (bench/pool-setup/); more were not measured.
MAX_PREFAULT_THREADS = 16


@dataclass(frozen=True)
class NodeFacts:
    allocatable_memory: int  # bytes
    gpus: int
    name: str = "described-node"
    dma_gbps: float | None = None  # qualified CPU->GPU copy rate (the node annotation, 8 MiB copies), if known
    dma_table: tuple[tuple[int, float], ...] = ()  # (block bytes, CPU->GPU GB/s) from the full qualification
    cpu_millis: int | None = None  # allocatable CPU in millicores, if known
    ephemeral_storage: int | None = None  # allocatable ephemeral-storage bytes, if known (the disk tier's auto)
    disk_read_gbps: float | None = None  # qualified disk -> CPU pool read rate (the annotation), if known
    hugepages_2mi: int | None = None  # allocatable hugepages-2Mi bytes, if known (where the pool's pages come from)
    __hash__ = cached_hash  # memoized steps hash it on every call (model_facts.cached_hash)


@dataclass(frozen=True)
class OffloadRequest:
    enabled: bool = True
    size: str = "auto"  # "auto", a fraction "0.5" of the replica's share, or a quantity "200Gi"
    eviction_policy: EvictionPolicy = EvictionPolicy.LRU
    layout: Layout = Layout.CONTIGUOUS
    offload_block_size: int | None = None  # tokens per offloaded chunk; a multiple of block_size
    connector: Connector = Connector.SPILLWAY
    disk: disk_tier.DiskTierRequest = field(default_factory=disk_tier.DiskTierRequest)  # the disk tier under the pool
    __hash__ = cached_hash  # memoized steps hash it on every call (model_facts.cached_hash)


@dataclass(frozen=True)
class ServingRequest:
    tensor_parallel_size: int = 1
    # tokens per GPU KV block (--block-size); None: none asked, and the plan takes the model's (block_size_for)
    block_size: int | None = None
    kv_cache_dtype: str = "auto"
    replicas_per_node: int | None = None
    offload: OffloadRequest = field(default_factory=OffloadRequest)
    vllm_version: str = api.IMAGE_VLLM_VERSION
    __hash__ = cached_hash  # memoized steps hash it on every call (model_facts.cached_hash)


@dataclass(frozen=True)
class PoolPlan:
    bytes: int
    gib: float  # the --kv-offloading-size value: bytes / 2**30, exact
    chunks: int
    blocks: int
    tokens: int
    chunk_bytes: int
    copies: int  # 1 when vLLM deduplicates a replicated MLA latent across ranks
    requested: str
    footprint_bytes: int = 0  # what the pool costs the pod's memory cgroup (footprint.py)
    shm_pool_bytes: int = 0  # what the pool holds in /dev/shm
    footprint: str = ""  # one line: the rule behind footprint_bytes
    vllm_release: str = ""
    hugepages_bytes: int = 0  # the pool on 2 MiB huge pages: its hugepages-2Mi (= bytes); 0 on 4 KiB pages


@dataclass(frozen=True)
class PodPlan:
    memory_request_bytes: int
    memory_limit_bytes: int
    shm_bytes: int
    process_reserve_bytes: int
    gpus: int
    startup_seconds: int  # how long the engine may take to serve /health (the startup probe)
    hugepages_bytes: int = 0  # hugepages-2Mi, request = limit: the pool's pages where it is on huge pages


@dataclass(frozen=True)
class NodePlan:
    name: str
    allocatable_bytes: int
    reserve_bytes: int
    replicas_per_node: int
    share_bytes: int  # one replica's share of the node
    fixed_bytes: int  # process reserve + shm extra: what the pod needs with no pool
    max_pool_bytes: int  # the largest pool the replica can have: of the two below, the larger
    max_memory_pool_bytes: int = 0  # the largest pool the memory share holds (on 4 KiB pages)
    max_hugepage_pool_bytes: int = 0  # the largest the hugepages-2Mi share holds; 0 where the pool can't be on them
    __hash__ = cached_hash  # memoized steps hash it on every call (model_facts.cached_hash)


@dataclass(frozen=True)
class TransferPlan:
    """What the node's qualified copy rate means for this model (present when the node was qualified)."""

    qualified_gbps: float  # CPU->GPU at the size of each copy (1e9 B/s), from the node's qualification
    copy_bytes: int  # one copy: a whole offload row when the layout is contiguous, else one layer's K and V
    block_reload_us: float  # one offload row (one KV block of one group, one rank) back from CPU
    reload_tokens_per_s: float  # tokens of KV one replica can reload per second (ranks load in parallel)


@dataclass(frozen=True)
class EnginePlan:
    api_servers: int  # vLLM --api-server-count; 1 is vLLM's default and writes no flag
    why: str
    cores: int | None = None  # whole CPU cores of the replica's share of the node, when the node says


NO_NODE_ENGINE = EnginePlan(1, "no node described: vLLM's one API server")


@dataclass(frozen=True)
class Plan:
    layout: KVLayout
    node: NodePlan | None
    pool: PoolPlan | None
    pod: PodPlan | None
    args: list[str]
    env: dict[str, str]
    warnings: list[str]
    transfer: TransferPlan | None = None
    groups: KVGroups | None = None
    engine: EnginePlan = NO_NODE_ENGINE
    disk: disk_tier.DiskTierPlan | None = None
    pages: PoolPages | None = None  # where the pool's pages come from (footprint.pool_pages)

    def to_dict(self) -> dict[str, Any]:
        layout = self.layout
        out: dict[str, Any] = {
            "model": layout.geometry.name,
            "geometry": {
                **layout.geometry.as_dict(),
                "tensor_parallel_size": layout.tensor_parallel_size,
                "block_size": layout.block_size,
                "kv_block_size": layout.kv_block_size,
                "kv_cache_dtype": layout.kv_cache_dtype,
                "dtype_bytes": layout.dtype_bytes,
                "kv_heads_per_rank": layout.kv_heads_per_rank,
                "layer_page_bytes": layout.layer_page_bytes,
                "block_bytes": layout.block_bytes,
                "bytes_per_token": layout.bytes_per_token,
                "replicated_across_ranks": layout.replicated,
            },
            "vllm": {"args": list(self.args), "env": dict(self.env)},
            "warnings": list(self.warnings),
        }
        if self.groups is not None:
            per_chunk = self.pool.blocks // self.pool.chunks if self.pool is not None and self.pool.chunks else 1
            out["kv_cache_groups"] = {
                "vllm_release": ".".join(map(str, self.groups.release)),
                "row_bytes": self.groups.row_bytes,
                "host_copies": self.groups.copies,
                # in the offload's chunks (a chunk of several blocks keeps fewer of them), as vLLM's scheduler counts
                "groups": [{**asdict(g), "window_chunks": self.groups.window_chunks(g, per_chunk)}
                           for g in self.groups.groups],
            }
        for name in ("node", "pool", "pod", "transfer", "engine", "disk", "pages"):
            part = getattr(self, name)
            if part is not None:
                out[name] = asdict(part)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def process_reserve(tensor_parallel_size: int, api_servers: int = 1, multimodal: bool = False) -> int:
    per_api_server = PROCESS_RESERVE_PER_EXTRA_API_SERVER + (MM_PROCESSOR_CACHE_BYTES if multimodal else 0)
    return (PROCESS_RESERVE_BASE + PROCESS_RESERVE_PER_RANK * tensor_parallel_size
            + per_api_server * (api_servers - 1))


def is_multimodal(geometry: ModelGeometry) -> bool:
    return geometry.facts is not None and geometry.facts.multimodal


def node_reserve(allocatable: int) -> int:
    return max(NODE_RESERVE_MIN, int(allocatable * NODE_RESERVE_FRACTION))


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def replica_share_bytes(node: NodeFacts, request: ServingRequest) -> int:
    """One replica's share of the node's memory (allocatable less the node reserve, split over the replicas).
    The process and the pool come out of it, so of several nodes the one with the smallest share limits a plan
    that has to fit them all."""
    fit = max(1, node.gpus // request.tensor_parallel_size)
    replicas = request.replicas_per_node if request.replicas_per_node is not None else fit
    return (node.allocatable_memory - node_reserve(node.allocatable_memory)) // max(1, replicas)


@functools.lru_cache(maxsize=256)
def _node_plan(node: NodeFacts, request: ServingRequest, multimodal: bool) -> tuple[NodePlan, EnginePlan]:
    tp = request.tensor_parallel_size
    if node.gpus < 1:
        raise NoEligibleNodes(f"node {node.name} has {node.gpus} GPUs; a replica needs {tp}")
    if tp > node.gpus:
        raise NoEligibleNodes(
            f"tensor parallel size {tp} needs {tp} GPUs on one node; node {node.name} has {node.gpus}"
        )
    fit = node.gpus // tp
    replicas = request.replicas_per_node if request.replicas_per_node is not None else fit
    if not 1 <= replicas <= fit:
        raise InvalidSpec(
            f"replicas per node must be 1..{fit} ({node.gpus} GPUs / tensor parallel size {tp}), got {replicas}"
        )
    reserve = node_reserve(node.allocatable_memory)
    share = replica_share_bytes(node, request)
    # With or without offload: the no-offload baseline runs the same engine.
    engine = api_servers(node.cpu_millis, replicas, node.name)
    fixed = process_reserve(tp, engine.api_servers, multimodal) + SHM_EXTRA_BYTES + ROUNDING_SLACK
    if share < fixed:
        raise PoolDoesNotFit(
            f"node {node.name}: one replica's share is {format_bytes(share)} "
            f"({format_bytes(node.allocatable_memory)} allocatable - {format_bytes(reserve)} node reserve, "
            f"/ {replicas} replicas) but the vLLM process alone needs {format_bytes(fixed)}"
        )
    return NodePlan(node.name, node.allocatable_memory, reserve, replicas, share, fixed, 0, 0, 0), engine


def model_groups(geometry: ModelGeometry, request: ServingRequest) -> KVGroups:
    """The model's KV-cache groups on the request's vLLM release (groups.py), as its layout sizes them."""
    return _layout(geometry, request).groups


def block_size_for(geometry: ModelGeometry, request: ServingRequest) -> int:
    """The --block-size a plan renders: the one asked; else DEFAULT_BLOCK_SIZE, or, for a model whose attention kernels
    cannot tile it, the block vLLM itself picks when none is given (DeepSeek-V4: 256, deepseek_v4.own_block_size)."""
    if request.block_size is not None:
        return request.block_size
    facts = geometry.facts
    if facts is not None and facts.compressed is not None:
        return own_block_size(facts.compressed, DEFAULT_BLOCK_SIZE)
    return DEFAULT_BLOCK_SIZE


def _layout(geometry: ModelGeometry, request: ServingRequest) -> KVLayout:
    return kv_layout(geometry, request.tensor_parallel_size, block_size_for(geometry, request),
                     request.kv_cache_dtype, _version_tuple(request.vllm_version))


@dataclass(frozen=True)
class _PoolShape:
    groups: KVGroups
    blocks_per_chunk: int
    chunk_bytes: int
    ranks: int
    tensors: tuple[int, ...]
    max_model_len: int
    __hash__ = cached_hash  # memoized steps hash it on every call (model_facts.cached_hash)

    def footprint(self, chunks: int) -> Footprint:
        return footprint(self.groups.release, chunks * self.chunk_bytes, self.ranks, self.tensors)

    def largest(self, budget: int) -> int:
        return largest_pool(self.groups.release, budget, self.chunk_bytes, self.ranks, self.tensors)


def _check_offload_block(groups: KVGroups, offload: OffloadRequest) -> None:
    """An offload block needs one block size across the offloaded groups: vLLM asserts it at engine start
    (kv_connector/v1/offloading/config.py), a crash loop the plan must not render."""
    blocks = sorted({g.block_size for g in groups.offloaded})
    if offload.enabled and offload.offload_block_size and len(blocks) > 1:
        raise InvalidSpec(f"offload block size {offload.offload_block_size} cannot be set for this model: its "
                          f"offloaded KV-cache groups keep blocks of {blocks} tokens, and vLLM requires that 'all "
                          "groups must have the same block size' when 'block_size' is specified in "
                          "kv_connector_extra_config; leave offload.blockSize unset (one GPU block a chunk)")


@functools.lru_cache(maxsize=256)
def _pool_shape(geometry: ModelGeometry, groups: KVGroups, request: ServingRequest) -> _PoolShape:
    offload = request.offload
    block = groups.block_size
    # The chunk defaults to one block. Larger chunks pay at full hits (256-token chunks: 1.14x over 16, but 0.95x
    # at 50%; bench/block-size), yet 64-token blocks with one-block chunks gained more (1.21x;
    # bench/block-size), and a chunk is the grain of a hit: a prefix is loaded in whole chunks.
    chunk_tokens = offload.offload_block_size or block
    if chunk_tokens % block:
        raise InvalidSpec(f"offload block size {chunk_tokens} must be a multiple of the model's KV block of "
                          f"{block} tokens (vLLM's block for its KV-cache groups)")
    blocks_per_chunk = chunk_tokens // block
    # 0.26's V1 model runner (set for the contiguous layout) hands the connector one cross-layer tensor.
    cross_layer = offload.layout == Layout.CONTIGUOUS
    tensors = pinned_tensors(groups.release, len(groups.groups) == 1, cross_layer, groups.groups[0].kind == MLA,
                             sum(g.layers for g in groups.groups), max(g.layers for g in groups.groups))
    return _PoolShape(groups, blocks_per_chunk, groups.chunk_bytes(blocks_per_chunk), request.tensor_parallel_size,
                      tensors, geometry.max_model_len or DEFAULT_MAX_MODEL_LEN)


@functools.lru_cache(maxsize=256)
def _memory_rows(shape: _PoolShape, node: NodePlan, offload: OffloadRequest) -> int:
    """The rows the request asks of the replica's memory share: auto's largest pool, a fraction's (0 where the
    fraction does not hold the process), or a quantity's rows, which may exceed the share: huge pages may hold
    them (footprint.place_pool decides, _refuse_unplaced refuses)."""
    kind, value = parse_size(offload.size, "offload size")
    chunk = shape.chunk_bytes
    if kind == "auto":
        return node.max_memory_pool_bytes // chunk  # the node's largest pool: searched once, in plan()
    if kind == "fraction":
        # The pod (pool footprint + process) takes this fraction of the replica's share.
        room = int(value * node.share_bytes) - node.fixed_bytes
        return shape.largest(room) if room > 0 else 0
    chunks = int(value) // chunk
    release = shape.groups.release
    if not pins(release, chunks * chunk, shape.ranks, shape.tensors):
        call = largest_pin_call(release, chunks * chunk, shape.ranks, shape.tensors)
        raise PoolDoesNotFit(
            f"offload size {offload.size} needs one pinned allocation of {format_bytes(call)} per rank on vLLM "
            f"{release[0]}.{release[1]}, which registers each pool tensor in one call; a registration of "
            f"{format_bytes(MAX_PIN_CALL_BYTES)} or more fails (vllm#51080, fixed by chunked registration in "
            f"vLLM 0.32): ask for less, more tensor-parallel ranks, or vLLM 0.32+")
    return chunks


def _placed(shape: _PoolShape, rows: int, node: NodeFacts, node_plan: NodePlan, offload: OffloadRequest,
            tiered: bool) -> PoolPages:
    """Where the pool's pages come from and, on huge pages, its rows (footprint.place_pool, for every size)."""
    return place_pool(shape.groups.release, rows, shape.chunk_bytes, node.hugepages_2mi, node_plan.replicas_per_node,
                      node.name, node_plan.share_bytes - node_plan.fixed_bytes, shape.ranks,
                      offload.connector == Connector.SPILLWAY, tiered, parse_size(offload.size, "offload size"),
                      node_plan.max_memory_pool_bytes // shape.chunk_bytes)


def _huge_limit(shape: _PoolShape, node: NodeFacts, node_plan: NodePlan, offload: OffloadRequest,
                tiered: bool) -> int:
    """The largest pool, in bytes, the replica's share of the node's hugepages-2Mi holds (0: none can be on them)."""
    return huge_pool_limit(shape.groups.release, shape.chunk_bytes, node.hugepages_2mi, node_plan.replicas_per_node,
                           node_plan.share_bytes - node_plan.fixed_bytes, shape.ranks,
                           offload.connector == Connector.SPILLWAY, tiered) * shape.chunk_bytes


def _refuse_unplaced(shape: _PoolShape, rows: int, pages: PoolPages, node: NodeFacts, node_plan: NodePlan,
                     offload: OffloadRequest, tiered: bool) -> None:
    """Raise PoolDoesNotFit where neither the memory share nor the huge pages hold the request, naming both."""
    if pages.huge_pages:
        return
    kind, value = parse_size(offload.size, "offload size")
    budget = node_plan.share_bytes - node_plan.fixed_bytes  # what the pool's footprint may cost
    huge = _huge_limit(shape, node, node_plan, offload, tiered)
    pages_say = (f"{format_bytes(huge)} on its hugepages-2Mi ({format_bytes(pages.share_bytes or 0)} per replica, "
                 "whole 2 MiB pages of rows)" if huge else f"none on huge pages ({_no_huge_pages(shape, node, node_plan, offload, tiered)})")
    if kind == "fraction" and rows < 1 and int(value * node_plan.share_bytes) <= node_plan.fixed_bytes:
        raise PoolDoesNotFit(
            f"offload size {value} of a {format_bytes(node_plan.share_bytes)} replica share is "
            f"{format_bytes(int(value * node_plan.share_bytes))}, less than the vLLM process alone needs "
            f"({format_bytes(node_plan.fixed_bytes)}); the smallest fraction that fits is "
            f"{math.ceil(node_plan.fixed_bytes / node_plan.share_bytes * 100) / 100}; "
            f"{value} of its huge pages hold no whole page of rows: {pages_say}"
        )
    if kind == "bytes" and rows * shape.chunk_bytes > node_plan.max_memory_pool_bytes:
        cost = shape.footprint(rows)
        raise PoolDoesNotFit(
            f"offload size {offload.size} fits neither the memory nor the huge pages of one replica's share of "
            f"node {node_plan.name} ({node_plan.replicas_per_node} per node): in memory it costs "
            f"{format_bytes(cost.charged_bytes)} ({cost.rule}) plus {format_bytes(node_plan.fixed_bytes)} for the "
            f"vLLM process, more than the share's {format_bytes(node_plan.share_bytes)}; the largest pool that fits "
            f"is {format_bytes(node_plan.max_memory_pool_bytes)} in memory and {pages_say}"
        )
    if rows < 1:
        raise PoolDoesNotFit(
            f"offload pool of {format_bytes(max(budget, 0) if kind != 'bytes' else int(value))} is smaller than one "
            f"offload block ({format_bytes(shape.chunk_bytes)} = {shape.blocks_per_chunk} x "
            f"{format_bytes(shape.groups.row_bytes)} x {shape.groups.copies} ranks)"
        )


def _no_huge_pages(shape: _PoolShape, node: NodeFacts, node_plan: NodePlan, offload: OffloadRequest,
                   tiered: bool) -> str:
    """Why no pool at all can be on the node's huge pages: pool_pages' reason for the smallest pool of whole pages
    (the asked pool's own reason may be only its size), less its "4 KiB pages: "."""
    step = huge_page_rows(shape.chunk_bytes)
    probe = pool_pages(shape.groups.release, step, shape.chunk_bytes, node.hugepages_2mi, node_plan.replicas_per_node,
                       node.name, offload.connector == Connector.SPILLWAY, tiered)
    if probe.huge_pages:
        return "the page tables of one page of rows would not fit the replica's memory share beside the process"
    return probe.why.partition(": ")[2]


@functools.lru_cache(maxsize=256)
def _pool_plan(shape: _PoolShape, chunks: int, requested: str, huge_pages: bool) -> PoolPlan:
    """`chunks` rows in /dev/shm (as the release maps its region), or on huge pages: hugepages-2Mi, not memory, holds
    them there (whole 2 MiB pages of rows)."""
    release = shape.groups.release
    pool_bytes = chunks * shape.chunk_bytes
    cost = (huge_page_footprint(release, pool_bytes, shape.ranks) if huge_pages else shape.footprint(chunks))
    tokens = shape.groups.tokens_held(chunks, shape.max_model_len, shape.blocks_per_chunk)
    return PoolPlan(pool_bytes, pool_bytes / GiB, chunks, chunks * shape.blocks_per_chunk, tokens, shape.chunk_bytes,
                    shape.groups.copies, requested, cost.charged_bytes, cost.shm_bytes, cost.rule,
                    f"{release[0]}.{release[1]}", pool_bytes if huge_pages else 0)


_CHOICES = {kind: choices(kind) for kind in (EvictionPolicy, Layout, Connector)}


def _validate_offload(offload: OffloadRequest, block_size: int) -> None:
    for what, value, kind in (("eviction policy", offload.eviction_policy, EvictionPolicy),
                              ("layout", offload.layout, Layout), ("connector", offload.connector, Connector)):
        if value not in _CHOICES[kind]:
            raise InvalidSpec(f"{what} must be one of {', '.join(_CHOICES[kind])}, got {value!r}")
    chunk = offload.offload_block_size
    if block_size < 1:
        raise InvalidSpec(f"block size must be >= 1 token, got {block_size}")
    if chunk is not None and (chunk < block_size or chunk % block_size):
        # The default block grew from vLLM's 16 to 64 tokens: a chunk written for the old default lands here.
        hint = (f"; the block is {DEFAULT_BLOCK_SIZE} tokens unless set, so a {chunk}-token chunk needs a block size "
                f"that divides it (blockSize, --block-size)" if block_size == DEFAULT_BLOCK_SIZE and chunk > 0 else "")
        raise InvalidSpec(f"offload block size {chunk} must be a positive multiple of the block size {block_size}{hint}")


def engine_args(layout: KVLayout, offload: OffloadRequest, pool: PoolPlan | None,
                disk: disk_tier.DiskTierPlan | None = None) -> list[str]:
    return list(_engine_args(layout, offload, pool, disk))


@functools.lru_cache(maxsize=256)
def _engine_args(layout: KVLayout, offload: OffloadRequest, pool: PoolPlan | None,
                 disk: disk_tier.DiskTierPlan | None) -> tuple[str, ...]:
    return tuple(_build_engine_args(layout, offload, pool, disk))


def _build_engine_args(layout: KVLayout, offload: OffloadRequest, pool: PoolPlan | None,
                       disk: disk_tier.DiskTierPlan | None) -> list[str]:
    args = [api.FLAG_TENSOR_PARALLEL_SIZE, str(layout.tensor_parallel_size), api.FLAG_BLOCK_SIZE, str(layout.block_size)]
    if layout.kv_cache_dtype != layout.geometry.dtype:
        args += [api.FLAG_KV_CACHE_DTYPE, layout.kv_cache_dtype]
    if pool is None:
        return args
    simple_native = offload.eviction_policy == EvictionPolicy.LRU and offload.offload_block_size is None
    if offload.connector == Connector.NATIVE and simple_native and disk is None:
        return args + [api.FLAG_KV_OFFLOADING_BACKEND, api.NATIVE_BACKEND, api.FLAG_KV_OFFLOADING_SIZE, repr(pool.gib)]
    connector = api.SPILLWAY_CONNECTOR if offload.connector == Connector.SPILLWAY else api.OFFLOADING_CONNECTOR
    # Every hit is loaded, however short: no recompute floor (docs/planning.md#short-prompts-loaded-measured).
    config = api.kv_transfer_config(pool.bytes, offload.eviction_policy, connector=connector,
                                    offload_block_size=offload.offload_block_size,
                                    extra=disk_tier.extra_config(disk) if disk is not None else None)
    return args + [api.FLAG_KV_TRANSFER_CONFIG, api.flag_value(config)]


def _warnings(layout: KVLayout, node: NodePlan | None, node_facts: NodeFacts | None, pool: PoolPlan | None,
              request: ServingRequest, transfer: TransferPlan | None) -> list[str]:
    out = []
    if layout.block_bytes < SMALL_BLOCK_WARNING and request.offload.enabled:
        out.append(
            f"KV block is {format_bytes(layout.block_bytes)} per rank: DMA copies run well below the link's speed "
            "under 1 MiB; consider a larger --block-size or offload block size"
        )
    if request.offload.layout == Layout.DEFAULT and request.offload.enabled:
        slower = f" ({transfer.qualified_gbps:.1f} GB/s on this node)" if transfer else ""
        out.append(
            f"layout 'default' splits each block per layer: offload transfers become "
            f"{layout.groups.row_layers} copies of {format_bytes(copy_bytes(layout, request))}{slower}"
        )
    if node is not None and node_facts is not None and node.replicas_per_node * request.tensor_parallel_size < node_facts.gpus:
        idle = node_facts.gpus - node.replicas_per_node * request.tensor_parallel_size
        out.append(f"{idle} of {node_facts.gpus} GPUs on node {node.name} stay idle with this plan")
    if transfer is not None and transfer.qualified_gbps < SLOW_LINK_GBPS:
        out.append(
            f"node {node_facts.name} qualified at {transfer.qualified_gbps:.1f} GB/s CPU->GPU for "
            f"{format_bytes(transfer.copy_bytes)} copies (under {SLOW_LINK_GBPS:.0f}): "
            "reloading KV may be slower than recomputing it"
        )
    if pool is not None and pool.tokens < 16_384:
        out.append(f"the pool holds only {pool.tokens} tokens: offloading will rarely hit")
    return out


def clear_caches() -> None:
    """Forget every memoized step (the benchmark's cold plans; nothing else needs it: each step is pure)."""
    for step in (_node_plan, _pool_shape, _memory_rows, _pool_plan, _pod_plan, _engine_args, api_servers, kv_layout,
                 clear_group_caches):
        getattr(step, "cache_clear", step)()


def plan(geometry: ModelGeometry, request: ServingRequest = ServingRequest(), node: NodeFacts | None = None) -> Plan:
    """Plan one replica of `geometry` on `node` (geometry only when node is None). Its steps are pure and
    memoized: the operator re-plans an unchanged spec on every reconcile, and no search runs twice on the same
    inputs."""
    _validate_offload(request.offload, block_size_for(geometry, request))
    disk_tier.check_request(request.offload.disk, request.offload.enabled, request.offload.connector,
                            _version_tuple(request.vllm_version))
    layout = _layout(geometry, request)
    groups = layout.groups
    _check_offload_block(groups, request.offload)
    node_plan = pool = pod = disk = pages = None
    huge_env: dict[str, str] = {}
    engine = NO_NODE_ENGINE
    prefault: dict[str, str] = {}
    if node is not None:
        multimodal = is_multimodal(geometry)
        node_plan, engine = _node_plan(node, request, multimodal)
        shape = _pool_shape(geometry, groups, request)
        node_plan = _with_max_pool(node_plan, shape.largest(node_plan.share_bytes - node_plan.fixed_bytes)
                                   * shape.chunk_bytes)
        tiered = False
        if request.offload.enabled:
            offload = request.offload
            rows = _memory_rows(shape, node_plan, offload)
            pages = _placed(shape, rows, node, node_plan, offload, tiered)
            _refuse_unplaced(shape, rows, pages, node, node_plan, offload, tiered)
            if offload.disk.enabled:
                # A chunk holds the same tokens in a pool of any size: tokens_held(c) // c is the one row's.
                chunk_tokens = groups.tokens_held(1, shape.max_model_len, shape.blocks_per_chunk)
                disk = disk_tier.plan_disk_tier(offload.disk, shape.chunk_bytes, chunk_tokens, node.ephemeral_storage,
                                                node.name, node_plan.replicas_per_node, offload.disk.replicas,
                                                groups.release)
                # a disk hit is read into the pool, then reloaded: at the node's qualified rate, else the default
                # link's
                qualified = _transfer_plan(layout, request, node)
                reload = qualified or _transfer_plan(layout, request,
                                                     replace(node, dma_gbps=disk_tier.DEFAULT_RELOAD_GBPS))
                disk = disk_tier.judge(disk, geometry.config, request.tensor_parallel_size, geometry.max_model_len,
                                       node.disk_read_gbps, reload.reload_tokens_per_s if reload else None,
                                       reload.qualified_gbps if reload else None, qualified is not None)
                if disk_tier.active(disk) is not None:  # the tier keeps the pool off huge pages (pool_pages)
                    tiered = True
                    pages = _placed(shape, rows, node, node_plan, offload, tiered)
                    _refuse_unplaced(shape, rows, pages, node, node_plan, offload, tiered)
            pool = _pool_plan(shape, pages.chunks if pages.huge_pages else rows, str(offload.size), pages.huge_pages)
            if pages.huge_pages:
                huge_env = {api.ENV_POOL_HUGEPAGES_DIR: names.POOL_HUGEPAGES_MOUNT}  # the connector's hugetlbfs
        node_plan = _with_max_pool(node_plan, node_plan.max_memory_pool_bytes,
                                   _huge_limit(shape, node, node_plan, request.offload, tiered))
        prefault = prefault_env(engine, pool, request)
        pod = _pod_plan(pool, process_reserve(request.tensor_parallel_size, engine.api_servers, multimodal),
                        request.tensor_parallel_size, prefault_threads(prefault))
    active_disk = disk_tier.active(disk)
    env = {**engine_env(request), **prefault, **huge_env, **(disk_tier.engine_env() if active_disk else {})}
    args = engine_args(layout, request.offload, pool, active_disk)
    if pool is not None and any(g.kind == MAMBA for g in groups.groups):
        args.append(api.FLAG_ENABLE_PREFIX_CACHING)  # vLLM: "Hybrid models (e.g. Mamba+Attention) need it"
    args += scheduler_args(pool, request)
    args += api_server_args(engine)
    transfer = _transfer_plan(layout, request, node) if pool is not None else None
    warnings = _warnings(layout, node_plan, node, pool, request, transfer)
    warnings += disk_tier.warning(disk)
    return Plan(layout, node_plan, pool, pod, args, env, warnings, transfer, groups, engine, disk, pages)


def _with_max_pool(node: NodePlan, memory_pool_bytes: int, hugepage_pool_bytes: int = 0) -> NodePlan:
    # dataclasses.replace, spelled out: replace inspects the fields on every call, on the cold path of every plan
    return NodePlan(node.name, node.allocatable_bytes, node.reserve_bytes, node.replicas_per_node, node.share_bytes,
                    node.fixed_bytes, max(memory_pool_bytes, hugepage_pool_bytes), memory_pool_bytes,
                    hugepage_pool_bytes)


@functools.lru_cache(maxsize=256)
def api_servers(cpu_millis: int | None, replicas_per_node: int, node_name: str = "the node") -> EnginePlan:
    """How many API servers one replica runs on its share of the node's CPU (CORES_PER_API_SERVER)."""
    if cpu_millis is None:
        return EnginePlan(1, f"allocatable CPU of {node_name} unknown: vLLM's one API server")
    # Nearest whole core: the kubelet holds back a fraction of a core, so a 16-core node reports 15.5-15.9.
    cores = (cpu_millis // replicas_per_node + 500) // 1000
    count = min(max(cores // CORES_PER_API_SERVER, 1), MAX_API_SERVERS)
    return EnginePlan(count, f"{cores} CPU cores per replica ({cpu_millis / 1000:g} allocatable on {node_name} / "
                             f"{replicas_per_node} per node): one API server per {CORES_PER_API_SERVER} cores, "
                             f"at most {MAX_API_SERVERS}", max(cores, 1))


def prefault_threads(env: dict[str, str]) -> int:
    """The threads the planned engine pre-faults its pool with: vLLM's own one, unless the plan set more."""
    return int(env.get(api.ENV_PREFAULT_THREADS, 1))


def prefault_env(engine: EnginePlan, pool: PoolPlan | None, request: ServingRequest) -> dict[str, str]:
    """The threads that pre-fault the pool: the replica's cores, up to the 16 measured (Spillway's offloading spec on
    vLLM 0.33+, spillway_connector/spec.py; without the variable it takes the CPUs it may run on,
    which on a shared node are the node's, not the replica's)."""
    if pool is None or engine.cores is None or _version_tuple(request.vllm_version) < api.PREFAULT_SINCE:
        return {}
    return {api.ENV_PREFAULT_THREADS: _prefault_threads_value(engine.cores)}


def scheduler_args(pool: PoolPlan | None, request: ServingRequest) -> list[str]:
    """Spillway's scheduler, which remembers a loading request's reservation (spillway_connector/scheduler.py), on the
    releases whose own scheduler recomputes it per admitted load (1.32x prompt throughput at 100% CPU hit on the
    H200 with vLLM 0.33: bench/api-servers); 0.34 remembers it itself."""
    if pool is None or request.offload.connector != Connector.SPILLWAY:
        return []
    if _version_tuple(request.vllm_version) >= api.SCHEDULER_CLS_BEFORE:
        return []
    return [api.FLAG_SCHEDULER_CLS, api.SCHEDULER_CLS]


def _prefault_threads_value(cores: int) -> str:
    return str(min(cores, MAX_PREFAULT_THREADS))


def api_server_args(engine: EnginePlan) -> list[str]:
    return [api.FLAG_API_SERVER_COUNT, str(engine.api_servers)] if engine.api_servers > 1 else []


def with_engine(p: Plan, engine: EnginePlan, geometry: ModelGeometry) -> Plan:
    """`p` running `engine`'s API servers (the operator takes the fewest any eligible node allows).

    The pool stays as planned and the pod's memory gives back the reserve of the API servers it no longer runs:
    a pool re-sized for the freed memory might not fit the other eligible nodes the pod can land on. The plan's
    `node` stays the node's own budget (its fixed bytes and largest pool at its own API-server count), so the pod
    is below `fixed_bytes + pool` by the reserve given back."""
    args = list(p.args)
    if api.FLAG_API_SERVER_COUNT in args:
        at = args.index(api.FLAG_API_SERVER_COUNT)
        del args[at:at + 2]
    env = dict(p.env)
    if api.ENV_PREFAULT_THREADS in env and engine.cores is not None:  # planned: the new engine's cores
        env[api.ENV_PREFAULT_THREADS] = _prefault_threads_value(engine.cores)
    pod = p.pod
    if pod is not None:
        pod = _pod_plan(p.pool, process_reserve(pod.gpus, engine.api_servers, is_multimodal(geometry)), pod.gpus,
                        prefault_threads(env))
    return replace(p, args=args + api_server_args(engine), engine=engine, pod=pod, env=env)


def with_disk(p: Plan, disk: disk_tier.DiskTierPlan | None, request: ServingRequest) -> Plan:
    """`p` carrying the tier `disk` instead of its own (the operator's: one tier for every eligible node class,
    disk_tier.across_classes): its --kv-transfer-config, its environment and its warning."""
    if disk == p.disk:
        return p
    old_args = engine_args(p.layout, request.offload, p.pool, disk_tier.active(p.disk))
    assert p.args[:len(old_args)] == old_args, "the plan's args start with its engine args"
    new = disk_tier.active(disk)
    args = engine_args(p.layout, request.offload, p.pool, new) + p.args[len(old_args):]
    tier_env = disk_tier.engine_env()
    env = {k: v for k, v in p.env.items() if k not in tier_env} | (tier_env if new else {})
    stale = disk_tier.warning(p.disk)
    warnings = [w for w in p.warnings if w not in stale] + disk_tier.warning(disk)
    return replace(p, args=args, env=env, warnings=warnings, disk=disk)


def pool_setup_seconds(footprint: int, prefault_threads: int, huge_pages: bool = False) -> int:
    """The startup probe's allowance for the pool: its setup at half the slowest rate measured for this many
    pre-faulting threads, or on huge pages."""
    rate = (POOL_SETUP_HUGE_BYTES_PER_S if huge_pages
            else min(prefault_threads * POOL_SETUP_BYTES_PER_S_PER_THREAD, POOL_SETUP_BYTES_PER_S_MAX)) / 2
    return math.ceil(footprint / rate)


@functools.lru_cache(maxsize=256)
def _pod_plan(pool: PoolPlan | None, reserve: int, gpus: int, prefault_threads: int = 1) -> PodPlan:
    """The pod around a pool: Guaranteed memory for the pool's footprint, /dev/shm's extra and the process, and the
    pool's huge pages where it is on them. The startup allowance is the pool's setup at the rate of its pages."""
    footprint = pool.footprint_bytes if pool else 0
    shm = _round_up((pool.shm_pool_bytes if pool else 0) + SHM_EXTRA_BYTES, MiB)
    limit = _round_up(footprint + SHM_EXTRA_BYTES + reserve, MiB)
    huge = bool(pool and pool.hugepages_bytes)
    startup = ENGINE_START_SECONDS + pool_setup_seconds(max(footprint, pool.bytes if pool else 0), prefault_threads,
                                                        huge)
    return PodPlan(limit, limit, shm, reserve, gpus, startup, pool.hugepages_bytes if pool else 0)


def engine_env(request: ServingRequest) -> dict[str, str]:
    """Environment that makes each offloaded block one contiguous copy on the given vLLM version."""
    if not (request.offload.enabled and request.offload.layout == Layout.CONTIGUOUS):
        return {}
    if _version_tuple(request.vllm_version) < api.BLOCK_LAYOUT_ENV_SINCE:
        # Older releases know only NHD/HND layouts; their V1 model runner already allocates cross-layer blocks
        # for the offloading connector, while the default V2 runner copies each layer separately.
        return {api.ENV_USE_V2_MODEL_RUNNER: "0"}
    return {api.ENV_KV_CACHE_LAYOUT: api.CONTIGUOUS_LAYOUT}


def copy_bytes(layout: KVLayout, request: ServingRequest) -> int:
    """Bytes of one host<->GPU copy: the whole offload row when it is contiguous, else one layer's K and V."""
    if request.offload.layout == Layout.CONTIGUOUS:
        return layout.block_bytes
    return layout.layer_page_bytes * layout.kv_per_layer


def _transfer_plan(layout: KVLayout, request: ServingRequest, node: NodeFacts | None) -> TransferPlan | None:
    if node is None:
        return None
    unit = copy_bytes(layout, request)
    gbps = interpolate_log2(node.dma_table, unit) if node.dma_table else node.dma_gbps
    if not gbps:
        return None
    rate = gbps * 1e9
    # A prefix reloads a row per block of each group that keeps it whole, at that group's own block (DeepSeek-V4's
    # latents a row per 256 tokens beside windows of 64): one rank's bytes a token, since each rank has its link.
    return TransferPlan(gbps, unit, layout.block_bytes / rate * 1e6, rate / layout.groups.prefix_bytes_per_token(1))


@functools.lru_cache(maxsize=64)
def _version_tuple(version: str) -> tuple[int, int]:
    try:
        return require_supported(version)
    except UnsupportedVLLMVersion as exc:
        raise InvalidSpec(str(exc)) from None
