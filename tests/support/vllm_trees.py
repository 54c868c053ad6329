"""The vLLM source trees the tests read beside the installed vLLM: SPILLWAY_VLLM_TREES, os.pathsep-separated
folders that each hold a `vllm/` package (make vllm-src unpacks 0.33.0 and 0.26.0 there; .ci/run sets it)."""
from __future__ import annotations

import os
from pathlib import Path

ENV = "SPILLWAY_VLLM_TREES"


def vllm_trees() -> list[Path]:
    return [Path(tree) for tree in os.environ.get(ENV, "").split(os.pathsep) if tree]


def vllm_tree(version: str) -> Path | None:
    """The tree of this release (make vllm-src names each folder by its version), or None."""
    return next((tree for tree in vllm_trees() if tree.name == version), None)
