"""Where a model's config.json comes from: a file, the bundled catalog, or (through hub.py) the hub."""
from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.errors import InvalidSpec, ModelGeometryUnknown
from ..core.geometry import ModelGeometry, geometry_from_config


def load_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ModelGeometryUnknown(f"cannot read model config {path}: {exc.strerror}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelGeometryUnknown(f"{path}: malformed JSON at line {exc.lineno}: {exc.msg}") from exc


@functools.lru_cache(maxsize=1)
def _catalog() -> dict[str, dict[str, Any]]:
    """The bundled catalog: model id -> the geometry fields of its config.json (read once)."""
    return json.loads(resources.files("spillway").joinpath("catalog/index.json").read_text())


def catalog_ids() -> list[str]:
    return sorted(_catalog())


@functools.lru_cache(maxsize=1)
def _catalog_by_lower_id() -> dict[str, dict[str, Any]]:
    return {k.lower(): v for k, v in _catalog().items()}


def catalog_config(model_id: str) -> dict[str, Any] | None:
    """The bundled config.json of a known model id (case-insensitive), or None."""
    entry = _catalog_by_lower_id().get(model_id.lower())
    return dict(entry) if entry is not None else None


def resolve_geometry(model_id: str | None = None, config_path: str | Path | None = None,
                     config: Mapping[str, Any] | None = None) -> ModelGeometry:
    """Geometry from an inline config, a config file, or the catalog (in that order)."""
    if config is not None:
        return geometry_from_config(config, model_id or "inline modelConfig")
    if config_path is not None:
        return geometry_from_config(load_config_file(config_path), model_id or str(config_path))
    if model_id:
        found = catalog_config(model_id)
        if found is None:
            raise ModelGeometryUnknown(
                f"model {model_id!r} is not in Spillway's catalog; pass its config.json "
                "(--model-config PATH, or spec.modelConfig) or allow a hub fetch"
            )
        return geometry_from_config(found, model_id)
    raise InvalidSpec("no model given: pass a model id or a config.json")
