"""Shared test setup: tests/ is on sys.path, so `support` (harnesses, tools) imports from any test directory."""
from __future__ import annotations

import pytest

pytest_plugins = ["support.operator_fixtures"]

# The files that cost most (a minute or more each on two cores: --durations of `make test-fast`), run first.
# The Makefile's workers (pytest-xdist, --dist loadfile) take files in collection order: collected last, these
# would start when the short files are done and leave the other workers idle while one of them runs. A file
# missing from this list only runs later; one gone from the tree is ignored.
LONGEST_FIRST = (
    "tests/images/test_operator_image.py",
    "tests/chart/test_operator_rbac.py",
    "tests/connector/test_vllm_sources.py",
    "tests/reliability/test_fuzz_operator.py",
    "tests/reliability/test_node_burst.py",
    "tests/routing/test_router_endpoint.py",
    "tests/reliability/test_cli_hostile.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath
    # sorted() is stable: within a file, and among the files not listed, the collection order stays.
    items[:] = sorted(items, key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))
