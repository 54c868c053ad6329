"""Transfer log for vLLM's CPU offload worker (profiling runs only; loaded through PYTHONPATH).

When SPILLWAY_TRANSFER_LOG names a directory, every process that imports vLLM's CPU offload worker
writes one JSON line per finished transfer to <dir>/transfers-<pid>.jsonl: direction, bytes, copy ops,
GPU time between the transfer's CUDA events, and wall-clock times of submission and of the moment
the engine noticed completion. Nothing else in vLLM changes.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

TARGET = "vllm.v1.kv_offload.cpu.gpu_worker"
LOG_DIR = os.environ.get("SPILLWAY_TRANSFER_LOG")


def _patch(module) -> None:
    handler_cls = module.SingleDirectionOffloadingHandler
    submit, finished = handler_cls.transfer_async, handler_cls.get_finished
    out = open(os.path.join(LOG_DIR, f"transfers-{os.getpid()}.jsonl"), "a", buffering=1)  # noqa: SIM115 - lives with the process
    pending: dict[int, tuple[float, float, int]] = {}

    def transfer_async(self, job_id, src_spec, dst_spec):
        t0 = time.time()
        ok = submit(self, job_id, src_spec, dst_spec)
        t1 = time.time()
        pending[job_id] = (t0, t1, len(self._transfers))
        return ok

    def get_finished(self):
        results = finished(self)
        now = time.time()
        for r in results:
            t0, t1, queued = pending.pop(r.job_id, (None, None, None))
            out.write(json.dumps({
                "dir": "g2c" if self.gpu_to_cpu else "c2g", "job": r.job_id, "bytes": r.transfer_size,
                "gpu_s": r.transfer_time, "submit_t": t0, "submit_cpu_s": None if t0 is None else t1 - t0,
                "done_seen_t": now, "queued_ahead": None if queued is None else queued - 1,
            }) + "\n")
        return results

    handler_cls.transfer_async, handler_cls.get_finished = transfer_async, get_finished


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if LOG_DIR:
    os.makedirs(LOG_DIR, exist_ok=True)
    sys.meta_path.insert(0, _Hook())
