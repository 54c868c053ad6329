"""PromQL building blocks shared by the recording rules, the alerts and the dashboards.

vLLM and the connector create their metrics with prometheus_client, which appends
`_total` to counters and `_bucket`/`_sum`/`_count` to histograms; names.py files hold
the bare names, these helpers add the suffixes.
"""
from __future__ import annotations

# Labels every vLLM series carries once Prometheus scraped it from a pod (the Kubernetes
# scrape config / PodMonitor adds namespace and pod; vLLM adds model_name and engine).
NAMESPACE = "namespace"
POD = "pod"
MODEL = "model_name"
NODE = "node"
CONTAINER = "container"
# Label the recorded transfer series carry to tell the two copy directions apart.
DIRECTION = "direction"
LOAD = "cpu_to_gpu"  # reload of offloaded KV into GPU memory
STORE = "gpu_to_cpu"  # offload of KV from GPU memory into the CPU pool

POD_KEY = (NAMESPACE, POD, MODEL)

# Every recorded rate/ratio covers this window. Four scrapes at a 1m scrape interval or
# more at shorter ones; the dashboards read the recorded series, so they cost one lookup.
WINDOW = "5m"


def counter(name: str) -> str:
    return f"{name}_total"


def bucket(name: str) -> str:
    return f"{name}_bucket"


def by(*labels: str) -> str:
    return f"by ({', '.join(labels)})"


BY_POD = by(*POD_KEY)


def selector(metric: str, *matchers: str) -> str:
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric


def eq(label: str, value: str) -> str:
    return f'{label}="{value}"'


def one_of(label: str, *values: str) -> str:
    return f'{label}=~"{"|".join(values)}"'


def rate_sum(metric: str, group: str = BY_POD, window: str = WINDOW) -> str:
    """Per-second rate of a counter, summed over engines and label values per pod."""
    return f"sum {group} (rate({metric}[{window}]))"


def quantile(q: float, histogram: str, labels: tuple[str, ...] = POD_KEY, window: str = WINDOW) -> str:
    """The q-quantile of a histogram (its bare name) over the window, per label set."""
    return f"histogram_quantile({q}, sum {by(*labels, 'le')} (rate({bucket(histogram)}[{window}])))"
