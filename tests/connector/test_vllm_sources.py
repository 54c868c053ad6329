"""The plugin's unit tests again, against other vLLM versions' sources (0.26 on the GPU, 0.33 and 0.34 in the image).

Set SPILLWAY_VLLM_TREES to directories that each hold a `vllm/` package of a supported version (its pure
Python offloading classes are what these tests exercise; the engine itself is not started), separated by
os.pathsep (make test sets it to make vllm-src's trees). Without it the test skips locally and fails under CI.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.tools import skip_or_fail
from support.vllm_trees import vllm_trees

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
UNIT_MODULES = ["test_host_backend.py", "test_probes.py", "test_prom_metrics.py", "test_hit_sources.py", "test_source_guard.py",
                "test_batched_release.py", "test_fs_tier.py", "test_kv_event_order_releases.py", "test_async_loads.py"]
TREES = [str(tree) for tree in vllm_trees()]


@pytest.mark.parametrize("tree", TREES or [None])
def test_unit_tests_pass_on_other_vllm_sources(tree):
    if tree is None:
        skip_or_fail("SPILLWAY_VLLM_TREES names no other vLLM sources (make test sets it)")
    assert (Path(tree) / "vllm" / "__init__.py").is_file(), f"{tree} holds no vllm package"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, str(REPO / "connector"), str(REPO / "operator")]))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO)]
    result = subprocess.run(command + [str(HERE / m) for m in UNIT_MODULES], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        # The release, for the message only: asked of vLLM only on a failure, an import of vLLM costs ~10 s.
        version = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"], env=env,
                                 capture_output=True, text=True, timeout=300, check=False).stdout.strip()
        pytest.fail(f"vLLM {version} at {tree}:\n{result.stdout[-4000:]}")
