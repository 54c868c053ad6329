"""The result document: every raw figure, the environment and the plan; written after every point.

The file is replaced atomically after each point, so an interrupted run leaves what it measured. In a
Kubernetes Job the same document is also printed after each point as one log line starting with
RESULT_MARKER; the last such line of `kubectl logs` is the result.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

SCHEMA = "spillway.loadtest/v1"
RESULT_MARKER = "SPILLWAY_LOADTEST_RESULT"
STATUS_RUNNING, STATUS_COMPLETE, STATUS_INTERRUPTED, STATUS_FAILED = "running", "complete", "interrupted", "failed"


def new_result(schema: str, plan: dict, labels: dict[str, str], **sections: Any) -> dict[str, Any]:
    """A result as a run starts; sections: the experiment's own keys (ttft, throughput; routes; runs; ...)."""
    return {
        "schema": schema,
        "status": STATUS_RUNNING,
        "error": None,
        "started_at": _now(),
        "finished_at": None,
        "environment": {"labels": dict(labels), "client": client_facts()},
        "plan": plan,
        **sections,
    }


def client_facts() -> dict[str, str | None]:
    """The machine and the versions that sent the load."""
    from .. import __version__

    return {"host": platform.node(), "python": platform.python_version(), "spillway": __version__,
            "aiohttp": _version("aiohttp")}


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ResultSink:
    """Holds the result and publishes it: the JSON file (atomic replace) and/or a marked log line."""

    def __init__(self, result: dict[str, Any], path: Path | None = None, emit: TextIO | None = None,
                 root: dict[str, Any] | None = None, prepare: Callable[[dict[str, Any]], None] | None = None) -> None:
        """root: a finished result this one is the baseline of; the document published is then root.
        prepare: brings the result's derived figures up to date before each publication."""
        self.result = result
        self.path = path
        self.emit = emit
        self.root = root
        self.prepare = prepare

    def publish(self) -> None:
        if self.prepare is not None:
            self.prepare(self.result)
        document = self.result
        if self.root is not None:
            self.root["baseline"] = self.result
            document = self.root
        if self.path is not None:
            write_atomic(self.path, json.dumps(document, indent=1))
        if self.emit is not None:
            print(f"{RESULT_MARKER} {json.dumps(document, separators=(',', ':'))}", file=self.emit, flush=True)

    def finish(self, status: str, error: str | None = None) -> None:
        self.result["status"] = status
        self.result["error"] = error
        self.result["finished_at"] = _now()
        self.publish()


def write_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MAX_RESULT_BYTES = 256 * 2**20  # a result of a long run is a few MiB; a saved Job log somewhat more


def check_output(path: Path) -> None:
    """Refuse an output path no result can be written to, before the run rather than after it."""
    from ..core.errors import InvalidSpec

    path = Path(path)
    if path.is_dir():
        raise InvalidSpec(f"--output {path} is a directory; give a file path such as {path / 'result.json'}")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise InvalidSpec(f"--output {path}: {parent} is not a directory")


def load(path: Path, schema: str = SCHEMA, what: str = "load test result") -> dict[str, Any]:
    """A result file, or the last RESULT_MARKER line of a saved log (`kubectl logs job/... > log`), of `schema`."""
    from ..core.errors import InvalidSpec

    try:
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_RESULT_BYTES + 1)
    except OSError as exc:
        raise InvalidSpec(f"cannot read result {path}: {exc.strerror}") from None
    if len(data) > MAX_RESULT_BYTES:
        raise InvalidSpec(f"{path}: larger than {MAX_RESULT_BYTES // 2**20} MiB; not a load test result")
    try:
        text = data.decode("utf-8")
        found = result_from_log(text)
        result = found if found is not None else json.loads(text)
    except UnicodeDecodeError:
        raise InvalidSpec(f"{path} is not UTF-8 text: neither a load test result (JSON) nor a log") from None
    except RecursionError:
        raise InvalidSpec(f"{path}: JSON nested too deeply to be a load test result") from None
    except ValueError:
        raise InvalidSpec(f"{path} is neither a load test result (JSON) nor a log holding one") from None
    if not isinstance(result, dict) or result.get("schema") != schema:
        raise InvalidSpec(f"{path} is not a {what} ({schema})")
    return result


def result_from_log(text: str) -> dict[str, Any] | None:
    last = None
    for line in text.splitlines():
        _, marker, rest = line.partition(RESULT_MARKER + " ")
        if marker:
            last = rest
    return json.loads(last) if last is not None else None


# -- TTFT summary -------------------------------------------------------------------------------------

def spread(values: list[float]) -> dict[str, float] | None:
    """Median, min, max, stdev and n of `values` (None for none): how the project quotes a measured figure."""
    if not values:
        return None
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "stdev": statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
        "n": len(ordered),
    }


def summarize_ttft(samples: list[dict]) -> list[dict]:
    """Per prompt length: TTFT of first requests (recompute) and of repeats (after GPU eviction)."""
    summary = []
    for length in sorted({s["length"] for s in samples}):
        cold = [s["ttft_s"] for s in samples if s["length"] == length and s["phase"] == "cold" and s["ok"]]
        warm = [s["ttft_s"] for s in samples if s["length"] == length and s["phase"] == "warm" and s["ok"]]
        warm_hits = [s["achieved"]["cpu_hit_rate"] for s in samples
                     if s["length"] == length and s["phase"] == "warm" and s["ok"]
                     and s.get("achieved", {}).get("cpu_hit_rate") is not None]
        phases = [s["server"] for s in samples
                  if s["length"] == length and s["phase"] == "warm" and s["ok"] and s.get("server")]
        row = {"length": length, "recompute_s": spread(cold), "repeat_s": spread(warm),
               "repeat_cpu_hit_rate": statistics.median(warm_hits) if warm_hits else None, "speedup": None,
               # where a repeat's time went, on the server's clocks: medians of each phase over the repeats
               "repeat_server_s": {key: statistics.median(p[key] for p in phases) for key in phases[0]
                                   if all(p[key] is not None for p in phases)} if phases else None}
        if row["recompute_s"] and row["repeat_s"] and row["repeat_s"]["median"] > 0:
            row["speedup"] = row["recompute_s"]["median"] / row["repeat_s"]["median"]
        summary.append(row)
    return summary


def percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "mean": statistics.fmean(ordered),
            "max": ordered[-1]}

