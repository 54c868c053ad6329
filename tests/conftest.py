"""Shared test setup: tests/ is on sys.path, so `support` (harnesses, tools) imports from any test directory."""
from __future__ import annotations

import pytest

pytest_plugins = ["support.operator_fixtures"]

# The files that cost most, longest first: each file's tests summed (setup included) in a full `make test` on a
# 2-core machine, 4 workers (junit times of 2026-12-06; the two fleet files of then are one now). The Makefile's
# workers (pytest-xdist, --dist loadfile) take files in collection order: collected last, as tests/routing's
# engines were, a long file starts when the short ones are done and leaves the other workers idle while it runs.
# A file missing from this list only runs later; one gone from the tree is ignored.
LONGEST_FIRST = (
    "tests/routing/test_fleet_engines.py",  # 844 s
    "tests/routing/test_fleet_warm.py",  # 380 s
    "tests/images/test_vllm_cpu_image.py",  # 303 s
    "tests/planner/test_groups_vllm.py",  # 202 s
    "tests/connector/test_disk_tier_engine.py",  # 188 s
    "tests/connector/test_hugetlb_pool.py",  # 178 s
    "tests/connector/test_short_hit_floor.py",  # 155 s
    "tests/loadtest/test_engine_runs.py",  # 146 s
    "tests/connector/test_scheduler_equivalence.py",  # 140 s
    "tests/reliability/test_fuzz_operator.py",  # 128 s
    "tests/images/test_operator_image.py",  # 128 s
    "tests/connector/test_vllm_sources.py",  # 108 s
    "tests/connector/test_hit_grain.py",  # 108 s
    "tests/chart/test_operator_rbac.py",  # 106 s
    "tests/loadtest/test_verify_engine.py",  # 102 s
    "tests/routing/test_router_endpoint.py",  # 98 s
    "tests/reliability/test_node_burst.py",  # 96 s
    "tests/connector/test_offload_server.py",  # 90 s
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath
    # sorted() is stable: within a file, and among the files not listed, the collection order stays.
    items[:] = sorted(items, key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))
