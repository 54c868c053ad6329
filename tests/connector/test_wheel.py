"""Stock vLLM plus one wheel: the spillway-connector wheel, installed over the CPU vLLM of .venv, runs the
connector, its offloading spec, its scheduler and its plugin in a real engine, from the wheel's files alone.

`make connector-wheel` builds the wheel; pip installs it into a folder of its own (`--target`), which comes first
on the engine's PYTHONPATH, so Python imports spillway_connector and reads its entry points from there, not from
the source tree. One engine: its log shows the plugin loaded from that folder with both replacements on, the spec's
pool probe with the batched pin and release on vLLM's own manager, and vLLM using Spillway's scheduler class;
/metrics shows the pool's capacity and the transfers of a prompt stored and reloaded, with the same output.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from spillway.core import vllm_api as V
from spillway_connector import names
from spillway_connector.host_backend import cpu_offload_args
from support import TinyLlama, VllmServer, require_vllm
from support.offload_workload import complete
from support.promtext import total

REPO = Path(__file__).resolve().parents[2]
BLOCK_TOKENS = 32
POOL_CHUNKS = 64
PROMPT_BLOCKS = 4


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    require_vllm()
    root = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(["make", "--no-print-directory", "connector-wheel", f"CONNECTOR_WHEEL_DIR={root / 'dist'}"],
                           cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    wheel, = (root / "dist").glob("spillway_connector-*-py3-none-any.whl")
    target = root / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "--no-deps", "--no-compile", "--target", str(target), str(wheel)],
                             capture_output=True, text=True, timeout=300, check=False)
    assert install.returncode == 0, install.stderr[-2000:]
    return target


def test_the_wheel_carries_the_package_and_its_plugin_entry_point(site):
    entry_points, = site.glob("spillway_connector-*.dist-info/entry_points.txt")
    assert entry_points.read_text().split() == ["[vllm.general_plugins]", "spillway", "=",
                                                "spillway_connector.plugin:register"]
    shipped = {path.name for path in (site / "spillway_connector").glob("*.py")}
    assert {"connector.py", "spec.py", "scheduler.py", "plugin.py", "source_guard.py"} <= shipped


@pytest.mark.engine
def test_a_stock_vllm_with_the_wheel_runs_every_seam(site):
    model = TinyLlama()
    pool_bytes = POOL_CHUNKS * model.kv_bytes_per_token * BLOCK_TOKENS
    env = {"PYTHONPATH": str(site)}
    server = VllmServer(model=model, block_size=BLOCK_TOKENS, num_gpu_blocks=4 * PROMPT_BLOCKS,
                        max_model_len=(PROMPT_BLOCKS + 1) * BLOCK_TOKENS, prefix_caching=False,
                        extra_args=cpu_offload_args(pool_bytes) + [V.FLAG_SCHEDULER_CLS, V.SCHEDULER_CLS], env=env)
    with server:
        prompt = server.token_ids(PROMPT_BLOCKS * BLOCK_TOKENS, seed=3)
        first = complete(server, prompt, 4)
        complete(server, server.token_ids(BLOCK_TOKENS, seed=4), 2)  # its steps report the first store done
        again = complete(server, prompt, 4)
        text = server.metrics_text()
        log = server.log_path.read_text(errors="replace")
    assert again == first
    loaded_from = str(site / "spillway_connector")
    assert (f"spillway_connector 0.1.0 plugin loaded from {loaded_from}: the detokenizer window, the request-body "
            "parse on") in log, server.log_tail(80)
    assert str(REPO / "connector" / "spillway_connector") not in log, "the source tree's package was loaded"
    assert ("HostOffloadingSpec's manager CPUOffloadingManager with the pool probe; batched pin on, release on"
            in log), server.log_tail(80)
    assert V.SCHEDULER_CLS in log, "vLLM did not name Spillway's scheduler class"
    assert total(text, names.POOL_CAPACITY_CHUNKS) == POOL_CHUNKS
    assert total(text, names.POOL_RESIDENT_CHUNKS) >= PROMPT_BLOCKS
    assert total(text, names.TRANSFER_THROUGHPUT + "_count", direction=names.DIRECTION_LOAD) > 0
    assert total(text, V.Metric.EXTERNAL_HITS + "_total") >= PROMPT_BLOCKS * BLOCK_TOKENS - BLOCK_TOKENS
