"""Test-only instrument for spillway_connector/scheduler.py, run inside a real vLLM engine.

A test copies this file as `sitecustomize.py` into a folder it puts first on the server's PYTHONPATH, so every
process of the server (the engine core is a subprocess) runs it at start. When that process imports Spillway's
scheduler, its memoised `_inflight_prefill_reserved_blocks` is wrapped: each call computes vLLM's own sum
(Scheduler's method) and Spillway's, returns vLLM's, and appends one JSON line to $SPILLWAY_SCHEDULER_PROBE_LOG:
{"original", "spillway", "inflight", "waiting_for_remote_kvs"} (or {"error"} when the memo is off).

Self-contained on purpose: it runs before anything else in the engine, with only the standard library.
"""
from __future__ import annotations

import importlib.abc
import json
import os
import sys

LOG_ENV = "SPILLWAY_SCHEDULER_PROBE_LOG"
MODULE = "spillway_connector.scheduler"
FUNCTION = "_inflight_prefill_reserved_blocks"


def _record(entry: dict) -> None:
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(json.dumps(entry) + "\n")


def instrument(module) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus

    memo = module._ReservationMemo
    ours = memo.__dict__.get(FUNCTION)
    if ours is None:
        _record({"error": "the memo is off on this vLLM"})
        return
    original = Scheduler.__dict__[FUNCTION]

    def both(self) -> int:
        inflight = list(self._inflight_prefills)
        expected = original(self)
        got = ours(self)
        _record({"original": expected, "spillway": got, "inflight": len(inflight),
                 "waiting_for_remote_kvs": sum(req.status == RequestStatus.WAITING_FOR_REMOTE_KVS for req in inflight)})
        return expected

    setattr(memo, FUNCTION, both)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Instrument the scheduler module right after vLLM imports it (by --scheduler-cls)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_instrument(module):
            exec_module(module)
            sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self]
            instrument(module)

        loader.exec_module = exec_and_instrument
        return spec


if os.environ.get(LOG_ENV):
    sys.meta_path.insert(0, _AfterImport())
