#!/usr/bin/env python3
"""The pool's set-up through Spillway's shared_region, on 2 MiB huge pages (hugetlbfs) against 4 KiB pages
(tmpfs /dev/shm), both pre-faulted from the same threads: CPU only, no GPU (cudaHostRegister is not timed here).

vLLM's own SharedOffloadRegion (0.33 and 0.34 source trees, SPILLWAY_VLLM_TREES), built as the worker builds it
for one rank (8 MiB rows, the plan's for Llama-3.1-8B; num_segments = REGION_SEGMENTS, which the huge-page path
turns into 1), timed from the constructor's call to the last page faulted; then its cleanup. Runs itself in a
private mount namespace with hugetlbfs mounted as the kubelet mounts a hugepages-2Mi emptyDir (a page size, no
size), raises vm.nr_hugepages for the largest pool (that reservation timed once) and puts it back. Needs root.

    .venv/bin/python bench/pool-setup/region_setup_cpu.py --gib 2 4 --reps 5 \
        --json bench/pool-setup/results/region_setup_cpu.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

SYSFS = "/sys/kernel/mm/hugepages/hugepages-2048kB"
ROW = 8 << 20
REGION = "vllm/v1/kv_offload/cpu/shared_offload_region.py"
IN_NAMESPACE = "_SPILLWAY_BENCH_IN_NAMESPACE"


def read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read())


def region_class(tree: str):
    name = "bench_region_" + re.sub(r"\W", "_", tree)
    loader = importlib.util.spec_from_file_location(name, os.path.join(tree, REGION))
    module = importlib.util.module_from_spec(loader)
    sys.modules[name] = module
    loader.loader.exec_module(module)
    return module.SharedOffloadRegion


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def one(spec, cls, gib: int, threads: int, lines: Lines) -> dict:
    chunks = gib * (1 << 30) // ROW
    lines.lines.clear()
    started = time.perf_counter()
    region = spec.shared_region(threads=threads, region_cls=cls, engine_id=f"bench-{uuid.uuid4().hex[:8]}",
                                num_chunks=chunks, rank=0, kv_bytes_per_chunk=ROW, cpu_page_size=ROW,
                                num_segments=32)
    setup = time.perf_counter() - started
    path = os.path.realpath(region.mmap_path)
    segments = len(region._segments)
    started = time.perf_counter()
    region.cleanup()
    cleanup = time.perf_counter() - started
    prefault = next((float(m.group(1)) for line in lines.lines
                     if (m := re.search(r"pre-faulted the CPU offload region .* in ([0-9.]+) s", line))), None)
    return {"setup_s": round(setup, 4), "prefault_s": prefault, "cleanup_s": round(cleanup, 4), "file": path,
            "files": segments, "huge_pages": any("is on 2 MiB huge pages" in line for line in lines.lines)}


def run(args: argparse.Namespace) -> dict:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "connector"))
    from spillway_connector import hugetlb_pool, spec

    lines = Lines()
    logging.getLogger("spillway_connector").addHandler(lines)
    logging.getLogger("spillway_connector").setLevel(logging.INFO)
    trees = [t for t in os.environ.get("SPILLWAY_VLLM_TREES", "").split(os.pathsep)
             if os.path.basename(t) in args.releases]
    need = max(args.gib) * 512
    old = read_int(f"{SYSFS}/nr_hugepages")
    mount = tempfile.mkdtemp(prefix="spillway-hugetlbfs-")
    subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "nodev", mount], check=True)
    out: dict = {"machine": {"kernel": platform.release(), "cpus": os.cpu_count(),
                             "affinity": len(os.sched_getaffinity(0)), "python": platform.python_version()},
                 "row_bytes": ROW, "threads": args.threads, "reps": args.reps, "cases": [],
                 # a shared machine: its 1-minute load before and after each case says how busy it was
                 "note": "CPU only; cudaHostRegister not timed (a GPU session)"}
    try:
        started = time.perf_counter()
        with open(f"{SYSFS}/nr_hugepages", "w") as f:
            f.write(str(old + need))
        out["reserve_hugepages"] = {"pages": read_int(f"{SYSFS}/nr_hugepages") - old, "asked": need,
                                    "seconds": round(time.perf_counter() - started, 3)}
        if out["reserve_hugepages"]["pages"] < need:
            raise SystemExit(f"the kernel gave {out['reserve_hugepages']['pages']} of {need} huge pages")
        for tree in trees:
            cls = region_class(tree)
            for gib in args.gib:
                # 4 KiB and 2 MiB runs alternate (their order too), so a busy spell of this shared machine lands
                # on both: the paired ratio is the figure, the medians beside it
                runs: dict[str, list[dict]] = {"4k": [], "2m": []}
                load_before = os.getloadavg()[0]
                for rep in range(args.reps):
                    for pages in (("4k", "2m") if rep % 2 == 0 else ("2m", "4k")):
                        if pages == "2m":
                            os.environ[hugetlb_pool.POOL_HUGEPAGES_DIR_ENV] = mount
                        else:
                            os.environ.pop(hugetlb_pool.POOL_HUGEPAGES_DIR_ENV, None)
                        runs[pages].append(one(spec, cls, gib, args.threads, lines))
                load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
                for pages, done in runs.items():
                    assert all(r["huge_pages"] == (pages == "2m") for r in done), done
                    case = {"release": os.path.basename(tree), "gib": gib, "pages": pages,
                            "files": done[0]["files"], "file": done[0]["file"],
                            "setup_s_median": statistics.median(r["setup_s"] for r in done),
                            "prefault_s_median": statistics.median(r["prefault_s"] for r in done),
                            "cleanup_s_median": statistics.median(r["cleanup_s"] for r in done),
                            "setup_s": [r["setup_s"] for r in done], "prefault_s": [r["prefault_s"] for r in done],
                            "load_1m": load}
                    case["gib_per_s"] = round(gib / case["setup_s_median"], 2)
                    if pages == "2m":
                        case["speedup_paired_median"] = round(statistics.median(
                            a["setup_s"] / b["setup_s"] for a, b in zip(runs["4k"], done, strict=True)), 2)
                    out["cases"].append(case)
                    print(json.dumps({k: v for k, v in case.items() if k not in ("setup_s", "prefault_s")}),
                          file=sys.stderr, flush=True)
    finally:
        os.environ.pop(hugetlb_pool.POOL_HUGEPAGES_DIR_ENV, None)
        link = f"{hugetlb_pool.SHM_PREFIX}{hugetlb_pool.link_name(os.path.realpath(mount))}"
        if os.path.islink(link):
            os.unlink(link)
        subprocess.run(["umount", mount], check=False)
        os.rmdir(mount)
        with open(f"{SYSFS}/nr_hugepages", "w") as f:
            f.write(str(old))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--releases", nargs="+", default=["0.33.0", "0.34.0"])
    parser.add_argument("--json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (hugetlbfs mount, vm.nr_hugepages)", file=sys.stderr)
        return 2
    if not os.environ.get(IN_NAMESPACE):
        env = dict(os.environ, **{IN_NAMESPACE: "1"})
        return subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, *sys.argv],
                              env=env, check=False).returncode
    out = run(args)
    text = json.dumps(out, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
