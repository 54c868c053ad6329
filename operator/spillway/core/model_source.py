"""Where a model's config.json comes from, and the one order in which the sources are tried.

Pure rules shared by `spillway plan` and the operator: a config the user gave (inline, a file, a ConfigMap)
wins, then the bundled catalog, then the Hugging Face hub when the caller allows it and the model is a hub id.
The reading itself (files, ConfigMaps, the catalog, the hub) is spillway.adapters.model_config's.
"""
from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import k8s_names as names
from .errors import InvalidSpec, ModelGeometryUnknown

# The most of a config.json read from a file, a ConfigMap or the hub (real ones are a few KiB).
MAX_CONFIG_BYTES = 4 * 2**20


class Origin(enum.StrEnum):
    INLINE = "inline"
    FILE = "file"
    CONFIG_MAP = "configMap"
    CATALOG = "catalog"
    HUB = "hub"


@dataclass(frozen=True)
class ModelSource:
    """What the user named: a model id and/or one explicit config.json (inline, a file or a ConfigMap key)."""

    model: str | None = None
    revision: str | None = None
    inline: Mapping[str, Any] | None = None
    config_file: str | None = None
    config_map: tuple[str, str] | None = None  # (ConfigMap name, key)

    @property
    def name(self) -> str:
        """The name the geometry and its error messages carry."""
        return self.model or self.config_file or "inline modelConfig"


def looks_like_hub_id(model: str) -> bool:
    return "://" not in model and not model.startswith(("/", ".")) and model.count("/") == 1


def origin(source: ModelSource, in_catalog: bool, hub_allowed: bool) -> Origin:
    """Which source supplies the config.json; ModelGeometryUnknown (or InvalidSpec) when none can."""
    if source.inline is not None:
        return Origin.INLINE
    if source.config_file is not None:
        return Origin.FILE
    if source.config_map is not None:
        return Origin.CONFIG_MAP
    if not source.model:
        raise InvalidSpec("no model given: pass a model id or a config.json")
    if in_catalog:
        return Origin.CATALOG
    if hub_allowed and looks_like_hub_id(source.model):
        return Origin.HUB
    if hub_allowed:
        why = "is not in Spillway's catalog and is not a hub id (owner/name) to fetch"
    else:
        why = (f"is not in Spillway's catalog and hub fetches are off (spillway plan --allow-hub; the operator's "
               f"{names.ENV_ALLOW_HUB_FETCH}=true)")
    raise ModelGeometryUnknown(f"model {source.model!r} {why}: give its config.json (spillway plan --model-config "
                               "PATH; a ModelServer's spec.modelConfig, inline or a configMapRef)")


def parse_config_text(text: str | bytes, where: str) -> dict[str, Any]:
    """config.json text (or its bytes) -> its object, or ModelGeometryUnknown naming `where` and the line."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ModelGeometryUnknown(f"{where}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; a config.json is a few KiB")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelGeometryUnknown(f"{where}: not UTF-8 text at byte {exc.start} (config.json is UTF-8 JSON)"
                                       ) from exc
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelGeometryUnknown(f"{where}: malformed JSON at line {exc.lineno}: {exc.msg}") from exc
    except RecursionError as exc:
        raise ModelGeometryUnknown(f"{where}: JSON nested too deeply to be a config.json") from exc
    except ValueError as exc:  # an integer past Python's digit limit (sys.get_int_max_str_digits)
        raise ModelGeometryUnknown(f"{where}: a number too long to be a config.json value ({exc})"[:300]) from exc
    if not isinstance(config, dict):
        raise ModelGeometryUnknown(f"{where}: config.json must be a JSON object")
    return config
