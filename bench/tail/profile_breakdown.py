#!/usr/bin/env python3
"""Where an engine core's busy time goes, from py-spy's raw (collapsed) stacks: shares of the sampled time by part.

    python3 bench/tail/profile_breakdown.py pyspy-spillway-t1-hit100-engine_core.txt [more files]

py-spy records only threads that are running, so the shares are of busy time. Each sample is charged to the part
of its innermost frame that belongs to one, so a connector call made from the scheduler counts as the connector's
and a transfer submitted from the model runner as the worker side's; what is left over is "other". serve_bench.py runs py-spy on an engine's core during a load
test ("profiles" in an engine set); this groups what it wrote.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

# (part, substrings of a frame "function (file:line)"); a sample goes to the part of its innermost matching frame
PARTS = [
    ("connector, scheduler side", ("offloading/scheduler.py", "kv_offload/cpu/manager.py", "kv_offload/cpu/policies",
                                   "spillway_connector/batched_", "spillway_connector/hit_sources.py")),
    ("connector, worker side", ("offloading/worker.py", "kv_offload/cpu/gpu_worker.py", "worker/gpu/kv_connector.py",
                                "spillway_connector/probes.py")),
    ("request intake (decode, block hashes)", ("process_input_sockets", "preprocess_add_request")),
    ("model forward and sampling", ("execute_model", "sample_tokens")),
    ("scheduler", ("core/sched/scheduler.py",)),
    ("outputs", ("process_output_sockets", "_send_engine_outputs", "output_processor")),
]


def _part(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, needles in PARTS:
            if any(needle in frame for needle in needles):
                return name
    return "other"


def breakdown(path: Path) -> dict:
    counts = {name: 0 for name, _ in PARTS} | {"other": 0}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        counts[_part(stack.split(";"))] += int(n)
    return {"samples": total, "shares": {k: round(v / total, 3) if total else None for k, v in counts.items()}}


if __name__ == "__main__":
    print(json.dumps({Path(p).name: breakdown(Path(p)) for p in sys.argv[1:]}, indent=1))
