"""The node-disk tier under the CPU pool: its size, its volume, the pod's ephemeral storage and vLLM's fs tier.

Pure: (disk request, node facts, the pool's chunk) -> DiskTierPlan, and the plan's kv_connector_extra_config.

vLLM 0.32+ runs a TieringOffloadingSpec: the CPU pool is its primary tier and every chunk stored there is also
written to each secondary tier (write-through); a chunk missing from the pool is looked up on disk and
promoted back into the pool before the GPU loads it (vllm/v1/kv_offload/tiering/manager.py). Its "fs" tier
writes one file per chunk and never deletes one; the connector's evictor (spillway_connector.disk_evictor)
keeps the files under `bound_bytes`, the number this module plans.

Sizes:
    emptyDir (the node's ephemeral storage):
        share     = (allocatable ephemeral-storage - node reserve) / replicas per node
        tier      = auto: share - OTHER_EPHEMERAL_BYTES; a fraction: of the share; a quantity: exactly
        the pod   = ephemeral-storage request = limit = share (the tier and, beside it, the weights vLLM
                    downloads to the home emptyDir, logs and /tmp); the tier's emptyDir sizeLimit holds the
                    bound plus TIER_SLACK_BYTES, which the evictor never lets it reach, so the kubelet has
                    no reason to evict the pod for the tier
    a generic ephemeral volume, a hostPath or a PVC the administrator names (`capacity` says its size):
        share     = capacity / replicas per node (a PVC: / all replicas, which share it)
        tier      = as above, without the allowance (nothing else lives there)
    bound       = tier - TIER_SLACK_BYTES, whole chunks: what the evictor keeps the files under

A ModelServer's replicas may land on any eligible node, and one Deployment carries one tier: where the nodes
differ in ephemeral storage or disk read rate, each node class is planned and judged, and the tier rendered is
the smallest class's size under the most doubtful class's verdict (`across_classes`), both named in the status.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spillway_connector.transfer_config import TIERING_OFFLOADING_SPEC, disk_tier_extra

from . import k8s_names as names
from . import vllm_api as api
from .claims import ClaimNotFound, check_mountable
from .errors import InvalidSpec, SpillwayError
from .options import Connector
from .quantity import GiB, MiB, format_bytes, parse_bytes, parse_size


class DiskTierDoesNotFit(SpillwayError):
    reason = "DiskTierDoesNotFit"


class DiskHostPathNotAllowed(SpillwayError):
    """A hostPath tier outside the directories the operator's administrator allows: a ModelServer's author
    could otherwise have the pods write (and the evictor delete) in any directory of every node."""

    reason = "DiskHostPathNotAllowed"


class DiskVolumeNotFound(ClaimNotFound):
    """The claim the tier names is not there: the pods would wait for it, Pending, with no word on the resource.
    The operator looks again after its retry delay, so a claim created later is found."""

    reason = "DiskVolumeNotFound"


# Volume kinds of spec.offload.disk.volume.
EMPTY_DIR = "emptyDir"
EPHEMERAL = "ephemeral"
HOST_PATH = "hostPath"
PVC = "persistentVolumeClaim"
VOLUME_KINDS = (EMPTY_DIR, EPHEMERAL, HOST_PATH, PVC)

SPILLWAY_CONNECTOR_CHOICE = Connector.SPILLWAY

# The node's disk read rate into the pool (GB/s), as `spillway qualify --disk` measures and annotates it.
ANNOTATION_QUALIFIED_DISK_GBPS = "spillway.dev/qualified-disk-read-gbps"

# Node directories no hostPath tier may be in, or above, whatever the administrator allows: the system's own
# trees, the kubelet's and the container runtimes' state (pods' volumes, images, secrets) and the node's logs.
SYSTEM_DIRECTORIES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/root", "/run",
                      "/sbin", "/sys", "/usr", "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/docker",
                      "/var/lib/etcd", "/var/log", "/var/run")

VOLUME_NAME = "kv-disk-tier"
MOUNT_PATH = "/var/lib/spillway/kv-tier"  # the fs tier's root_dir
TIERING_SINCE = (0, 32)  # vllm/v1/kv_offload/tiering/ (fs tier) ships from 0.32

# Beside the tier on the node's ephemeral storage: the weights vLLM downloads into the pod's home emptyDir, its
# logs and /tmp. 8B bf16 weights are 16 GB, 70B 141 GB: an `auto` tier leaves this much of the replica's share
# to them, a given size must leave it too (set a smaller tier for larger weights, or mount them from a volume).
OTHER_EPHEMERAL_BYTES = 160 * GiB
# Files being written (a temporary file per chunk before its rename), directories and config.json: room above
# the evictor's bound inside the tier's volume.
TIER_SLACK_BYTES = 1 * GiB
NODE_EPHEMERAL_RESERVE_FRACTION = 0.05  # images, logs and the kubelet's own files on the node's disk
MIN_TIER_CHUNKS = 16

# Thread counts of vLLM's fs tier (its default is 16 each). Reads are on the TTFT path: each thread holds one
# O_DIRECT chunk read in flight (the C extension releases the GIL), so the thread count is the queue depth the
# disk sees; NVMe drives need 8-32 outstanding reads of 1-8 MiB to reach their sequential rate, so reads keep
# vLLM's 16. Writes are every store of the CPU pool again (write-through), off the request path: 8 leave the
# device's queue to the reads. Not measured on the H200 node yet: `spillway qualify --disk` measures the read side.
READ_THREADS = 16
WRITE_THREADS = 8

# A disk hit is read into the CPU pool, then copied to the GPU like any pool hit: where the node's CPU->GPU rate
# is not qualified, that copy is counted at one direction of a PCIe Gen5 x16 link, 51.3-52.4 GB/s measured on the
# H200 (bench/copy-rates/README.md), rounded down. Leaving the copy out would price a disk
# hit of Llama-3.1-8B at 5.43 GB/s of disk reads instead of 6.09 (7.21 with the chunks' checksum).
DEFAULT_RELOAD_GBPS = 50.0

# Every chunk a load reads is checked (BLAKE3 over its bytes) by the read thread that read it before the pool
# may serve it, so a disk hit costs its checksum too: 36.22 GiB/s (38.9 GB/s) over 2 MiB chunks with 16 threads
# on the H200 host, the READ_THREADS the tier runs (bench/disk-tier/results/checksum-cost-h200-host.json). It is
# added to the read's time, as if no thread hashed while another read: an upper bound on what it costs.
CHECKSUM_GBPS = 36.22 * GiB / 1e9


@dataclass(frozen=True)
class DiskVolume:
    kind: str = EMPTY_DIR
    capacity: str | None = None  # the volume's size, for auto: required for hostPath, ephemeral and PVC
    storage_class: str | None = None  # ephemeral: the StorageClass of each pod's claim
    host_path: str | None = None
    claim_name: str | None = None


@dataclass(frozen=True)
class DiskTierRequest:
    enabled: bool = False
    size: str = "auto"  # "auto", a fraction "0.5" of the replica's share, or a quantity "500Gi"
    volume: DiskVolume = field(default_factory=DiskVolume)
    replicas: int = 1  # the ModelServer's replicas: a PVC tier is shared by all of them
    # Where the engine sees the tier: the pod's mount; `spillway plan --disk-root-dir` for an engine run on a node
    # directly (bench/gpu), where no volume is mounted.
    root_dir: str = MOUNT_PATH


@dataclass(frozen=True)
class DiskTierPlan:
    tier_bytes: int  # the volume's part for this replica (the emptyDir sizeLimit, the ephemeral claim)
    bound_bytes: int  # what the evictor keeps the chunk files under
    chunks: int  # chunk files the bound holds
    tokens: int
    chunk_bytes: int
    share_bytes: int  # this replica's share of the node's ephemeral storage or of the named volume
    requested: str
    volume: str
    root_dir: str
    ephemeral_request_bytes: int | None  # the pod's ephemeral-storage request = limit (emptyDir only)
    read_threads: int
    write_threads: int
    why: str
    active: bool = True  # False: planned, but a disk hit would not beat recompute: nothing of it is rendered
    pays: bool | None = None  # None: the node's disk read rate (or the model's prefill rate) is unknown
    break_even_gbps: float | None = None
    read_gbps: float | None = None
    verdict: str = ""
    reload_gbps: float | None = None  # the pool-to-GPU rate the break-even counts (qualified or the default)
    reload_qualified: bool = False  # whether reload_gbps is the node's qualified rate
    node_classes: int = 1  # the eligible node classes the tier was planned for (across_classes)
    sized_for: str = ""  # a node of the class whose share sized the tier ("": the planned node)
    decided_by: str = ""  # a node of the class whose verdict decided whether the tier is rendered


def check_request(request: DiskTierRequest, offload_enabled: bool, connector: str, release: tuple[int, int]) -> None:
    """What the spec alone can refuse."""
    if not request.enabled:
        return
    if not offload_enabled:
        raise InvalidSpec("offload.disk needs the CPU pool above it: offload.enabled is false")
    if connector != SPILLWAY_CONNECTOR_CHOICE:
        raise InvalidSpec(f"offload.disk needs offload.connector {SPILLWAY_CONNECTOR_CHOICE}: its evictor keeps the "
                          f"tier under its size (vLLM's fs tier never deletes a file), got {connector!r}")
    check_release(release)
    check_volume(request.volume)
    check_root_dir(request.root_dir)
    parse_size(request.size, "offload.disk.size")


def check_root_dir(root_dir: str) -> None:
    # vLLM's fs tier joins its chunk paths onto root_dir: a relative one would land wherever the engine started.
    if not str(root_dir).startswith("/"):
        raise InvalidSpec(f"the disk tier's root directory must be an absolute path, got {root_dir!r}")


def engine_env() -> dict[str, str]:
    """The chunk files are named by vLLM's block hashes, a chain seeded from PYTHONHASHSEED when the prefix-cache
    hash is not a cryptographic one (vllm/v1/core/kv_cache_utils.py NONE_HASH): a fixed seed keeps the names of a
    prefix the same after a restart, so a restarted engine finds its chunks."""
    return {api.ENV_PYTHONHASHSEED: api.PYTHONHASHSEED_VALUE}


def check_release(release: tuple[int, int]) -> None:
    if release < TIERING_SINCE:
        raise InvalidSpec(f"offload.disk needs vLLM's tiered offloading (vLLM {TIERING_SINCE[0]}.{TIERING_SINCE[1]} "
                          f"or newer), but the plan is for vLLM {release[0]}.{release[1]}")


def check_volume(volume: DiskVolume) -> None:
    """What no node fact can tell: the volume named completely."""
    if volume.kind not in VOLUME_KINDS:
        raise InvalidSpec(f"offload.disk.volume must be one of {', '.join(VOLUME_KINDS)}, got {volume.kind!r}")
    if volume.kind == HOST_PATH:
        check_host_directory(volume.host_path, "offload.disk.volume.hostPath.path")
    if volume.kind == PVC and not volume.claim_name:
        raise InvalidSpec("offload.disk.volume.persistentVolumeClaim.claimName is required")
    if volume.kind == EPHEMERAL and not volume.capacity:
        raise InvalidSpec("offload.disk.volume.ephemeral.capacity is required: the size each pod's claim "
                          "may take of its storage class")


def check_host_directory(path: str | None, where: str) -> str:
    """A node directory named plainly: absolute, every segment a name (no `.`, `..` or empty one, which the
    kubelet would resolve elsewhere), neither a system directory nor above one; InvalidSpec otherwise."""
    text = path or ""
    if not text.startswith("/"):
        raise InvalidSpec(f"{where} must be an absolute path, got {path!r}")
    segments = text[1:].split("/")
    if "\0" in text or any(s in ("", ".", "..") for s in segments):
        raise InvalidSpec(f"{where} {path!r} must name its directory plainly: no '.', '..' or empty segments "
                          "(and not / itself)")
    for system in SYSTEM_DIRECTORIES:
        if _within(text, system) or _within(system, text):
            raise InvalidSpec(f"{where} {path} is {'in' if _within(text, system) else 'above'} the node's {system}: "
                              "a disk tier writes and deletes files there; name a directory of its own")
    return text


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def check_host_path_prefixes(prefixes: Sequence[str], where: str) -> tuple[str, ...]:
    """The administrator's allowed hostPath directories, each named as plainly as a ModelServer's must be."""
    return tuple(check_host_directory(p, f"{where}: {p!r}") for p in prefixes)


def check_host_path_allowed(volume: DiskVolume, prefixes: Sequence[str]) -> None:
    """A hostPath tier only in, or under, a directory the operator's administrator allows (default: none)."""
    if volume.kind != HOST_PATH:
        return
    where = "offload.disk.volume.hostPath.path"
    path = check_host_directory(volume.host_path, where)
    if not prefixes:
        raise DiskHostPathNotAllowed(
            f"{where} {path}: this operator allows no node directory for a disk tier (its administrator lists them "
            f"in the chart value {names.CHART_VALUE_DISK_HOST_PATH_PREFIXES}); use emptyDir, ephemeral or a "
            "persistentVolumeClaim")
    if not any(_within(path, prefix) for prefix in prefixes):
        raise DiskHostPathNotAllowed(f"{where} {path} is under none of the directories this operator allows for a "
                                     f"disk tier ({', '.join(prefixes)}; {names.CHART_VALUE_DISK_HOST_PATH_PREFIXES})")


def claim_bytes(claim: Mapping[str, Any]) -> int | None:
    """What a claim holds: its bound capacity, else what it asks for; None when it says neither readably."""
    held = ((claim.get("status") or {}).get("capacity") or {}).get("storage")
    held = held or (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
    try:
        return parse_bytes(str(held), "storage") if held is not None else None
    except InvalidSpec:
        return None


def check_claim(request: DiskTierRequest, claim: Mapping[str, Any] | None, namespace: str) -> None:
    """A PVC tier against its claim as the API server has it (None: there is none). Each of these would leave the
    pods Pending or ContainerCreating, or let the tier fill the claim, with nothing said on the ModelServer."""
    v = request.volume
    where = "offload.disk.volume.persistentVolumeClaim"
    check_mountable(claim, field=f"{where}.claimName", name=v.claim_name, namespace=namespace,
                    replicas=request.replicas, writes="the tier writes its chunk files there",
                    not_found=DiskVolumeNotFound)
    assert claim is not None
    held = claim_bytes(claim)
    declared = parse_bytes(v.capacity, f"{where}.capacity") if v.capacity else None
    if held is None and declared is not None:  # the check below cannot be made: said, not skipped
        shown = ((claim.get("status") or {}).get("capacity") or {}).get("storage") or (
            ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
        raise DiskTierDoesNotFit(f"{where}.claimName {v.claim_name}: the claim's size {str(shown)[:40]!r} is no "
                                 f"readable quantity, so the tier's capacity {v.capacity} cannot be checked against "
                                 "it; fix the claim's storage request")
    if held is not None and declared is not None and declared > held:
        raise DiskTierDoesNotFit(f"{where}.capacity {v.capacity} ({format_bytes(declared)}) is more than "
                                 f"PersistentVolumeClaim {v.claim_name} holds ({format_bytes(held)}): the tier "
                                 f"would fill the claim; give at most {format_bytes(held)}")


def node_ephemeral_reserve(allocatable: int) -> int:
    return int(allocatable * NODE_EPHEMERAL_RESERVE_FRACTION)


def _share(request: DiskTierRequest, node_ephemeral: int | None, node_name: str, replicas_per_node: int,
           replicas: int) -> tuple[int, int, str]:
    """(this replica's share, the allowance left beside the tier, where the share comes from)."""
    volume = request.volume
    if volume.kind == EMPTY_DIR:
        if node_ephemeral is None:
            raise DiskTierDoesNotFit(f"node {node_name} reports no allocatable ephemeral-storage: an emptyDir disk "
                                     "tier cannot be sized there (name a hostPath or PVC with its capacity)")
        usable = node_ephemeral - node_ephemeral_reserve(node_ephemeral)
        return (usable // replicas_per_node, OTHER_EPHEMERAL_BYTES,
                (f"{format_bytes(node_ephemeral)} allocatable ephemeral storage on {node_name}, less "
                 f"{NODE_EPHEMERAL_RESERVE_FRACTION:.0%}, / {replicas_per_node} replicas"))
    if volume.capacity is None:
        raise InvalidSpec(f"offload.disk.volume.{volume.kind}.capacity is required to size the tier "
                          "(the operator cannot see how large the volume is)")
    capacity = parse_bytes(volume.capacity, f"offload.disk.volume.{volume.kind}.capacity")
    sharing = replicas if volume.kind == PVC else replicas_per_node
    what = "all replicas share the claim" if volume.kind == PVC else "replicas per node"
    return capacity // max(1, sharing), 0, f"{format_bytes(capacity)} {volume.kind} / {sharing} ({what})"


def plan_disk_tier(request: DiskTierRequest, chunk_bytes: int, chunk_tokens: int, node_ephemeral: int | None,
                   node_name: str, replicas_per_node: int, replicas: int, release: tuple[int, int]) -> DiskTierPlan:
    """The tier of one replica on the node; raises DiskTierDoesNotFit with the numbers when it cannot be."""
    check_release(release)
    check_volume(request.volume)
    share, other, source = _share(request, node_ephemeral, node_name, replicas_per_node, replicas)
    kind, value = parse_size(request.size, "offload.disk.size")
    room = share - other
    if kind == "auto":
        tier = room
    elif kind == "fraction":
        tier = int(share * value)
    else:
        tier = int(value)
    if tier > room:
        beside = f" and {format_bytes(other)} for the weights, logs and /tmp beside it" if other else ""
        raise DiskTierDoesNotFit(f"offload.disk.size {request.size} ({format_bytes(tier)}) exceeds the replica's "
                                 f"share of {format_bytes(share)} ({source}){beside}: at most "
                                 f"{format_bytes(max(room, 0))}")
    chunks = (tier - TIER_SLACK_BYTES) // chunk_bytes if chunk_bytes > 0 else 0
    if chunks < MIN_TIER_CHUNKS:
        raise DiskTierDoesNotFit(f"offload.disk tier of {format_bytes(max(tier, 0))} ({source}) holds {max(chunks, 0)} "
                                 f"chunks of {format_bytes(chunk_bytes)} after {format_bytes(TIER_SLACK_BYTES)} for "
                                 f"files in flight; it needs at least {MIN_TIER_CHUNKS}")
    ephemeral = share if request.volume.kind == EMPTY_DIR else None
    why = (f"{format_bytes(tier)} of {format_bytes(share)} ({source}); the evictor keeps {chunks:,} chunk files "
           f"({format_bytes(chunks * chunk_bytes)}) under it")
    return DiskTierPlan(tier, chunks * chunk_bytes, chunks, chunks * chunk_tokens, chunk_bytes, share,
                        str(request.size), request.volume.kind, request.root_dir, ephemeral, READ_THREADS, WRITE_THREADS,
                        why)


def extra_config(plan: DiskTierPlan) -> dict[str, Any]:
    """kv_connector_extra_config keys of the tier: vLLM's TieringOffloadingSpec with its fs tier at the volume,
    and the connector's bound."""
    return disk_tier_extra(plan.root_dir, plan.bound_bytes, plan.read_threads, plan.write_threads,
                           spec_name=TIERING_OFFLOADING_SPEC, break_even_gbps=plan.break_even_gbps)


def volume(request: DiskTierRequest, plan: DiskTierPlan) -> dict[str, Any]:
    """The pod's volume for the tier."""
    v = request.volume
    size = _mi(plan.tier_bytes)
    if v.kind == EMPTY_DIR:
        return {"name": VOLUME_NAME, "emptyDir": {"sizeLimit": size}}
    if v.kind == EPHEMERAL:
        claim: dict[str, Any] = {"accessModes": [names.ACCESS_READ_WRITE_ONCE], "resources": {"requests": {"storage": size}}}
        if v.storage_class:
            claim["storageClassName"] = v.storage_class
        return {"name": VOLUME_NAME, "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}
    if v.kind == HOST_PATH:
        return {"name": VOLUME_NAME, "hostPath": {"path": v.host_path, "type": "DirectoryOrCreate"}}
    return {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": v.claim_name}}


def mount() -> dict[str, Any]:
    return {"name": VOLUME_NAME, "mountPath": MOUNT_PATH}


def _mi(n: int) -> str:
    return f"{-(-n // MiB)}Mi"


# -- does it pay -----------------------------------------------------------------------------------------------
# The prompt lengths a disk hit is judged at: where the CPU pool runs out first and recompute costs most.
JUDGED_LENGTHS = (8_192, 32_768, 131_072)


@dataclass(frozen=True)
class DiskVerdict:
    pays: bool | None  # None: the node's disk read rate is not qualified, so the tier runs as asked
    break_even_gbps: float | None  # the disk read rate (1e9 B/s) at which a disk hit costs what recompute does
    why: str


def disk_load_seconds(tokens: int, bytes_per_token: float, read_gbps: float, reload_tokens_per_s: float | None,
                      checksum_gbps: float | None = CHECKSUM_GBPS) -> float:
    """A disk hit of `tokens`: read into the CPU pool and checked, then the pool's copy to the GPU (the tier's
    steps, one after the other)."""
    read_bytes = tokens * bytes_per_token
    seconds = read_bytes / (read_gbps * 1e9) + (read_bytes / (checksum_gbps * 1e9) if checksum_gbps else 0.0)
    return seconds + (tokens / reload_tokens_per_s if reload_tokens_per_s else 0.0)


def disk_pays(read_gbps: float | None, bytes_per_token: float, recompute_tokens_per_s: float | None,
              reload_tokens_per_s: float | None, max_model_len: int, reload_note: str = "",
              checksum_gbps: float | None = CHECKSUM_GBPS) -> DiskVerdict:
    """Whether loading a prefix from the node's disk beats recomputing it, at the judged lengths the model serves.

    Both sides are linear in the tokens here (a read of their KV bytes, its checksum and the pool's reload,
    against the replica's prefill rate, routing.recompute_tokens_per_s), which leaves out attention's quadratic
    share of a long prefill: a disk hit that pays here pays more at 128K, one that loses here may still win
    there."""
    lengths = [n for n in JUDGED_LENGTHS if n <= max_model_len] or [max_model_len]
    if not recompute_tokens_per_s or bytes_per_token <= 0:
        return DiskVerdict(None, None, "the model's prefill rate is unknown: the tier runs as asked")
    recompute_s_per_token = 1.0 / recompute_tokens_per_s
    reload_s_per_token = 1.0 / reload_tokens_per_s if reload_tokens_per_s else 0.0
    checksum_s_per_token = bytes_per_token / (checksum_gbps * 1e9) if checksum_gbps else 0.0
    room = recompute_s_per_token - reload_s_per_token - checksum_s_per_token
    break_even = bytes_per_token / room / 1e9 if room > 0 else None
    checked = f", its checksum at {checksum_gbps:.1f} GB/s" if checksum_gbps else ""
    need = (f"a disk hit pays from {break_even:.2f} GB/s of disk reads{reload_note}{checked}"
            if break_even is not None
            else "the pool's own reload and the checksum are already slower than recompute: no disk rate pays")
    if read_gbps is None:
        return DiskVerdict(None, break_even, f"the node's disk read rate is not qualified (spillway qualify --disk); "
                                             f"{need}: the tier runs as asked")
    parts = []
    for n in lengths:
        load = disk_load_seconds(n, bytes_per_token, read_gbps, reload_tokens_per_s, checksum_gbps)
        parts.append(f"{n // 1024}K tokens: {load * 1e3:,.0f} ms from disk vs {n * recompute_s_per_token * 1e3:,.0f} "
                     "ms recompute")
    pays = break_even is not None and read_gbps > break_even
    verdict = "pays" if pays else "does not pay"
    return DiskVerdict(pays, break_even, f"disk reads {read_gbps:.2f} GB/s, {need}: the tier {verdict} "
                                         f"({'; '.join(parts)})")



def judge(plan: DiskTierPlan, config: Any, tensor_parallel_size: int, max_model_len: int | None,
          read_gbps: float | None, reload_tokens_per_s: float | None, reload_gbps: float | None = None,
          reload_qualified: bool = False) -> DiskTierPlan:
    """The tier with its verdict: active where a disk hit beats recompute or nobody can tell, inactive (planned,
    its numbers kept, nothing of it rendered) where it does not. The reload is the pool's copy to the GPU at
    `reload_gbps` (the node's qualified rate, else DEFAULT_RELOAD_GBPS)."""
    from .routing import recompute_tokens_per_s

    bytes_per_token = plan.chunk_bytes / (plan.tokens // plan.chunks)
    note = ""
    if reload_tokens_per_s and reload_gbps:
        source = "qualified" if reload_qualified else "the default: the node's CPU->GPU rate is not qualified"
        note = f", its reload from the pool counted at {reload_gbps:.1f} GB/s ({source})"
    verdict = disk_pays(read_gbps, bytes_per_token, recompute_tokens_per_s(config, tensor_parallel_size),
                        reload_tokens_per_s, max_model_len or JUDGED_LENGTHS[-1], note)
    return dataclasses.replace(plan, active=verdict.pays is not False, pays=verdict.pays,
                               break_even_gbps=verdict.break_even_gbps, read_gbps=read_gbps,
                               verdict=verdict.why, reload_gbps=reload_gbps if reload_tokens_per_s else None,
                               reload_qualified=reload_qualified and bool(reload_tokens_per_s))


# How doubtful each verdict is: one class whose disk loses to recompute leaves the tier off for all (a pod there
# would read slower than it recomputes); one unjudged class leaves it running as asked.
_DOUBT = {False: 0, None: 1, True: 2}


def across_classes(classes: Sequence[tuple[DiskTierPlan, Sequence[str]]]) -> DiskTierPlan:
    """One tier for the replicas of every node class: each class's plan (judged) with its nodes' names.

    The Deployment's pods land on any of the classes, so the size (the emptyDir sizeLimit, the pod's
    ephemeral-storage request, the evictor's bound) is the class with the smallest share's, which fits on every
    node; the verdict is the most doubtful class's (a loss on any class leaves the tier off). A ModelServer per
    node class (nodeSelector) gets each class its own size and verdict."""
    if not classes:
        raise ValueError("across_classes needs at least one node class")
    if len(classes) == 1:
        plan, nodes = classes[0]
        first = min(nodes)
        return dataclasses.replace(plan, node_classes=1, sized_for=first, decided_by=first)
    named = [(plan, sorted(nodes)) for plan, nodes in classes]
    sized, sized_nodes = min(named, key=lambda c: (c[0].share_bytes, c[0].tier_bytes, c[1][0]))
    decided, decided_nodes = min(named, key=lambda c: (_DOUBT[c[0].pays], c[0].read_gbps or 0.0,
                                                       -(c[0].break_even_gbps or 0.0), c[1][0]))
    shares = ", ".join(f"{_class_name(n)}: {format_bytes(p.share_bytes)}"
                       for p, n in sorted(named, key=lambda c: (c[0].share_bytes, c[1][0])))
    why = (f"{sized.why}; sized for {_class_name(sized_nodes)}, the smallest share of the {len(named)} node classes "
           f"the replicas may land on ({shares})")
    verdicts = sorted({_DOUBT[p.pays] for p, _ in named})
    verdict = decided.verdict
    if len(verdicts) > 1 or len({p.read_gbps for p, _ in named}) > 1:
        verdict = (f"{_class_name(decided_nodes)} decides for all {len(named)} node classes: {verdict} "
                   "(one ModelServer per node class, by nodeSelector, judges each on its own)")
    return dataclasses.replace(sized, active=decided.active, pays=decided.pays,
                               break_even_gbps=decided.break_even_gbps, read_gbps=decided.read_gbps,
                               verdict=verdict, reload_gbps=decided.reload_gbps,
                               reload_qualified=decided.reload_qualified, why=why, node_classes=len(named),
                               sized_for=sized_nodes[0], decided_by=decided_nodes[0])


def _class_name(nodes: Sequence[str]) -> str:
    return f"node {nodes[0]}" + (f" (and {len(nodes) - 1} more like it)" if len(nodes) > 1 else "")


def warning(plan: DiskTierPlan | None) -> list[str]:
    if plan is None or plan.pays is True:
        return []
    return [f"disk tier {'left off' if not plan.active else 'unjudged'}: {plan.verdict}"]


def active(plan: DiskTierPlan | None) -> DiskTierPlan | None:
    return plan if plan is not None and plan.active else None
