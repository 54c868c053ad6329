"""Copy rates measured at a few block sizes, read at any block size (pure)."""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable


def interpolate_log2(points: Iterable[tuple[int, float]], block_bytes: int) -> float | None:
    """Rate at `block_bytes`, linear in log2(block size) between measured sizes.

    Outside the measured range the nearest measured size is used. None when nothing was measured.
    """
    points = sorted(points)
    if not points or block_bytes <= 0:
        return None
    if block_bytes <= points[0][0]:
        return points[0][1]
    if block_bytes >= points[-1][0]:
        return points[-1][1]
    for (b0, r0), (b1, r1) in itertools.pairwise(points):
        if b0 <= block_bytes <= b1:
            if b1 == b0:
                return r1
            t = (math.log2(block_bytes) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
            return r0 + t * (r1 - r0)
    return None  # pragma: no cover - the loop covers the range
