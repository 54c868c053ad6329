#!/usr/bin/env python3
"""Where each engine start's time went, the pool's phases to the millisecond, from hugepages34.sh's calls.

Per start (run34.json beside its logs34.tgz, as hugepages34.sh leaves them under $OUT/huge and $OUT/plain): the
pages the pool sat on, from vLLM's "Created mmap file" to the worker's "Registering full CPU offload region" (the
file made and its pages faulted: vLLM's one thread, or the connector's threads, whose own line gives the pre-fault)
and from there to the engine core's next line (cudaHostRegister of the whole region), the process's start to ready,
the calibration, and the 100%-hit and TTFT medians; and where the whole start went, milestone to milestone
(start_phases). vLLM's lines carry milliseconds under logging-ms.json; a log without them is read to the second,
and gives no milestones.

    python3 bench/pool-setup/pool_phases.py DIR [DIR ...]     (each DIR holding run34.json and logs34.tgz)
"""
from __future__ import annotations

import io
import json
import re
import statistics
import sys
import tarfile
from datetime import datetime
from pathlib import Path

_STAMP = re.compile(r"\(EngineCore[^)]*\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?) ")
_CREATED = "Created mmap file"
_REGISTERING = "Registering full CPU offload region"
_PREFAULT = re.compile(r"pre-faulted the CPU offload region \(([\d.]+) GB(?:, (\S+ \S+) pages)?\) in ([\d.]+) s "
                       r"with (\d+) thread")
_HUGE = "is on 2 MiB huge pages"
_FALLBACK = "not 2 MiB huge pages"


def _when(line: str) -> datetime | None:
    m = _STAMP.search(line)
    if not m:
        return None
    stamp = m.group(1)
    return datetime.strptime(stamp, "%m-%d %H:%M:%S.%f" if "." in stamp else "%m-%d %H:%M:%S")


def pool_phases(log: str) -> dict:
    """The pool's phases in one engine's log: seconds from the file's creation to the registration's start and
    from there to the engine core's next line."""
    core = [(t, line) for line in log.splitlines() if (t := _when(line)) is not None]
    out: dict = {"pages": "2 MiB" if _HUGE in log else "4 KiB",
                 "fallback": next((line[-240:] for line in log.splitlines() if _FALLBACK in line), None)}
    created = next((i for i, (_, line) in enumerate(core) if _CREATED in line), None)
    registering = next((i for i, (_, line) in enumerate(core) if _REGISTERING in line), None)
    if created is None or registering is None or registering + 1 >= len(core):
        return out
    out["created_to_registering_s"] = round((core[registering][0] - core[created][0]).total_seconds(), 3)
    out["registration_s"] = round((core[registering + 1][0] - core[registering][0]).total_seconds(), 3)
    out["created_to_registered_s"] = round(out["created_to_registering_s"] + out["registration_s"], 3)
    out["after_registration"] = core[registering + 1][1][-120:]
    m = _PREFAULT.search(log)
    if m:
        out["prefault"] = {"gb": float(m.group(1)), "pages": m.group(2), "s": float(m.group(3)),
                           "threads": int(m.group(4))}
    return out


# Where a start's time goes, milestone by milestone: (name, the first line that holds the text; "last": the last).
_MILESTONES = (("the CLI's first line", None, "first"), ("the engine core's first line", "(EngineCore", "first"),
               ("weights loaded", "Model loading took", "first"),
               ("compiled graphs loaded", "torch.compile took", "first"),
               ("memory profiled", "Available KV cache memory", "first"),
               ("graphs captured", "Graph capturing finished", "first"), ("pool file created", _CREATED, "first"),
               ("pool registered", _REGISTERING, "next"), ("every API server's routes", "Available routes are", "last"))
# Any process's line: the CLI (MainProcess, or APIServer where one server runs), the engine core, the API servers.
_ANY_STAMP = re.compile(r"^\([^)]*\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) ")
_ENGINE_START = re.compile(r"^\[(\d\d:\d\d:\d\d)\] engine (\S+): ")


def start_phases(log: str, started: str | None) -> dict:
    """Seconds from one milestone to the next in an engine's log (_MILESTONES; "pool registered" is the engine
    core's line after the registration's: its engine init's end), and from the process's start (run34.log's
    "[HH:MM:SS] engine NAME:", to the second) to the CLI's first line: what the CLI imports before it logs."""
    stamped = [(datetime.strptime(m.group(1), "%m-%d %H:%M:%S.%f"), line) for line in log.splitlines()
               if (m := _ANY_STAMP.match(line))]
    if not stamped:
        return {}  # no millisecond stamps: a log from before logging-ms.json
    times: list[tuple[str, datetime | None]] = []
    for name, text, which in _MILESTONES:
        hits = [i for i, (_, line) in enumerate(stamped) if text is None or text in line]
        index = None if not hits else hits[-1] if which == "last" else hits[0] + (which == "next")
        times.append((name, stamped[index][0] if index is not None and index < len(stamped) else None))
    out: dict = {"steps_s": {}}
    previous = None
    for name, when in times:
        if when is not None and previous is not None:
            out["steps_s"][name] = round((when - previous).total_seconds(), 3)
        previous = when if when is not None else previous
    first = stamped[0][0]
    if started:
        start = datetime.strptime(f"{first:%m-%d} {started}", "%m-%d %H:%M:%S")
        out["process_start_to_cli_line_s"] = round((first - start).total_seconds(), 1)  # +-1 s: a whole second
    return out


def _engine_starts(run_log: str) -> dict[str, str]:
    """Each engine's process start in run34.log, to the second (the last, where a name ran twice)."""
    return {m.group(2): m.group(1) for line in run_log.splitlines() if (m := _ENGINE_START.match(line))}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def starts(directory: Path) -> list[dict]:
    call = json.loads((directory / "run34.json").read_text())
    logs: dict[str, str] = {}
    engine_starts: dict[str, str] = {}
    tgz = directory / "logs34.tgz"
    if tgz.exists():
        with tarfile.open(tgz) as tar:
            for member in tar.getmembers():
                name = Path(member.name).name
                if name.startswith("serve-") and name.endswith(".log"):
                    logs[name[len("serve-"):-len(".log")]] = io.TextIOWrapper(tar.extractfile(member)).read()
                elif name == "run34.log":
                    engine_starts = _engine_starts(io.TextIOWrapper(tar.extractfile(member)).read())
    rows = []
    for engine in call["engines"]:
        if "skipped" in engine:
            rows.append({"name": engine["name"], "skipped": engine["skipped"]})
            continue
        result = engine.get("loadtest_result") or {}
        hit100 = [p["prompt_tokens_per_s"] for p in result.get("throughput", {}).get("points", [])
                  if p["target_hit_rate"] == 1]
        ttft: dict[str, list[float]] = {}
        for s in result.get("ttft", {}).get("samples", []):
            if s["ok"]:
                ttft.setdefault(f"{s['length']}/{s['phase']}", []).append(s["ttft_s"] * 1000)
        rows.append({"call": directory.as_posix(), "name": engine["name"], "kind": engine.get("kind"),
                     "uptime_at_start_s": round(engine["calibration_before"].get("host_uptime_s") or 0),
                     "calibration_s": [engine["calibration_before"]["python_s"], engine["calibration_after"]["python_s"]],
                     "slow": engine.get("slow"), "startup_s": round(engine.get("startup_s") or 0, 1),
                     "pool": pool_phases(logs.get(engine["name"], "")),
                     "start": start_phases(logs.get(engine["name"], ""), engine_starts.get(engine["name"])),
                     "hit100_tok_s": _median(hit100),
                     "ttft_ms": {k: _median(v) for k, v in sorted(ttft.items())},
                     "error": engine.get("error")})
    return rows


def main(paths: list[str]) -> None:
    print(json.dumps([row for path in paths for row in starts(Path(path))], indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
