"""Pure pieces of the transfer qualification: block sizes, scattering, GB/s, statistics, lookups.

No GPU and no third-party imports: the CLI, the operator and the tests share these.
GB/s here is always 1e9 bytes per second.
"""
from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..rates import interpolate_log2

KiB, MiB, GiB = 2**10, 2**20, 2**30

DEFAULT_BLOCK_SIZES = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB, 16 * MiB)
BLOCKS_PER_TRANSFER = 1000
POOL_FACTOR_SMALL = 2  # blocks under LARGE_BLOCK are scattered over a pool twice the transfer
LARGE_BLOCK = 4 * MiB  # from here on the pool holds exactly one transfer's blocks
PLAN_BLOCK_BYTES = 2 * MiB  # the KV block of Llama-3.1-8B (bf16, 16 tokens, all layers): the annotated figure

DIRECTIONS = ("g2c", "c2g", "bidir")  # GPU->CPU, CPU->GPU (the reload path), both at once on two streams
METHODS = ("vllm", "dma", "kernel")  # vLLM's batched copy op, one cudaMemcpyAsync per block, one copy kernel
HOST_KINDS = ("alloc", "shm")  # cudaHostAlloc'd memory, or an mmap of /dev/shm registered with cudaHostRegister
DIRECTION_TITLES = {"g2c": "G2C", "c2g": "C2G", "bidir": "bidir"}


def gbps(num_bytes: int, seconds: float) -> float:
    """Rate in GB/s (1e9 bytes per second)."""
    if seconds <= 0:
        raise ValueError(f"elapsed time must be positive, got {seconds}")
    return num_bytes / seconds / 1e9


def transfer_bytes(block_bytes: int, blocks: int, direction: str) -> int:
    """Bytes one timed transfer moves; both directions count when they run at once."""
    return block_bytes * blocks * (2 if direction == "bidir" else 1)


def pool_blocks(block_bytes: int, blocks: int = BLOCKS_PER_TRANSFER) -> int:
    """How many blocks the source/destination pools hold for this block size."""
    return blocks if block_bytes >= LARGE_BLOCK else blocks * POOL_FACTOR_SMALL


def pool_bytes(block_sizes: Iterable[int], blocks: int = BLOCKS_PER_TRANSFER) -> int:
    """The largest pool any of the block sizes needs (one buffer on each side serves them all)."""
    return max(pool_blocks(b, blocks) * b for b in block_sizes)


def scatter(rng: random.Random, pool: int, blocks: int) -> list[int]:
    """`blocks` distinct block indices drawn at random from a pool of `pool` blocks, in random order."""
    if not 0 < blocks <= pool:
        raise ValueError(f"cannot scatter {blocks} blocks over a pool of {pool}")
    return rng.sample(range(pool), blocks)


def block_pointers(base: int, indices: Sequence[int], block_bytes: int) -> list[int]:
    """Byte addresses of the indexed blocks in a buffer that starts at `base`."""
    return [base + i * block_bytes for i in indices]


@dataclass
class Row:
    """One (method, direction, block size, host memory) cell: the rate of every timed transfer."""

    method: str
    direction: str
    block_bytes: int
    blocks: int
    host: str = "alloc"
    samples: list[float] = field(default_factory=list)  # GB/s of each repeat
    error: str | None = None  # why the cell could not be measured

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best(self) -> float:
        return max(self.samples)

    @property
    def worst(self) -> float:
        return min(self.samples)

    @property
    def spread_pct(self) -> float:
        """(best - worst) / median, in percent."""
        return (self.best - self.worst) / self.median * 100 if self.median else 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method, "direction": self.direction, "block_bytes": self.block_bytes,
            "blocks": self.blocks, "host": self.host,
        }
        if self.ok:
            out.update(median_gbps=round(self.median, 3), best_gbps=round(self.best, 3),
                       worst_gbps=round(self.worst, 3), spread_pct=round(self.spread_pct, 2),
                       samples_gbps=[round(s, 3) for s in self.samples])
        else:
            out["error"] = self.error or "no samples"
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        return cls(d["method"], d["direction"], d["block_bytes"], d["blocks"], d.get("host", "alloc"),
                   list(d.get("samples_gbps", [])), d.get("error"))


def production_method(rows: Iterable[Row]) -> str | None:
    """The method vLLM itself uses when it was measured, else the plain DMA loop."""
    methods = {r.method for r in rows if r.ok}
    for m in ("vllm", "dma", "kernel"):
        if m in methods:
            return m
    return None


def rate_at(rows: Iterable[Row], block_bytes: int, direction: str = "c2g", method: str | None = None,
            host: str | None = None, stat: str = "median") -> float | None:
    """The measured rate at `block_bytes`, interpolated on log2(block size) between measured sizes.

    Outside the measured range the nearest measured size is used. None when nothing fits.
    """
    rows = [r for r in rows if r.ok and r.direction == direction and (host is None or r.host == host)]
    method = method or production_method(rows)
    return interpolate_log2(((r.block_bytes, getattr(r, stat)) for r in rows if r.method == method), block_bytes)


def relative_gap(measured: float, reference: float) -> float:
    """Signed relative difference (measured - reference) / reference."""
    return (measured - reference) / reference
