#!/usr/bin/env python3
"""A fixed CPU-bound calibration: how fast this host runs single-threaded Python right now.

The H200 host of 2026-12-03 ran CPU-bound work at about half speed for its first ~18 minutes after boot, and the
100%-hit throughput (bounded by the engine core, a Python loop) followed it (bench/headline/README.md). So each
engine start is bracketed by this calibration, and a start whose calibration is slow is reported as such.

The work is fixed (same operations, same count, no I/O, no randomness): dict updates, integer hashing, and a JSON
round trip of a request-sized body, the kinds of work the engine core and the API servers do per request. It runs
REPS times; the minimum is the figure (the least disturbed), all times are kept.

    python3 bench/vllm-0.34/calibrate.py            # prints one JSON line
"""
from __future__ import annotations

import json
import os
import time

LOOP_N = 400_000  # about 0.4 s a rep on a 2-core developer machine (2026-12-03); the host's own seconds are the figure
REPS = 5
BODY = {"model": "llama", "prompt": list(range(1000, 1512)), "max_tokens": 1, "temperature": 0.0, "stream": False}


def _work() -> int:
    table: dict[int, int] = {}
    acc = 0
    for i in range(LOOP_N):
        k = (i * 2654435761) & 0xFFFF
        table[k] = table.get(k, 0) + i
        acc ^= k
    text = json.dumps(BODY)
    for _ in range(LOOP_N // 200):
        acc += len(json.loads(text)["prompt"])
    return acc + len(table)


def _uptime_s() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def calibrate(reps: int = REPS) -> dict:
    check = None
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = _work()
        times.append(time.perf_counter() - t0)
        if check is None:
            check = out
        elif out != check:  # the same work every rep, or the figure means nothing
            raise RuntimeError("calibration work is not deterministic")
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    return {"python_s": round(min(times), 4), "reps_s": [round(t, 4) for t in times], "loop_n": LOOP_N,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host_uptime_s": _uptime_s(),
            "loadavg_1m": load1}


if __name__ == "__main__":
    print(json.dumps(calibrate()))
