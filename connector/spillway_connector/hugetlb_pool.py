"""The CPU offload pool on 2 MiB huge pages: vLLM's own region, its file on a hugetlbfs mount (PATCHES.md entry 10).

vLLM 0.33 and 0.34 create the pool at f"/dev/shm/vllm_offload_{engine_id}.mmap"
(vllm/v1/kv_offload/cpu/shared_offload_region.py). /dev/shm must stay a tmpfs (vLLM's message queues and Python's
shared memory ask for sizes hugetlbfs refuses), so the pool goes to a second mount, the pod's hugepages emptyDir,
named by SPILLWAY_POOL_HUGEPAGES_DIR, and vLLM's own path is made to land there: a directory symlink
/dev/shm/vllm_offload_<link> -> that mount, and the engine id handed to the region "<link>/vllm_offload_<engine id>".
vLLM's O_CREAT|O_EXCL creator and joiner protocol, its barrier, its unlink and its cleanup then act on the hugetlbfs
file unchanged, and the file's name is one the image's stale-pool sweep knows (images/vllm/stale_pools.py).

What hugetlbfs asks of the region, and how it is met:
  - a file size of whole huge pages (ftruncate: EINVAL otherwise): the planner sizes the pool so; a pool that is not
    stays on 4 KiB pages;
  - one file: vLLM 0.34 splits a region into files mapped with MAP_FIXED over a memfd reservation, whose addresses
    need not be 2 MiB aligned; segments only parallelise tmpfs page-cache inserts, which hugetlbfs does not have;
  - /dev/shm's free space: vLLM's creator checks /dev/shm for the whole region (check_shm_free_space). The pool is
    not there, and the pod's /dev/shm is sized for the queues (a memory emptyDir is at most the pod's memory limit,
    which the pool on huge pages is no part of), so while the region is built the region module's check is the
    huge pages' own: the free pages of the node and of the pod's hugetlb cgroup.
Where any of it does not hold (the mount is not hugetlbfs with 2 MiB pages, the pages are short, the code does not
read as verified, the link is taken) the pool is built by vLLM as it would be, on 4 KiB pages in /dev/shm, and one
log line says why.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from spillway_connector.source_guard import verified

POOL_HUGEPAGES_DIR_ENV = "SPILLWAY_POOL_HUGEPAGES_DIR"  # spillway.core.vllm_api.ENV_POOL_HUGEPAGES_DIR
HUGE_PAGE = 2 << 20
SHM_PREFIX = "/dev/shm/vllm_offload_"  # vLLM's f"/dev/shm/vllm_offload_{engine_id}.mmap", verified below
POOL_FILE_PREFIX = "vllm_offload_"  # the file's name on the mount: the stale-pool sweep's pattern
_SYSFS = "/sys/kernel/mm/hugepages/hugepages-2048kB"
_FALLBACK = "spillway_connector: the CPU offload pool is on 4 KiB pages in /dev/shm, not 2 MiB huge pages: "
_CGROUP = "/sys/fs/cgroup"

# The code the huge-page placement relies on (0.33.0 and 0.34.0): the constructor's path, check, single-file mmap and
# joiner wait; the unlink and cleanup through the path (the symlink).
HUGETLBFS_CODE = {
    "SharedOffloadRegion.__init__": frozenset({"060b13faebb3d2b3", "77acfdf279323ecc"}),
    "SharedOffloadRegion._unlink": frozenset({"61d0432f4f2e4f89"}),
    "SharedOffloadRegion.cleanup": frozenset({"bc6c8b00fb4a9f48"}),
}


def hugetlbfs_functions(region_cls: Any) -> dict[str, Any]:
    return {name: vars(region_cls).get(name.split(".")[1]) for name in HUGETLBFS_CODE}


def _mount_of(path: str) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount holding `path`, from /proc/self/mountinfo."""
    best = ("", "")
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = left.split()[4].replace("\\040", " ")
            fields = right.split()
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
                best = (point, fields[0])
    return best


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            raw = f.read().strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None


def available_huge_pages() -> int:
    """2 MiB pages this process may still take: the node's free and unreserved ones, within its hugetlb cgroup's
    limit (cgroup v2 hugetlb.2MB.max; the reservation limit too where the kernel accounts it)."""
    free, reserved = _read_int(f"{_SYSFS}/free_hugepages"), _read_int(f"{_SYSFS}/resv_hugepages")
    pages = max(0, (free or 0) - (reserved or 0))
    for kind in ("", ".rsvd"):
        limit = _read_int(f"{_CGROUP}/hugetlb.2MB{kind}.max")
        if limit is not None:
            pages = min(pages, max(0, limit - (_read_int(f"{_CGROUP}/hugetlb.2MB{kind}.current") or 0)) // HUGE_PAGE)
    return pages


def link_name(directory: str) -> str:
    """The /dev/shm link's part after vllm_offload_: one per mount directory, the same in every rank."""
    return f"spillway-hugepages-{hashlib.sha256(directory.encode()).hexdigest()[:12]}"


def placement(kwargs: dict[str, Any], region_cls: Any) -> tuple[dict[str, Any] | None, str]:
    """The region's arguments with its file on the hugetlbfs mount SPILLWAY_POOL_HUGEPAGES_DIR names, and a line
    for the log; (None, why) where the pool stays on 4 KiB pages."""
    raw = _planned_dir()
    if not raw:
        return None, ""
    if not verified("the pool on huge pages (hugetlb_pool.py)", hugetlbfs_functions(region_cls), HUGETLBFS_CODE) \
            or not hasattr(sys.modules[region_cls.__module__], "check_shm_free_space"):
        return None, _FALLBACK + "vLLM's region code is not the code this was verified on (PATCHES.md entry 10)"
    directory = os.path.realpath(raw)
    point, fstype = _mount_of(directory)
    if fstype != "hugetlbfs" or not os.path.isdir(directory):
        return None, _FALLBACK + f"{raw} is not a hugetlbfs directory ({fstype or 'no mount'} at {point or '?'})"
    if not os.access(directory, os.W_OK | os.X_OK):  # the kubelet mounts it root's, 0755: the pod's fsGroup opens it
        info = os.stat(directory)
        return None, _FALLBACK + (f"{raw} is not writable by uid {os.geteuid()} (owner {info.st_uid}:{info.st_gid}, "
                                 f"mode {info.st_mode & 0o7777:o}; the pod's fsGroup makes it the pod's)")
    page = os.statvfs(directory).f_bsize
    if page != HUGE_PAGE:
        return None, _FALLBACK + f"{raw}'s hugetlbfs pages are {page} bytes, not 2 MiB"
    total = kwargs["num_chunks"] * kwargs["kv_bytes_per_chunk"]
    if total % HUGE_PAGE:
        return None, _FALLBACK + f"the region's {total} bytes are not whole 2 MiB pages"
    name = link_name(directory)
    file = os.path.join(directory, f"{POOL_FILE_PREFIX}{kwargs['engine_id']}.mmap")
    # A rank that comes after the creator joins its file whatever pages are left (the creator's are taken). The
    # pages are read before the file is looked for: the creator makes the file before its mapping takes the pages,
    # so a rank that saw them taken also sees the file, and no two ranks of one engine choose different backings.
    free = available_huge_pages()
    if free < total // HUGE_PAGE and not os.path.exists(file):
        return None, _FALLBACK + f"{free} free 2 MiB pages (node and cgroup), the pool needs {total // HUGE_PAGE}"
    link = f"{SHM_PREFIX}{name}"
    try:
        os.symlink(directory, link)
    except FileExistsError:  # another rank made it, or a previous container in this pod
        if not (os.path.islink(link) and os.readlink(link) == directory):
            return None, _FALLBACK + f"{link} exists and is not a link to {directory}"
    except OSError as exc:
        return None, _FALLBACK + f"cannot link {link} to {directory}: {exc.strerror}"
    placed = dict(kwargs, engine_id=f"{name}/{POOL_FILE_PREFIX}{kwargs['engine_id']}")
    if "num_segments" in placed:
        placed["num_segments"] = 1
    return placed, (f"spillway_connector: the CPU offload pool ({total / 2**30:.2f} GiB) is on 2 MiB huge pages: "
                    f"{file} on the hugetlbfs mount {point}")


def _planned_dir() -> str:
    """The hugetlbfs directory the plan named (SPILLWAY_POOL_HUGEPAGES_DIR), or "" where it asked for none."""
    return os.environ.get(POOL_HUGEPAGES_DIR_ENV, "").strip()


def not_placed_line() -> str:
    """The log line where the plan asked for huge pages but the region's spec keeps it off them; "" if not asked."""
    if not _planned_dir():
        return ""
    return _FALLBACK + "vLLM's tiering spec maps the pool in the engine core at its own /dev/shm path " \
                       "(spec.tiering_region)"


def check_huge_pages(required_bytes: int, shm_path: str = "/dev/shm", *, allocation_name: str = "") -> None:
    """Stands for vLLM's check_shm_free_space while a region is built on hugetlbfs: the pool's room is in huge
    pages, not in /dev/shm."""
    needed, free = -(-required_bytes // HUGE_PAGE), available_huge_pages()
    if needed > free:
        raise RuntimeError(f"Insufficient 2 MiB huge pages for {allocation_name or 'the CPU offload pool'}: "
                           f"{needed} required, {free} free (node and hugetlb cgroup)")


@contextlib.contextmanager
def huge_page_check(region_cls: Any) -> Iterator[None]:
    """vLLM's region module checks huge pages instead of /dev/shm for the region built meanwhile."""
    module = sys.modules[region_cls.__module__]
    stock = module.check_shm_free_space
    module.check_shm_free_space = check_huge_pages
    try:
        yield
    finally:
        module.check_shm_free_space = stock
