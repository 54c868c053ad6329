"""The CPU offload pool on 2 MiB huge pages: vLLM 0.33's and 0.34's own SharedOffloadRegion, built by Spillway's
shared_region with its file on a hugetlbfs mount (spillway_connector/hugetlb_pool.py, PATCHES.md entry 10).

Each case runs in a private mount namespace (unshare -m) with hugetlbfs mounted on a temporary directory, as the
kubelet mounts a hugepages-2Mi emptyDir (a page size, no size), and with the machine's vm.nr_hugepages raised for
the test and put back after. Two processes play two workers: the creator (rank 0) and a joiner (rank 1), each
faulting its own slots, each reading what the other wrote.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from spillway.core import vllm_api as V
from support import hugepages, require_vllm
from support.tools import skip_or_fail
from support.vllm_trees import vllm_tree

require_vllm(allow_module_level=True)

from spillway_connector import hugetlb_pool, spec

MiB = 1 << 20
RELEASES = ["0.33.0", "0.34.0"]
CHUNKS, ROW, SLOT = 16, 4 * MiB, 2 * MiB  # 64 MiB: 32 huge pages, two workers' slots per row
POOL_PAGES = CHUNKS * ROW // (2 * MiB)

WORKER = r"""
import importlib.util, json, os, sys
import numpy as np
tree, role, engine = sys.argv[1], sys.argv[2], sys.argv[3]
loader = importlib.util.spec_from_file_location("region_under_test", tree + "/vllm/v1/kv_offload/cpu/shared_offload_region.py")
module = importlib.util.module_from_spec(loader)
sys.modules["region_under_test"] = module
loader.loader.exec_module(module)
module._MIN_SEGMENT_BYTES = 16 << 20  # vLLM would split this region into 4 files: the pool on huge pages keeps 1
import logging
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("spillway_connector").addHandler(Keep())
logging.getLogger("spillway_connector").setLevel(logging.INFO)
from spillway_connector import spec
def free():
    return int(open("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages").read())
rank = 0 if role == "creator" else 1
before = free()
region = spec.shared_region(threads=2, region_cls=module.SharedOffloadRegion, engine_id=engine, num_chunks=16,
                            rank=rank, kv_bytes_per_chunk=4 << 20, cpu_page_size=2 << 20, num_segments=32)
out = {"path": region.mmap_path, "real": os.path.realpath(region.mmap_path), "faulted": before - free(),
       "segments": len(getattr(region, "_segments", [None])), "log": records}
data = region.base_tensor.numpy().view(np.uint8)
mine, theirs = (0x5A, 0xA5) if rank == 0 else (0xA5, 0x5A)
for row in range(16):  # this worker's slot of each row: the first 2 MiB for rank 0, the second for rank 1
    at = row * (4 << 20) + rank * (2 << 20)
    data[at:at + 4096] = mine
if role == "creator":
    import subprocess
    child = subprocess.run([sys.executable, "-c", sys.argv[4], tree, "joiner", engine, sys.argv[4]],
                           capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-3000:]
    out["joiner"] = json.loads(child.stdout.strip().splitlines()[-1])
    out["after_both"] = before - free()
other = 1 - rank
out["read_other"] = all((data[row * (4 << 20) + other * (2 << 20):][:4096] == theirs).all() for row in range(16))
out["files"] = sorted(os.listdir(os.environ["SPILLWAY_POOL_HUGEPAGES_DIR"]))
del data
region.cleanup()
out["after_cleanup"] = before - free()
out["files_after"] = sorted(os.listdir(os.environ["SPILLWAY_POOL_HUGEPAGES_DIR"]))
print(json.dumps(out))
"""


@pytest.fixture
def huge_pages(request):
    """Raises vm.nr_hugepages by the asked number of pages (indirect param) and puts the old value back."""
    with hugepages.reserved(request.param) as pages:
        yield pages


def _tree(release: str) -> Path:
    tree = vllm_tree(release)
    if tree is None:
        skip_or_fail(f"SPILLWAY_VLLM_TREES holds no {release} tree (make vllm-src unpacks it)")
    return tree


def _link(mount: Path) -> str:
    return f"/dev/shm/vllm_offload_{hugetlb_pool.link_name(os.path.realpath(mount))}"


def _run(tree: Path, mount: Path) -> dict:
    engine = f"test-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, **{V.ENV_POOL_HUGEPAGES_DIR: str(mount)})
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          'mount -t hugetlbfs -o pagesize=2M nodev "$0" && exec "$1" -c "$2" "$3" creator "$4" "$2"',
                          str(mount), sys.executable, WORKER, str(tree), engine],
                         capture_output=True, text=True, timeout=300, env=env, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    out["engine"], out["mount"] = engine, str(mount)
    return out


@pytest.mark.parametrize("huge_pages", [POOL_PAGES + 8], indirect=True)
@pytest.mark.parametrize("release", RELEASES)
def test_vllms_region_lives_on_huge_pages_shared_by_two_workers(release, huge_pages, tmp_path):
    mount = tmp_path / "hugepages"
    mount.mkdir()
    link = _link(mount)
    try:
        out = _run(_tree(release), mount)
        # vLLM's own path, through the link, onto the mount: one file (no segments), named as the sweep knows it
        assert out["path"] == f"{link}/vllm_offload_{out['engine']}.mmap"
        assert out["real"] == f"{out['mount']}/vllm_offload_{out['engine']}.mmap"
        assert out["segments"] == 1 and out["joiner"]["segments"] == 1
        assert out["files"] == [f"vllm_offload_{out['engine']}.mmap"]
        # each worker faulted its own slots' pages, 16 of the 32; together the whole pool
        assert out["faulted"] == POOL_PAGES // 2 and out["after_both"] == POOL_PAGES
        assert out["read_other"] and out["joiner"]["read_other"]
        assert any("is on 2 MiB huge pages" in line for line in out["log"]), out["log"]
        assert any("pre-faulted the CPU offload region" in line and "2 MiB pages" in line for line in out["log"])
        # the creator unlinked the file at cleanup (through the link): every page is back
        assert out["files_after"] == [] and out["after_cleanup"] == 0
    finally:
        if os.path.islink(link):
            os.unlink(link)


SHORT = r"""
import importlib.util, json, os, sys
tree = sys.argv[1]
loader = importlib.util.spec_from_file_location("region_under_test", tree + "/vllm/v1/kv_offload/cpu/shared_offload_region.py")
module = importlib.util.module_from_spec(loader)
sys.modules["region_under_test"] = module
loader.loader.exec_module(module)
import logging
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
logging.getLogger("spillway_connector").addHandler(Keep())
logging.getLogger("spillway_connector").setLevel(logging.INFO)
from spillway_connector import spec
region = spec.shared_region(threads=2, region_cls=module.SharedOffloadRegion, engine_id=sys.argv[2], num_chunks=16,
                            rank=None, kv_bytes_per_chunk=4 << 20, cpu_page_size=4 << 20)
out = {"path": region.mmap_path, "on_shm": os.path.exists(region.mmap_path), "log": records,
       "files": os.listdir(os.environ["SPILLWAY_POOL_HUGEPAGES_DIR"])}
region.cleanup()
print(json.dumps(out))
"""


@pytest.mark.parametrize("huge_pages", [4], indirect=True)
@pytest.mark.parametrize("release", RELEASES)
def test_short_huge_pages_leave_the_pool_on_4k_pages_with_one_line(release, huge_pages, tmp_path):
    mount = tmp_path / "hugepages"
    mount.mkdir()
    engine = f"test-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, **{V.ENV_POOL_HUGEPAGES_DIR: str(mount)})
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          'mount -t hugetlbfs -o pagesize=2M nodev "$0" && exec "$1" -c "$2" "$3" "$4"',
                          str(mount), sys.executable, SHORT, str(_tree(release)), engine],
                         capture_output=True, text=True, timeout=300, env=env, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["path"] == f"/dev/shm/vllm_offload_{engine}.mmap" and out["on_shm"] and out["files"] == []
    warnings = [line for level, line in out["log"] if level == "WARNING"]
    assert len(warnings) == 1 and "on 4 KiB pages in /dev/shm, not 2 MiB huge pages" in warnings[0]
    assert f"the pool needs {POOL_PAGES}" in warnings[0], warnings
    assert any("4 KiB pages) in" in line for _, line in out["log"])


def test_a_directory_that_is_not_hugetlbfs_leaves_the_pool_to_vllm(tmp_path, monkeypatch, caplog):
    """No root needed: the plan's directory is an ordinary one (a misconfigured volume)."""
    module = _region_module("0.34.0")
    monkeypatch.setenv(V.ENV_POOL_HUGEPAGES_DIR, str(tmp_path))
    with caplog.at_level(logging.INFO, logger="spillway_connector"):
        region = spec.shared_region(threads=2, region_cls=module.SharedOffloadRegion,
                                    engine_id=f"test-{uuid.uuid4().hex[:8]}", num_chunks=4, rank=None,
                                    kv_bytes_per_chunk=2 * MiB, cpu_page_size=2 * MiB)
    try:
        assert region.mmap_path.startswith("/dev/shm/vllm_offload_test-")
    finally:
        region.cleanup()
    line, = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{tmp_path} is not a hugetlbfs directory" in line
    assert module.check_shm_free_space.__module__ != hugetlb_pool.__name__  # vLLM's check is back


def test_the_connectors_env_name_is_the_planners():
    assert hugetlb_pool.POOL_HUGEPAGES_DIR_ENV == V.ENV_POOL_HUGEPAGES_DIR


def _region_module(release: str):
    import importlib.util

    name = f"region_{release.replace('.', '_')}_hugetlb"
    if name not in sys.modules:
        loader = importlib.util.spec_from_file_location(
            name, _tree(release) / "vllm/v1/kv_offload/cpu/shared_offload_region.py")
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.parametrize("release", RELEASES)
def test_both_releases_read_as_verified(release):
    from spillway_connector import source_guard

    module = _region_module(release)
    assert not source_guard.differences(hugetlb_pool.hugetlbfs_functions(module.SharedOffloadRegion),
                                        hugetlb_pool.HUGETLBFS_CODE)
    assert hasattr(module, "check_shm_free_space")  # the name swapped while the region is built


def test_a_region_whose_code_differs_stays_on_4k_pages(tmp_path, monkeypatch, caplog):
    from spillway_connector import source_guard

    module = _region_module("0.34.0")
    monkeypatch.setattr(source_guard, "_refused", set())
    monkeypatch.setattr(hugetlb_pool, "HUGETLBFS_CODE", dict(hugetlb_pool.HUGETLBFS_CODE, **{
        "SharedOffloadRegion._unlink": frozenset({"another release"})}))
    monkeypatch.setenv(V.ENV_POOL_HUGEPAGES_DIR, str(tmp_path))
    with caplog.at_level(logging.INFO, logger="spillway_connector"):
        placed, line = hugetlb_pool.placement({"engine_id": "e", "num_chunks": 4, "kv_bytes_per_chunk": 2 * MiB},
                                              module.SharedOffloadRegion)
    assert placed is None and "vLLM's region code is not the code this was verified on" in line
    assert any("SharedOffloadRegion._unlink" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("huge_pages", [POOL_PAGES + 8], indirect=True)
def test_the_kubelets_root_owned_mount_needs_the_pods_group(huge_pages):
    """The kubelet mounts the hugepages emptyDir as root's, mode 0755; vLLM runs as the image's user. Without the
    pod's fsGroup the pool stays on 4 KiB pages, said; with the group (what fsGroup does: the mount's group, g+rwx,
    and the group added to the process) it is on huge pages."""
    if shutil.which("setpriv") is None:
        skip_or_fail("needs setpriv (util-linux)")
    user = str(65532)  # names.VLLM_IMAGE_UID: the image's user and the pod's fsGroup
    # pytest's tmp_path is root's alone (0700): the mount goes where the user can walk
    holder = Path(os.path.realpath(tempfile.gettempdir())) / f"spillway-hugetlbfs-{uuid.uuid4().hex[:8]}"
    holder.mkdir(mode=0o755)
    mount = holder / "pages"
    mount.mkdir()
    tree = str(_tree("0.34.0"))
    as_user = f'setpriv --reuid {user} --regid {user} --clear-groups "$1" -c "$2" "$3" "$4"'
    as_group = f'setpriv --reuid {user} --regid {user} --groups {user} "$1" -c "$2" "$3" "$5"'
    script = (f'mount -t hugetlbfs -o pagesize=2M nodev "$0" && {as_user} && chgrp {user} "$0" && chmod 2775 "$0" '
              f'&& {as_group}')
    env = dict(os.environ, HOME=str(holder), **{V.ENV_POOL_HUGEPAGES_DIR: str(mount)})
    try:
        run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(mount),
                              sys.executable, SHORT, tree, f"test-{uuid.uuid4().hex[:8]}",
                              f"test-{uuid.uuid4().hex[:8]}"],
                             capture_output=True, text=True, timeout=300, env=env, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        without, with_group = (json.loads(line) for line in run.stdout.strip().splitlines()[-2:])
        assert without["path"].startswith("/dev/shm/vllm_offload_test-") and without["on_shm"]
        warning, = [line for level, line in without["log"] if level == "WARNING"]
        assert f"{mount} is not writable by uid {user} (owner 0:0, mode 755" in warning
        assert with_group["path"].startswith(_link(mount))
        assert any("is on 2 MiB huge pages" in line for _, line in with_group["log"])
    finally:
        if os.path.islink(_link(mount)):
            os.unlink(_link(mount))
        shutil.rmtree(holder, ignore_errors=True)


def test_the_tiering_specs_region_never_goes_to_huge_pages(monkeypatch, caplog):
    """vLLM's tiering spec maps the pool in the engine core too, at its own /dev/shm path, which the connector does
    not build: a worker's region placed on the hugetlbfs mount would be another file than the disk tier reads and
    writes. tiering_region keeps it in /dev/shm, and says so where the plan asked for huge pages."""
    from types import SimpleNamespace

    module = _region_module("0.34.0")
    monkeypatch.setattr(spec, "SharedOffloadRegion", module.SharedOffloadRegion)
    monkeypatch.setenv(V.ENV_POOL_HUGEPAGES_DIR, "/dev/hugepages-never-read")
    monkeypatch.setattr(hugetlb_pool, "placement", lambda *_: pytest.fail("a tiering region was placed"))
    tiering = SimpleNamespace(replicated_layout=False, config=SimpleNamespace(parallel=SimpleNamespace(rank=0)),
                              _engine_id=f"test-{uuid.uuid4().hex[:8]}", num_chunks=4, kv_bytes_per_chunk=2 * MiB,
                              cpu_page_size_per_worker=2 * MiB)
    with caplog.at_level(logging.INFO, logger="spillway_connector"):
        region = spec.tiering_region(tiering)
    try:
        assert region.mmap_path == f"/dev/shm/vllm_offload_{tiering._engine_id}.mmap"
    finally:
        region.cleanup()
    assert any("vLLM's tiering spec maps the pool in the engine core" in r.getMessage() for r in caplog.records)
