"""Spillway's offloading specs pre-fault vLLM's shared CPU region from several threads (spec.shared_region).

It must fault exactly the pages vLLM's own constructor faults, no more and no fewer, for every layout the region
has (one worker's slots, a rank's half of each row, the whole region, one file or several), and leave a region
whose code does not read as verified to vLLM. The region's module is vLLM 0.33's and 0.34's own source (make
vllm-src), run here on the installed vLLM's helpers: the CPU platform never maps the region in an engine
(`_uses_shared_region` is CUDA and XPU), so the region is built directly, in /dev/shm, as vLLM builds it.
"""
from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import uuid

import pytest
from spillway.core import vllm_api as V
from support import require_vllm
from support.tools import skip_or_fail
from support.vllm_trees import vllm_tree

require_vllm(allow_module_level=True)

from spillway_connector import source_guard, spec

MiB = 1 << 20
RELEASES = ["0.33.0", "0.34.0"]
REGION = "vllm/v1/kv_offload/cpu/shared_offload_region.py"


@pytest.fixture(scope="module", params=RELEASES)
def region_module(request):
    """That release's region module, importable beside the installed vLLM."""
    tree = vllm_tree(request.param)
    if tree is None:
        skip_or_fail(f"SPILLWAY_VLLM_TREES holds no {request.param} tree (make vllm-src unpacks it)")
    name = f"region_{request.param.replace('.', '_')}"
    loader = importlib.util.spec_from_file_location(name, tree / REGION)
    module = importlib.util.module_from_spec(loader)
    import sys

    sys.modules[name] = module
    loader.loader.exec_module(module)
    return module


def _resident(region) -> list[int]:
    """mincore's residency byte of every page of the region's mapping."""
    base, size = region.base_tensor.data_ptr(), region.total_size_bytes
    page = 4096
    vector = (ctypes.c_ubyte * (size // page))()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(base, size, vector) == 0, ctypes.get_errno()
    return [b & 1 for b in vector]


def _kwargs(*, chunks, row, slot, rank, segments, shard=None, barrier=None):
    kwargs = {"engine_id": f"spillway-test-{uuid.uuid4().hex[:8]}", "num_chunks": chunks, "rank": rank,
              "kv_bytes_per_chunk": row, "cpu_page_size": slot, "num_segments": segments}
    if shard is not None:
        kwargs["populate_shard"] = shard
    if barrier is not None:
        kwargs["barrier"] = barrier
    return kwargs


LAYOUTS = {
    "one-worker-four-files": {"chunks": 48, "row": 2 * MiB, "slot": 2 * MiB, "rank": 0, "segments": 4},
    "rank-1-of-2": {"chunks": 40, "row": 2 * MiB, "slot": 1 * MiB, "rank": 1, "segments": 2},
    "rank-0-of-2-unaligned-slot": {"chunks": 24, "row": 3 * MiB, "slot": 1536 * 1024, "rank": 0, "segments": 1},
    "whole-region": {"chunks": 32, "row": 2 * MiB, "slot": 2 * MiB, "rank": None, "segments": 1},
    "replicated-shard-1-of-3": {"chunks": 30, "row": 2 * MiB, "slot": 2 * MiB, "rank": 0, "segments": 2,
                                "shard": (1, 3)},
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_the_region_is_faulted_exactly_as_vllm_faults_it_from_several_threads(region_module, monkeypatch, layout,
                                                                             caplog):
    # vLLM splits the region into files of at least 1 GiB; a smaller floor gives these small regions several
    # files, as a real pool has.
    monkeypatch.setattr(region_module, "_MIN_SEGMENT_BYTES", 16 * MiB)
    cls = region_module.SharedOffloadRegion
    calls = {"vllm": 0, "spillway": 0}

    def counting(side):
        def barrier():
            calls[side] += 1
        return barrier

    built = []
    try:
        built.append(cls(**_kwargs(**LAYOUTS[layout], barrier=counting("vllm"))))
        with caplog.at_level(logging.INFO, logger="spillway_connector"):
            built.append(spec.shared_region(threads=4, region_cls=cls,
                                            **_kwargs(**LAYOUTS[layout], barrier=counting("spillway"))))
        want, got = (_resident(region) for region in built)
    finally:
        for region in built:
            region.cleanup()
    assert sum(got) > 0 and got == want, f"{sum(got)} pages faulted, vLLM's own constructor faults {sum(want)}"
    line, = [r.getMessage() for r in caplog.records if "pre-faulted the CPU offload region" in r.getMessage()]
    assert line.endswith("with 4 thread(s)"), line
    # Every worker runs the same spec, so each meets the others as often: vLLM's meetings, one more (vLLM's
    # pre-fault of nothing) and, for a replicated region's shard, one after the pre-fault, as vLLM's shards do.
    assert calls["spillway"] == calls["vllm"] + 1


def test_a_region_whose_code_differs_is_left_to_vllm(region_module, monkeypatch, caplog):
    monkeypatch.setattr(region_module, "_MIN_SEGMENT_BYTES", 16 * MiB)
    monkeypatch.setattr(source_guard, "_refused", set())
    monkeypatch.setattr(spec, "REGION_CODE", dict(spec.REGION_CODE, **{
        "SharedOffloadRegion.iter_worker_slot_ranges": frozenset({"another release"})}))
    with caplog.at_level(logging.INFO, logger="spillway_connector"):
        region = spec.shared_region(threads=4, region_cls=region_module.SharedOffloadRegion,
                                    **_kwargs(**LAYOUTS["one-worker-four-files"]))
    try:
        assert all(_resident(region))  # vLLM's own pre-fault ran
    finally:
        region.cleanup()
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "pre-faulted" in m]
    assert [m for m in messages if "iter_worker_slot_ranges" in m and "stock code runs" in m]


def test_the_installed_cpu_release_keeps_vllms_region():
    """vLLM 0.32's region (the CPU engine's) has no populate_shard and pre-faults otherwise: refused."""
    from spillway_connector.compat import VLLM_MINOR

    if VLLM_MINOR != (0, 32):
        pytest.skip("the installed vLLM is not 0.32")
    assert source_guard.differences(spec.region_functions(), spec.REGION_CODE)


@pytest.mark.parametrize("value, threads", [("8", 8), ("0", None), ("-3", None), ("x", None), ("500", 64)])
def test_the_thread_count_comes_from_the_environment_within_bounds(monkeypatch, value, threads):
    monkeypatch.setenv(spec.PREFAULT_THREADS_ENV, value)
    default = max(1, min(len(os.sched_getaffinity(0)), 16))
    assert spec.prefault_threads() == (threads if threads is not None else default)


def test_the_operator_and_the_spec_name_the_same_variable():
    assert V.ENV_PREFAULT_THREADS == spec.PREFAULT_THREADS_ENV
