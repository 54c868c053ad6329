"""What an offload pool really costs in host memory, per vLLM release: the measured rule, not a factor.

vLLM 0.26 pins each pool tensor with `torch.zeros(..., pin_memory=True)` (vllm/v1/kv_offload/cpu/
gpu_worker.py; its CPUOffloadingSpec.create_worker passes no mmap region). PyTorch's pinned host
allocator rounds every allocation up to a power of two, and the pages are shared memory charged to the
pod's memory cgroup, though not held in /dev/shm. Measured on the H200 (vLLM 0.26, dummy
Llama-3.1-8B, offline API, 2026-12-01; issue figures, raw data to land in
bench/results/h200-2026-12-01/): 16 GiB asked -> Shmem +16.06 GiB, 48 GiB asked -> Shmem
+64.06 GiB, /dev/shm 0 bytes, anonymous memory +0.7 GiB (inside the process reserve).

vLLM 0.32 and 0.33 back the pool with one mmap region in /dev/shm that every rank maps and pins
with cudaHostRegister (vllm/v1/kv_offload/cpu/shared_offload_region.py); its creator checks that
/dev/shm has room for the whole region (check_shm_free_space). vllm#50094: 6 GiB asked, 6.00 GiB
used: about 1.0x, held in /dev/shm.

Both add the page tables of every process that maps the pool: 8 bytes per 4 KiB page on x86-64,
charged to the cgroup (memory.stat pagetables).
"""
from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30
MiB = 2**20

# 16 GiB asked -> +16.06 GiB on 0.26 (issue figures above): ~61 MiB over the pool, budgeted twice.
PINNED_POOL_OVERHEAD = 128 * MiB
# 0.32/0.33: the region itself is the whole cost (vllm#50094: 6 GiB -> 6.00 GiB); one MiB rounding slack.
MMAP_POOL_OVERHEAD = 1 * MiB
PAGE_TABLE_FRACTION = 8 / 4096  # one 8-byte page-table entry per 4 KiB page, per mapping process


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


def pinned_tensors(release: tuple[int, int], single_group: bool, cross_layer: bool, max_group_layers: int) -> int:
    """Pool tensors vLLM 0.26 pins on each rank: one per canonical GPU KV tensor (gpu_worker.py allocates a
    CPU twin of each). The V1 model runner gives the offloading connector one cross-layer tensor for a
    single-group model; otherwise each KV-cache tensor holds one layer of every group."""
    if release >= (0, 32):
        return 1
    return 1 if (single_group and cross_layer) else max_group_layers


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def footprint(release: tuple[int, int], pool_bytes: int, ranks: int, tensors: int) -> Footprint:
    """The pool's cost for `pool_bytes` (all ranks' rows), `ranks` mapping processes, `tensors` per rank."""
    tables = int(pool_bytes * PAGE_TABLE_FRACTION * ranks)
    if release < (0, 32):
        per_tensor = -(-pool_bytes // (ranks * tensors))
        rounded = ranks * tensors * next_power_of_two(per_tensor)
        charged = rounded + tables + PINNED_POOL_OVERHEAD
        rule = (f"vLLM {release[0]}.{release[1]} pins {ranks * tensors} tensor(s), each rounded up to a power of "
                f"two: {_gib(pool_bytes)} -> {_gib(rounded)} of shared memory charged to the pod, none in /dev/shm")
        return Footprint(pool_bytes, charged, 0, tensors, rule)
    charged = pool_bytes + tables + MMAP_POOL_OVERHEAD
    rule = (f"vLLM {release[0]}.{release[1]} maps one {_gib(pool_bytes)} region in /dev/shm (about 1.0x, "
            f"vllm#50094) plus page tables of {ranks} rank(s)")
    return Footprint(pool_bytes, charged, pool_bytes + MMAP_POOL_OVERHEAD, 1, rule)


def largest_pool(release: tuple[int, int], budget: int, chunk_bytes: int, ranks: int, tensors: int) -> int:
    """The most chunks whose footprint fits `budget` bytes. On 0.26 a pool filling its power-of-two tensors
    exactly: any more chunks would double the rounding, any fewer would waste it."""
    if budget <= 0:
        return 0
    if release >= (0, 32):
        chunks = int((budget - MMAP_POOL_OVERHEAD) / (chunk_bytes * (1 + PAGE_TABLE_FRACTION * ranks)))
    else:
        per_tensor_row = chunk_bytes / (ranks * tensors)
        room = (budget - PINNED_POOL_OVERHEAD) / (1 + PAGE_TABLE_FRACTION * ranks) / (ranks * tensors)
        if room < 1:
            return 0
        power = 1 << (int(room).bit_length() - 1)  # the largest power of two under the room per tensor
        chunks = int(power // per_tensor_row)
    while chunks > 0 and footprint(release, chunks * chunk_bytes, ranks, tensors).charged_bytes > budget:
        chunks -= 1  # float rounding at the edge
    return max(chunks, 0)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"
