"""What an offload pool really costs in host memory, per vLLM release: the measured rule, not a factor.

vLLM 0.26 pins each pool tensor with `torch.zeros(..., pin_memory=True)` (vllm/v1/kv_offload/cpu/
gpu_worker.py; its CPUOffloadingSpec.create_worker passes no mmap region). PyTorch's pinned host
allocator rounds every allocation up to a power of two, and the pages are shared memory charged to the
pod's memory cgroup, though not held in /dev/shm. Measured on the H200
(bench/footprint/README.md, raw figures in footprint.json): Llama-3.1-8B V1 runner
16 GiB asked -> Shmem +16.14 GiB (one tensor), 24 -> +32.14, 48 -> +64.14; V2 runner 24 GiB ->
32 x 0.75 GiB tensors -> +32.05; DeepSeek-V2-Lite (MLA) 24 GiB -> 27 x 0.889 GiB -> +27.05;
Nemotron-H-8B 16 GiB -> 4 x 3.999 GiB -> +16.15. /dev/shm held 0 bytes in every case.

vLLM 0.32 and 0.33 back the pool with one mmap region in /dev/shm that every rank maps and pins
with cudaHostRegister (vllm/v1/kv_offload/cpu/shared_offload_region.py); its creator checks that
/dev/shm has room for the whole region (check_shm_free_space). That allocation path on the H200
(bench/footprint/results/pinned_alloc.json): 3 GiB -> Shmem +3.01 GiB, /dev/shm +3.00 GiB;
vllm#50094: 6 GiB asked, 6.00 GiB used. About 1.0x, held in /dev/shm.

Both add the page tables of every process that maps the pool: 8 bytes per 4 KiB page on x86-64,
charged to the cgroup (memory.stat pagetables).

On 2 MiB huge pages (0.33+, Spillway's spec: pool_pages below) the region's pages are the hugetlb cgroup's, the
pod's hugepages-2Mi request, not memory: the memory cgroup keeps 8 bytes of page table per 2 MiB per process.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GiB = 2**30
MiB = 2**20

# Other pinned buffers of 0.26 beyond the pool tensors: +0.05 to +0.15 GiB of shmem
# (bench/footprint/README.md); budgeted at 0.25 GiB.
PINNED_POOL_OVERHEAD = 256 * MiB
# 0.32+: the region is the cost (pinned_alloc.json: 3 GiB -> +3.01 GiB, the 0.01 being page tables, below);
# 16 MiB rounding slack.
MMAP_POOL_OVERHEAD = 16 * MiB
PAGE_TABLE_FRACTION = 8 / 4096  # one 8-byte page-table entry per 4 KiB page, per mapping process
# One host registration of 512 GiB or more fails with cudaErrorMemoryAllocation however much memory is free
# (the driver's per-call page table; 549.7e9 B pinned, 549.9e9 B failed: vllm#51080). vLLM registers the pool in
# row-aligned chunks of at most 64 GiB since vllm#51081 (0.32 and 0.33: pin_mmap_region in
# vllm/v1/kv_offload/cpu/gpu_worker.py); 0.26 pins each pool tensor in one call (torch pin_memory).
MAX_PIN_CALL_BYTES = 512 * GiB
CHUNKED_PINNING_SINCE = (0, 32)


@dataclass(frozen=True)
class Footprint:
    pool_bytes: int  # what vLLM allocates for the pool (chunks x chunk bytes)
    charged_bytes: int  # what the pool adds to the pod's memory cgroup
    shm_bytes: int  # what the pool holds in /dev/shm
    tensors: int  # pool allocations (0.26: pinned tensors per rank; 0.32+: one shared region)
    rule: str  # one line: how charged_bytes follows from pool_bytes

    @property
    def factor(self) -> float:
        return self.charged_bytes / self.pool_bytes if self.pool_bytes else 1.0


def pinned_tensors(release: tuple[int, int], single_group: bool, cross_layer: bool, mla: bool, num_layers: int,
                   max_group_layers: int) -> tuple[int, ...]:
    """How many pool tensors vLLM 0.26 pins on each rank: one per GPU KV-cache tensor it hands the offload
    worker (footprint.md): 1 with the V1 runner's cross-layer block of a uniform model, one per layer with the
    V2 runner and for MLA (measured with V2; the V1 case is unmeasured, so both counts are charged), one per
    slot of the hybrid allocator's shared tensors (the layers of a KV-cache group) for hybrid models.
    0.32+ maps one region. Several counts: the footprint is the largest of them."""
    if release >= (0, 32):
        return (1,)
    if not single_group:
        return (max_group_layers,)
    if mla:
        return (1, num_layers) if cross_layer else (num_layers,)
    return (1,) if cross_layer else (num_layers,)


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _charged(release: tuple[int, int], pool_bytes: int, ranks: int, tensors: tuple[int, ...]) -> int:
    """footprint(...).charged_bytes without its description (the searches call it many times)."""
    tables = int(pool_bytes * PAGE_TABLE_FRACTION * ranks)
    if release < (0, 32):
        return max(ranks * n * next_power_of_two(-(-pool_bytes // (ranks * n))) for n in tensors) + tables + \
            PINNED_POOL_OVERHEAD
    return pool_bytes + tables + MMAP_POOL_OVERHEAD


def footprint(release: tuple[int, int], pool_bytes: int, ranks: int, tensors: tuple[int, ...]) -> Footprint:
    """The pool's cost for `pool_bytes` (all ranks' rows), `ranks` mapping processes, `tensors` per rank."""
    tables = int(pool_bytes * PAGE_TABLE_FRACTION * ranks)
    if release < (0, 32):
        count, rounded = max(((n, ranks * n * next_power_of_two(-(-pool_bytes // (ranks * n)))) for n in tensors),
                             key=lambda pair: pair[1])
        charged = rounded + tables + PINNED_POOL_OVERHEAD
        rule = (f"vLLM {release[0]}.{release[1]} pins {ranks * count} tensor(s), each rounded up to a power of "
                f"two: {_gib(pool_bytes)} -> {_gib(rounded)} of shared memory charged to the pod, none in /dev/shm")
        return Footprint(pool_bytes, charged, 0, count, rule)
    charged = pool_bytes + tables + MMAP_POOL_OVERHEAD
    rule = (f"vLLM {release[0]}.{release[1]} maps one {_gib(pool_bytes)} region in /dev/shm, the pool's "
            f"exact size, plus page tables of {ranks} rank(s)")
    return Footprint(pool_bytes, charged, pool_bytes + MMAP_POOL_OVERHEAD, 1, rule)


def largest_pin_call(release: tuple[int, int], pool_bytes: int, ranks: int, tensors: tuple[int, ...]) -> int:
    """The largest single host registration the pool takes: 0.26's largest pinned tensor (rounded up to a power
    of two by PyTorch's pinned allocator), 0; with chunked registration (0.32+)."""
    if release >= CHUNKED_PINNING_SINCE or pool_bytes <= 0:
        return 0
    return next_power_of_two(-(-pool_bytes // (ranks * min(tensors))))


def pins(release: tuple[int, int], pool_bytes: int, ranks: int, tensors: tuple[int, ...]) -> bool:
    return largest_pin_call(release, pool_bytes, ranks, tensors) < MAX_PIN_CALL_BYTES


def largest_pool(release: tuple[int, int], budget: int, chunk_bytes: int, ranks: int,
                 tensors: tuple[int, ...]) -> int:
    """The most chunks whose footprint fits `budget` bytes and that the release can pin. The footprint only grows
    with the chunks, so the largest count fills 0.26's power-of-two tensors to the brim: the rounding is paid for,
    never wasted."""
    low, high = 0, max(budget, 0) // chunk_bytes
    if release >= CHUNKED_PINNING_SINCE:
        # the region costs itself, its page tables and a fixed slack: linear, so solved, then checked exactly
        per_chunk = chunk_bytes * (1 + PAGE_TABLE_FRACTION * ranks)
        chunks = max(0, min(high, int((budget - MMAP_POOL_OVERHEAD) // per_chunk)))
        while chunks > 0 and _charged(release, chunks * chunk_bytes, ranks, tensors) > budget:
            chunks -= 1
        while chunks < high and _charged(release, (chunks + 1) * chunk_bytes, ranks, tensors) <= budget:
            chunks += 1
        return chunks
    if release < CHUNKED_PINNING_SINCE:
        # each tensor's power of two stays under the per-call ceiling: at most half of it per tensor
        high = min(high, (MAX_PIN_CALL_BYTES // 2) * ranks * min(tensors) // chunk_bytes)
    while low < high:
        mid = (low + high + 1) // 2
        if _charged(release, mid * chunk_bytes, ranks, tensors) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


HUGE_PAGE_BYTES = 2 * MiB  # the node's hugepages-2Mi resource
# The releases whose pool Spillway's offloading spec puts on a hugetlbfs mount (spillway_connector/hugetlb_pool.py,
# PATCHES.md entry 10): vLLM 0.33 and 0.34 create the region at a fixed /dev/shm/vllm_offload_{engine_id}.mmap
# (vllm/v1/kv_offload/cpu/shared_offload_region.py), and /dev/shm itself cannot be hugetlbfs (vLLM's message queues
# and Python's shared memory ask for sizes it refuses; the kubelet mounts it with no size, so statvfs says 0 free:
# tests/planner/test_hugepages.py). The connector links a directory in /dev/shm to the pod's hugepages emptyDir and
# hands vLLM an engine id through the link, in one file of whole huge pages. 0.32's region is vLLM's own (the spec
# does not build it), 0.26 pins torch tensors, which no file backs; vLLM's own connector builds vLLM's own region.
HUGETLBFS_REGION_RELEASES: frozenset[tuple[int, int]] = frozenset({(0, 33), (0, 34)})
HUGE_PAGE_TABLE_FRACTION = 8 / HUGE_PAGE_BYTES  # one 8-byte PMD entry per 2 MiB page, per mapping process


def huge_page_footprint(release: tuple[int, int], pool_bytes: int, ranks: int) -> Footprint:
    """The pool's cost to the memory cgroup on huge pages: its pages are the hugetlb cgroup's (the hugepages-2Mi
    request), so only page tables and the slack stay; nothing in /dev/shm."""
    charged = _huge_charged(pool_bytes, ranks)
    rule = (f"vLLM {release[0]}.{release[1]} maps one {_gib(pool_bytes)} region on 2 MiB huge pages (hugepages-2Mi, "
            f"not memory): page tables of {ranks} rank(s) and a slack are what memory holds")
    return Footprint(pool_bytes, charged, 0, 1, rule)


def _huge_charged(pool_bytes: int, ranks: int) -> int:
    return int(pool_bytes * HUGE_PAGE_TABLE_FRACTION * ranks) + MMAP_POOL_OVERHEAD


def huge_page_rows(chunk_bytes: int) -> int:
    """The fewest chunk rows that make whole 2 MiB pages: hugetlbfs takes no other file size."""
    return HUGE_PAGE_BYTES // math.gcd(chunk_bytes, HUGE_PAGE_BYTES)


@dataclass(frozen=True)
class PoolPages:
    """Where the pool's pages come from: 2 MiB huge pages, or 4 KiB pages pre-faulted before the pool is pinned."""

    huge_pages: bool
    hugepages_bytes: int  # the hugepages-2Mi request = limit; 0 on 4 KiB pages
    share_bytes: int | None  # the replica's share of the node's allocatable hugepages-2Mi; None when unknown
    why: str  # one line, for the status and `spillway plan`
    chunks: int = 0  # the pool's chunks on huge pages: whole pages of rows (auto: as many as the share holds); 0 on
    # 4 KiB pages


def pool_pages(release: tuple[int, int], chunks: int, chunk_bytes: int, node_hugepages: int | None, replicas: int,
               node_name: str, spillway_spec: bool = True, disk_tier: bool = False) -> PoolPages:
    """Huge pages when Spillway's spec places the release's region on hugetlbfs and the replica's share of the node's
    hugepages-2Mi holds the pool's rows rounded down to whole 2 MiB pages (as largest_huge_pool counts); else 4 KiB
    pages, pre-faulted, and the reason. Never with a disk tier: vLLM's tiering spec maps the pool in the engine core too, at its own path in
    /dev/shm (vllm/v1/kv_offload/tiering/spec.py get_manager), which the connector does not place, so the tier would
    read and write another file than the workers' (spillway_connector/spec.py tiering_region)."""
    step = huge_page_rows(chunk_bytes)
    whole = chunks // step * step  # what goes on huge pages: hugetlbfs takes whole 2 MiB pages only
    share = hugepage_share(node_hugepages, replicas)
    fallback = "4 KiB pages"  # pre-faulted as the plan's env and connector say (SPILLWAY_PREFAULT_THREADS)
    if share is None:
        return PoolPages(False, 0, None, f"{fallback}: node {node_name}'s allocatable hugepages-2Mi is not known")
    if share < whole * chunk_bytes:
        return PoolPages(False, 0, share, f"{fallback}: the replica's share of node {node_name}'s hugepages-2Mi is "
                                          f"{_gib(share)}, the pool needs {_gib(whole * chunk_bytes)}")
    if disk_tier:
        return PoolPages(False, 0, share, f"{fallback}: node {node_name}'s hugepages-2Mi would hold the pool "
                                          f"({_gib(share)} per replica), but with the disk tier vLLM's engine core "
                                          "maps the pool at its own path in /dev/shm")
    if not on_hugetlbfs(release, spillway_spec):
        how = ("pins torch tensors, which no file backs" if release < CHUNKED_PINNING_SINCE
               else "builds its region itself, in /dev/shm (Spillway's spec builds it from 0.33)" if release < (0, 33)
               else "creates its own region in /dev/shm with the native connector (Spillway's connector puts it on "
                    "the hugepages volume)")
        return PoolPages(False, 0, share, f"{fallback}: node {node_name}'s hugepages-2Mi would hold the pool "
                                          f"({_gib(share)} per replica), but vLLM {release[0]}.{release[1]} {how}")
    if whole < 1:
        return PoolPages(False, 0, share, f"{fallback}: a chunk row of {chunk_bytes} bytes makes whole 2 MiB pages "
                                          f"only every {step} rows, more than the pool's {chunks}")
    return _huge(whole, chunk_bytes, share, _of_share(whole * chunk_bytes, node_name, share) + _given_up(chunks, whole))


def _huge(rows: int, chunk_bytes: int, share: int | None, why: str) -> PoolPages:
    """`rows` on huge pages, the one wording every such placement shares: `why` says where from."""
    return PoolPages(True, rows * chunk_bytes, share, f"2 MiB huge pages: {why}; memory holds only its page tables",
                     rows)


def _of_share(pool_bytes: int, node_name: str, share: int) -> str:
    return f"{_gib(pool_bytes)} of node {node_name}'s hugepages-2Mi ({_gib(share)} per replica)"


def _given_up(asked: int, whole: int) -> str:
    return f", {asked - whole} of its {asked} rows given up to make whole pages" if whole < asked else ""


def hugepage_share(node_hugepages: int | None, replicas: int) -> int | None:
    """One replica's whole 2 MiB pages of the node's allocatable hugepages-2Mi; None when unknown."""
    if node_hugepages is None:
        return None
    return node_hugepages // max(1, replicas) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES


def on_hugetlbfs(release: tuple[int, int], spillway_spec: bool) -> bool:
    """Whether the pool's region is a file Spillway's spec places, so that it can be on the hugetlbfs mount."""
    return release in HUGETLBFS_REGION_RELEASES and spillway_spec


def largest_huge_pool(share: int, chunk_bytes: int, memory_budget: int, ranks: int) -> int:
    """The most chunk rows, whole 2 MiB pages of them, that `share` bytes of hugepages-2Mi hold while their page
    tables and slack (huge_page_footprint) fit `memory_budget`: the pod's memory still holds what the pool costs it."""
    step = huge_page_rows(chunk_bytes)
    step_bytes = step * chunk_bytes
    steps = share // step_bytes
    tables = step_bytes * HUGE_PAGE_TABLE_FRACTION * ranks
    steps = min(steps, max(0, int((memory_budget - MMAP_POOL_OVERHEAD) // tables)))
    while steps > 0 and _huge_charged(steps * step_bytes, ranks) > memory_budget:
        steps -= 1  # the float division above may round one step over
    return steps * step


def huge_pool_limit(release: tuple[int, int], chunk_bytes: int, node_hugepages: int | None, replicas: int,
                    memory_budget: int, ranks: int, spillway_spec: bool = True, disk_tier: bool = False) -> int:
    """The most chunk rows the replica's share of the node's hugepages-2Mi can hold (largest_huge_pool); 0 where
    the pool cannot be on huge pages at all (their share unknown, a release or connector whose region Spillway's
    spec does not place, a disk tier: pool_pages says each)."""
    share = hugepage_share(node_hugepages, replicas)
    if share is None or disk_tier or not on_hugetlbfs(release, spillway_spec):
        return 0
    return largest_huge_pool(share, chunk_bytes, memory_budget, ranks)


def place_pool(release: tuple[int, int], memory_chunks: int, chunk_bytes: int, node_hugepages: int | None,
               replicas: int, node_name: str, memory_budget: int, ranks: int, spillway_spec: bool = True,
               disk_tier: bool = False, size: tuple[str, float | int | None] = ("auto", None),
               memory_max_chunks: int | None = None) -> PoolPages:
    """Where the pool goes and, on huge pages, how many rows: the one rule for every offload.size (`size` as
    quantity.parse_size reads it). On Kubernetes allocatable memory excludes the huge pages a node reserves, so
    memory and hugepages-2Mi are two budgets, and the pool may come out of either; only its page tables and slack
    stay in memory on huge pages, bounded by `memory_budget` (largest_huge_pool).

    auto and a fraction f size two pools, f of each share (auto: f = 1): `memory_chunks`, what f of the memory
    share holds beside the process, and the rows f of the hugepages-2Mi share holds in whole pages. The huge pool
    is taken where it holds at least as many rows; else the memory pool, placed as pool_pages places any pool.
    A quantity (`memory_chunks` its rows) is kept, never grown: where it is within `memory_max_chunks`, the memory
    share's largest pool, it is placed as any pool; beyond it, on huge pages where whole pages of its rows and their
    page tables fit, else not at all (huge_pages False, the reason in `why`; the planner refuses it)."""
    pages = pool_pages(release, memory_chunks, chunk_bytes, node_hugepages, replicas, node_name, spillway_spec,
                       disk_tier)
    largest = huge_pool_limit(release, chunk_bytes, node_hugepages, replicas, memory_budget, ranks, spillway_spec,
                              disk_tier)
    share = pages.share_bytes
    kind, value = size
    if kind == "bytes":
        assert memory_max_chunks is not None, "a quantity is placed against the memory share's largest pool"
        if memory_chunks <= memory_max_chunks:
            return pages
        if pages.huge_pages and pages.chunks <= largest:
            assert share is not None  # pool_pages placed it on huge pages: the share is known
            return _huge(pages.chunks, chunk_bytes, share, _of_share(pages.hugepages_bytes, node_name, share)
                         + f", more than the {_gib(memory_max_chunks * chunk_bytes)} its memory share holds"
                         + _given_up(memory_chunks, pages.chunks))
        if pages.huge_pages:  # whole pages fit the share, but their page tables not the memory budget
            return PoolPages(False, 0, share, f"4 KiB pages: the page tables of {_gib(pages.hugepages_bytes)} on huge "
                                              f"pages would not fit the replica's memory share beside the process")
        return pages
    if share is None or disk_tier or not on_hugetlbfs(release, spillway_spec):
        return pages
    fraction = 1.0 if kind == "auto" else float(value or 0)
    sized = "auto" if kind == "auto" else f"offload size {value:g}"
    of = "" if kind == "auto" else f"{value:g} of "
    memory = _gib(memory_chunks * chunk_bytes)
    target = int(fraction * share) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    chunks = min(largest, largest_huge_pool(target, chunk_bytes, memory_budget, ranks))
    if chunks >= max(memory_chunks, 1):
        return _huge(chunks, chunk_bytes, share, f"{sized} sized the pool from node {node_name}'s hugepages-2Mi, "
                                                 f"{_gib(chunks * chunk_bytes)} of the replica's {_gib(share)}, " + (
                         f"at least the {memory} {of}its memory share holds" if memory_chunks else
                         f"where {of}its memory share holds no pool beside the process"))
    if pages.huge_pages:
        return pages
    return PoolPages(False, 0, share, f"4 KiB pages: {sized} sized the pool from the replica's memory share, {memory}; "
                                      f"{of}its {_gib(share)} of node {node_name}'s hugepages-2Mi hold less "
                                      f"({_gib(chunks * chunk_bytes)} in whole pages of rows)")


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"
