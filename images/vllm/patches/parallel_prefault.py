"""A small patch to vLLM's CPU offload region: pre-fault the pool from several threads instead of one.

What it fixes. vLLM 0.33 backs the CPU pool with files in /dev/shm behind one mapping and touches every page
before it pins the pool (`SharedOffloadRegion.__init__`, vllm/v1/kv_offload/cpu/shared_offload_region.py:
madvise(MADV_POPULATE_WRITE) one chunk row at a time, from one thread). Faulting tmpfs pages runs at 1.4-1.9
GiB/s per thread, so a 64 GiB pool took 41-68 s before the engine served /health, and 225 GiB several minutes
(bench/pool-setup/results/pool_setup.json; ../docs/results.md#pool-setup). The pages are independent:
disjoint ranges faulted from 16 threads took 7.2-7.8 s for the same 64 GiB, registration included. vLLM splits
the pool into 32 files for exactly this reason (page-cache inserts serialise per file), but faults them in order.

What the patch does. The same ranges vLLM would fault (this worker's slots, or the whole region), merged where
they touch and cut into pieces, each thread taking a contiguous share (so threads work in different files).
madvise is called through ctypes, which releases the GIL; `mmap.madvise` does not. The thread count is
SPILLWAY_PREFAULT_THREADS (the operator sets the replica's CPU cores), else the CPUs this process may run on,
at most 16. One thread, or a kernel without MADV_POPULATE_WRITE, takes vLLM's own path unchanged. A failed
madvise raises as vLLM's own call does. The bytes, files and mapping are vLLM's: only who touches the pages
changes, which tests/images/test_vllm_patches.py checks on the installed vLLM's region (every page resident,
data kept).

When it can go. When vLLM pre-faults in parallel itself: `apply` refuses a region whose pre-fault no longer reads
as below (exit 1, one line). Applied at image build time (images/vllm/Dockerfile) and by bench/gpu/serve_bench.py
for an engine that asks for it; never at run time. `python3 parallel_prefault.py apply|revert|check [SITE]`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# The shared apply/revert/check machinery lives beside this file (the image copies the folder whole).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from source_patch import PatchError, SourcePatch, vllm_site

__all__ = [
    "MARKER",
    "NAME",
    "PATCH",
    "THREADS_ENV",
    "PatchError",
    "apply",
    "is_applied",
    "patch_source",
    "revert",
    "target",
    "vllm_site",
]

NAME = "parallel_prefault"
TARGET = Path("vllm/v1/kv_offload/cpu/shared_offload_region.py")
MARKER = f"# Spillway patch: {NAME}"
THREADS_ENV = "SPILLWAY_PREFAULT_THREADS"

# vLLM 0.33.0: the per-worker (or whole-region) pre-fault at the end of SharedOffloadRegion.__init__.
ORIGINAL = re.compile(
    r'(?P<indent>[ ]{8})populate_write_fn = _get_populate_write_fn\(self\.mmap_obj\)\n'
    r'\n'
    r'[ ]{8}if rank is not None:\n'
    r'[ ]{12}# Populate only this worker\'s pages \(one slot per chunk row\)\.\n'
    r'[ ]{12}_t0 = time\.perf_counter\(\)\n'
    r'[ ]{12}for offset, length in self\.iter_worker_slot_ranges\(\):\n'
    r'[ ]{16}populate_write_fn\(self\.mmap_obj, offset, length\)\n'
    r'(?:[ ]{12}logger\.debug\(\n(?:[ ]{16}.*\n)+[ ]{12}\)\n)'
    r'[ ]{8}else:\n'
    r'[ ]{12}# No rank .*\n'
    r'[ ]{12}_t0 = time\.perf_counter\(\)\n'
    r'[ ]{12}populate_write_fn\(self\.mmap_obj, 0, self\.total_size_bytes\)\n'
    r'(?:[ ]{12}logger\.debug\(\n(?:[ ]{16}.*\n)+[ ]{12}\)\n)'
)
# Where the module-level helper goes: before the class, after the pre-fault method's selection.
CLASS_LINE = "class SharedOffloadRegion:\n"

PATCHED_CALL = f'''        populate_write_fn = _get_populate_write_fn(self.mmap_obj)

        {MARKER} (images/vllm/patches/{NAME}.py).
        # The same ranges, faulted from several threads: one thread runs at 1.4-1.9 GiB/s.
        _t0 = time.perf_counter()
        _ranges = (list(self.iter_worker_slot_ranges()) if rank is not None
                   else [(0, self.total_size_bytes)])
        _threads = _spillway_prefault(self, _ranges, populate_write_fn)
        logger.info(
            "Pre-faulted the CPU offload region (%.2f GB) in %.3f s with %d thread(s)",
            sum(length for _, length in _ranges) / 1e9,
            time.perf_counter() - _t0,
            _threads,
        )
'''

HELPER = f'''{MARKER} (images/vllm/patches/{NAME}.py).
_SPILLWAY_PREFAULT_PIECE = 256 << 20  # pieces a thread faults in one madvise call: small enough to balance


def _spillway_prefault_threads() -> int:
    raw = os.environ.get("{THREADS_ENV}", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return min(int(raw), 64)
    return max(1, min(len(os.sched_getaffinity(0)), 16))


def _spillway_prefault(region, ranges, populate_write_fn) -> int:
    """Fault `ranges` (offset, length) of `region` from several threads; returns how many ran."""
    threads = _spillway_prefault_threads()
    if threads == 1 or populate_write_fn is not _madvise_populate_write:
        for offset, length in ranges:
            populate_write_fn(region.mmap_obj, offset, length)
        return 1
    merged: list[list[int]] = []
    for offset, length in sorted(ranges):
        if merged and merged[-1][0] + merged[-1][1] == offset:
            merged[-1][1] += length
        else:
            merged.append([offset, length])
    page = mmap.PAGESIZE
    piece = max(page, min(_SPILLWAY_PREFAULT_PIECE,
                          round_up(cdiv(sum(n for _, n in merged), threads), page)))
    pieces = [(offset + at, min(piece, length - at))
              for offset, length in merged for at in range(0, length, piece)]
    threads = min(threads, len(pieces))
    libc = ctypes.CDLL(None, use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = [c_void_p, c_size_t, c_int]
    base = region._base.data_ptr()

    def fault(share) -> None:
        for offset, length in share:
            if madvise(base + offset, length, _MADV_POPULATE_WRITE) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"madvise(MADV_POPULATE_WRITE): {{os.strerror(err)}}")

    from concurrent.futures import ThreadPoolExecutor

    # Contiguous shares, so that each thread works in its own files (inserts serialise per file).
    shares = [pieces[len(pieces) * i // threads:len(pieces) * (i + 1) // threads] for i in range(threads)]
    with ThreadPoolExecutor(threads, thread_name_prefix="spillway-prefault") as pool:
        for done in [pool.submit(fault, share) for share in shares]:
            done.result()
    return threads


'''

# Names the helper and the patched call read from the module; a release that lacks one is refused.
MODULE_NAMES = ("import ctypes", "import mmap", "import os", "import time", "c_void_p", "c_size_t", "c_int",
                "cdiv", "round_up", "_MADV_POPULATE_WRITE", "def _madvise_populate_write", "logger")


def _transform(source: str) -> str:
    found = ORIGINAL.findall(source)
    missing = [name for name in MODULE_NAMES if name not in source]
    if len(found) != 1 or source.count(CLASS_LINE) != 1 or missing:
        raise PatchError(f"{TARGET}: SharedOffloadRegion's pre-fault does not read as vLLM 0.33's "
                         f"({len(found)} matches, missing {missing}); this vLLM needs its own look before the "
                         f"patch is carried")
    patched = ORIGINAL.sub(lambda _m: PATCHED_CALL, source, count=1)
    return patched.replace(CLASS_LINE, HELPER + CLASS_LINE, 1)


# 0.32 pre-faults differently and only on the creator; its CPU platform, the CPU image's, never maps the region
# (vllm/v1/kv_offload/cpu/spec.py `_uses_shared_region`: CUDA and XPU), so that image leaves it as is.
PATCH = SourcePatch(NAME, TARGET, _transform, releases=("0.33",))
target, is_applied, patch_source, apply, revert = (PATCH.target, PATCH.is_applied, PATCH.patch_source,
                                                   PATCH.apply, PATCH.revert)


if __name__ == "__main__":
    sys.exit(PATCH.main(sys.argv[1:]))
