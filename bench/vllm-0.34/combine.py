#!/usr/bin/env python3
"""The medians over the engine starts of several run34.py files (calls), with run34.py's own rules: each start's
calibration against the fastest of all the calls (or --calib-ref-s), slow starts apart, pairs within a call.

    python3 bench/vllm-0.34/combine.py results/run34-call2.json results/run34-call3.json > results/headline34.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run34


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--calib-ref-s", type=float)
    a = p.parse_args()
    starts = []
    for f in a.files:
        run = json.loads(Path(f).read_text())
        for e in run["engines"]:
            if e.get("loadtest_result"):
                starts.append({**e, "call": Path(f).name})
    ref = run34.mark_slow(starts, a.calib_ref_s)
    summary = run34.summarize(starts)
    for row, s in zip(summary["per_start"], starts, strict=True):
        row.update(call=s["call"], calibration_vs_reference=s.get("calibration_vs_reference"),
                   host_uptime_s=s["calibration_before"].get("host_uptime_s"))
    print(json.dumps({"files": [Path(f).name for f in a.files], "calibration_reference_s": ref,
                      "slow_factor": run34.SLOW_FACTOR, **summary}, indent=1))


if __name__ == "__main__":
    main()
