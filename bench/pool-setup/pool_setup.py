#!/usr/bin/env python3
"""Where a CPU KV pool's setup time goes, and how fast it can be (run on the GPU machine, no vLLM needed).

vLLM 0.33 maps its pool as 32 /dev/shm segment files behind one contiguous mapping, pre-faults it one 8 MiB
chunk row at a time with madvise(MADV_POPULATE_WRITE) from one thread, then pins it with one cudaHostRegister
(vllm/v1/kv_offload/cpu/shared_offload_region.py, cpu/spec.py `_REGION_SEGMENTS`, cpu/gpu_worker.py
`pin_mmap_region`). Each case below times the same phases (files, pre-fault, register) for one way of doing it:

  vllm033      the release's way: 32 segments, one thread, 8 MiB at a time
  threads      the same files, pre-faulted by THREADS threads over disjoint ranges (ctypes releases the GIL)
  register     no pre-fault: cudaHostRegister faults the pages itself
  hugetlbfs    2 MiB pages (a hugetlbfs mount, as a Kubernetes `medium: HugePages` emptyDir is), pre-faulted by
               THREADS threads; the reservation of the pages (nr_hugepages) is timed as its own phase
and the copy rate between the pinned pool and the GPU (4 GiB, both directions) for 4 KiB and 2 MiB pages.

    python3 bench/pool-setup/pool_setup.py --gib 64 --json $OUT/pool_setup.json
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import subprocess
import threading
import time

GiB = 1 << 30
CHUNK = 8 << 20  # one 64-token block of Llama-3.1-8B, all layers (the plan's chunk_bytes)
SEGMENTS = 32
MADV_POPULATE_WRITE = 23
MAP_FIXED = 0x10
HUGE_MOUNT = "/mnt/spillway-huge2m"
ALIGN = 2 << 20

libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mmap.restype = ctypes.c_void_p
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def meminfo(*keys: str) -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            if k in keys:
                out[k] = int(v.split()[0]) * 1024
    return out


class Pool:
    """`size` bytes behind one address range, backed by `segments` files in `folder`."""

    def __init__(self, folder: str, size: int, segments: int):
        self.size, self.paths = size, []
        per = size // segments
        t = time.perf_counter()
        fds = []
        for i in range(segments):
            path = os.path.join(folder, f"spillway-pool-probe.{i}")
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, per)
            self.paths.append(path)
            fds.append(fd)
        # a placeholder range, aligned for 2 MiB pages, that the segments then replace in place
        self.reserved = libc.mmap(None, size + ALIGN, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                                  | getattr(mmap, "MAP_NORESERVE", 0x4000), -1, 0)
        self.base = -(-self.reserved // ALIGN) * ALIGN
        for i, fd in enumerate(fds):
            addr = libc.mmap(self.base + i * per, per, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_FIXED,
                             fd, 0)
            if addr != self.base + i * per:
                raise OSError(ctypes.get_errno(), f"mmap of segment {i} failed")
            os.close(fd)
        self.files_s = time.perf_counter() - t

    def populate(self, lo: int, hi: int, step: int) -> None:
        for off in range(lo, hi, step):
            if libc.madvise(self.base + off, min(step, hi - off), MADV_POPULATE_WRITE) != 0:
                raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")

    def prefault(self, threads: int, step: int) -> float:
        t = time.perf_counter()
        if threads <= 1:
            self.populate(0, self.size, step)
        else:
            share = -(-self.size // threads // CHUNK) * CHUNK
            errors: list[BaseException] = []

            def work(lo: int) -> None:
                try:
                    self.populate(lo, min(lo + share, self.size), step)
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    errors.append(exc)

            ts = [threading.Thread(target=work, args=(i * share,)) for i in range(threads) if i * share < self.size]
            for x in ts:
                x.start()
            for x in ts:
                x.join()
            if errors:
                raise errors[0]
        return time.perf_counter() - t

    def close(self) -> None:
        libc.munmap(self.reserved, self.size + ALIGN)
        for p in self.paths:
            os.unlink(p)


def register(cudart, pool: Pool) -> float:
    t = time.perf_counter()
    rc = cudart.cudaHostRegister(pool.base, pool.size, 0)
    if int(rc) != 0:
        raise RuntimeError(f"cudaHostRegister returned {int(rc)}")
    return time.perf_counter() - t


def copy_rates(torch, pool: Pool, dev) -> dict[str, float]:
    n = dev.numel()
    host = torch.frombuffer((ctypes.c_char * n).from_address(pool.base), dtype=torch.uint8)
    out = {}
    for name, fn in (("h2d_gbps", lambda: dev.copy_(host, non_blocking=True)),
                     ("d2h_gbps", lambda: host.copy_(dev, non_blocking=True))):
        times = []
        for _ in range(4):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        out[name] = round(n / min(times[1:]) / 1e9, 2)
    return out


def case(torch, cudart, dev, name: str, folder: str, size: int, threads: int, step: int, prefault: bool) -> dict:
    before = meminfo("MemFree", "Shmem", "HugePages_Free")
    pool = Pool(folder, size, SEGMENTS)
    r: dict = {"case": name, "gib": size / GiB, "threads": threads if prefault else 0, "files_s": pool.files_s}
    try:
        r["prefault_s"] = pool.prefault(threads, step) if prefault else 0.0
        r["register_s"] = register(cudart, pool)
        r["total_s"] = r["files_s"] + r["prefault_s"] + r["register_s"]
        r["gib_per_s"] = size / GiB / r["total_s"]
        r.update(copy_rates(torch, pool, dev))
        cudart.cudaHostUnregister(pool.base)
    except Exception as exc:  # noqa: BLE001 - the next case still runs
        r["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        pool.close()
    r["meminfo_before"] = before
    print(json.dumps(r), flush=True)
    return r


def reserve_huge(pages: int) -> dict:
    t = time.perf_counter()
    with open("/proc/sys/vm/nr_hugepages", "w") as f:
        f.write(str(pages))
    with open("/proc/sys/vm/nr_hugepages") as f:
        got = int(f.read())
    return {"asked": pages, "got": got, "reserve_s": time.perf_counter() - t}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 8)
    p.add_argument("--cases", default="vllm033,threads,vllm033,register,hugetlbfs")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    import torch

    torch.cuda.init()
    cudart = torch.cuda.cudart()
    dev = torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
    size = a.gib * GiB
    out: dict = {"gib": a.gib, "threads": a.threads, "cpus": os.cpu_count(), "cases": [],
                 "meminfo_start": meminfo("MemTotal", "MemFree", "Shmem")}
    for key, path in (("thp_shmem", "/sys/kernel/mm/transparent_hugepage/shmem_enabled"),
                      ("kernel", "/proc/sys/kernel/osrelease")):
        try:
            with open(path) as f:
                out[key] = f.read().strip()
        except OSError as exc:
            out[key] = repr(exc)
    for name in a.cases.split(","):
        if name == "vllm033":
            out["cases"].append(case(torch, cudart, dev, name, "/dev/shm", size, 1, CHUNK, True))
        elif name == "threads":
            out["cases"].append(case(torch, cudart, dev, name, "/dev/shm", size, a.threads, CHUNK, True))
        elif name == "register":
            out["cases"].append(case(torch, cudart, dev, name, "/dev/shm", size, 0, CHUNK, False))
        elif name == "hugetlbfs":
            pages = size // (2 << 20) + SEGMENTS
            try:
                res = reserve_huge(pages)
                os.makedirs(HUGE_MOUNT, exist_ok=True)
                subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "none", HUGE_MOUNT], check=True)
                try:
                    if res["got"] >= size // (2 << 20):
                        r = case(torch, cudart, dev, name, HUGE_MOUNT, size, a.threads, 2 << 20, True)
                        r["reserve"] = res
                        r["total_with_reserve_s"] = r.get("total_s", 0) + res["reserve_s"]
                        out["cases"].append(r)
                    else:
                        out["cases"].append({"case": name, "reserve": res, "error": "too few huge pages"})
                finally:
                    subprocess.run(["umount", HUGE_MOUNT], check=False)
                    reserve_huge(0)
            except Exception as exc:  # noqa: BLE001
                out["cases"].append({"case": name, "error": f"{type(exc).__name__}: {exc}"})
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    for r in out["cases"]:
        print(f"{r['case']:10s} files {r.get('files_s', 0):6.2f} s  prefault {r.get('prefault_s', 0):6.2f} s  "
              f"register {r.get('register_s', 0):6.2f} s  total {r.get('total_s', 0):6.2f} s  "
              f"h2d {r.get('h2d_gbps', 0)} d2h {r.get('d2h_gbps', 0)} GB/s {r.get('error', '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
