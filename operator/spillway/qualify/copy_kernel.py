"""A Triton kernel that copies scattered blocks through unified virtual addresses (one program per block).

Triton ships with vLLM, so this runs wherever the vLLM image runs. Imported only on a GPU node.
"""
from __future__ import annotations

import triton
import triton.language as tl

WORDS_PER_STEP = 2048  # int64 words one program moves per loop step: 16 KiB, 512 threads x 4 words


@triton.jit
def _copy_blocks(src_ptrs, dst_ptrs, words_per_block, WORDS: tl.constexpr):
    block = tl.program_id(0)
    src = tl.load(src_ptrs + block).to(tl.pointer_type(tl.int64))
    dst = tl.load(dst_ptrs + block).to(tl.pointer_type(tl.int64))
    offsets = tl.arange(0, WORDS)
    for start in range(0, words_per_block, WORDS):
        idx = start + offsets
        mask = idx < words_per_block
        tl.store(dst + idx, tl.load(src + idx, mask=mask), mask=mask)


def copy_blocks(src_ptrs, dst_ptrs, block_bytes: int) -> None:
    """Launch on the current stream. src_ptrs/dst_ptrs: int64 CUDA tensors of byte addresses (8-byte aligned)."""
    if block_bytes % 8:
        raise ValueError(f"block size {block_bytes} is not a multiple of 8 bytes")
    words = min(WORDS_PER_STEP, triton.next_power_of_2(block_bytes // 8))
    _copy_blocks[(src_ptrs.numel(),)](src_ptrs, dst_ptrs, block_bytes // 8, WORDS=words, num_warps=16)
