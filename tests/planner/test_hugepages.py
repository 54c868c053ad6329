"""Where the pool's pages come from: the node's hugepages-2Mi where they hold the pool on a release whose region
Spillway's spec places on hugetlbfs (0.33, 0.34), else 4 KiB pages, and why."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from spillway.adapters.model_config import catalog_config
from spillway.core import footprint as fp
from spillway.core import k8s_names as names
from spillway.core import vllm_api as V
from spillway.core.errors import PoolDoesNotFit
from spillway.core.geometry import geometry_from_config
from spillway.core.planner import ENGINE_START_SECONDS, SHM_EXTRA_BYTES, NodeFacts, OffloadRequest, ServingRequest, plan
from spillway.core.quantity import GiB, MiB
from support import hugepages

LLAMA = geometry_from_config(catalog_config("meta-llama/Llama-3.1-8B-Instruct"), "meta-llama/Llama-3.1-8B-Instruct")
BENCH_RESULTS = Path(__file__).resolve().parents[2] / "bench" / "pool-setup" / "results"
NODE = {"allocatable_memory": 512 * GiB, "gpus": 8, "name": "h200", "cpu_millis": 128_000}


def planned(hugepages: int | None, size: str = "32Gi", version: str = "0.34.0", connector: str = "spillway"):
    request = ServingRequest(offload=OffloadRequest(size=size, connector=connector), vllm_version=version)
    return plan(LLAMA, request, NodeFacts(**NODE, hugepages_2mi=hugepages))


def test_a_node_without_hugepages_keeps_the_parallel_prefault():
    p = planned(None)
    assert not p.pages.huge_pages and p.pages.hugepages_bytes == 0 and p.pages.share_bytes is None
    assert p.pages.why == "4 KiB pages: node h200's allocatable hugepages-2Mi is not known"
    assert "SPILLWAY_PREFAULT_THREADS" in p.env


def test_the_share_of_the_node_is_what_the_replica_may_take():
    # 8 replicas share 200 GiB of huge pages: 25 GiB each, under a 32 GiB pool
    p = planned(200 * GiB)
    assert p.pages.share_bytes == 25 * GiB
    assert not p.pages.huge_pages
    needed = -(-p.pool.bytes // (2 * MiB)) * 2 * MiB
    assert f"the pool needs {needed / GiB:.2f} GiB" in p.pages.why and "is 25.00 GiB" in p.pages.why


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_huge_pages_that_hold_the_pool_take_it_out_of_memory(version):
    p, plain = planned(8 * 40 * GiB, version=version), planned(None, version=version)
    assert p.pages.huge_pages and p.pages.share_bytes == 40 * GiB
    assert p.pages.why.startswith("2 MiB huge pages: 32.00 GiB of node h200's hugepages-2Mi (40.00 GiB per replica)")
    assert p.to_dict()["pages"]["why"] == p.pages.why
    # Llama's rows are whole 2 MiB pages already: the pool is the one planned without huge pages
    assert p.pool.bytes == plain.pool.bytes and p.pool.bytes % (2 * MiB) == 0
    assert p.pod.hugepages_bytes == p.pool.hugepages_bytes == p.pool.bytes
    # the pages are the hugetlb cgroup's: memory keeps page tables and the slack, /dev/shm the queues only
    assert p.pool.shm_pool_bytes == 0 and p.pod.shm_bytes == SHM_EXTRA_BYTES
    assert p.pool.footprint_bytes == p.pool.bytes * 8 // (2 * MiB) + fp.MMAP_POOL_OVERHEAD
    assert plain.pod.memory_limit_bytes - p.pod.memory_limit_bytes == pytest.approx(
        plain.pool.footprint_bytes - p.pool.footprint_bytes, abs=MiB)
    assert p.pod.memory_request_bytes == p.pod.memory_limit_bytes
    assert p.env[V.ENV_POOL_HUGEPAGES_DIR] == names.POOL_HUGEPAGES_MOUNT and V.ENV_POOL_HUGEPAGES_DIR not in plain.env
    assert p.env[V.ENV_PREFAULT_THREADS] == plain.env[V.ENV_PREFAULT_THREADS]  # the connector faults huge pages too
    assert p.pod.startup_seconds < plain.pod.startup_seconds  # huge pages set up faster: the allowance below


def test_the_startup_allowance_on_huge_pages_is_their_measured_setup_doubled():
    """A 64 GiB pool on huge pages was pre-faulted and registered in 3.0-3.2 s on the H200, against 7.2-10.2 s on 4
    KiB pages from 16 threads (bench/pool-setup/results/pool_setup.json, pool_setup-fresh-machine.json)."""
    per_gib = [case["total_s"] / case["gib"] for name in ("pool_setup.json", "pool_setup-fresh-machine.json")
               for case in json.loads((BENCH_RESULTS / name).read_text())["cases"] if case["case"] == "hugetlbfs"]
    huge, plain = planned(8 * 40 * GiB), planned(None)
    assert huge.pages.huge_pages and not plain.pages.huge_pages and huge.pool.bytes == 32 * GiB
    allowance = huge.pod.startup_seconds - ENGINE_START_SECONDS
    assert 2 * 32 * max(per_gib) <= allowance <= 2 * 32 * max(per_gib) + 1, (allowance, per_gib)
    assert allowance < plain.pod.startup_seconds - ENGINE_START_SECONDS
    # and in real vLLM 0.34 engines (H100), vLLM's file to registered, pre-fault and registration both in it
    engines = [row["pool"] for row in json.loads((BENCH_RESULTS / "hugepages34-phases.json").read_text())["starts"]
               if row["pool"]["pages"] == "2 MiB"]
    assert len(engines) >= 3 and max(pool["created_to_registered_s"] / 64 for pool in engines) * 32 <= allowance


def test_the_native_connector_keeps_vllms_own_region():
    p = planned(8 * 40 * GiB, connector="native")
    assert not p.pages.huge_pages and p.pod == planned(None, connector="native").pod
    assert p.pages.why.endswith("but vLLM 0.34 creates its own region in /dev/shm with the native connector "
                                "(Spillway's connector puts it on the hugepages volume)")


def test_a_disk_tier_keeps_the_pool_on_4k_pages():
    """vLLM's tiering spec maps the pool in the engine core at its own /dev/shm path: a worker's region on the
    hugetlbfs mount would be another file, and the disk tier would read and write bytes the workers never see."""
    from spillway.core import disk_tier as dt

    disk = dt.DiskTierRequest(enabled=True)
    request = ServingRequest(offload=OffloadRequest(size="32Gi", disk=disk), vllm_version="0.34.0")
    facts = {**NODE, "ephemeral_storage": 28 * 2**40}
    p = plan(LLAMA, request, NodeFacts(**facts, hugepages_2mi=8 * 40 * GiB))
    assert dt.active(p.disk) is not None and not p.pages.huge_pages, p.pages.why
    assert p.pages.why.endswith("but with the disk tier vLLM's engine core maps the pool at its own path in /dev/shm")
    assert V.ENV_POOL_HUGEPAGES_DIR not in p.env
    assert p.pod == plan(LLAMA, request, NodeFacts(**facts)).pod


def test_032_builds_its_own_region():
    p = planned(8 * 40 * GiB, version="0.32.0")
    assert not p.pages.huge_pages and "builds its region itself, in /dev/shm" in p.pages.why


def test_rows_round_down_to_whole_pages():
    # 3 MiB rows make whole 2 MiB pages every 2 rows: 5 rows -> 4
    pages = fp.pool_pages((0, 34), 5, 3 * MiB, 64 * GiB, 1, "n")
    assert pages.huge_pages and pages.chunks == 4 and pages.hugepages_bytes == 12 * MiB
    assert pages.why.endswith("1 of its 5 rows given up to make whole pages; memory holds only its page tables")
    # the share need hold only those whole pages, not the 15 MiB asked
    exact = fp.pool_pages((0, 34), 5, 3 * MiB, 12 * MiB, 1, "n")
    assert exact.huge_pages and exact.chunks == 4
    assert not fp.pool_pages((0, 34), 5, 3 * MiB, 10 * MiB, 1, "n").huge_pages
    # a row of 513 x 4 KiB makes whole pages only every 512 rows
    refused = fp.pool_pages((0, 34), 100, 513 * 4096, 64 * GiB, 1, "n")
    assert not refused.huge_pages and refused.why == ("4 KiB pages: a chunk row of 2101248 bytes makes whole 2 MiB "
                                                      "pages only every 512 rows, more than the pool's 100")
    assert fp.pool_pages((0, 34), 512, 513 * 4096, 64 * GiB, 1, "n").chunks == 512


def test_026_pins_tensors_no_file_backs():
    p = planned(8 * 40 * GiB, version="0.26.0")
    assert not p.pages.huge_pages and p.pages.why.endswith("but vLLM 0.26 pins torch tensors, which no file backs")


def test_share_rounds_down_to_whole_pages():
    pages = fp.pool_pages((0, 34), 3, MiB, 2 * 5 * MiB + 1, 2, "n")
    assert pages.share_bytes == 4 * MiB  # 5 MiB + a byte per replica holds two 2 MiB pages


TiB = 1024 * GiB


def auto(memory: int, hugepages: int | None, version: str = "0.34.0", **offload):
    request = ServingRequest(offload=OffloadRequest(**offload), vllm_version=version)
    return plan(LLAMA, request, NodeFacts(memory, 8, name="h200", hugepages_2mi=hugepages))


def test_auto_keeps_the_memory_pool_where_the_huge_page_share_holds_less():
    """2 TiB of memory beside 400 GiB of huge pages, 8 replicas: 50 GiB of them each, the memory share 227.73 GiB."""
    p, plain = auto(2 * TiB, 400 * GiB), auto(2 * TiB, None)
    assert not p.pages.huge_pages and p.pool == plain.pool and p.pod == plain.pod
    assert round(p.pool.gib, 2) == 227.73 and p.pages.share_bytes == 50 * GiB
    assert p.pages.why == ("4 KiB pages: auto sized the pool from the replica's memory share, 227.73 GiB; its "
                           "50.00 GiB of node h200's hugepages-2Mi hold less (50.00 GiB in whole pages of rows)")


def test_auto_fills_the_huge_page_share_where_it_holds_more_than_memory():
    """A node that reserved most of its memory as huge pages (allocatable memory excludes them): 400 GiB of memory
    and 1600 GiB of hugepages-2Mi, 8 replicas. The memory share alone held 32.41 GiB; the pages hold 200 GiB."""
    p, plain = auto(400 * GiB, 1600 * GiB), auto(400 * GiB, None)
    assert round(plain.pool.gib, 2) == 32.41
    assert p.pages.huge_pages and p.pool.bytes == p.pod.hugepages_bytes == p.pages.hugepages_bytes == 200 * GiB
    assert p.pool.chunks == p.pages.chunks == 200 * GiB // p.pool.chunk_bytes
    assert p.pool.tokens == 200 * GiB // (128 * 1024) and p.pool.requested == "auto"
    assert p.pages.why == ("2 MiB huge pages: auto sized the pool from node h200's hugepages-2Mi, 200.00 GiB of the "
                           "replica's 200.00 GiB, at least the 32.41 GiB its memory share holds; memory holds only "
                           "its page tables")
    # what the node holds for all its replicas: Guaranteed memory and huge pages, neither overcommitted
    assert p.node.replicas_per_node * p.pod.memory_limit_bytes <= 400 * GiB
    assert p.node.replicas_per_node * p.pod.hugepages_bytes <= 1600 * GiB
    assert p.pod.memory_limit_bytes >= p.pool.footprint_bytes + SHM_EXTRA_BYTES + p.pod.process_reserve_bytes
    assert p.pod.shm_bytes == SHM_EXTRA_BYTES and p.pod.memory_limit_bytes < plain.pod.memory_limit_bytes
    config = json.loads(p.args[p.args.index(V.FLAG_KV_TRANSFER_CONFIG) + 1])
    assert config["kv_connector_extra_config"][V.EXTRA_CPU_BYTES] == 200 * GiB
    assert p.env[V.ENV_POOL_HUGEPAGES_DIR] == names.POOL_HUGEPAGES_MOUNT


def test_a_size_is_not_grown_by_huge_pages():
    p, plain = auto(400 * GiB, 1600 * GiB, size="32Gi"), auto(400 * GiB, None, size="32Gi")
    assert p.pages.huge_pages and p.pool.bytes == plain.pool.bytes


def test_a_size_beyond_the_memory_share_goes_on_the_huge_pages_that_hold_it():
    """400 GiB of memory and 1600 GiB of hugepages-2Mi, 8 replicas: the memory share holds 32.41 GiB, the huge-page
    share 200 GiB. 200Gi asked is 200 GiB on huge pages, as auto plans it, not a refusal."""
    p = auto(400 * GiB, 1600 * GiB, size="200Gi")
    assert p.pages.huge_pages and p.pool.bytes == p.pod.hugepages_bytes == 200 * GiB and p.pool.requested == "200Gi"
    assert p.pages.why == ("2 MiB huge pages: 200.00 GiB of node h200's hugepages-2Mi (200.00 GiB per replica), more "
                           "than the 32.41 GiB its memory share holds; memory holds only its page tables")
    assert p.pod == auto(400 * GiB, 1600 * GiB).pod
    assert p.node.replicas_per_node * p.pod.memory_limit_bytes <= 400 * GiB
    assert p.pod.memory_limit_bytes >= p.pool.footprint_bytes + SHM_EXTRA_BYTES + p.pod.process_reserve_bytes
    # the largest pool the user sees is the larger of the two, each said on its own
    node = p.to_dict()["node"]
    assert node["max_pool_bytes"] == node["max_hugepage_pool_bytes"] == 200 * GiB
    assert round(node["max_memory_pool_bytes"] / GiB, 2) == 32.41
    # a size both hold keeps today's placement: on huge pages, as asked
    assert auto(400 * GiB, 1600 * GiB, size="16Gi").pool.hugepages_bytes == 16 * GiB


def test_a_size_neither_holds_is_refused_naming_both_limits():
    with pytest.raises(PoolDoesNotFit) as error:
        auto(400 * GiB, 1600 * GiB, size="500Gi")
    assert str(error.value).startswith("offload size 500Gi fits neither the memory nor the huge pages of one "
                                       "replica's share of node h200 (8 per node): in memory it costs ")
    assert str(error.value).endswith("the largest pool that fits is 32.41 GiB in memory and 200.0 GiB on its "
                                     "hugepages-2Mi (200.0 GiB per replica, whole 2 MiB pages of rows)")
    with pytest.raises(PoolDoesNotFit) as error:
        auto(400 * GiB, None, size="200Gi")
    assert str(error.value).endswith("the largest pool that fits is 32.41 GiB in memory and none on huge pages "
                                     "(node h200's allocatable hugepages-2Mi is not known)")


@pytest.mark.parametrize(("version", "offload", "reason"), [
    ("0.32.0", {}, "but vLLM 0.32 builds its region itself"), ("0.26.0", {}, "but vLLM 0.26 pins torch tensors"),
    ("0.34.0", {"connector": "native"}, "creates its own region in /dev/shm with the native connector")])
def test_a_size_beyond_memory_where_the_pool_cannot_be_on_huge_pages_is_refused(version, offload, reason):
    with pytest.raises(PoolDoesNotFit, match="the largest pool that fits is .* in memory and none on huge pages") \
            as error:
        auto(400 * GiB, 1600 * GiB, version, size="200Gi", **offload)
    assert reason in str(error.value)


def test_a_size_beyond_memory_with_a_disk_tier_is_refused_for_the_tier():
    from spillway.core import disk_tier as dt

    request = ServingRequest(offload=OffloadRequest(size="200Gi", disk=dt.DiskTierRequest(enabled=True)),
                             vllm_version="0.34.0")
    with pytest.raises(PoolDoesNotFit, match=r"in memory and none on huge pages \(.*but with the disk tier vLLM's "
                                             r"engine core maps the pool at its own path in /dev/shm\)"):
        plan(LLAMA, request, NodeFacts(400 * GiB, 8, "h200", ephemeral_storage=28 * TiB, hugepages_2mi=1600 * GiB))


def test_a_size_whose_page_tables_overflow_the_memory_share_is_not_on_huge_pages():
    """Whole pages of the asked rows fit the huge-page share, but their page tables do not fit the memory budget: no
    pod whose own pool would OOMKill it."""
    budget = fp.MMAP_POOL_OVERHEAD + 1000 * 8 * 2  # page tables of 1000 pages on 2 ranks
    fits = fp.place_pool((0, 34), 1000, 2 * MiB, 64 * TiB, 1, "n", budget, 2, size=("bytes", 1000 * 2 * MiB),
                         memory_max_chunks=10)
    assert fits.huge_pages and fits.chunks == 1000
    over = fp.place_pool((0, 34), 1001, 2 * MiB, 64 * TiB, 1, "n", budget, 2, size=("bytes", 1001 * 2 * MiB),
                         memory_max_chunks=10)
    assert not over.huge_pages and over.why.startswith("4 KiB pages: the page tables of 1.96 GiB on huge pages")


def test_a_fraction_is_of_each_share_and_one_is_auto():
    """A fraction f sizes two pools as auto does (auto is f = 1): the pod taking f of its memory share, and f of its
    hugepages-2Mi share in whole pages of rows; the huge one where it holds at least as many rows."""
    half = auto(400 * GiB, 1600 * GiB, size="0.5")
    assert half.pages.huge_pages and half.pool.bytes == half.pod.hugepages_bytes == 100 * GiB
    assert half.pages.why.startswith("2 MiB huge pages: offload size 0.5 sized the pool from node h200's "
                                     "hugepages-2Mi, 100.00 GiB of the replica's 200.00 GiB, at least the 8.71 GiB "
                                     "0.5 of its memory share holds")
    whole, full = auto(400 * GiB, 1600 * GiB, size="1.0"), auto(400 * GiB, 1600 * GiB)
    assert whole.pool.bytes == full.pool.bytes and whole.pod == full.pod
    # 0.1 of the memory share does not hold the process, 0.1 of the huge pages hold 20 GiB
    tenth = auto(400 * GiB, 1600 * GiB, size="0.1")
    assert tenth.pages.huge_pages and tenth.pool.bytes == 20 * GiB
    with pytest.raises(PoolDoesNotFit, match="the smallest fraction that fits is"):
        auto(400 * GiB, None, size="0.1")
    # where memory holds the larger pool, the fraction is the memory share's, as before
    memory, plain = auto(2 * TiB, 400 * GiB, size="0.5"), auto(2 * TiB, None, size="0.5")
    assert memory.pool.chunks == plain.pool.chunks and not memory.pages.huge_pages
    assert memory.pages.why.endswith("; 0.5 of its 50.00 GiB of node h200's hugepages-2Mi hold less (25.00 GiB in "
                                     "whole pages of rows)")


@pytest.mark.parametrize(("version", "offload", "reason"), [
    ("0.32.0", {}, "builds its region itself"), ("0.26.0", {}, "pins torch tensors"),
    ("0.34.0", {"connector": "native"}, "creates its own region in /dev/shm with the native connector")])
def test_auto_keeps_the_memory_pool_where_the_pool_cannot_be_on_huge_pages(version, offload, reason):
    p, plain = auto(400 * GiB, 1600 * GiB, version, **offload), auto(400 * GiB, None, version, **offload)
    assert not p.pages.huge_pages and p.pool == plain.pool and p.pod == plain.pod and reason in p.pages.why


def test_auto_with_a_disk_tier_keeps_the_memory_pool():
    from spillway.core import disk_tier as dt

    request = ServingRequest(offload=OffloadRequest(disk=dt.DiskTierRequest(enabled=True)), vllm_version="0.34.0")
    huge, plain = (plan(LLAMA, request, NodeFacts(400 * GiB, 8, "h200", ephemeral_storage=28 * TiB, hugepages_2mi=h))
                   for h in (1600 * GiB, None))
    assert dt.active(huge.disk) is not None and not huge.pages.huge_pages and huge.pool == plain.pool
    assert huge.pages.why.endswith("but with the disk tier vLLM's engine core maps the pool at its own path in /dev/shm")


def test_auto_pool_pages_at_the_boundary():
    """At least the memory pool's rows: an equal count goes on huge pages; one row short keeps the memory pool;
    rows of 3 MiB (whole pages every 2 rows) keep today's placement of the memory pool, a row given up."""
    big = 64 * GiB
    equal = fp.place_pool((0, 34), 10, 8 * MiB, 80 * MiB, 1, "n", big, 1)
    assert equal.huge_pages and equal.chunks == 10
    short = fp.place_pool((0, 34), 10, 8 * MiB, 78 * MiB, 1, "n", big, 1)
    assert not short.huge_pages and short.why == ("4 KiB pages: auto sized the pool from the replica's memory share, "
                                                  "0.08 GiB; its 0.08 GiB of node n's hugepages-2Mi hold less "
                                                  "(0.07 GiB in whole pages of rows)")
    odd = fp.place_pool((0, 34), 5, 3 * MiB, 16 * MiB, 1, "n", big, 1)
    assert odd == fp.pool_pages((0, 34), 5, 3 * MiB, 16 * MiB, 1, "n") and odd.huge_pages and odd.chunks == 4


def test_the_memory_budget_bounds_a_huge_pool_by_its_page_tables():
    """Huge pages take the pool out of memory, but not its page tables (8 bytes per 2 MiB page per rank) and slack:
    the pod's memory limit holds them, so they bound the pool too."""
    budget = fp.MMAP_POOL_OVERHEAD + 1000 * 8 * 2  # page tables of 1000 pages on 2 ranks
    pages = fp.place_pool((0, 34), 10, 2 * MiB, 64 * TiB, 1, "n", budget, 2)
    assert pages.huge_pages and pages.chunks == 1000
    assert fp.huge_page_footprint((0, 34), pages.hugepages_bytes, 2).charged_bytes <= budget
    assert fp.huge_page_footprint((0, 34), pages.hugepages_bytes + 2 * MiB, 2).charged_bytes > budget


def _trees() -> list[Path]:
    return [Path(t) for t in os.environ.get("SPILLWAY_VLLM_TREES", "").split(os.pathsep) if t]


@pytest.mark.parametrize("tree", _trees(), ids=lambda t: t.name)
def test_the_regions_path_and_free_space_check_are_still_vllms(tree):
    """The placement on hugetlbfs rests on vLLM creating the region at a fixed /dev/shm path with the engine id in
    it, after check_shm_free_space (spillway_connector/hugetlb_pool.py): a release that moves it (or drops the check)
    must be looked at again (its guard, HUGETLBFS_CODE, turns the placement off meanwhile)."""
    if tuple(map(int, tree.name.split(".")[:2])) < fp.CHUNKED_PINNING_SINCE:
        pytest.skip("0.26 pins torch tensors: its spec maps no region (footprint.py)")
    text = (tree / "vllm/v1/kv_offload/cpu/shared_offload_region.py").read_text()
    assert 'f"/dev/shm/vllm_offload_{engine_id}.mmap"' in text
    assert re.search(r"check_shm_free_space\(\s*self\.total_size_bytes", text)


REGION_ON_HUGETLBFS = """
import json, shutil
from multiprocessing import shared_memory
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
out = {"free": shutil.disk_usage("/dev/shm").free}
try:
    SharedOffloadRegion("hugepages-test", num_chunks=8, rank=None, kv_bytes_per_chunk=2 << 20,
                        cpu_page_size=2 << 20).cleanup()
    out["region"] = "created"
except Exception as exc:
    out["region"] = str(exc)
try:
    shared_memory.SharedMemory(create=True, size=1 << 16).unlink()
    out["small_file"] = "created"
except OSError as exc:
    out["small_file"] = exc.errno
print(json.dumps(out))
"""


@pytest.fixture
def eight_huge_pages():
    """8 more 2 MiB pages for the test (vm.nr_hugepages), the old count put back after."""
    with hugepages.reserved(8):
        yield


def test_vllms_region_on_a_kubelet_style_hugetlbfs_dev_shm():
    """Why the pool's hugetlbfs is a mount of its own, not /dev/shm: a Kubernetes hugepages emptyDir is hugetlbfs
    mounted with a page size and no size (the kubelet's setupHugepages); at /dev/shm vLLM's region refuses it, and
    small shared-memory files fail. Mounted at /dev/shm in a private mount namespace, so the machine's own
    /dev/shm is untouched."""
    pytest.importorskip("vllm.v1.kv_offload.cpu.shared_offload_region")
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          'mount -t hugetlbfs -o pagesize=2M nodev /dev/shm && exec "$0" -c "$1"',
                          sys.executable, REGION_ON_HUGETLBFS], capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["free"] == 0
    assert out["region"].startswith("Insufficient space in /dev/shm for CPU KV offload shared region")
    assert out["small_file"] == 22  # EINVAL: hugetlbfs takes whole huge pages only
