"""`spillway loadtest working-set`: which tier served each request, from vLLM's cached-by-source counters; bad
input as one line. (A real engine runs it in tests/connector/test_disk_tier_engine.py.)"""
from __future__ import annotations

import subprocess
import sys

import pytest
from spillway.core.errors import InvalidSpec
from spillway.loadtest.metrics import Snapshot, serving_tier
from spillway.loadtest.working_set import WorkingSetPlan, summarize


def scrape(host: float, disk: float, device: float = 0.0) -> Snapshot:
    lines = [f'vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="m",source="{source}"}} {value}'
             for source, value in (("host", host), ("disk", disk), ("device", device))]
    return Snapshot.from_text("\n".join(lines) + "\n")


def test_each_request_is_put_with_the_tier_that_served_it():
    assert serving_tier(scrape(0, 0), scrape(96, 0))[0] == "cpu"
    assert serving_tier(scrape(96, 0), scrape(96, 64))[0] == "disk"
    assert serving_tier(scrape(96, 64), scrape(128, 96))[0] == "disk"  # partly on disk: waited for the disk
    assert serving_tier(scrape(1, 1, 0), scrape(1, 1, 32))[0] == "gpu"
    assert serving_tier(scrape(1, 1), scrape(1, 1)) == ("miss", {"disk": 0, "host": 0, "device": 0})
    assert serving_tier(None, scrape(1, 1))[0] == "miss"


def test_the_summary_gives_ttft_and_prompt_throughput_per_tier():
    samples = [{"class": "disk", "ok": True, "ttft_s": 0.2, "latency_s": 0.25, "prompt_tokens": 1000,
                "cached_tokens": {"disk": 960}},
               {"class": "disk", "ok": True, "ttft_s": 0.4, "latency_s": 0.25, "prompt_tokens": 1000,
                "cached_tokens": {"disk": 960}},
               {"class": "miss", "ok": True, "ttft_s": 1.0, "latency_s": 1.0, "prompt_tokens": 1000,
                "cached_tokens": {}}]
    out = summarize(samples)
    assert out["disk"]["requests"] == 2 and out["disk"]["prompt_tokens_per_s"] == 4000
    assert out["disk"]["ttft_s"]["p99"] == 0.4 and out["disk"]["cached_tokens"] == 1920
    assert out["miss"]["prompt_tokens_per_s"] == 1000 and out["cpu"]["requests"] == 0
    assert WorkingSetPlan(prompts=5).validate().requests == 10


def test_bad_input_is_one_line():
    with pytest.raises(InvalidSpec, match="prompt length"):
        WorkingSetPlan(prompt_len=0).validate()
    done = subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", "working-set", "run", "--endpoint",
                           "http://127.0.0.1:9", "--requests", "0"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
