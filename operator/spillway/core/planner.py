"""The pure planning core: (offload request, node facts, model geometry) -> Plan.

No I/O. The operator, the CLI and the chart tests all call `plan()`.

Memory model of one replica (one pod, `tensor_parallel_size` GPUs):

    pool        = what vLLM allocates for offloaded KV: whole chunks of
                  `block_bytes x copies x blocks_per_chunk`, page aligned (vLLM's CPUOffloadingSpec)
    shm         = pool x SHM_OVERHEAD_FACTOR + SHM_EXTRA_BYTES
                  (the pool is an mmap in /dev/shm pinned with cudaHostRegister;
                  vllm issue #53042 measured 1.92x the requested size as unreclaimable shmem;
                  SHM_EXTRA covers NCCL and vLLM's shared-memory message queues)
    reserve     = PROCESS_RESERVE_BASE + PROCESS_RESERVE_PER_RANK x TP
                  (API server, engine core, one worker per rank: Python, torch, CUDA context,
                  model loading buffers, NCCL; #53042 saw ~8.75 GiB anonymous memory per rank)
    limit       = request = shm + reserve   (/dev/shm emptyDir pages are charged to the pod)

A node runs `replicas_per_node` such pods next to its daemons: NODE_RESERVE is held back
from allocatable memory, and the sum of the pods' limits never exceeds allocatable.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from spillway_connector.versions import UnsupportedVLLMVersion, require_supported

from . import vllm_api as api
from .errors import InvalidSpec, NoEligibleNodes, PoolDoesNotFit
from .geometry import DEFAULT_BLOCK_SIZE, KVLayout, ModelGeometry, kv_layout
from .options import Attention, Connector, EvictionPolicy, Layout, choices
from .quantity import GiB, MiB, format_bytes, parse_bytes
from .rates import interpolate_log2

SHM_OVERHEAD_FACTOR = 2.0  # measured 1.92x (vllm#53042), rounded up
SHM_EXTRA_BYTES = 1 * GiB
PROCESS_RESERVE_BASE = 8 * GiB
PROCESS_RESERVE_PER_RANK = 6 * GiB
NODE_RESERVE_MIN = 4 * GiB
NODE_RESERVE_FRACTION = 0.05
PAGE_ALIGNMENT = 4096  # vLLM aligns each CPU chunk to the page size
SMALL_BLOCK_WARNING = 1 * MiB  # below this DMA runs well under the link's speed
SLOW_LINK_GBPS = 10.0  # a qualified rate under this rarely beats recomputing the prefill
ROUNDING_SLACK = 2 * MiB  # limits are rounded up to MiB; keep that inside the share


@dataclass(frozen=True)
class NodeFacts:
    allocatable_memory: int  # bytes
    gpus: int
    name: str = "described-node"
    dma_gbps: float | None = None  # qualified CPU->GPU copy rate at 2 MiB blocks (the node annotation), if known
    dma_table: tuple[tuple[int, float], ...] = ()  # (block bytes, CPU->GPU GB/s) from the full qualification


@dataclass(frozen=True)
class OffloadRequest:
    enabled: bool = True
    size: str = "auto"  # "auto", a fraction "0.5" of the replica's share, or a quantity "200Gi"
    eviction_policy: EvictionPolicy = EvictionPolicy.LRU
    layout: Layout = Layout.CONTIGUOUS
    offload_block_size: int | None = None  # tokens per offloaded chunk; a multiple of block_size
    connector: Connector = Connector.SPILLWAY


@dataclass(frozen=True)
class ServingRequest:
    tensor_parallel_size: int = 1
    block_size: int = DEFAULT_BLOCK_SIZE
    kv_cache_dtype: str = "auto"
    replicas_per_node: int | None = None
    offload: OffloadRequest = field(default_factory=OffloadRequest)
    vllm_version: str = api.IMAGE_VLLM_VERSION


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


@dataclass(frozen=True)
class PodPlan:
    memory_request_bytes: int
    memory_limit_bytes: int
    shm_bytes: int
    process_reserve_bytes: int
    gpus: int


@dataclass(frozen=True)
class NodePlan:
    name: str
    allocatable_bytes: int
    reserve_bytes: int
    replicas_per_node: int
    share_bytes: int  # one replica's share of the node
    fixed_bytes: int  # process reserve + shm extra: what the pod needs with no pool
    max_pool_bytes: int


@dataclass(frozen=True)
class TransferPlan:
    """What the node's qualified copy rate means for this model (present when the node was qualified)."""

    qualified_gbps: float  # CPU->GPU at the size of each copy (1e9 B/s), from the node's qualification
    copy_bytes: int  # one copy: a whole block when the layout is contiguous, else one layer's K and V
    block_reload_us: float  # one KV block (one rank) back from CPU
    reload_tokens_per_s: float  # tokens of KV one replica can reload per second (ranks load in parallel)


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

    def to_dict(self) -> dict[str, Any]:
        layout = self.layout
        out: dict[str, Any] = {
            "model": layout.geometry.name,
            "geometry": {
                **layout.geometry.as_dict(),
                "tensor_parallel_size": layout.tensor_parallel_size,
                "block_size": layout.block_size,
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
        for name in ("node", "pool", "pod", "transfer"):
            part = getattr(self, name)
            if part is not None:
                out[name] = asdict(part)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def process_reserve(tensor_parallel_size: int) -> int:
    return PROCESS_RESERVE_BASE + PROCESS_RESERVE_PER_RANK * tensor_parallel_size


def node_reserve(allocatable: int) -> int:
    return max(NODE_RESERVE_MIN, int(allocatable * NODE_RESERVE_FRACTION))


def shm_bytes_for(pool_bytes: int) -> int:
    return _round_up(math.ceil(pool_bytes * SHM_OVERHEAD_FACTOR) + SHM_EXTRA_BYTES, MiB)


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def _parse_size(size: str) -> tuple[str, float | int | None]:
    """("auto", None) | ("fraction", f) | ("bytes", n)."""
    text = str(size).strip()
    if text == "auto":
        return "auto", None
    if "." in text and text.replace(".", "", 1).isdigit():  # "0.5", "1.0": a fraction; "1" is one byte
        try:
            fraction = float(Decimal(text))
        except InvalidOperation:  # pragma: no cover - guarded above
            raise InvalidSpec(f"offload size {size!r} is not a number")
        if not 0 < fraction <= 1:
            raise InvalidSpec(f"offload size fraction must be in (0, 1], got {text}")
        return "fraction", fraction
    return "bytes", parse_bytes(text, "offload size")


def _node_plan(node: NodeFacts, request: ServingRequest) -> NodePlan:
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
    share = (node.allocatable_memory - reserve) // replicas
    fixed = process_reserve(tp) + SHM_EXTRA_BYTES + ROUNDING_SLACK
    if share < fixed:
        raise PoolDoesNotFit(
            f"node {node.name}: one replica's share is {format_bytes(share)} "
            f"({format_bytes(node.allocatable_memory)} allocatable - {format_bytes(reserve)} node reserve, "
            f"/ {replicas} replicas) but the vLLM process alone needs {format_bytes(fixed)}"
        )
    max_pool = int((share - fixed) / SHM_OVERHEAD_FACTOR)
    return NodePlan(node.name, node.allocatable_memory, reserve, replicas, share, fixed, max_pool)


def _pool_plan(layout: KVLayout, node: NodePlan, offload: OffloadRequest) -> PoolPlan:
    kind, value = _parse_size(offload.size)
    if kind == "auto":
        wanted = node.max_pool_bytes
    elif kind == "fraction":
        # The pod (pool footprint + process) takes this fraction of the replica's share.
        wanted = int((value * node.share_bytes - node.fixed_bytes) / SHM_OVERHEAD_FACTOR)
        if wanted <= 0:
            raise PoolDoesNotFit(
                f"offload size {value} of a {format_bytes(node.share_bytes)} replica share is "
                f"{format_bytes(int(value * node.share_bytes))}, less than the vLLM process alone needs "
                f"({format_bytes(node.fixed_bytes)}); the smallest fraction that fits is "
                f"{math.ceil(node.fixed_bytes / node.share_bytes * 100) / 100}"
            )
    else:
        wanted = int(value)
        if wanted > node.max_pool_bytes:
            raise PoolDoesNotFit(
                f"offload size {offload.size} needs {format_bytes(shm_bytes_for(wanted))} of /dev/shm "
                f"(pool x {SHM_OVERHEAD_FACTOR} + {format_bytes(SHM_EXTRA_BYTES)}) plus the vLLM process, but one "
                f"replica's share of node {node.name} is {format_bytes(node.share_bytes)} "
                f"({node.replicas_per_node} per node); the largest pool that fits is {format_bytes(node.max_pool_bytes)}"
            )
    copies = 1 if (layout.geometry.attention == Attention.MLA and layout.tensor_parallel_size > 1) else layout.tensor_parallel_size
    blocks_per_chunk = (offload.offload_block_size or layout.block_size) // layout.block_size
    chunk = _round_up(layout.block_bytes * copies * blocks_per_chunk, PAGE_ALIGNMENT)
    chunks = wanted // chunk
    if chunks < 1:
        raise PoolDoesNotFit(
            f"offload pool of {format_bytes(wanted)} is smaller than one offload block "
            f"({format_bytes(chunk)} = {blocks_per_chunk} x {format_bytes(layout.block_bytes)} x {copies} ranks)"
        )
    pool_bytes = chunks * chunk
    blocks = chunks * blocks_per_chunk
    return PoolPlan(pool_bytes, pool_bytes / GiB, chunks, blocks, blocks * layout.block_size, chunk, copies,
                    str(offload.size))


def _validate_offload(offload: OffloadRequest, block_size: int) -> None:
    for what, value, kind in (("eviction policy", offload.eviction_policy, EvictionPolicy),
                              ("layout", offload.layout, Layout), ("connector", offload.connector, Connector)):
        if value not in choices(kind):
            raise InvalidSpec(f"{what} must be one of {', '.join(choices(kind))}, got {value!r}")
    chunk = offload.offload_block_size
    if block_size < 1:
        raise InvalidSpec(f"block size must be >= 1 token, got {block_size}")
    if chunk is not None and (chunk < block_size or chunk % block_size):
        raise InvalidSpec(f"offload block size {chunk} must be a positive multiple of the block size {block_size}")


def engine_args(layout: KVLayout, offload: OffloadRequest, pool: PoolPlan | None) -> list[str]:
    args = [api.FLAG_TENSOR_PARALLEL_SIZE, str(layout.tensor_parallel_size), api.FLAG_BLOCK_SIZE, str(layout.block_size)]
    if layout.kv_cache_dtype != layout.geometry.dtype:
        args += [api.FLAG_KV_CACHE_DTYPE, layout.kv_cache_dtype]
    if pool is None:
        return args
    simple_native = offload.eviction_policy == EvictionPolicy.LRU and offload.offload_block_size is None
    if offload.connector == Connector.NATIVE and simple_native:
        return args + [api.FLAG_KV_OFFLOADING_BACKEND, api.NATIVE_BACKEND, api.FLAG_KV_OFFLOADING_SIZE, repr(pool.gib)]
    connector = api.SPILLWAY_CONNECTOR if offload.connector == Connector.SPILLWAY else api.OFFLOADING_CONNECTOR
    config = api.kv_transfer_config(pool.bytes, offload.eviction_policy, connector=connector,
                                    offload_block_size=offload.offload_block_size)
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
            f"{layout.geometry.num_layers} copies of {format_bytes(copy_bytes(layout, request))}{slower}"
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


def plan(geometry: ModelGeometry, request: ServingRequest = ServingRequest(), node: NodeFacts | None = None) -> Plan:
    """Plan one replica of `geometry` on `node` (geometry only when node is None)."""
    _validate_offload(request.offload, request.block_size)
    layout = kv_layout(geometry, request.tensor_parallel_size, request.block_size, request.kv_cache_dtype)
    node_plan = pool = pod = None
    if node is not None:
        node_plan = _node_plan(node, request)
        if request.offload.enabled:
            pool = _pool_plan(layout, node_plan, request.offload)
        shm = shm_bytes_for(pool.bytes) if pool else SHM_EXTRA_BYTES
        reserve = process_reserve(request.tensor_parallel_size)
        limit = _round_up(shm + reserve, MiB)
        pod = PodPlan(limit, limit, shm, reserve, request.tensor_parallel_size)
    env = engine_env(request)
    args = engine_args(layout, request.offload, pool)
    transfer = _transfer_plan(layout, request, node) if pool is not None else None
    warnings = _warnings(layout, node_plan, node, pool, request, transfer)
    return Plan(layout, node_plan, pool, pod, args, env, warnings, transfer)


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
    """Bytes of one host<->GPU copy: the whole block when it is contiguous, else one layer's K and V."""
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
    return TransferPlan(gbps, unit, layout.block_bytes / rate * 1e6, rate * layout.block_size / layout.block_bytes)


def _version_tuple(version: str) -> tuple[int, int]:
    try:
        return require_supported(version)
    except UnsupportedVLLMVersion as exc:
        raise InvalidSpec(str(exc)) from None
