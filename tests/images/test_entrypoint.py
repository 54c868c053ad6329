"""The vLLM image's entrypoint, run directly with sh: the planned arguments, the layout preset, and the
removal of stale offload pool files from /dev/shm (here a temporary directory: SPILLWAY_SHM_DIR).

The built image runs the same entrypoint in test_vllm_cpu_image.py, with the holder in another container.
"""
from __future__ import annotations

import re
import runpy
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pools import HOLDER, plant
from spillway.core import vllm_api
from support.tools import skip_or_fail
from support.vllm_trees import vllm_trees

ENTRYPOINT = Path(__file__).resolve().parents[2] / "images" / "vllm" / "entrypoint.sh"

def stub(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def entrypoint(tmp_path: Path, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    # A vllm stand-in that prints what it was started with: its arguments and the layout variable.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub(bin_dir, "vllm", f'echo "$@"; echo "layout=${{{vllm_api.ENV_KV_CACHE_LAYOUT}-unset}}"\n')
    shm = tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "SPILLWAY_SHM_DIR": str(shm), **env_vars}
    return subprocess.run(["sh", str(ENTRYPOINT), *args], check=False, capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.mark.parametrize("args, expected", [
    (["Qwen/Qwen2.5-7B-Instruct", "--tensor-parallel-size", "2"], "serve Qwen/Qwen2.5-7B-Instruct --tensor-parallel-size 2"),
    (["vllm", "serve", "m", "--port", "8000"], "serve m --port 8000"),
])
def test_entrypoint_runs_vllm_serve_with_the_planned_args(tmp_path, args, expected):
    proc = entrypoint(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == expected


@pytest.mark.parametrize("given, seen", [
    (None, vllm_api.CONTIGUOUS_LAYOUT),  # the preset
    ("HND", "HND"),  # a planned or chosen layout is kept
    ("auto", "unset"),  # the attention backend chooses
])
def test_entrypoint_presets_the_contiguous_layout(tmp_path, given, seen):
    env_vars = {} if given is None else {vllm_api.ENV_KV_CACHE_LAYOUT: given}
    proc = entrypoint(tmp_path, "m", **env_vars)
    assert proc.returncode == 0 and proc.stdout.splitlines()[1] == f"layout={seen}"


def test_entrypoint_without_args_explains(tmp_path):
    proc = subprocess.run(["sh", str(ENTRYPOINT)], check=False, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "MODEL" in proc.stderr


def test_entrypoint_removes_stale_pool_files_and_keeps_held_ones(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    stale = plant(shm / "vllm_offload_0f3a9c1e.mmap")
    stale_segment = plant(shm / "vllm_offload_0f3a9c1e.mmap.1")
    held = plant(shm / "vllm_offload_5b7d2e44.mmap")
    other = plant(shm / "vllm_offload_notes.txt")  # not vLLM's name pattern: never touched
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(held)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        proc = entrypoint(tmp_path, "m", "--port", "8000")
    finally:
        holder.kill()
        holder.wait(10)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "serve m --port 8000", "vLLM must still start after the cleanup"
    assert not stale.exists() and not stale_segment.exists()
    assert held.exists() and other.exists()
    log = proc.stderr
    assert f"removed stale pool file {stale}" in log and f"removed stale pool file {stale_segment}" in log
    assert f"kept {held}" in log and "a running process holds it" in log
    assert str(other) not in log


def test_entrypoint_removes_a_pool_file_once_its_holder_is_gone(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    pool = plant(shm / "vllm_offload_77aa.mmap")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(pool)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    assert "kept" in entrypoint(tmp_path, "m").stderr and pool.exists()
    holder.kill()
    holder.wait(10)
    assert "removed stale pool file" in entrypoint(tmp_path, "m").stderr and not pool.exists()


def test_entrypoint_with_a_clean_shm_logs_nothing(tmp_path):
    proc = entrypoint(tmp_path, "m")
    assert proc.returncode == 0 and proc.stderr == ""


def test_an_unreadable_shm_is_reported_and_vllm_still_starts(tmp_path):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    proc = entrypoint(tmp_path, "m", SPILLWAY_SHM_DIR=str(blocked))
    assert proc.returncode == 0 and proc.stdout.splitlines()[0] == "serve m"
    assert "cannot list" in proc.stderr and "starting vLLM anyway" in proc.stderr


def region_sources() -> list[Path]:
    """vLLM's shared_offload_region.py in the installed vLLM and in SPILLWAY_VLLM_TREES (CI: 0.33, 0.26)."""
    import importlib.util

    roots = vllm_trees()
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).parents[1])
    files = [root / "vllm" / "v1" / "kv_offload" / "cpu" / "shared_offload_region.py" for root in roots]
    return [f for f in files if f.is_file()]


def test_the_cleanup_knows_the_pool_file_names_of_vllms_sources():
    stale_pools = runpy.run_path(str(ENTRYPOINT.with_name("stale_pools.py")))
    sources = region_sources()
    if not sources:
        skip_or_fail("no vLLM source with a shared offload region (vLLM >= 0.32) is at hand")
    engine_id = str(uuid.uuid4())  # vllm/config/kv_transfer.py: the default engine_id
    for source in sources:
        text = source.read_text()
        path, = re.findall(r'self\.mmap_path = f"([^"]+)"', text)
        directory, name = path.replace("{engine_id}", engine_id).rsplit("/", 1)
        assert directory == "/dev/shm", f"{source}: vLLM moved its pool files to {directory}"
        names = [name]
        # 0.33 splits a large pool into segment files: f"{self.mmap_path}.{i}"
        for segment in re.findall(r'f"(\{self\.mmap_path\}\.\{i\})"', text):
            names += [segment.replace("{self.mmap_path}", name).replace("{i}", str(n)) for n in (1, 12)]
        for found in names:
            assert stale_pools["POOL_FILE"].fullmatch(found), f"{source} names a pool file {found}"


def test_the_segments_of_a_pool_in_use_are_kept_even_while_unmapped(tmp_path):
    # vLLM 0.33 holds the first file open while it creates, sizes and closes the segments, before mapping them.
    shm = tmp_path / "shm"
    shm.mkdir()
    first = plant(shm / "vllm_offload_c0ffee.mmap")
    segment = plant(shm / "vllm_offload_c0ffee.mmap.1")
    orphan = plant(shm / "vllm_offload_dead.mmap.1")  # its first file is gone: judged by itself
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(first)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        proc = entrypoint(tmp_path, "m")
    finally:
        holder.kill()
        holder.wait(10)
    assert first.exists() and segment.exists() and not orphan.exists()
    assert f"kept {segment}: a segment of the kept {first.name}" in proc.stderr
    assert f"removed stale pool file {orphan}" in proc.stderr


def test_entrypoint_sweeps_the_huge_page_directory_too(tmp_path):
    """The pool on huge pages is a file on the pod's hugepages emptyDir (spillway_connector/hugetlb_pool.py), named
    as in /dev/shm: a restarted container's stale one there holds the pages the next pool needs."""
    pages = tmp_path / "hugepages"
    pages.mkdir()
    stale = plant(pages / "vllm_offload_0f3a9c1e.mmap")
    proc = entrypoint(tmp_path, "m", **{vllm_api.ENV_POOL_HUGEPAGES_DIR: str(pages)})
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and f"removed stale pool file {stale}" in proc.stderr
