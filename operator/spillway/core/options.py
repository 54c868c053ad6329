"""The closed sets of choices a serving request takes: one StrEnum each.

argparse (`spillway plan`), the ModelServer spec checks and the planner all take their choices from here.
"""
from __future__ import annotations

import enum


class Layout(enum.StrEnum):
    CONTIGUOUS = "contiguous"  # VLLM_KV_CACHE_LAYOUT=BLHNC: one region holds a block's KV of all layers
    DEFAULT = "default"  # vLLM's own per-layer layout


class Connector(enum.StrEnum):
    SPILLWAY = "spillway"  # our connector plugin (vLLM's OffloadingConnector plus its metrics)
    NATIVE = "native"  # vLLM's OffloadingConnector, by vLLM's own flags where they suffice


class EvictionPolicy(enum.StrEnum):
    LRU = "lru"  # vLLM's CPU offloading manager's policies
    ARC = "arc"


class Attention(enum.StrEnum):
    STANDARD = "standard"  # MHA/GQA: a K and a V per KV head per layer
    MLA = "mla"  # multi-head latent attention: one compressed latent per layer


def choices(kind: type[enum.StrEnum]) -> tuple[str, ...]:
    return tuple(member.value for member in kind)
