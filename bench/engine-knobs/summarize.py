#!/usr/bin/env python3
"""The knobs table: per engine start, medians of every pass and repetition, from the calls' run34.json files.

    python3 bench/engine-knobs/summarize.py bench/engine-knobs/results/knobs-call*.json
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def engine_rows(path: str) -> list[dict]:
    with open(path) as f:
        call = json.load(f)
    rows = []
    for engine in call["engines"]:
        if "skipped" in engine or not engine.get("loadtest_result"):
            continue
        result = engine["loadtest_result"]
        by_rate = defaultdict(list)
        for point in result["throughput"]["points"]:
            by_rate[point["target_hit_rate"]].append(point["prompt_tokens_per_s"])
        ttft = defaultdict(list)
        for sample in result["ttft"]["samples"]:
            if sample["ok"]:
                ttft[(sample["length"], sample["phase"])].append(sample["ttft_s"] * 1000)
        rows.append({"call": path.rsplit("/", 1)[-1], "name": engine["name"], "startup_s": round(engine["startup_s"]),
                     "slow": engine.get("slow"),
                     "calibration_s": [engine["calibration_before"]["python_s"], engine["calibration_after"]["python_s"]],
                     "tok_s": {rate: round(statistics.median(v)) for rate, v in sorted(by_rate.items(), reverse=True)},
                     "ttft_ms": {f"{length}/{phase}": round(statistics.median(v), 1)
                                 for (length, phase), v in sorted(ttft.items())}})
    return rows


def main(paths: list[str]) -> None:
    rows = [row for path in paths for row in engine_rows(path)]
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
