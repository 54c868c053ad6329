"""Pure pieces of the transfer measurement: block sizes, scattering, GB/s.

No GPU and no third-party imports. The table's format (Row, rate lookups, the Node annotation)
is spillway.core.qualification. GB/s here is always 1e9 bytes per second.
"""
from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

KiB, MiB, GiB = 2**10, 2**20, 2**30

DEFAULT_BLOCK_SIZES = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB, 16 * MiB)
BLOCKS_PER_TRANSFER = 1000
POOL_FACTOR_SMALL = 2  # blocks under LARGE_BLOCK are scattered over a pool twice the transfer
LARGE_BLOCK = 4 * MiB  # from here on the pool holds exactly one transfer's blocks


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
