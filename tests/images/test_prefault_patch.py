"""images/vllm/patches/parallel_prefault.py: vLLM 0.33's CPU offload region pre-faulted from several threads.

The patch must fault exactly the pages vLLM's own loop faults, no more and no fewer, for every layout the region
has (one worker's slots, a rank's half of each row, the whole region, one file or several), leave the release it
is not for as it is, and refuse a region whose code moved. The region's module is vLLM 0.33's own source (make
vllm-src), run here on the installed vLLM's helpers: the CPU platform never maps the region in an engine
(`_uses_shared_region` is CUDA and XPU), so the region is built directly, in /dev/shm, as vLLM builds it.
"""
from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from spillway.core import vllm_api as V
from support import source_patch_checks as checks
from support import vllm_available
from support.tools import skip_or_fail
from support.vllm_trees import vllm_tree

REPO = Path(__file__).resolve().parents[2]
PATCH_FILE = REPO / "images" / "vllm" / "patches" / "parallel_prefault.py"
MiB = 1 << 20


patch = checks.load_module(PATCH_FILE, "parallel_prefault")


@pytest.fixture(scope="module")
def tree() -> Path:
    found = vllm_tree("0.33.0")
    if found is None:
        skip_or_fail("SPILLWAY_VLLM_TREES holds no 0.33.0 tree (make vllm-src unpacks it)")
    return found


@pytest.fixture(scope="module")
def regions(tree, tmp_path_factory):
    """(vLLM 0.33's region module, the same module patched), importable beside the installed vLLM."""
    if not vllm_available():
        skip_or_fail("vLLM is not installed (make setup)")
    folder = tmp_path_factory.mktemp("region")
    source = patch.target(tree).read_text()
    (folder / "original.py").write_text(source)
    (folder / "patched.py").write_text(patch.patch_source(source))
    return (checks.load_module(folder / "original.py", "region_original"),
            checks.load_module(folder / "patched.py", "region_patched"))


def _resident(region) -> list[int]:
    """mincore's residency byte of every page of the region's mapping."""
    base, size = region.base_tensor.data_ptr(), region.total_size_bytes
    page = 4096
    vector = (ctypes.c_ubyte * (size // page))()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(base, size, vector) == 0, ctypes.get_errno()
    return [b & 1 for b in vector]


def _build(module, monkeypatch, *, chunks, row, slot, rank, segments):
    # vLLM splits the region into files of at least 1 GiB; a smaller floor gives these small regions several
    # files, as a real pool has.
    monkeypatch.setattr(module, "_MIN_SEGMENT_BYTES", 16 * MiB)
    return module.SharedOffloadRegion(engine_id=f"spillway-test-{uuid.uuid4().hex[:8]}", num_chunks=chunks,
                                      rank=rank, kv_bytes_per_chunk=row, cpu_page_size=slot,
                                      num_segments=segments)


LAYOUTS = {
    "one-worker-four-files": {"chunks": 48, "row": 2 * MiB, "slot": 2 * MiB, "rank": 0, "segments": 4},
    "rank-1-of-2": {"chunks": 40, "row": 2 * MiB, "slot": 1 * MiB, "rank": 1, "segments": 2},
    "rank-0-of-2-unaligned-slot": {"chunks": 24, "row": 3 * MiB, "slot": 1536 * 1024, "rank": 0, "segments": 1},
    "whole-region": {"chunks": 32, "row": 2 * MiB, "slot": 2 * MiB, "rank": None, "segments": 1},
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_the_patched_region_faults_exactly_vllms_pages_from_several_threads(regions, monkeypatch, layout):
    original, patched = regions
    monkeypatch.setenv(patch.THREADS_ENV, "4")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    patched.logger.addHandler(handler)
    # In an engine the module logs under vLLM's logger, at INFO; loaded here under its own name it would not.
    level = patched.logger.level
    patched.logger.setLevel(logging.INFO)
    built = []
    try:
        built.append(_build(original, monkeypatch, **LAYOUTS[layout]))
        built.append(_build(patched, monkeypatch, **LAYOUTS[layout]))
        want, got = (_resident(region) for region in built)
    finally:
        patched.logger.removeHandler(handler)
        patched.logger.setLevel(level)
        for region in built:
            region.cleanup()
    assert sum(got) > 0 and got == want, f"{sum(got)} pages faulted, vLLM's own loop faults {sum(want)}"
    if LAYOUTS[layout]["rank"] is None or LAYOUTS[layout]["row"] == LAYOUTS[layout]["slot"]:
        assert all(got), "a page of a whole-row layout was left to fault at the first copy"
    line, = [r for r in records if r.startswith("Pre-faulted the CPU offload region")]
    assert line.endswith("with 4 thread(s)"), line


def test_one_thread_takes_vllms_own_path(regions, monkeypatch):
    _, patched = regions
    monkeypatch.setenv(patch.THREADS_ENV, "1")
    region = _build(patched, monkeypatch, **LAYOUTS["one-worker-four-files"])
    try:
        assert all(_resident(region))
    finally:
        region.cleanup()
    assert patched._spillway_prefault_threads() == 1


@pytest.mark.parametrize("value, threads", [("8", 8), ("0", None), ("-3", None), ("x", None), ("500", 64)])
def test_the_thread_count_comes_from_the_environment_within_bounds(regions, monkeypatch, value, threads):
    _, patched = regions
    monkeypatch.setenv(patch.THREADS_ENV, value)
    default = max(1, min(len(os.sched_getaffinity(0)), 16))
    assert patched._spillway_prefault_threads() == (threads if threads is not None else default)


def test_the_operator_and_the_patch_name_the_same_variable():
    assert V.ENV_PREFAULT_THREADS == patch.THREADS_ENV


def test_the_patch_is_idempotent_and_reverts_to_the_exact_bytes(tree, tmp_path):
    copy = patch.target(tmp_path)
    copy.parent.mkdir(parents=True)
    original = patch.target(tree).read_bytes()
    copy.write_bytes(original)
    assert patch.apply(tmp_path) == "applied"
    once = copy.read_bytes()
    assert patch.apply(tmp_path) == "already applied" and copy.read_bytes() == once
    assert patch.revert(tmp_path) == "reverted" and copy.read_bytes() == original


def test_a_region_whose_prefault_changed_is_refused_in_one_line(tree, tmp_path):
    copy = patch.target(tmp_path)
    copy.parent.mkdir(parents=True)
    source = patch.target(tree).read_text()
    copy.write_text(source.replace("for offset, length in self.iter_worker_slot_ranges():",
                                   "for offset, length in self.iter_worker_slots():"))
    proc = subprocess.run([sys.executable, str(PATCH_FILE), "apply", str(tmp_path)], capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc
    line, = proc.stderr.splitlines()
    assert line.startswith("parallel_prefault: ") and "does not read as" in line
    assert not copy.with_name(copy.name + ".orig").exists()


def test_a_release_without_the_region_pre_fault_is_left_as_is(tmp_path):
    """The CPU image's vLLM (0.32) pre-faults on the creator only and never maps the region on the CPU."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "_version.py").write_text("__version__ = version = '0.32.0'\n")
    proc = subprocess.run([sys.executable, str(PATCH_FILE), "apply", str(tmp_path)], capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 0 and "not needed on vLLM 0.32.0" in proc.stdout, proc
