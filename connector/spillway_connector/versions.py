"""Which vLLM versions the connector supports (dependency-free).

The connector builds on vLLM's offloading classes, whose interfaces change between minor releases; it
loads only on the minors whose interfaces it was built and tested against. What it replaces inside them is
checked function by function instead (source_guard.py), so a minor whose code moved keeps vLLM's own.
"""
from __future__ import annotations

import re

SUPPORTED_MINORS: tuple[tuple[int, int], ...] = ((0, 26), (0, 32), (0, 33), (0, 34))


class UnsupportedVLLMVersion(ImportError):
    """The installed vLLM is not one the connector supports."""


def supported_list() -> str:
    return ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED_MINORS)


def require_supported(version: str) -> tuple[int, int]:
    """Return (major, minor) of `version`, or raise UnsupportedVLLMVersion with one clear line."""
    match = re.match(r"^(\d+)\.(\d+)", version)
    minor = (int(match.group(1)), int(match.group(2))) if match else None
    if minor not in SUPPORTED_MINORS:
        raise UnsupportedVLLMVersion(
            f"spillway_connector supports vLLM {supported_list()}, but vLLM {version} is installed; "
            "install a supported vLLM or use vLLM's own OffloadingConnector"
        )
    return minor
