"""The node qualification format: the table `spillway qualify` writes on a Node and the planner reads back.

`node_patch()` writes it (a JSON merge patch with the annotations of k8s_names), `qualification_table()`
reads it; Row, the copy methods and the directions are its vocabulary. GB/s is always 1e9 bytes per second.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import k8s_names as names
from .geometry import DEFAULT_BLOCK_SIZE
from .rates import interpolate_log2

MiB = 2**20
SCHEMA = f"{names.GROUP}/qualification/v1"
# The annotated figure's copy size: one cross-layer KV block of Llama-3.1-8B (bf16, 128 KiB per token over
# all layers) at the planner's default block, 8 MiB at 64 tokens. The planner reads the whole table at each
# plan's own copy size; the single figure is what a node without the table is planned with.
LLAMA_31_8B_KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x KV heads x head dim x bf16
PLAN_BLOCK_BYTES = LLAMA_31_8B_KV_BYTES_PER_TOKEN * DEFAULT_BLOCK_SIZE

DIRECTIONS = ("g2c", "c2g", "bidir")  # GPU->CPU, CPU->GPU (the reload path), both at once on two streams
METHODS = ("vllm", "dma", "kernel")  # vLLM's batched copy op, one cudaMemcpyAsync per block, one copy kernel
HOST_KINDS = ("alloc", "shm")  # cudaHostAlloc'd memory, or an mmap of /dev/shm registered with cudaHostRegister
DIRECTION_TITLES = {"g2c": "G2C", "c2g": "C2G", "bidir": "bidir"}


@dataclass
class Row:
    """One (method, direction, block size, host memory) cell: the rate of every timed transfer."""

    method: str
    direction: str
    block_bytes: int
    blocks: int
    host: str = "alloc"
    samples: list[float] = field(default_factory=list)  # GB/s of each repeat
    error: str | None = None  # why the cell could not be measured

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best(self) -> float:
        return max(self.samples)

    @property
    def worst(self) -> float:
        return min(self.samples)

    @property
    def spread_pct(self) -> float:
        """(best - worst) / median, in percent."""
        return (self.best - self.worst) / self.median * 100 if self.median else 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method, "direction": self.direction, "block_bytes": self.block_bytes,
            "blocks": self.blocks, "host": self.host,
        }
        if self.ok:
            out.update(median_gbps=round(self.median, 3), best_gbps=round(self.best, 3),
                       worst_gbps=round(self.worst, 3), spread_pct=round(self.spread_pct, 2),
                       samples_gbps=[round(s, 3) for s in self.samples])
        else:
            out["error"] = self.error or "no samples"
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        return cls(d["method"], d["direction"], d["block_bytes"], d["blocks"], d.get("host", "alloc"),
                   list(d.get("samples_gbps", [])), d.get("error"))


def production_method(rows: Iterable[Row]) -> str | None:
    """The method vLLM itself uses when it was measured, else the plain DMA loop."""
    methods = {r.method for r in rows if r.ok}
    for m in ("vllm", "dma", "kernel"):
        if m in methods:
            return m
    return None


def rate_at(rows: Iterable[Row], block_bytes: int, direction: str = "c2g", method: str | None = None,
            host: str | None = None, stat: str = "median") -> float | None:
    """The measured rate at `block_bytes`, interpolated on log2(block size) between measured sizes.

    Outside the measured range the nearest measured size is used. None when nothing fits.
    """
    rows = [r for r in rows if r.ok and r.direction == direction and (host is None or r.host == host)]
    method = method or production_method(rows)
    return interpolate_log2(((r.block_bytes, getattr(r, stat)) for r in rows if r.method == method), block_bytes)


def round_gbps(x: float | None, digits: int = 1) -> float | None:
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
            out[d] = [round_gbps(cell.get((d, b))) for b in sizes]
    return out


def rows_from_summary(s: dict[str, Any]) -> list[Row]:
    """Rebuild medians from an annotation's summary (for `rate_at` on the operator side)."""
    rows = []
    for d in DIRECTION_TITLES:
        for b, v in zip(s.get("sizes", []), s.get(d, [])):
            if v is not None:
                rows.append(Row(s.get("method") or "dma", d, b, s.get("blocks") or 0, s.get("host") or "alloc", [v]))
    return rows


def qualification_table(raw: str | None) -> tuple[tuple[int, float], ...]:
    """(block bytes, CPU->GPU GB/s) of the production copy method from the Node's qualification annotation."""
    if not raw:
        return ()
    try:
        rows = [r for r in rows_from_summary(json.loads(raw)) if r.direction == "c2g"]
        method = production_method(rows)
        return tuple(sorted((r.block_bytes, r.median) for r in rows if r.method == method))
    except (ValueError, TypeError, AttributeError):
        return ()  # a damaged annotation: fall back to the single figure


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
