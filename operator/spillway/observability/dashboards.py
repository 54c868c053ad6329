"""Grafana dashboards, built with grafana-foundation-sdk and committed as JSON.

Each row opens with a text panel that says what the row answers; every panel has a
description. Queries read the recorded series (recording.py) where one exists, and
filter on the namespace / model / pod template variables.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, table, text, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as gcm
from grafana_foundation_sdk.models import dashboard as gm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat
from spillway_connector import names as connector

from spillway.vllm_api import Metric, OffloadConfigInfoLabel

from . import recording as rec
from .promql import DIRECTION, MODEL, NAMESPACE, POD, POD_KEY, by, counter, eq, selector

DATASOURCE_VAR = "datasource"
NAMESPACE_VAR, MODEL_VAR, POD_VAR = "namespace", "model", "pod"
# Grafana's own interval variable; raw counters not recorded use it.
RATE_INTERVAL = "$__rate_interval"
FILTER = (f'{NAMESPACE}=~"${NAMESPACE_VAR}"', f'{MODEL}=~"${MODEL_VAR}"', f'{POD}=~"${POD_VAR}"')
DATASOURCE = gm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")
# A series every vLLM pod exports from its start: the template variables list its labels.
VARIABLE_SOURCE = Metric.REQUESTS_RUNNING

# Metrics only newer vLLM releases export (the test skips queries of these on older ones).
MIN_VLLM = {Metric.OFFLOAD_CONFIG_INFO: (0, 33)}

TOKENS_PER_SECOND = "suffix: tok/s"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "table" (instant queries, one row per pod)


@dataclass(frozen=True)
class RowSpec:
    title: str
    description: str
    panels: tuple[PanelSpec, ...]


def f(metric: str, *matchers: str) -> str:
    """The metric restricted to the dashboard's namespace/model/pod selection."""
    return selector(metric, *matchers, *FILTER)


def _per_pod_rate(metric: str) -> str:
    return f"sum {by(*POD_KEY)} (rate({f(counter(metric))}[{RATE_INTERVAL}]))"


def _direction(record: str, direction: str) -> str:
    return f(record, eq(DIRECTION, direction))


def _dma_panel(direction: str, title: str, description: str) -> PanelSpec:
    return PanelSpec(
        title,
        description,
        "GBs",
        (
            Query(_direction(rec.DMA_GBPS_MEAN, direction), "{{pod}} mean"),
            Query(_direction(rec.DMA_GBPS_P50, direction), "{{pod}} p50"),
            Query(_direction(rec.DMA_GBPS_P99, direction), "{{pod}} p99"),
        ),
    )


def _pool_plan() -> PanelSpec:
    info_labels = (
        OffloadConfigInfoLabel.SIZE_TOKENS,
        OffloadConfigInfoLabel.SIZE_BYTES,
        OffloadConfigInfoLabel.NUM_CHUNKS,
        OffloadConfigInfoLabel.BLOCKS_PER_CHUNK,
    )
    return PanelSpec(
        "Pool plan",
        "What the pod's CPU pool holds: chunks (the connector's capacity gauge, one chunk = the KV of an "
        "offload block), and on vLLM 0.33+ the pool plan vLLM publishes in vllm:kv_offload_config_info: "
        "tokens it holds for requests of max_model_len, bytes, chunks and GPU blocks per chunk.",
        "none",
        (
            Query(f"max {by(*POD_KEY)} ({f(connector.POOL_CAPACITY_CHUNKS)})", "chunks"),
            Query(f"max {by(*POD_KEY, *info_labels)} ({f(Metric.OFFLOAD_CONFIG_INFO)})", "plan"),
        ),
        kind="table",
    )


def offload_rows() -> tuple[RowSpec, ...]:
    return (
        RowSpec(
            "Is offloading paying?",
            "How much of each prompt came back from the CPU pool instead of being recomputed, with time to "
            "first token and token throughput beside it. Offloading pays when the hit rate is high and TTFT "
            "stays low while prompt tokens from the pool make up a large share of prompt tokens.",
            (
                PanelSpec(
                    "CPU pool hit rate",
                    "Prompt tokens found in the CPU pool / prompt tokens looked up there "
                    "(vllm:external_prefix_cache_hits / _queries), per pod.",
                    "percentunit",
                    (Query(f(rec.HIT_RATIO), "{{pod}}"),),
                ),
                PanelSpec(
                    "Time to first token",
                    "Median and 99th percentile time to first token (vllm:time_to_first_token_seconds).",
                    "s",
                    (Query(f(rec.TTFT_P50), "{{pod}} p50"), Query(f(rec.TTFT_P99), "{{pod}} p99")),
                ),
                PanelSpec(
                    "Token throughput",
                    "Prompt tokens processed, tokens generated, and prompt tokens served from the CPU pool "
                    "(loaded instead of recomputed), per second.",
                    TOKENS_PER_SECOND,
                    (
                        Query(f(rec.PROMPT_TOKENS_RATE), "{{pod}} prompt"),
                        Query(f(rec.GENERATION_TOKENS_RATE), "{{pod}} generated"),
                        Query(f(rec.HIT_TOKENS_RATE), "{{pod}} prompt from CPU pool"),
                    ),
                ),
            ),
        ),
        RowSpec(
            "Preemption",
            "When GPU KV memory runs out, vLLM preempts running requests. With offloading, their KV waits in "
            "the CPU pool and is reloaded when they resume; without it they recompute their whole prefix. "
            "Reloads close to preemptions mean offloading absorbs them; preemptions without reloads mean it "
            "does not help (alert SpillwayPreemptionStormWithoutReloads).",
            (
                PanelSpec(
                    "Preemptions vs preemption reloads",
                    "Requests preempted per second (vllm:num_preemptions) and preempted requests that resumed "
                    "with KV loaded from the CPU pool (the connector's preempted_reload_requests).",
                    "reqps",
                    (
                        Query(f(rec.PREEMPTIONS_RATE), "{{pod}} preempted"),
                        Query(f(rec.PREEMPTED_RELOADS_RATE), "{{pod}} resumed from CPU pool"),
                    ),
                ),
                PanelSpec(
                    "Resumed requests: tokens reloaded",
                    "Tokens of resumed preempted requests loaded from the CPU pool instead of recomputed, per "
                    "second, and their share of the tokens those requests looked up.",
                    TOKENS_PER_SECOND,
                    (
                        Query(f(rec.PREEMPTED_RELOAD_TOKENS_RATE), "{{pod}} reloaded"),
                        Query(f(rec.PREEMPTED_QUERIED_TOKENS_RATE), "{{pod}} looked up"),
                    ),
                ),
                PanelSpec(
                    "GPU KV cache usage",
                    "Fraction of the GPU KV cache in use (vllm:kv_cache_usage_perc): near 1, vLLM preempts.",
                    "percentunit",
                    (Query(f"max {by(*POD_KEY)} ({f(Metric.GPU_CACHE_USAGE)})", "{{pod}}"),),
                ),
            ),
        ),
        RowSpec(
            "Offload traffic",
            "Bytes copied each way between GPU memory and the CPU pool, and how fast. Store (GPU->CPU) runs "
            "as computed KV is offloaded; load (CPU->GPU) runs when a prompt or a resumed request finds its KV "
            "in the pool. Mean = bytes / seconds spent copying (vLLM's counters); p50 and p99 are per-transfer "
            "throughput (the connector's histogram). Compare load throughput with the node's qualified figure "
            "(`spillway qualify`, alert SpillwayDMAThroughputLow).",
            (
                PanelSpec(
                    "Offload bytes/s",
                    "Bytes per second stored GPU->CPU (direction=store) and loaded CPU->GPU (direction=load) "
                    "(vllm:kv_offload_store_bytes / _load_bytes).",
                    "Bps",
                    (Query(f(rec.OFFLOAD_BYTES_RATE), "{{pod}} {{direction}}"),),
                ),
                _dma_panel(
                    rec.LOAD,
                    "Reload throughput (CPU->GPU)",
                    "Copy throughput of KV loaded from the CPU pool into GPU memory, GB/s: mean over the "
                    "window and per-transfer p50/p99.",
                ),
                _dma_panel(
                    rec.STORE,
                    "Offload throughput (GPU->CPU)",
                    "Copy throughput of KV stored from GPU memory into the CPU pool, GB/s: mean over the "
                    "window and per-transfer p50/p99.",
                ),
            ),
        ),
        RowSpec(
            "CPU pool",
            "How full the pool is, whether stores fail for want of space, and the plan the pod runs with. "
            "Resident = chunks holding KV; pinned by transfers = chunks that copies in flight hold "
            "(vllm:kv_offload_cpu_cache_usage_perc). Allocation failures drop KV that should have been "
            "offloaded (alert SpillwayOffloadAllocationFailures).",
            (
                PanelSpec(
                    "Pool usage",
                    "Fraction of the pool's chunks holding KV (the connector's resident/capacity gauges) and "
                    "fraction pinned by transfers in flight (vLLM).",
                    "percentunit",
                    (
                        Query(f(rec.POOL_RESIDENT_RATIO), "{{pod}} resident"),
                        Query(f"max {by(*POD_KEY)} ({f(Metric.OFFLOAD_CPU_USAGE)})", "{{pod}} pinned by transfers"),
                    ),
                ),
                PanelSpec(
                    "Allocation failures and evictions",
                    "Stores per second the pool refused (vllm:kv_offload_allocation_failure) and chunks per "
                    "second evicted to make room (the connector's pool_evicted_chunks).",
                    "ops",
                    (
                        Query(f(rec.ALLOCATION_FAILURES_RATE), "{{pod}} allocation failures"),
                        Query(f(rec.POOL_EVICTIONS_RATE), "{{pod}} chunks evicted"),
                    ),
                ),
                _pool_plan(),
            ),
        ),
    )


# -- building -------------------------------------------------------------------------
ROW_TEXT_HEIGHT = 3
PANEL_HEIGHT = 8
GRID_WIDTH = 24


def _variable(name: str, label: str, label_name: str, *upstream: str) -> gd.QueryVariable:
    query = f"label_values({selector(VARIABLE_SOURCE, *upstream)}, {label_name})"
    return (
        gd.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(gm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(gm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(gm.VariableOption(selected=True, text="All", value="$__all"))
    )


def _target(query: Query, ref_id: str, instant: bool) -> prometheus.Dataquery:
    target = prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref_id).datasource(DATASOURCE)
    if instant:
        target = target.instant().format(PromQueryFormat.TABLE)
    return target


def _panel(spec: PanelSpec, panel_id: int, width: int):
    builder = table.Panel() if spec.kind == "table" else timeseries.Panel()
    builder = (
        builder.id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .datasource(DATASOURCE)
        .unit(spec.unit)
        .height(PANEL_HEIGHT)
        .span(width)
    )
    if spec.kind == "table":
        builder = builder.show_header(True).with_transformation(gm.DataTransformerConfig(id_val="merge", options={}))
    else:
        builder = builder.legend(
            gc.VizLegendOptions().display_mode(gcm.LegendDisplayMode.TABLE).placement(gcm.LegendPlacement.BOTTOM)
            .show_legend(True).calcs(["lastNotNull", "max"])
        ).tooltip(gc.VizTooltipOptions().mode(gcm.TooltipDisplayMode.MULTI).sort(gcm.SortOrder.DESCENDING))
    for index, query in enumerate(spec.queries):
        builder = builder.with_target(_target(query, chr(ord("A") + index), instant=spec.kind == "table"))
    return builder


def build(title: str, uid: str, description: str, rows: tuple[RowSpec, ...]) -> gd.Dashboard:
    board = (
        gd.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["spillway", "vllm", "kv-offload"])
        .editable()
        .time("now-3h", "now")
        .refresh("30s")
        .tooltip(gm.DashboardCursorSync.CROSSHAIR)
        .with_variable(gd.DatasourceVariable(DATASOURCE_VAR).label("Data source").type("prometheus"))
        .with_variable(_variable(NAMESPACE_VAR, "Namespace", NAMESPACE))
        .with_variable(_variable(MODEL_VAR, "Model", MODEL, FILTER[0]))
        .with_variable(_variable(POD_VAR, "Pod", POD, *FILTER[:2]))
    )
    panel_id = 0
    for row in rows:
        panel_id += 1
        board = board.with_row(gd.Row(row.title).id(panel_id))
        panel_id += 1
        board = board.with_panel(
            text.Panel().id(panel_id).title("").content(row.description).mode("markdown")
            .height(ROW_TEXT_HEIGHT).span(GRID_WIDTH).transparent(True)
        )
        width = GRID_WIDTH // len(row.panels)
        for spec in row.panels:
            panel_id += 1
            board = board.with_panel(_panel(spec, panel_id, width))
    return board


@dataclass(frozen=True)
class DashboardFile:
    filename: str
    builder: gd.Dashboard


def dashboards() -> list[DashboardFile]:
    return [
        DashboardFile(
            "spillway-kv-offload.json",
            build(
                "Spillway / KV offload",
                "spillway-kv-offload",
                "Per pod: KV bytes offloaded to and reloaded from the CPU pool, copy throughput each way, "
                "CPU pool hit rate, preemptions vs preemption reloads, pool usage and plan, beside TTFT and "
                "token throughput.",
                offload_rows(),
            ),
        ),
    ]


def render(builder: gd.Dashboard) -> str:
    return json.dumps(builder.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
