"""Test-only instrument for images/vllm/patches/inflight_reservation.py, run inside a real vLLM engine.

A test copies this file as `sitecustomize.py` into a folder it puts first on the server's PYTHONPATH, so
every process of the server (the engine core is a subprocess) runs it at start. When that process imports
vLLM's scheduler, Scheduler._inflight_prefill_reserved_blocks is wrapped: each call computes vLLM's
original sum and the patched function's (compiled from patch_source(the module's own source) as a
separate module), returns the original, and appends one JSON line to $SPILLWAY_PATCH_PROBE_LOG:
{"original", "patched", "inflight", "waiting_for_remote_kvs"} (or {"error"} when the patch cannot be built).
Nothing here is imported by the project's code; the image applies the patch at build time instead.

Self-contained on purpose: it runs before anything else in the engine, with only the standard library.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import types

LOG_ENV = "SPILLWAY_PATCH_PROBE_LOG"
PATCH_ENV = "SPILLWAY_PATCH_PROBE_PATCH"  # the path of inflight_reservation.py
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
FUNCTION = "_inflight_prefill_reserved_blocks"


def _record(entry: dict) -> None:
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(json.dumps(entry) + "\n")


def _load_patch(path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("spillway_inflight_reservation", path)
    patch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(patch)
    return patch


def patched_function(scheduler_module: types.ModuleType, patch_path: str):
    """The patched function, from the patched text of the scheduler module itself, run as its own module."""
    patch = _load_patch(patch_path)
    with open(scheduler_module.__file__) as source:
        patched_source = patch.patch_source(source.read())
    patched = types.ModuleType(SCHEDULER_MODULE + "_spillway_patched")
    patched.__file__ = scheduler_module.__file__
    exec(compile(patched_source, scheduler_module.__file__ + " (patched)", "exec"), patched.__dict__)  # noqa: S102
    return getattr(patched.Scheduler, FUNCTION)


def instrument(scheduler_module: types.ModuleType) -> None:
    scheduler = scheduler_module.Scheduler
    original = getattr(scheduler, FUNCTION)
    try:
        patched = patched_function(scheduler_module, os.environ[PATCH_ENV])
    except Exception as exc:  # noqa: BLE001 - reported to the test through the log
        _record({"error": f"{type(exc).__name__}: {exc}"})
        return
    waiting_status = scheduler_module.RequestStatus.WAITING_FOR_REMOTE_KVS

    def both(self) -> int:
        inflight = list(self._inflight_prefills)
        expected = original(self)
        got = patched(self)
        _record({
            "original": expected,
            "patched": got,
            "inflight": len(inflight),
            "waiting_for_remote_kvs": sum(req.status == waiting_status for req in inflight),
        })
        return expected

    setattr(scheduler, FUNCTION, both)


class _AfterSchedulerImport(importlib.abc.MetaPathFinder):
    """Instrument the scheduler right after vLLM imports it (importing it here would load torch in every
    process that starts, before vLLM has set up its environment)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != SCHEDULER_MODULE:
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


if os.environ.get(LOG_ENV) and os.environ.get(PATCH_ENV):
    sys.meta_path.insert(0, _AfterSchedulerImport())
