"""Read samples out of a Prometheus text exposition (vLLM's /metrics)."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample called `name` whose labels include `labels`."""
    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                found.append((sample.labels, sample.value))
    return found


def total(text: str, name: str, **labels: str) -> float:
    """Sum of the matching samples; 0 when there are none."""
    return sum(value for _, value in samples(text, name, **labels))
