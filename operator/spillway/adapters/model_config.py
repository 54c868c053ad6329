"""The one model-source resolver of `spillway plan`, `spillway render` and the operator: the reading half.

core.model_source decides which source supplies a model's config.json; this module reads it: a file, a
ConfigMap key (through the caller's reader), the bundled catalog, or the hub (through the caller's fetcher).
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.errors import ModelGeometryUnknown
from ..core.geometry import ModelGeometry, geometry_from_config
from ..core.model_source import MAX_CONFIG_BYTES, ModelSource, Origin, origin, parse_config_text

ConfigMapReader = Callable[[str, str], "str | None"]  # (name, key) -> config.json text, None when absent
HubFetcher = Callable[[str, "str | None"], "dict[str, Any]"]  # (model, revision) -> config.json


def load_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)  # bounded: the path may be a device or a pipe
    except OSError as exc:
        raise ModelGeometryUnknown(f"cannot read model config {path}: {exc.strerror}") from exc
    return parse_config_text(data, str(path))


@functools.lru_cache(maxsize=1)
def _catalog() -> dict[str, dict[str, Any]]:
    """The bundled catalog: model id -> the geometry fields of its config.json (read once)."""
    return json.loads(resources.files("spillway").joinpath("catalog/index.json").read_text())


@functools.lru_cache(maxsize=1)
def catalog_aliases() -> dict[str, dict[str, Any]]:
    """Re-release id -> {"base": catalog id, "differs": fields its config.json changes} (catalog/aliases.json)."""
    entries = json.loads(resources.files("spillway").joinpath("catalog/aliases.json").read_text())
    return {k: v for k, v in entries.items() if not k.startswith("_")}


def catalog_ids() -> list[str]:
    return sorted([*_catalog(), *catalog_aliases()])


@functools.lru_cache(maxsize=1)
def _catalog_by_lower_id() -> dict[str, dict[str, Any]]:
    out = {k.lower(): v for k, v in _catalog().items()}
    for alias, entry in catalog_aliases().items():
        out[alias.lower()] = {**_catalog()[entry["base"]], **entry["differs"]}  # exact ids only: no pattern
    return out


def catalog_config(model_id: str) -> dict[str, Any] | None:
    """The bundled config.json of a known model id (case-insensitive), or None."""
    entry = _catalog_by_lower_id().get(model_id.lower())
    return dict(entry) if entry is not None else None


def resolve_geometry(source: ModelSource | str, read_config_map: ConfigMapReader | None = None,
                     fetch_hub: HubFetcher | None = None) -> ModelGeometry:
    """The geometry of a model, its config.json taken from the first source core.model_source.origin() picks.

    A plain string is a model id (catalog, or the hub when `fetch_hub` is given). `read_config_map` reads a
    ConfigMap key (the operator; `spillway render --model-config`), `fetch_hub` fetches from the hub.
    """
    if isinstance(source, str):
        source = ModelSource(source)
    found = catalog_config(source.model) if source.model else None
    picked = origin(source, found is not None, fetch_hub is not None)
    if picked is Origin.INLINE:
        config: Mapping[str, Any] = source.inline or {}
    elif picked is Origin.FILE:
        config = load_config_file(source.config_file or "")
    elif picked is Origin.CONFIG_MAP:
        config = _read_config_map(source, read_config_map)
    elif picked is Origin.CATALOG:
        config = found or {}
    else:
        assert fetch_hub is not None and source.model
        config = fetch_hub(source.model, source.revision)
    return geometry_from_config(config, source.name)


def _read_config_map(source: ModelSource, read_config_map: ConfigMapReader | None) -> dict[str, Any]:
    name, key = source.config_map or ("", "")
    if read_config_map is None:
        raise ModelGeometryUnknown(f"{source.name}: modelConfig.configMapRef {name} cannot be read here; "
                                   "pass the config.json with --model-config")
    text = read_config_map(name, key)
    if text is None:
        raise ModelGeometryUnknown(f"{source.name}: ConfigMap {name} with key {key} not found")
    return parse_config_text(text, f"{source.name}: ConfigMap {name} key {key}")
