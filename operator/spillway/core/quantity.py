"""Kubernetes resource quantities: memory (`512Gi`, `2T`, `1.5e9`) as integer bytes and back, CPU (`16`, `15500m`) as millicores."""
from __future__ import annotations

import math
import re
from decimal import Decimal

from .errors import InvalidSpec

_SUFFIX = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_NUMBER = r"[+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?"
_QUANTITY = re.compile(rf"^({_NUMBER})(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_CPU = re.compile(rf"^({_NUMBER})(m)?$")
INT64_MAX = 2**63 - 1

GiB = 2**30
MiB = 2**20
# The largest byte count planned: status fields are int64 and floats stay exact enough below it.
MAX_BYTES = INT64_MAX  # 8 EiB
MAX_CPU_MILLIS = INT64_MAX


def parse_bytes(text: str | int, what: str = "quantity") -> int:
    """Parse a byte quantity; raise InvalidSpec naming `what` when it is not one."""
    if isinstance(text, bool):
        raise InvalidSpec(f"{what}: expected a quantity like 512Gi, got {text!r}")
    if isinstance(text, int):
        value = Decimal(text)
    else:
        match = _QUANTITY.match(str(text).strip())
        if not match:
            raise InvalidSpec(f"{what}: expected a quantity like 512Gi or 200G, got {text!r}")
        try:
            value = Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]
        except ArithmeticError as exc:  # decimal.Overflow past 1e999999: no memory is that large either
            raise InvalidSpec(f"{what}: {str(text)[:40]!r} is larger than 8 EiB") from exc
    if value < 0:
        raise InvalidSpec(f"{what}: must not be negative, got {text!r}")
    if value > MAX_BYTES:
        raise InvalidSpec(f"{what}: {str(text)[:40]!r} is larger than 8 EiB, more memory "
                          "than any node has")
    return int(value)


def parse_size(size: str | int, what: str) -> tuple[str, float | int | None]:
    """A pool or tier size as a spec writes it: ("auto", None), ("fraction", f) for "0.5" (a share, in (0, 1]),
    or ("bytes", n) for a quantity ("1" is one byte, not the whole); raise InvalidSpec naming `what`."""
    text = str(size).strip()
    if text == "auto":
        return "auto", None
    if "." in text and text.replace(".", "", 1).isdigit():
        fraction = float(Decimal(text))  # digits and one dot: always a Decimal
        if not 0 < fraction <= 1:
            raise InvalidSpec(f"{what} fraction must be in (0, 1], got {text}")
        return "fraction", fraction
    return "bytes", parse_bytes(text, what)


def parse_cpu_millis(text: str | int, what: str = "cpu") -> int:
    """Parse a CPU quantity (`16`, `15500m`, `0.5`) into millicores; raise InvalidSpec naming `what`."""
    match = None if isinstance(text, bool) else _CPU.match(str(text).strip())
    if not match:
        raise InvalidSpec(f"{what}: expected a CPU quantity like 16 or 15500m, got {text!r}")
    try:
        millis = Decimal(match.group(1)) * (1 if match.group(2) else 1000)
    except ArithmeticError as exc:
        raise InvalidSpec(f"{what}: {str(text)[:40]!r} is not a CPU count") from exc
    # Bounded before it becomes an int: 1e999990 would make a million-digit integer first (29 s).
    if not 0 < millis <= MAX_CPU_MILLIS:
        raise InvalidSpec(f"{what}: must be more than 0 and at most int64 millicores, got {str(text)[:40]!r}")
    return math.ceil(millis)  # Kubernetes keeps CPU to the millicore and rounds a finer figure up


def format_bytes(n: int) -> str:
    """Human figure with binary units: 2.00 MiB, 61.3 GiB."""
    for unit, size in (("TiB", 2**40), ("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.2f} {unit}" if value < 100 else f"{value:.1f} {unit}"
    return f"{n} B"


def to_quantity(n: int, unit: str = "Mi") -> str:
    """Kubernetes quantity rounded UP to whole `unit`s (never under-states a limit)."""
    size = _SUFFIX[unit]
    return f"{math.ceil(n / size)}{unit}"
