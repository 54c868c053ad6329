#!/usr/bin/env python3
"""What one pinned host tensor costs the host, by allocation path, without vLLM (run on the GPU machine).

Paths: `torch.zeros(..., pin_memory=True)` (vLLM 0.26's pool) with PyTorch's default pinned allocator and
with `PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True`, and an mmap of a /dev/shm file registered
with cudaHostRegister (the pool of vLLM >= 0.27). Each size runs in a fresh process; deltas of
/proc/meminfo Shmem and AnonPages and of /dev/shm usage, against the bytes asked.

    python3 bench/footprint/pinned_alloc.py --sizes-mib 3072,4096,5120 --json $OUT/pinned_alloc.json
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import sys
import time

PATHS = ("torch_default", "torch_host_register", "shm_mmap_register")


def meminfo() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            if key in ("Shmem", "AnonPages", "MemAvailable", "Mlocked"):
                out[key] = int(value.split()[0]) * 1024
    return out


def shm_used() -> int:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def child(path: str, size: int) -> dict:
    import torch

    torch.cuda.init()
    before = {**meminfo(), "dev_shm": shm_used()}
    t0 = time.time()
    if path.startswith("torch"):
        t = torch.zeros(size, dtype=torch.int8, pin_memory=True)
        assert t.is_pinned()
    else:
        fname = f"/dev/shm/pinned_alloc_probe_{os.getpid()}"
        fd = os.open(fname, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED)
        t = torch.frombuffer(mm, dtype=torch.int8)
        rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), size, 0)
        assert int(rc) == 0, rc
        t.zero_()
        os.unlink(fname)  # the mapping keeps the pages
    secs = time.time() - t0
    after = {**meminfo(), "dev_shm": shm_used()}
    return {"path": path, "asked": size, "seconds": secs,
            "delta": {k: after[k] - before[k] for k in after}}


def main() -> int:
    if len(sys.argv) > 3 and sys.argv[1] == "child":
        print("RESULT " + json.dumps(child(sys.argv[2], int(sys.argv[3]))), flush=True)
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("--sizes-mib", default="3072,4096,5120")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    rows = []
    for mib in (int(x) for x in a.sizes_mib.split(",")):
        for path in PATHS:
            env = dict(os.environ)
            if path == "torch_host_register":
                env["PYTORCH_CUDA_ALLOC_CONF"] = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
            out = subprocess.run([sys.executable, __file__, "child", path, str(mib << 20)], env=env,
                                 capture_output=True, text=True, timeout=240, check=False)
            lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            row = json.loads(lines[-1][7:]) if lines else {"path": path, "asked": mib << 20, "rc": out.returncode,
                                                           "error": out.stderr[-600:]}
            rows.append(row)
            d = row.get("delta", {})
            print(f"{path:<20} asked {mib / 1024:6.2f} GiB: dShmem {d.get('Shmem', 0) / 2**30:6.2f} GiB "
                  f"dAnon {d.get('AnonPages', 0) / 2**30:6.2f} GiB /dev/shm {d.get('dev_shm', 0) / 2**30:6.2f} GiB "
                  f"dMlocked {d.get('Mlocked', 0) / 2**30:5.2f} in {row.get('seconds', 0):.1f}s {row.get('error', '')[-300:]}",
                  flush=True)
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
