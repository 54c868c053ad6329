"""Every replacement of vLLM code runs only over the exact code it was verified against (source_guard.py).

On every supported vLLM with the code (the installed 0.32 and, through test_vllm_sources.py, the 0.33 and 0.34
trees) the batched pin and release and the one-pass hit sources are on; a function whose code differs by one
token turns its replacement off with one warning, while comments, blank lines and docstrings do not count.
"""
from __future__ import annotations

import importlib.util
import logging

import pytest
from support import require_vllm

require_vllm(allow_module_level=True)

from spillway_connector import compat, source_guard
from spillway_connector.batched_pin import batched_prepare_load
from spillway_connector.batched_release import batched_complete_load

ORIGINAL = '''
def reserved(self) -> int:
    """Blocks still needed."""
    return sum(self.remaining(req) for req in self.inflight)
'''


def _function(tmp_path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reserved


def test_comments_blank_lines_and_docstrings_do_not_count_but_code_does(tmp_path):
    original = source_guard.fingerprint(_function(tmp_path, "original", ORIGINAL))
    assert original is not None
    reworded = ORIGINAL.replace('"""Blocks still needed."""', '"""Other words."""\n    # a comment\n')
    assert source_guard.fingerprint(_function(tmp_path, "reworded", reworded)) == original
    for changed in (ORIGINAL.replace("self.inflight", "self.in_flight"), ORIGINAL.replace("sum(", "max(")):
        assert source_guard.fingerprint(_function(tmp_path, f"changed{hash(changed) & 0xffff}", changed)) != original


def test_a_function_without_source_has_no_fingerprint():
    assert source_guard.fingerprint(len) is None
    assert source_guard.differences({"len": len}, {"len": frozenset({"0"})}) == ["len"]
    assert source_guard.differences({}, {"gone": frozenset({"0"})}) == ["gone"]


@pytest.mark.skipif(not compat.lru_manager_functions(), reason="vLLM 0.26: another manager, vLLM's path only")
def test_this_vllm_reads_as_verified_and_the_replacements_are_on():
    assert not source_guard.differences(compat.lru_manager_functions(), compat.LRU_MANAGER_CODE)
    assert not source_guard.differences(compat.hit_sources_functions(), compat.HIT_SOURCES_CODE)
    assert compat.FAST_HIT_SOURCES
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    manager = CPUOffloadingManager(8, cache_policy="lru")
    assert batched_prepare_load(manager) is not None and batched_complete_load(manager) is not None


@pytest.mark.skipif(not compat.lru_manager_functions(), reason="vLLM 0.26: another manager, vLLM's path only")
def test_a_manager_whose_code_differs_keeps_vllms_path_and_says_so(monkeypatch, caplog):
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    changed = dict(compat.LRU_MANAGER_CODE, **{"LRUCachePolicy.mark_evictable": frozenset({"another release"})})
    monkeypatch.setattr(compat, "LRU_MANAGER_CODE", changed)
    monkeypatch.setattr(source_guard, "_refused", set())
    manager = CPUOffloadingManager(8, cache_policy="lru")
    with caplog.at_level(logging.WARNING, logger="spillway_connector"):
        assert batched_prepare_load(manager) is None and batched_complete_load(manager) is None
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "LRUCachePolicy.mark_evictable" in warnings[0] and "stock code runs" in warnings[0]


# Which replacement is on, by release: a new release that moves a function shows here first (the upgrade's one
# manual step is to read the moved function and either add its fingerprint or leave the replacement off).
ON_BY_RELEASE = {
    (0, 26): {"batched pin and release": False, "hit sources": False, "reservation memo": True,
              "pre-fault": False, "detokenizer window": True, "disk tier checksum": False, "huge pages": False},
    (0, 32): {"batched pin and release": True, "hit sources": True, "reservation memo": True,
              "pre-fault": False, "detokenizer window": True, "disk tier checksum": True, "huge pages": False},
    (0, 33): {"batched pin and release": True, "hit sources": True, "reservation memo": True,
              "pre-fault": True, "detokenizer window": True, "disk tier checksum": True, "huge pages": True},
    (0, 34): {"batched pin and release": True, "hit sources": True, "reservation memo": False,
              "pre-fault": True, "detokenizer window": True, "disk tier checksum": True, "huge pages": True},
}


def _on() -> dict[str, bool]:
    from spillway_connector import disk_tier, hugetlb_pool, plugin, scheduler, spec
    from vllm.v1.engine import detokenizer

    def clean(functions, known) -> bool:
        return bool(functions) and not source_guard.differences(functions, known)

    worker = {}
    if compat.TieringOffloadingSpec is not None:
        worker["TieringOffloadingSpec.create_worker"] = vars(compat.TieringOffloadingSpec).get("create_worker")
    return {
        "batched pin and release": clean(compat.lru_manager_functions(), compat.LRU_MANAGER_CODE),
        "hit sources": compat.CacheHitSource is not None and clean(compat.hit_sources_functions(),
                                                                   compat.HIT_SOURCES_CODE),
        "reservation memo": clean(scheduler.reservation_functions(), scheduler.RESERVATION_CODE),
        "pre-fault": clean(spec.region_functions(), spec.REGION_CODE)
        and clean({"CPUOffloadingSpec.create_worker": vars(compat.CPUOffloadingSpec).get("create_worker")},
                  spec.CPU_WORKER_CODE)
        and clean(worker, spec.TIERING_WORKER_CODE),
        "detokenizer window": clean({"FastIncrementalDetokenizer.__init__":
                                     detokenizer.FastIncrementalDetokenizer.__init__}, plugin.DETOKENIZER_CODE),
        "disk tier checksum": clean(disk_tier.fs_tier_functions(), disk_tier.FS_TIER_CODE),
        # the pool's file on hugetlbfs (hugetlb_pool.py) rides on the pre-fault's region path
        "huge pages": compat.SharedOffloadRegion is not None and clean(
            hugetlb_pool.hugetlbfs_functions(compat.SharedOffloadRegion), hugetlb_pool.HUGETLBFS_CODE),
    }


def test_each_replacement_is_on_exactly_where_it_was_verified():
    expected = ON_BY_RELEASE.get(compat.VLLM_MINOR)
    assert expected is not None, f"vLLM {compat.VLLM_VERSION}: no row in ON_BY_RELEASE yet; it reads {_on()}"
    assert _on() == expected, f"vLLM {compat.VLLM_VERSION}"


def _other_pythons() -> list[str]:
    """Interpreters of other Python minors on this machine: vLLM's GPU image runs 3.12 where the tests run 3.11."""
    import glob
    import shutil
    import sys

    found = {shutil.which(f"python3.{minor}") for minor in range(12, 15)}
    found |= set(glob.glob("/root/.pyenv/versions/3.1[2-4].*/bin/python"))
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    # pyenv's shims answer 127 for a version the environment has not selected: only real interpreters count.
    return sorted(p for p in found if p and "/shims/" not in p and mine not in p)


def test_a_fingerprint_reads_the_same_on_every_python(tmp_path):
    """ast.dump's text differs between Python minors (3.12 adds type_params to each def), which once turned
    every replacement off in the GPU image; the fingerprint is the same on each interpreter at hand."""
    import subprocess

    others = _other_pythons()
    if not others:
        pytest.skip("no other Python minor on this machine to compare with")
    (tmp_path / "probe.py").write_text(ORIGINAL)
    script = ("import importlib.util, sys\n"
              "def load(name, path):\n"
              "    spec = importlib.util.spec_from_file_location(name, path)\n"
              "    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); return module\n"
              "guard = load('guard', sys.argv[1]); probe = load('probe', sys.argv[2])\n"
              "print(guard.fingerprint(probe.reserved))\n")
    here = source_guard.fingerprint(_function(tmp_path, "here", ORIGINAL))
    for python in others:
        out = subprocess.run([python, "-I", "-c", script, source_guard.__file__, str(tmp_path / "probe.py")],
                             capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        assert out == here, (python, out, here)
