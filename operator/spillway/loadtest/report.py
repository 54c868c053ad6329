"""The human table of a result (and of its no-offload baseline, side by side), and the cells every table shares."""
from __future__ import annotations

from typing import Any


def _ms(stats: dict | None, key: str = "median") -> str:
    return f"{stats[key] * 1e3:.1f}" if stats else "-"


def _spread(stats: dict | None) -> str:
    return f"{stats['min'] * 1e3:.1f}-{stats['max'] * 1e3:.1f}" if stats else "-"


def pct(value: float | None) -> str:
    return f"{value * 100:.1f}%" if value is not None else "-"


def num(value: float | None, fmt: str = "{:.1f}") -> str:
    return fmt.format(value) if value is not None else "-"


def _mib(value: float | None) -> str:
    return f"{value / 2**20:.1f}" if value is not None else "-"


def table(result: dict[str, Any], baseline: dict[str, Any] | None = None) -> str:
    env = result.get("environment", {})
    labels = env.get("labels") or {}
    lines = [
        (f"Load test of {env.get('model', '?')} at {env.get('endpoint', '?')} (vLLM {env.get('vllm_version') or '?'}; "
         f"block {env.get('block_size', '?')} tokens; GPU KV {env.get('gpu_kv_tokens') or '?'} tokens; "
         f"status {result.get('status')}{'; ' + result['error'] if result.get('error') else ''})"),
    ]
    if labels:
        lines.append("labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    base_ttft = {row["length"]: row for row in (baseline or {}).get("ttft", {}).get("summary", [])}
    summary = result.get("ttft", {}).get("summary") or []
    if summary:
        lines += ["", "TTFT, ms (median of repetitions; min-max)"]
        header = ["prompt tokens", "recompute", "spread", "from CPU", "spread", "speedup", "CPU hit"]
        if base_ttft:
            header += ["baseline repeat", "vs baseline"]
        rows = []
        for row in summary:
            cells = [str(row["length"]), _ms(row["recompute_s"]), _spread(row["recompute_s"]), _ms(row["repeat_s"]),
                     _spread(row["repeat_s"]), num(row["speedup"], "{:.2f}x"), pct(row["repeat_cpu_hit_rate"])]
            if base_ttft:
                base = base_ttft.get(row["length"], {}).get("repeat_s")
                gain = base["median"] / row["repeat_s"]["median"] if base and row["repeat_s"] else None
                cells += [_ms(base), num(gain, "{:.2f}x")]
            rows.append(cells)
        lines += grid(header, rows)
        phased = [row for row in summary if row.get("repeat_server_s")]
        if phased:
            lines += ["", "Where a repeat's time to first token went, ms (the server's own clocks, medians)",
                      ("  outside: HTTP, parsing and the response; intake: the API server to the engine's queue; "
                       "queue: lookup, copy and the wait for it; prefill: the forward of what was not loaded")]
            header = ["prompt tokens", "client TTFT", "outside", "intake", "queue", "of it copy", "prefill"]
            rows = []
            for row in phased:
                phases, client = row["repeat_server_s"], row["repeat_s"]["median"]
                rows.append([str(row["length"]), num(client * 1e3), num((client - phases["ttft_s"]) * 1e3),
                             *(num(phases[key] * 1e3) if phases.get(key) is not None else "-"
                               for key in ("intake_s", "queue_s", "copy_s", "prefill_s"))])
            lines += grid(header, rows)
    points = result.get("throughput", {}).get("points") or []
    base_points = {p["target_hit_rate"]: p for p in (baseline or {}).get("throughput", {}).get("points", [])}
    if points:
        lines += ["", "Throughput (timed phase; warm-up excluded)"]
        header = ["target hit", "CPU hit", "GPU hit", "prompt tok/s", "req/s", "p50 s", "errors", "preempt",
                  "load MiB", "store MiB"]
        if base_points:
            header += ["baseline tok/s", "gain"]
        rows = []
        for p in points:
            achieved = p.get("achieved", {})
            cells = [pct(p["target_hit_rate"]), pct(achieved.get("cpu_hit_rate")), pct(achieved.get("gpu_hit_rate")),
                     num(p["prompt_tokens_per_s"], "{:.0f}"), num(p["requests_per_s"], "{:.2f}"),
                     num((p.get("latency_s") or {}).get("p50"), "{:.3f}"), str(p["errors"]),
                     num(achieved.get("preemptions"), "{:.0f}"), _mib(achieved.get("offload_load_bytes")),
                     _mib(achieved.get("offload_store_bytes"))]
            if base_points:
                base = base_points.get(p["target_hit_rate"])
                base_tps = base["prompt_tokens_per_s"] if base else None
                gain = p["prompt_tokens_per_s"] / base_tps if base_tps and p["prompt_tokens_per_s"] else None
                cells += [num(base_tps, "{:.0f}"), num(gain, "{:.2f}x")]
            rows.append(cells)
        lines += grid(header, rows)
    return "\n".join(lines)


def grid(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns as wide as their widest cell, right-aligned, under a header and a rule."""
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows]
