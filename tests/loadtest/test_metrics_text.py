"""The load test's reading of /metrics against text that prometheus_client's own exposition writes: counters with
their _total and _created series, histograms, escaped label values, an info metric, and a scrape with a bad line."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from spillway.core.vllm_api import Metric
from spillway.loadtest.metrics import CacheFacts, Snapshot, counter_deltas, parse

ODD = 'a "quoted" C:\\path\nsecond line'


def exposition(prompt_tokens: float, hits: float) -> str:
    registry = CollectorRegistry()
    prompts = Counter("prompt_tokens", "prompt tokens",
                      ["model_name"], registry=registry)
    prompts.labels(ODD).inc(prompt_tokens)
    prompts.labels("other").inc(1)
    Counter("external_hits", "hits", registry=registry).inc(hits)
    Histogram("ttft_seconds", "ttft", registry=registry, buckets=(0.1, 1.0)).observe(0.25)
    Gauge("cache_config_info", "info", ["num_gpu_blocks", "block_size", "enable_prefix_caching"],
          registry=registry).labels("1000", "16", "False").set(1)
    # vLLM's names carry a colon, which the client library's writer does not take: put it back in the text
    text = generate_latest(registry).decode()
    return (text.replace("prompt_tokens", Metric.PROMPT_TOKENS).replace("external_hits", Metric.EXTERNAL_HITS)
            .replace("cache_config_info", Metric.CACHE_CONFIG_INFO))


def test_counters_histograms_and_escaped_labels_are_read():
    samples = parse(exposition(100, 40))
    prompts = [s for s in samples if s.name == f"{Metric.PROMPT_TOKENS}_total"]
    assert {s.labels["model_name"]: s.value for s in prompts} == {ODD: 100.0, "other": 1.0}
    assert {s.name for s in samples} >= {"ttft_seconds_bucket", "ttft_seconds_sum", "ttft_seconds_count"}
    snapshot = Snapshot(samples)
    assert snapshot.counter(Metric.PROMPT_TOKENS) == 101.0
    assert snapshot.counter(Metric.PROMPT_TOKENS, model_name=ODD) == 100.0
    facts = CacheFacts.from_snapshot(snapshot)
    assert (facts.num_gpu_blocks, facts.block_size, facts.prefix_caching, facts.gpu_tokens) == (1000, 16, False, 16000)


def test_deltas_between_two_scrapes():
    before, after = Snapshot.from_text(exposition(100, 40)), Snapshot.from_text(exposition(350, 90))
    deltas = counter_deltas(before, after)
    assert deltas[Metric.PROMPT_TOKENS] == 250.0 and deltas[Metric.EXTERNAL_HITS] == 50.0


def test_a_bad_line_costs_that_line_only():
    text = exposition(100, 40)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{Metric.EXTERNAL_HITS}_total"))
    broken = "\n".join([*lines[:at], 'vllm:garbage{unclosed="x 1', *lines[at:]]) + "\n"
    snapshot = Snapshot.from_text(broken)
    assert snapshot.counter(Metric.EXTERNAL_HITS) == 40.0 and snapshot.counter(Metric.PROMPT_TOKENS) == 101.0
    assert not any(s.name.startswith("vllm:garbage") for s in snapshot.samples)
