"""What the disk tier's chunk checksum costs: BLAKE3 over a chunk and its name (spillway_connector.chunk_integrity
.digest, the function every store and load runs), in ms per GiB and GiB/s, on one thread and on the tier's I/O
threads at once, next to a plain memcpy of the same bytes (the floor any copy pays).

    python bench/disk-tier/checksum_cost.py [--threads 1,2,16] [--out results/checksum-cost-<host>.json]

Chunk sizes: 2 MiB (16 tokens of Llama-3.1-8B's bf16 KV, 128 KiB a token) and 16 KiB (the CPU engine tests').
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "connector"))
from spillway_connector.chunk_integrity import chunk_name, digest

TOTAL = 512 << 20
NAME = chunk_name("/tier/replica-0/model_0123456789ab_r0/abc/de_g0/" + "ab" * 32 + ".bin")


def rate(chunk: int, threads: int, work) -> float:
    """GiB/s over TOTAL bytes split in chunks, `threads` at once; the best of 3."""
    buf = memoryview(bytearray(os.urandom(1 << 20) * (TOTAL >> 20)))
    slices = [buf[offset:offset + chunk] for offset in range(0, TOTAL, chunk)]
    shares = [slices[i::threads] for i in range(threads)]  # each thread loops over its own share: no per-chunk
                                                           # executor overhead, as in the tier's I/O threads

    def run(share):
        for data in share:
            work(data)

    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(3):
            start = time.perf_counter()
            list(pool.map(run, shares))
            best = min(best, time.perf_counter() - start)
    return TOTAL / 2**30 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for chunk in (2 << 20, 16 << 10):
        for threads in (int(t) for t in args.threads.split(",")):
            checksum = rate(chunk, threads, lambda data: digest(NAME, data))
            copy = rate(chunk, threads, bytes)
            rows.append({"chunk_bytes": chunk, "threads": threads, "blake3_gib_per_s": round(checksum, 2),
                         "blake3_ms_per_gib": round(1000 / checksum, 1), "memcpy_gib_per_s": round(copy, 2)})
            print(json.dumps(rows[-1]), flush=True)
    result = {"host": platform.node(), "cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
              "blake3": _blake3_version(), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _blake3_version() -> str:
    from importlib.metadata import version

    return version("blake3")


if __name__ == "__main__":
    main()
