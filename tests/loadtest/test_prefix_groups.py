"""`spillway loadtest prefix-groups` without an engine: the measured result of the routing test (a real run,
bench/routing/results/prefix-groups.json) through the report and the plot, per-replica figures from /metrics
text, and the bad inputs the command refuses. The end-to-end run is tests/routing."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from spillway.core.errors import InvalidSpec
from spillway.loadtest import prefix_groups as pg
from spillway.loadtest.metrics import Snapshot

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "bench" / "routing" / "results" / "prefix-groups.json"


def spillway(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", pg.EXPERIMENT, *args],
                          capture_output=True, text=True, check=False)


def test_report_and_plot_of_a_measured_run(tmp_path):
    done = spillway("report", str(MEASURED), "--plot", str(tmp_path / "pg.png"))
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip().startswith(("round", "kv"))}
    assert set(rows) == {"round_robin", "kv_aware"}
    assert "48.1%" in rows["round_robin"] and "92.3%" in rows["kv_aware"]
    assert (tmp_path / "pg.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replica_figures_come_from_the_counters():
    before = Snapshot.from_text('vllm:external_prefix_cache_hits_total{engine="0"} 100\n'
                                'vllm:prefix_cache_hits_total{engine="0"} 0\n'
                                'vllm:prompt_tokens_total{engine="0"} 1000\n'
                                'vllm:request_success_total{finished_reason="length"} 5\n')
    after = Snapshot.from_text('vllm:external_prefix_cache_hits_total{engine="0"} 400\n'
                               'vllm:prefix_cache_hits_total{engine="0"} 50\n'
                               'vllm:prompt_tokens_total{engine="0"} 1500\n'
                               'vllm:request_success_total{finished_reason="length"} 8\n'
                               'vllm:request_success_total{finished_reason="stop"} 1\n')
    one = pg.replica_figures("http://a", before, after)
    assert one["cpu_hit_rate"] == 300 / 500 and one["gpu_hit_rate"] == 50 / 500 and one["requests"] == 4
    other = {**one, "url": "http://b", "requests": 2, "prompt_tokens": 500, "cpu_hit_tokens": 0, "gpu_hit_tokens": 0}
    assert pg.totals([one, other]) == {"cpu_hit_rate": 0.3, "gpu_hit_rate": 0.05, "request_balance": 0.5,
                                       "max_share": 4 * 2 / 6}


def test_router_counters_are_recorded_as_deltas():
    before = Snapshot.from_text('vllm_router_kv_placement_lookups_total{result="hit"} 2\n'
                                'vllm_router_requests_total 5\nother 1\n')
    after = Snapshot.from_text('vllm_router_kv_placement_lookups_total{result="hit"} 9\n'
                               'vllm_router_requests_total 5\nother 7\n')
    assert pg.router_deltas(before, after) == {"vllm_router_kv_placement_lookups_total{result=hit}": 7.0}


@pytest.mark.parametrize(("args", "message"), [
    (["--route", "kv_aware"], "NAME=http"),
    (["--route", "a=http://x", "--route", "a=http://y"], "twice"),
    (["--route", "a=http://x", "--router-metrics", "b=http://m"], "names no --route"),
    (["--route", "a=http://x", "--groups", "0"], "groups must be"),
])
def test_bad_input_is_one_line(args, message):
    done = spillway("run", "--replica", "http://127.0.0.1:9", *args, "--no-plot", "-o", "/dev/null")
    assert done.returncode == 2, done.stderr
    line, = done.stderr.strip().splitlines()
    assert message in line


def test_a_result_of_another_experiment_is_refused(tmp_path):
    other = tmp_path / "x.json"
    other.write_text(json.dumps({"schema": "spillway.loadtest/v1"}))
    with pytest.raises(InvalidSpec, match="not a prefix-groups result"):
        pg.COMMAND.load(other)
