"""`spillway plan`: size the offload pool of one replica on a described node."""
from __future__ import annotations

import argparse
import math
import sys

from ..adapters.hub import fetch_config
from ..adapters.model_config import catalog_ids, resolve_geometry
from ..core import disk_tier as dt
from ..core import vllm_api as api
from ..core.errors import InvalidSpec
from ..core.geometry import DEFAULT_BLOCK_SIZE
from ..core.model_source import ModelSource
from ..core.options import Attention, Connector, EvictionPolicy, Layout, choices
from ..core.planner import NodeFacts, OffloadRequest, Plan, ServingRequest, plan
from ..core.quantity import format_bytes, parse_bytes, parse_cpu_millis


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="size the CPU offload pool of one replica on a node")
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="model id (bundled catalog; see --list-models)")
    model.add_argument("--model-config", metavar="PATH", help="a Hugging Face config.json (or its directory)")
    model.add_argument("--list-models", action="store_true", help="list the catalog's model ids")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--block-size", type=int, help=f"tokens per KV block (default {DEFAULT_BLOCK_SIZE}, or the "
                   "block vLLM picks for a model whose kernels cannot tile it)")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto|bfloat16|float16|fp8")
    p.add_argument("--node-memory", help="node allocatable memory, e.g. 512Gi")
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--node-cpus", help="node allocatable CPU, e.g. 16 or 15500m (sets the API servers)")
    add_node_hugepages(p)
    p.add_argument("--offload-size", default="auto", help="auto | fraction of the replica's share | quantity")
    p.add_argument("--offload-block-size", type=int, help="tokens per offloaded chunk (multiple of --block-size)")
    p.add_argument("--eviction-policy", default=EvictionPolicy.LRU.value, choices=choices(EvictionPolicy))
    p.add_argument("--layout", default=Layout.CONTIGUOUS.value, choices=choices(Layout))
    p.add_argument("--connector", default=Connector.SPILLWAY.value, choices=choices(Connector))
    p.add_argument("--no-offload", action="store_true", help="plan the replica without a CPU pool")
    p.add_argument("--replicas-per-node", type=int)
    p.add_argument("--vllm-version", default=api.IMAGE_VLLM_VERSION,
                   help=f"vLLM release the replica runs (default: our image's, {api.IMAGE_VLLM_VERSION})")
    p.add_argument("--qualified-gbps", type=float, help="the node's measured GPU<->CPU rate (spillway qualify)")
    disk = p.add_argument_group("disk tier (spec.offload.disk)")
    disk.add_argument("--disk-tier", action="store_true", help="a node-disk tier under the CPU pool (vLLM 0.32+)")
    disk.add_argument("--disk-size", help="offload.disk.size: auto (default) | fraction of the replica's share | "
                      "quantity")
    disk.add_argument("--disk-volume", choices=dt.VOLUME_KINDS, help="offload.disk.volume: where the tier lives "
                      f"(default {dt.EMPTY_DIR}: the node's ephemeral storage)")
    disk.add_argument("--disk-capacity", help="the volume's capacity (hostPath, ephemeral, persistentVolumeClaim)")
    disk.add_argument("--disk-path", help="hostPath.path")
    disk.add_argument("--disk-claim", help="persistentVolumeClaim.claimName")
    disk.add_argument("--disk-storage-class", help="ephemeral.storageClassName")
    disk.add_argument("--disk-root-dir", help=f"where the engine sees the tier (default {dt.MOUNT_PATH}, the pod's "
                      "mount): for an engine run on the node itself, outside a pod")
    disk.add_argument("--node-ephemeral-storage", help="the node's allocatable ephemeral storage, e.g. 3Ti (sizes an "
                      "emptyDir tier)")
    disk.add_argument("--qualified-disk-gbps", type=float, help="the node's measured disk read rate into the pool "
                      "(spillway qualify --disk): whether the tier pays")
    p.add_argument("--allow-hub", action="store_true",
                   help="fetch config.json from the Hugging Face hub (needs HF_TOKEN) when the catalog lacks the model")
    p.add_argument("--revision", default="main", help="model revision for --allow-hub")
    p.add_argument("--output", "-o", default="text", choices=["text", "json"])
    p.set_defaults(func=run)


def add_node_hugepages(parser: argparse.ArgumentParser) -> None:
    """--node-hugepages, one flag for the two commands that describe a node (`spillway plan`, `spillway render`)."""
    parser.add_argument("--node-hugepages", help="node allocatable hugepages-2Mi, e.g. 1600Gi (the pool goes on 2 MiB "
                        "huge pages where the replica's share holds it; auto or a fraction fills that share, or that "
                        "fraction of it, where it holds at least the pool the memory share would; a quantity beyond "
                        "the memory share goes on them where they hold it)")


def node_from_args(memory: str | None, gpus: int | None, dma_gbps: float | None = None,
                   cpus: str | None = None, ephemeral: str | None = None,
                   disk_gbps: float | None = None, hugepages: str | None = None) -> NodeFacts | None:
    if memory is None and gpus is None:
        for flag, value in (("--node-cpus", cpus), ("--node-ephemeral-storage", ephemeral),
                            ("--qualified-disk-gbps", disk_gbps), ("--node-hugepages", hugepages)):
            if value is not None:
                raise InvalidSpec(f"{flag} describes a node: give --node-memory and --gpus-per-node too")
        return None
    if memory is None or gpus is None:
        raise InvalidSpec("--node-memory and --gpus-per-node go together")
    for flag, rate in (("--qualified-gbps", dma_gbps), ("--qualified-disk-gbps", disk_gbps)):
        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise InvalidSpec(f"{flag} must be a measured rate > 0 GB/s, got {rate:g}")
    cpu_millis = parse_cpu_millis(cpus, "--node-cpus") if cpus is not None else None
    ephemeral_bytes = parse_bytes(ephemeral, "--node-ephemeral-storage") if ephemeral is not None else None
    return NodeFacts(parse_bytes(memory, "--node-memory"), gpus, dma_gbps=dma_gbps, cpu_millis=cpu_millis,
                     ephemeral_storage=ephemeral_bytes, disk_read_gbps=disk_gbps,
                     hugepages_2mi=parse_bytes(hugepages, "--node-hugepages") if hugepages is not None else None)


# flag -> the DiskVolume field it sets, and the volume kinds that take it (as spec.offload.disk.volume does)
DISK_VOLUME_FLAGS = {
    "disk_capacity": ("--disk-capacity", "capacity", (dt.EPHEMERAL, dt.HOST_PATH, dt.PVC)),
    "disk_path": ("--disk-path", "host_path", (dt.HOST_PATH,)),
    "disk_claim": ("--disk-claim", "claim_name", (dt.PVC,)),
    "disk_storage_class": ("--disk-storage-class", "storage_class", (dt.EPHEMERAL,)),
}


def disk_from_args(args: argparse.Namespace) -> dt.DiskTierRequest:
    """The disk tier the flags ask for, as spec.offload.disk would; a flag without --disk-tier, or one its volume
    kind does not take, is refused rather than ignored."""
    given = [flag for flag in ("disk_size", "disk_volume", "disk_root_dir", *DISK_VOLUME_FLAGS)
             if getattr(args, flag, None) is not None]
    if not getattr(args, "disk_tier", False):
        if given:
            raise InvalidSpec(f"--{given[0].replace('_', '-')} sets the disk tier: give --disk-tier too")
        return dt.DiskTierRequest()
    kind = args.disk_volume or dt.EMPTY_DIR
    fields = {}
    for attr, (flag, field_name, kinds) in DISK_VOLUME_FLAGS.items():
        value = getattr(args, attr, None)
        if value is None:
            continue
        if kind not in kinds:
            raise InvalidSpec(f"{flag} is for --disk-volume {' or '.join(kinds)}, not {kind}")
        fields[field_name] = value
    return dt.DiskTierRequest(enabled=True, size=args.disk_size or "auto", volume=dt.DiskVolume(kind, **fields),
                              root_dir=args.disk_root_dir or dt.MOUNT_PATH)


def request_from_args(args: argparse.Namespace) -> ServingRequest:
    return ServingRequest(
        tensor_parallel_size=args.tensor_parallel_size,
        block_size=args.block_size,
        kv_cache_dtype=args.kv_cache_dtype,
        replicas_per_node=args.replicas_per_node,
        vllm_version=args.vllm_version,
        offload=OffloadRequest(
            enabled=not args.no_offload,
            size=args.offload_size,
            eviction_policy=EvictionPolicy(args.eviction_policy),
            layout=Layout(args.layout),
            offload_block_size=args.offload_block_size,
            connector=Connector(args.connector),
            disk=disk_from_args(args),
        ),
    )


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The Plan `spillway plan` prints for these parsed arguments (bench/gpu calls it too)."""
    source = ModelSource(model=args.model, revision=args.revision, config_file=args.model_config)
    fetch_hub = (lambda model, revision: fetch_config(model, revision or "main")) if args.allow_hub else None
    geometry = resolve_geometry(source, fetch_hub=fetch_hub)
    node = node_from_args(args.node_memory, args.gpus_per_node, args.qualified_gbps, args.node_cpus,
                          getattr(args, "node_ephemeral_storage", None), getattr(args, "qualified_disk_gbps", None),
                          getattr(args, "node_hugepages", None))
    request = request_from_args(args)
    if request.offload.disk.enabled and node is None:
        raise InvalidSpec("--disk-tier is sized from the node: give --node-memory and --gpus-per-node")
    return plan(geometry, request, node)


def run(args: argparse.Namespace) -> int:
    if args.list_models:
        print("\n".join(catalog_ids()))
        return 0
    result = plan_from_args(args)
    sys.stdout.write(result.to_json() + "\n" if args.output == "json" else format_plan(result))
    return 0


def _rows(title: str, rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [title] + [f"  {k.ljust(width)}  {v}" for k, v in rows] + [""]


def _groups_line(p: Plan) -> str:
    """vLLM's KV-cache groups in one line: kinds, windows and the chunk row each OffloadKey reserves."""
    counts: dict[str, int] = {}
    for g in p.groups.groups:
        label = g.kind + (f" ({g.window}-token window)" if g.window else "")
        counts[label] = counts.get(label, 0) + 1
    kinds = ", ".join(f"{n} {label}" for label, n in counts.items())
    return (f"{kinds}; {p.groups.block_size}-token blocks, each key holds a "
            f"{format_bytes(p.groups.row_bytes)} row per rank")


def _row_layers(p: Plan) -> str:
    """What one offload row holds: every layer, or for a model of several KV-cache groups one group's."""
    groups = p.layout.groups
    return "all layers" if len(groups.groups) == 1 else f"{groups.row_layers} layers of one KV-cache group"


def format_plan(p: Plan) -> str:
    g, lay = p.layout.geometry, p.layout
    heads = "latent (MLA)" if g.attention == Attention.MLA else f"{g.num_kv_heads} KV heads, {lay.kv_heads_per_rank} per rank"
    lines = _rows(f"Model  {g.name}", [
        ("architecture", g.architecture),
        ("layers", str(g.num_layers)),
        ("attention", f"{heads}, head dim {g.head_dim}"),
        ("kv cache dtype", f"{lay.kv_cache_dtype} ({lay.dtype_bytes} B)"),
        ("tensor parallel", str(lay.tensor_parallel_size)),
        ("layer page", f"{format_bytes(lay.layer_page_bytes)} ({lay.kv_block_size} tokens, one of K/V, one rank)"),
        ("KV block", f"{format_bytes(lay.block_bytes)} ({_row_layers(p)}, one rank: the DMA unit)"),
        ("bytes per token", f"{format_bytes(lay.bytes_per_token)} (all ranks)"),
        *([("KV-cache groups", _groups_line(p))] if p.groups is not None and p.groups.is_hybrid else []),
    ])
    if p.node is not None:
        n = p.node
        lines += _rows(f"Node  {n.name}", [
            ("allocatable", format_bytes(n.allocatable_bytes)),
            ("node reserve", format_bytes(n.reserve_bytes)),
            ("replicas", f"{n.replicas_per_node} per node"),
            ("replica share", format_bytes(n.share_bytes)),
        ])
    if p.pool is not None:
        pool = p.pool
        lines += _rows("CPU offload pool (one replica)", [
            ("size", f"{format_bytes(pool.bytes)} (--kv-offloading-size {pool.gib:.3f} GiB, asked: {pool.requested})"),
            ("blocks", f"{pool.blocks:,}"),
            ("tokens held", f"{pool.tokens:,}"),
            ("footprint", f"{format_bytes(pool.footprint_bytes)}: {pool.footprint}"),
            *([("pages", p.pages.why)] if p.pages is not None else []),
        ])
    if p.pod is not None:
        pod = p.pod
        lines += _rows("Pod", [
            ("memory request", format_bytes(pod.memory_request_bytes)),
            ("memory limit", format_bytes(pod.memory_limit_bytes)),
            ("/dev/shm", format_bytes(pod.shm_bytes)),
            *([("hugepages-2Mi", f"{format_bytes(pod.hugepages_bytes)} (request = limit: the pool)")]
              if pod.hugepages_bytes else []),
            ("process reserve", format_bytes(pod.process_reserve_bytes)),
            ("GPUs", str(pod.gpus)),
            ("startup", f"{pod.startup_seconds // 60} min (the startup probe; the pool's setup included)"),
        ])
    if p.transfer is not None:
        t = p.transfer
        lines += _rows("Transfer (qualified node)", [
            ("CPU->GPU", f"{t.qualified_gbps:.1f} GB/s for {format_bytes(t.copy_bytes)} copies"),
            ("block reload", f"{t.block_reload_us:.0f} us"),
            ("reload rate", f"{t.reload_tokens_per_s:,.0f} tokens/s"),
        ])
    if p.disk is not None:
        d = p.disk
        judged = {True: "pays", False: "does not pay: left off", None: "not judged: runs as asked"}[d.pays]
        lines += _rows("Disk tier (one replica)", [
            ("size", f"{format_bytes(d.tier_bytes)} on {d.volume} (asked: {d.requested}), at {d.root_dir}"),
            ("sizing", d.why),
            ("chunks", f"{d.chunks:,} of {format_bytes(d.chunk_bytes)} ({d.tokens:,} tokens)"),
            *([("ephemeral storage", f"{format_bytes(d.ephemeral_request_bytes)} (request = limit)")]
              if d.ephemeral_request_bytes is not None else []),
            ("threads", f"{d.read_threads} read, {d.write_threads} write"),
            ("pays", f"{judged}; {d.verdict}" if d.verdict else judged),
        ])
    lines += ["vLLM", f"  API servers  {p.engine.api_servers}: {p.engine.why}",
              "  args  " + " ".join(_quote(a) for a in p.args)]
    lines += [f"  env   {k}={v}" for k, v in p.env.items()] + [""]
    lines += [f"warning: {w}" for w in p.warnings]
    return "\n".join(lines).rstrip("\n") + "\n"


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in ' {}"') else arg
