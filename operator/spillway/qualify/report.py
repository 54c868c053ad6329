"""The qualification's outputs: a table for people, a JSON document, and the Node patch."""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .. import k8s_names as names
from ..quantity import format_bytes
from .measure import DIRECTION_TITLES, PLAN_BLOCK_BYTES, Row, production_method, rate_at

SCHEMA = f"{names.GROUP}/qualification/v1"


def size_label(n: int) -> str:
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return format_bytes(n)


def columns(rows: Iterable[Row]) -> list[tuple[str, str, str]]:
    """(method, direction, host) in a stable order: methods as measured, then G2C, C2G, bidir."""
    seen: list[tuple[str, str, str]] = []
    for r in rows:
        key = (r.method, r.direction, r.host)
        if key not in seen:
            seen.append(key)
    order = {d: i for i, d in enumerate(DIRECTION_TITLES)}
    methods = list(dict.fromkeys(k[0] for k in seen))
    hosts = list(dict.fromkeys(k[2] for k in seen))
    return sorted(seen, key=lambda k: (hosts.index(k[2]), methods.index(k[0]), order.get(k[1], 9)))


def format_table(rows: list[Row], stat: str = "median") -> str:
    """Block sizes down, (method, direction) across; each cell is `stat` GB/s, '±' the spread in percent."""
    cols = columns(rows)
    multi_host = len({c[2] for c in cols}) > 1
    heads = [f"{m}{'/' + h if multi_host else ''} {DIRECTION_TITLES.get(d, d)}" for m, d, h in cols]
    cells = {(r.method, r.direction, r.host, r.block_bytes): r for r in rows}
    sizes = sorted({r.block_bytes for r in rows})
    body = []
    for b in sizes:
        line = [size_label(b)]
        for m, d, h in cols:
            r = cells.get((m, d, h, b))
            if r is None:
                line.append("")
            elif not r.ok:
                line.append("failed")
            else:
                line.append(f"{getattr(r, stat):.1f} ±{r.spread_pct:.0f}%")
        body.append(line)
    widths = [max(len(x) for x in col) for col in zip(["block", *heads], *body)]
    out = ["  ".join(h.ljust(w) for h, w in zip(["block", *heads], widths))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in body]
    return "\n".join(out) + f"\n({stat} GB/s of the repeats, ± (best - worst) / median)\n"


def document(rows: list[Row], meta: dict[str, Any], plan_block_bytes: int = PLAN_BLOCK_BYTES) -> dict[str, Any]:
    """The full JSON result."""
    method = production_method(rows)
    return {
        "schema": SCHEMA,
        "unit": "GB/s (1e9 B/s)",
        **meta,
        "annotated": {
            "method": method,
            "direction": "c2g",
            "block_bytes": plan_block_bytes,
            "gbps": _round(rate_at(rows, plan_block_bytes, "c2g", method)),
        },
        "rows": [r.to_dict() for r in rows],
    }


def _round(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)


def summary(rows: list[Row], meta: dict[str, Any]) -> dict[str, Any]:
    """The compact table stored in the node annotation: median GB/s of the production method per size."""
    method = production_method(rows)
    picked = [r for r in rows if r.ok and r.method == method]
    sizes = sorted({r.block_bytes for r in picked})
    cell = {(r.direction, r.block_bytes): r.median for r in picked}
    out: dict[str, Any] = {"v": 1, "method": method, "blocks": picked[0].blocks if picked else None,
                           "host": picked[0].host if picked else None, "sizes": sizes}
    for key in ("gpu", "measured_at", "vllm"):
        if meta.get(key):
            out[key] = meta[key]
    for d in DIRECTION_TITLES:
        if any((d, b) in cell for b in sizes):
            out[d] = [_round(cell.get((d, b))) for b in sizes]
    return out


def rows_from_summary(s: dict[str, Any]) -> list[Row]:
    """Rebuild medians from an annotation's summary (for `rate_at` on the operator side)."""
    rows = []
    for d in DIRECTION_TITLES:
        for b, v in zip(s.get("sizes", []), s.get(d, [])):
            if v is not None:
                rows.append(Row(s.get("method") or "dma", d, b, s.get("blocks") or 0, s.get("host") or "alloc", [v]))
    return rows


def node_patch(rows: list[Row], meta: dict[str, Any], plan_block_bytes: int = PLAN_BLOCK_BYTES) -> dict[str, Any]:
    """JSON merge patch for the Node: the annotated CPU->GPU rate, the compact table, the 'qualified' label."""
    rate = rate_at(rows, plan_block_bytes, "c2g")
    if rate is None:
        raise ValueError("no CPU->GPU measurement to annotate")
    return {
        "metadata": {
            "labels": {names.LABEL_QUALIFIED: "true"},
            "annotations": {
                names.ANNOTATION_QUALIFIED_DMA_GBPS: f"{rate:.1f}",
                names.ANNOTATION_QUALIFICATION: json.dumps(summary(rows, meta), separators=(",", ":"),
                                                           sort_keys=True),
            },
        }
    }
