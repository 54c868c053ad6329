"""The qualification's outputs for people and files: a table and a JSON document (the Node patch is core's)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..core.qualification import DIRECTION_TITLES, PLAN_BLOCK_BYTES, SCHEMA, Row, production_method, rate_at, round_gbps
from ..core.quantity import format_bytes


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
            "gbps": round_gbps(rate_at(rows, plan_block_bytes, "c2g", method)),
        },
        "rows": [r.to_dict() for r in rows],
    }
