"""Alerts that say when offloading stops paying, each with its runbook.

Thresholds and the runbook location live in `Config`; `python -m spillway.observability --help`
lists the flags that override them when regenerating the rules files.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from spillway_connector import names as connector

from spillway.core import k8s_names, routing
from spillway.core.disk_tier import TIER_SLACK_BYTES
from spillway.core.vllm_api import Metric

from . import recording as rec
from .promql import CONTAINER, NAMESPACE, NODE, POD, POD_KEY, WINDOW, by, counter, eq, selector

# cAdvisor (kubelet) and kube-state-metrics series the alerts join with.
CONTAINER_WORKING_SET = "container_memory_working_set_bytes"
CONTAINER_LIMITS = "kube_pod_container_resource_limits"
POD_INFO = "kube_pod_info"

SEVERITY = "severity"


# The anchor GitHub gives a heading `### <alert name>` in docs/metrics.md.
RUNBOOK_URL_PATTERN = "https://github.com/spillway-dev/spillway/blob/main/docs/metrics.md#{anchor}"


@dataclass(frozen=True)
class Config:
    """Every threshold and where the runbooks live, in one object (kubernetes-mixin's `_config`): a site
    regenerates the rules with its own values instead of editing PromQL."""

    allocation_failures_per_s: float = 0.0  # any sustained failure
    hit_ratio_collapse_fraction: float = 0.5  # hit rate below this fraction of its 6h baseline
    hit_ratio_min_queried_tokens_per_s: float = 100.0  # "under load"
    dma_fraction_of_qualified: float = 0.5
    dma_floor_gbps: float = 5.0  # nodes with no qualified figure
    preemptions_per_s: float = 0.1  # a storm: 6 a minute or more
    reloads_fraction_of_preemptions: float = 0.1
    memory_limit_fraction: float = 0.9
    disk_min_evicted_chunks_per_s: float = 1.0  # "evicting at all": below this churn the ratio means little
    disk_read_fraction_of_break_even: float = 1.0  # reads below the planned break-even rate (times this)
    disk_failures_per_s: float = 0.0  # failed disk stores or loads, sustained: any
    # Free bytes of the tier's volume under which it counts as full: the room the plan leaves above the evictor's
    # bound for files being written (core.disk_tier.TIER_SLACK_BYTES).
    disk_free_floor_bytes: float = float(TIER_SLACK_BYTES)
    router_upstream_error_fraction: float = 0.05  # of the requests the router sends a pod
    router_min_upstream_errors_per_s: float = 0.05  # 3 a minute: a few cut streams on a quiet router are not it
    runbook_url_pattern: str = RUNBOOK_URL_PATTERN  # {anchor}: the alert's section

    def runbook_url(self, alert_name: str) -> str:
        return self.runbook_url_pattern.format(anchor=runbook_anchor(alert_name))


def runbook_anchor(alert_name: str) -> str:
    return alert_name.lower()


DEFAULT = Config()


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    duration: str
    severity: str
    summary: str
    description: str
    runbook: str
    labels: dict[str, str] = field(default_factory=dict)


def _on(*labels: str) -> str:
    return f"on ({', '.join(labels)})"


def allocation_failures(t: Config) -> Alert:
    return Alert(
        name="SpillwayOffloadAllocationFailures",
        expr=f"{rec.ALLOCATION_FAILURES_RATE} > {t.allocation_failures_per_s:g}",
        duration="10m",
        severity="warning",
        summary="CPU pool of {{ $labels.namespace }}/{{ $labels.pod }} refuses KV stores",
        description=(
            "{{ $labels.pod }} ({{ $labels.model_name }}) failed {{ printf \"%.2f\" $value }} KV store allocations "
            "per second for 10 minutes: the CPU pool had no free or evictable chunk, so KV that should have "
            "been offloaded was not and is recomputed when the GPU drops it."
        ),
        runbook=(
            "1. Open the Spillway KV offload dashboard, row 'CPU pool', for this pod: resident fraction near 1 "
            "and high store bytes/s mean the pool is too small for the working set.\n"
            "2. Raise spec.offload.size of the ModelServer (or use `auto`), or lower max concurrency; check "
            "`spillway plan` for what the node's memory allows.\n"
            "3. If the pool is mostly empty yet allocations fail, stores are stuck in flight: check DMA "
            "throughput on the same dashboard and the vLLM container log for transfer errors."
        ),
    )


def hit_rate_collapse(t: Config) -> Alert:
    baseline = f"avg_over_time({rec.HIT_RATIO}[6h] offset 30m)"
    expr = (
        f"{rec.HIT_RATIO}\n  < {t.hit_ratio_collapse_fraction:g} * {baseline}\n"
        f"and {_on(*POD_KEY)}\n  {rec.QUERIED_TOKENS_RATE} > {t.hit_ratio_min_queried_tokens_per_s:g}"
    )
    return Alert(
        name="SpillwayOffloadHitRateCollapse",
        expr=expr,
        duration="15m",
        severity="warning",
        summary="CPU pool hit rate of {{ $labels.namespace }}/{{ $labels.pod }} collapsed under load",
        description=(
            "{{ $labels.pod }} ({{ $labels.model_name }}) finds {{ $value | humanizePercentage }} of looked-up "
            f"tokens in its CPU pool, less than {t.hit_ratio_collapse_fraction:g} of its 6-hour average, while "
            f"looking up more than {t.hit_ratio_min_queried_tokens_per_s:g} tokens/s. Prompts that used to "
            "reload now recompute: TTFT rises and GPU time is wasted."
        ),
        runbook=(
            "1. Dashboard row 'CPU pool': resident fraction at 1 with rising allocation failures means the "
            "working set outgrew the pool; raise spec.offload.size.\n"
            "2. If the traffic changed (new prompts, no shared prefixes), the collapse is the workload's and "
            "offloading has little left to save; compare prompt tokens/s and TTFT with the baseline.\n"
            "3. A restart of the pod empties the pool; the rate recovers as prompts repeat."
        ),
    )


def dma_throughput_low(t: Config) -> Alert:
    qualified = k8s_names.METRIC_NODE_QUALIFIED_DMA_GBPS
    reload = selector(rec.DMA_GBPS_MEAN, eq("direction", rec.LOAD))
    node_of_pod = f"max {by(NAMESPACE, POD, NODE)} ({POD_INFO})"
    with_node = f"({reload} * {_on(NAMESPACE, POD)} group_left ({NODE}) {node_of_pod})"
    expr = (
        f"{with_node}\n  < {_on(NODE)} group_left () ({t.dma_fraction_of_qualified:g} * max {by(NODE)} ({qualified}))\n"
        f"or\n({with_node} unless {_on(NODE)} {qualified}) < {t.dma_floor_gbps:g}\n"
        f"or\n({reload} unless {_on(NAMESPACE, POD)} {POD_INFO}) < {t.dma_floor_gbps:g}"
    )
    return Alert(
        name="SpillwayDMAThroughputLow",
        expr=expr,
        duration="15m",
        severity="warning",
        summary="KV reloads of {{ $labels.namespace }}/{{ $labels.pod }} copy far below the node's qualified rate",
        description=(
            "CPU->GPU copies of {{ $labels.pod }} ({{ $labels.model_name }}){{ with $labels.node }} on node "
            "{{ . }}{{ end }} run at {{ printf \"%.2f\" $value }} GB/s, below "
            f"{t.dma_fraction_of_qualified:g} x the node's qualified figure ({qualified}, from the node "
            f"annotation {k8s_names.ANNOTATION_QUALIFIED_DMA_GBPS}), or below {t.dma_floor_gbps:g} GB/s where "
            "the node has none. Reloads that slow can cost more than recomputing."
        ),
        runbook=(
            "1. Re-run `spillway qualify` on the node: a lower figure than the annotation points at the node "
            "(PCIe link width/speed, a GPU in a slow slot, IOMMU settings).\n"
            "2. Check that the pool is pinned: the vLLM log reports registering the CPU offload region; "
            "unpinned host memory copies at a fraction of the DMA rate.\n"
            "3. Check NUMA placement: the pool's memory should sit on the GPU's socket.\n"
            "4. Small transfers are latency-bound: the dashboard's p50 vs mean and the transfer size tell "
            "whether larger offload block sizes would help."
        ),
    )


def preemption_storm_without_reloads(t: Config) -> Alert:
    expr = (
        f"{rec.PREEMPTIONS_RATE} > {t.preemptions_per_s:g}\n"
        f"unless {_on(*POD_KEY)}\n"
        f"  {rec.PREEMPTED_RELOADS_RATE} > {t.reloads_fraction_of_preemptions:g} * {rec.PREEMPTIONS_RATE}"
    )
    return Alert(
        name="SpillwayPreemptionStormWithoutReloads",
        expr=expr,
        duration="10m",
        severity="warning",
        summary="{{ $labels.namespace }}/{{ $labels.pod }} preempts requests and offloading does not bring them back",
        description=(
            "{{ $labels.pod }} ({{ $labels.model_name }}) preempts {{ printf \"%.2f\" $value }} requests/s, and fewer "
            f"than {t.reloads_fraction_of_preemptions:g} of them resume from the CPU pool: preempted requests "
            "recompute their KV, so offloading is not helping."
        ),
        runbook=(
            "1. Dashboard row 'Preemption': if reloads stay at 0, check that the pod runs the Spillway connector "
            "(kv_offload metrics present) and that stores succeed (row 'CPU pool', allocation failures).\n"
            "2. If the pool is full, preempted requests' KV was evicted before they resumed: raise "
            "spec.offload.size.\n"
            "3. Preemption itself means GPU KV cache is short: lower max concurrency or max model length, or "
            "add GPUs."
        ),
    )


def pool_near_memory_limit(t: Config) -> Alert:
    container = eq(CONTAINER, k8s_names.CONTAINER_VLLM)
    key = (NAMESPACE, POD, CONTAINER)
    used = f"max {by(*key)} ({selector(CONTAINER_WORKING_SET, container)})"
    limit = f"max {by(*key)} ({selector(CONTAINER_LIMITS, container, eq('resource', 'memory'))})"
    # Pods with a CPU pool: vLLM's pool gauge, or the connector's where vLLM's is absent.
    offloading = f"group {by(NAMESPACE, POD)} ({Metric.OFFLOAD_CPU_USAGE} or {connector.POOL_CAPACITY_CHUNKS})"
    expr = f"{used}\n/ {_on(*key)}\n{limit}\n> {t.memory_limit_fraction:g}\nand {_on(NAMESPACE, POD)} {offloading}"
    return Alert(
        name="SpillwayOffloadPoolNearMemoryLimit",
        expr=expr,
        duration="5m",
        severity="critical",
        summary="{{ $labels.namespace }}/{{ $labels.pod }} uses {{ $value | humanizePercentage }} of its memory limit",
        description=(
            "The vLLM container of {{ $labels.pod }} holds a CPU KV pool in shared memory, which counts against "
            f"its memory limit; its working set is above {t.memory_limit_fraction:g} of the limit. Past the "
            "limit the kernel kills the container and the pool's contents are lost."
        ),
        runbook=(
            "1. Compare the pool size (dashboard row 'CPU pool', pool plan) with the limit: "
            "`kubectl get pod POD -o jsonpath='{.spec.containers[0].resources.limits.memory}'`.\n"
            "2. Regenerate the plan with `spillway plan` for the node and apply a smaller spec.offload.size, or "
            "raise the limit if the node has the memory.\n"
            "3. Other memory in the container (tokenizer, API server, request queues) grows with concurrency; "
            "leave headroom beyond the pool."
        ),
    )


def modelserver_not_planned(t: Config) -> Alert:
    expr = f"{k8s_names.METRIC_MODELSERVER_PLANNED} == 0"
    return Alert(
        name="SpillwayModelServerNotPlanned",
        expr=expr,
        duration="15m",
        severity="warning",
        summary="ModelServer {{ $labels.modelserver_namespace }}/{{ $labels.modelserver }} has no plan that fits",
        description=(
            "The operator's last plan of {{ $labels.modelserver }} failed (its Planned condition says why): a spec "
            "the operator refuses, a model it cannot size, or nodes that no longer fit an explicit offload size, "
            "in which case its Deployment is scaled to 0 until they do."
        ),
        runbook=(
            "1. `kubectl -n NAMESPACE get ms NAME -o jsonpath='{.status.conditions}'`: the Planned reason and message "
            "name the field or the numbers.\n"
            "2. PoolDoesNotFit after a node change: the nodes shrank; lower spec.offload.size (`spillway plan` for "
            "the node shows what fits) or use `auto`, or restore the nodes' memory.\n"
            "3. NoEligibleNodes: no GPU node matches nodeSelector/tolerations/affinity or has tensorParallelSize GPUs.\n"
            "4. InternalError is an operator bug: the operator log has the traceback."
        ),
    )


def disk_tier_churns(t: Config) -> Alert:
    tier_key = (*POD_KEY, "tier")
    expr = (f"{rec.TIER_EVICTED_CHUNKS_RATE} > {t.disk_min_evicted_chunks_per_s:g}\n"
            f"and {_on(*tier_key)}\n{rec.TIER_EVICTED_CHUNKS_RATE} > {_on(*tier_key)} {rec.TIER_HIT_CHUNKS_RATE}")
    return Alert(
        name="SpillwayDiskTierEvictsFasterThanHit",
        expr=expr,
        duration="30m",
        severity="warning",
        summary="Disk tier of {{ $labels.namespace }}/{{ $labels.pod }} deletes chunks faster than it serves them",
        description=(
            "{{ $labels.pod }} ({{ $labels.model_name }}) deleted {{ printf \"%.1f\" $value }} chunk files per second "
            "from its disk tier ({{ $labels.tier }}) for 30 minutes, more than it found there: most of what it writes "
            "is evicted before any request reads it back, so the tier costs disk writes and buys few hits."
        ),
        runbook=(
            "1. Dashboard row 'Disk tier': occupancy at the bound with evictions above hits means the working set "
            "is larger than the tier, or has no reuse at this depth.\n"
            "2. A larger tier (spec.offload.disk.size, or a hostPath/PVC volume with more capacity) helps when the "
            "hit rate rises with size; `spillway loadtest` with a working set beyond the pool shows it.\n"
            "3. If prompts rarely repeat beyond the CPU pool's reach, the tier cannot pay: set "
            "spec.offload.disk.enabled: false and save the disk writes."
        ),
    )


def disk_tier_reads_too_slow(t: Config) -> Alert:
    tier_key = (*POD_KEY, "tier")
    break_even = f"max {by(*tier_key)} ({connector.TIER_BREAK_EVEN_GBPS})"
    expr = (f"{rec.TIER_READ_GBPS}\n< {_on(*tier_key)}\n"
            f"{t.disk_read_fraction_of_break_even:g} * {break_even}")
    return Alert(
        name="SpillwayDiskTierReadsTooSlow",
        expr=expr,
        duration="15m",
        severity="warning",
        summary="Disk tier of {{ $labels.namespace }}/{{ $labels.pod }} reads slower than recompute pays for",
        description=(
            "{{ $labels.pod }} ({{ $labels.model_name }}) reads its disk tier ({{ $labels.tier }}) at "
            "{{ printf \"%.2f\" $value }} GB/s, below the rate the planner found a disk hit needs to beat "
            "recomputing the prefix: requests served from disk now wait longer than a prefill would take."
        ),
        runbook=(
            "1. Dashboard row 'Disk tier': read GB/s against the break-even line. A drop under load means the "
            "disk is shared (other pods' ephemeral storage, image pulls) or its queue is full of the tier's "
            "own writes.\n"
            "2. Re-qualify the node: `spillway qualify --disk /var/lib/spillway/kv-tier --annotate-node NODE` "
            "inside the pod; with the new figure the operator re-plans and leaves the tier off where it does not "
            "pay.\n"
            "3. Move the tier to a faster volume (a local NVMe hostPath or storage class) or disable it."
        ),
    )


TIER_KEY = (*POD_KEY, "tier")


def _rose(metric: str, window: str) -> str:
    """Per pod and tier, how much a counter rose over `window`, including a series born inside it (its first
    sample already counts, which increase() alone would miss: a labelled counter appears at its first event)."""
    raw = counter(metric)
    return f"sum {by(*TIER_KEY)} (increase({raw}[{window}]) > 0 or ({raw} > 0 unless {raw} offset {window}))"


def disk_tier_faults(t: Config) -> list[Alert]:
    """What breaks a disk tier, an alert a row: the rows differ in their expression and their words only.
    Columns: name, expr, for, severity, summary, description, runbook."""
    failing = f"> {t.disk_failures_per_s:g}"
    floor = t.disk_free_floor_bytes
    rows = (
        ("SpillwayDiskTierStoreFailures", f"{rec.TIER_STORE_FAILURES_RATE} {failing}", "10m", "warning",
         "Disk tier of {{ $labels.namespace }}/{{ $labels.pod }} fails to store chunks",
         ("{{ $labels.pod }} ({{ $labels.model_name }}) failed {{ printf \"%.2f\" $value }} writes per second of "
          "CPU-pool chunks to its disk tier ({{ $labels.tier }}) for 10 minutes: what the pool drops from now on is "
          "not on disk and is recomputed when asked for again."),
         ("1. The vLLM container log names the error: 'No space left on device' or 'Input/output error' (the "
          "volume is full: alert SpillwayDiskTierVolumeFull, dashboard row 'Disk tier faults', panel 'Volume free "
          "space'), "
          "'Read-only file system' (alert SpillwayDiskTierReadOnly), 'O_DIRECT is not supported' (the volume's "
          "filesystem, e.g. tmpfs or some overlay setups, cannot take the fs tier: use a local disk volume).\n"
          "2. Check the node's disk: `kubectl describe node NODE` (DiskPressure), `df` of the tier's mount "
          "(/var/lib/spillway/kv-tier) in the pod.\n"
          "3. If the volume cannot be fixed, set spec.offload.disk.enabled: false: the CPU pool keeps working.")),
        ("SpillwayDiskTierLoadFailures", f"{rec.TIER_LOAD_FAILURES_RATE} {failing}", "10m", "warning",
         "Disk tier of {{ $labels.namespace }}/{{ $labels.pod }} fails to load chunks",
         ("{{ $labels.pod }} ({{ $labels.model_name }}) failed {{ printf \"%.2f\" $value }} reads per second from its "
          "disk tier ({{ $labels.tier }}) into the CPU pool for 10 minutes: those prompts are recomputed, so "
          "requests that should have hit the disk wait for a full prefill and also for the failed read."),
         ("1. The vLLM container log names the file and the error: 'Input/output error' points at the disk "
          "(the node's kernel log, SMART), a short read at a file truncated or replaced under the tier.\n"
          "2. Dashboard row 'Disk tier faults', panel 'Checksums and evictor': checksum mismatches at the same "
          "time mean chunk files are corrupted (alert SpillwayDiskTierChecksumMismatches).\n"
          "3. If it persists, move the tier to another volume or set spec.offload.disk.enabled: false.")),
        ("SpillwayDiskTierChecksumMismatches", f"{_rose(connector.TIER_CHECKSUM_MISMATCHES, '15m')} > 0", "1m",
         "warning",
         "Disk tier of {{ $labels.namespace }}/{{ $labels.pod }} found corrupted chunk files",
         ("{{ printf \"%.0f\" $value }} chunk files of {{ $labels.pod }} ({{ $labels.model_name }}) on its disk tier "
          "({{ $labels.tier }}) failed their checksum in the last 15 minutes. None was served: each was removed and "
          "its prompt recomputed. The bytes changed after they were written: the disk, the filesystem, or "
          "something else writing into the tier's directory."),
         ("1. The vLLM container log names each file ('checksum mismatch'). One now and then after a node crash "
          "is a torn write and heals by itself.\n"
          "2. Repeated mismatches: check the node's disk (kernel log, SMART) and whether anything else writes "
          "into the tier's directory (a shared hostPath or claim, a process on the node).\n"
          "3. Until it is fixed the tier costs reads it throws away: cordon the node or set "
          "spec.offload.disk.enabled: false.")),
        ("SpillwayDiskTierEvictorFailing",
         f"{_rose(connector.TIER_EVICTOR_RESTARTS, '15m')} > 0\nor\n{rec.TIER_EVICTOR_FAULTS_RATE} {failing}", "5m",
         "warning",
         "The disk tier's evictor of {{ $labels.namespace }}/{{ $labels.pod }} fails",
         ("The connector's evictor of {{ $labels.pod }} ({{ $labels.model_name }}), which keeps the disk tier "
          "({{ $labels.tier }}) under its planned bound, died and was restarted in the last 15 minutes, or fails "
          "to delete files for 5 minutes. While it cannot delete, the tier grows past its bound: an emptyDir "
          "past its sizeLimit makes the kubelet evict the pod with its tier."),
         ("1. The vLLM container log says what failed: a file it may not delete (permissions, a read-only "
          "volume: alert SpillwayDiskTierReadOnly) or the traceback of the error the evictor died of.\n"
          "2. Dashboard rows 'Disk tier' (held bytes against the bound) and 'Disk tier faults'.\n"
          "3. Files the tier did not write must not sit under its directory; an evictor dying again and again "
          "is a connector bug: report the traceback, and set spec.offload.disk.enabled: false meanwhile.")),
        ("SpillwayDiskTierVolumeFull", f"min {by(*TIER_KEY)} ({connector.TIER_VOLUME_FREE_BYTES}) < {floor:.0f}",
         "5m", "critical",
         "The disk tier's volume of {{ $labels.namespace }}/{{ $labels.pod }} is full",
         ("The volume of {{ $labels.pod }}'s disk tier ({{ $labels.tier }}) has {{ $value | humanize1024 }}B free, "
          f"less than the {floor / 2**30:g} GiB the plan leaves for chunk files being written, for 5 minutes: stores "
          "fail, and on the node's own disk (emptyDir) the kubelet evicts pods under DiskPressure."),
         ("1. Something besides the tier fills the volume: on an emptyDir it is the node's ephemeral storage "
          "(images, logs, other pods), on a hostPath or claim whatever else writes there. `du` of "
          "/var/lib/spillway/kv-tier in the pod against `df` tells the tier's share.\n"
          "2. The evictor frees the tier's own files when the volume fills; if free bytes stay low while the "
          "tier is small, free space on the node or give the tier a volume of its own.\n"
          "3. A smaller spec.offload.disk.size leaves more room to the rest.")),
        ("SpillwayDiskTierReadOnly", f"min {by(*TIER_KEY)} ({connector.TIER_WRITABLE}) == 0", "5m", "warning",
         "The disk tier of {{ $labels.namespace }}/{{ $labels.pod }} is read-only",
         ("The disk tier ({{ $labels.tier }}) of {{ $labels.pod }} ({{ $labels.model_name }}) cannot be written "
          "for 5 minutes: every store fails and the evictor can delete nothing; chunks already there are still "
          "read."),
         ("1. A filesystem the kernel remounted read-only after I/O errors: the node's kernel log; the disk "
          "needs attention, cordon the node.\n"
          "2. A volume mounted read-only (a claim's access mode, a hostPath's permissions for the container's "
          "user 65532): fix the volume or set spec.offload.disk.enabled: false.")),
    )
    return [Alert(*row) for row in rows]


def router_upstream_errors(t: Config) -> Alert:
    key = by(NAMESPACE, POD, routing.ROUTER_LABEL_WORKER)  # the router pod and the worker it failed to reach
    errors = f"sum {key} (rate({routing.ROUTER_METRIC_UPSTREAM_ERRORS}[{WINDOW}]))"
    requests = f"sum {key} (rate({routing.ROUTER_METRIC_REQUESTS}[{WINDOW}]))"
    expr = (f"{errors}\n/\n{requests}\n> {t.router_upstream_error_fraction:g}\n"
            f"and\n{errors}\n> {t.router_min_upstream_errors_per_s:g}")
    return Alert(
        name="SpillwayRouterUpstreamErrors",
        expr=expr,
        duration="10m",
        severity="warning",
        summary="Router {{ $labels.namespace }}/{{ $labels.pod }} gets no answer from {{ $labels.worker }} for "
                "{{ $value | humanizePercentage }} of its requests",
        description=(
            "The kv-aware router {{ $labels.pod }} sent {{ $labels.worker }} requests it did not answer (the "
            "client got a 502) or whose answer was cut mid-stream: {{ $value | humanizePercentage }} of them over "
            f"the last {WINDOW}, more than {t.router_upstream_error_fraction:.0%} and "
            f"{t.router_min_upstream_errors_per_s:g}/s, for 10 minutes. The router keeps sending the pod its "
            "prefixes for as long as DNS lists it as ready."
        ),
        runbook=(
            "1. Dashboard row 'Router', panel 'Upstream errors': one pod failing while the others answer is that "
            "pod's trouble. Find it by the IP in the worker URL (`kubectl -n NAMESPACE get pods -o wide`), then "
            "its vLLM log, restarts (an OOM kill) and readiness.\n"
            "2. Every pod failing: the path from the router to the pods. The vLLM pods' NetworkPolicy admits "
            "the ModelServer's router pods to port 8000 (docs/routing.md); a policy of the site's own can block "
            "them.\n"
            "3. Cut streams count too: a client that closes its stream early shows as errors of the pod it "
            "streamed from. The router's log says 'a response from ... was cut' for these; raise the client's "
            "timeout, or regenerate the rules with a higher --router-upstream-error-fraction if clients cancel by design."
        ),
    )


def alerts(t: Config = DEFAULT) -> list[Alert]:
    return [
        allocation_failures(t),
        hit_rate_collapse(t),
        dma_throughput_low(t),
        preemption_storm_without_reloads(t),
        pool_near_memory_limit(t),
        modelserver_not_planned(t),
        disk_tier_churns(t),
        disk_tier_reads_too_slow(t),
        *disk_tier_faults(t),
        router_upstream_errors(t),
    ]
