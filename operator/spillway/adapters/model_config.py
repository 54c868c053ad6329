"""The one model-source resolver of `spillway plan`, `spillway render` and the operator: the reading half.

core.model_source decides which source supplies a model's config.json; this module reads it: a file, a
ConfigMap key (through the caller's reader), the bundled catalog, or the hub (through the caller's fetcher).

vLLM never reads a config.json as written: it builds transformers' config class of the model type
(vllm/transformers_utils/config.py get_config, AutoConfig), whose constructor fills every field the file leaves
out, some derived from others (Gemma 3's layer_types from num_hidden_layers and sliding_window_pattern: 52
sliding and 10 full layers for gemma-3-27b-it, whose config.json lists none). `filled_config` builds the same
class with the transformers release vLLM's image carries and hands the core its to_dict(): the planner's
defaults are transformers' own. The model types vLLM builds with a config class of its own (_CONFIG_REGISTRY)
and those transformers does not know (remote code) are read as written, as vLLM's own classes keep the
file's fields and the core reads them with vLLM's defaults.
"""
from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.errors import ModelGeometryUnknown
from ..core.geometry import ModelGeometry, geometry_from_config
from ..core.model_facts import check_config
from ..core.model_source import MAX_CONFIG_BYTES, ModelSource, Origin, origin, parse_config_text

# The transformers release the vLLM images carry (the CPU engine's in .venv; operator/pyproject.toml pins it):
# its config classes' defaults are the ones vLLM serves with.
TRANSFORMERS_VERSION = "5.19.0"
# vllm/transformers_utils/config.py _CONFIG_REGISTRY of vLLM 0.33.0 and 0.34.0 (together): the model types whose
# config vLLM builds with a class of its own instead of transformers' (tests/planner/test_model_reader.py checks it
# against both source trees; 0.34 adds the LFM3, Kimi-K3.1, Ming-V3, NeMo SpeechLM and Ricursive types, none of
# which transformers knows, and drops three ASR types of 0.33's).
VLLM_CONFIG_TYPES = frozenset({
    "RefinedWeb", "RefinedWebModel", "alpamayo2_super", "bagel", "bailing_moe_v3_vl", "beam", "chatglm", "colqwen3",
    "deepseek_v32", "deepseek_v41", "deepseek_vl_v2", "dory", "dots3_note", "eagle", "flint", "funaudiochat", "hy_v4",
    "hyperclovax", "inkling_mm_model", "inkling_model", "isaac", "k3_dspark", "kimi_k2", "kimi_k25", "kimi_k3",
    "kimi_linear", "kimi_vl", "midashenglm", "minimax_m3_mtp", "minimax_m3_vl", "moondream3",
    "moss_transcribe_diarize", "muse_spark", "muse_spark_audio", "muse_spark_dspark", "muse_spark_text",
    "muse_spark_vision", "musespark1x_text", "openvla", "ops_colqwen3", "ovis", "qwen3_asr",
    "qwen3_vl_nemotron_embed", "speculators", "step3_text", "step3_vl", "step3p5", "step5", "step5_vl",
    "ultravbert", "ultravox", "unlimited-ocr", "unlimited_ocr",
    "kimi_k31", "lfm3", "lfm3_audio", "lfm3_vl", "ming_v3_asr", "nemo_speechlm", "ricursive",
})

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
        # the catalog stores configs as vLLM reads them (test_model_reader.py fills each and finds them equal)
        return geometry_from_config(found or {}, source.name)
    else:
        assert fetch_hub is not None and source.model
        config = fetch_hub(source.model, source.revision)
    return geometry_of(config, source.name)


# transformers' first import, one thread at a time: its lazy modules are not safe to import from several threads at
# once (the operator plans ModelServers in parallel handler threads), where the threads that lose the race get an
# ImportError of a partly initialized module, which read as "transformers is not installed" and refused every
# inline config.json (the fuzz test's catalog generator: 5 of 11 ModelGeometryUnknown). Held while importing only.
_IMPORT_LOCK = threading.RLock()


@functools.lru_cache(maxsize=1)
def _config_classes() -> Mapping[str, Any] | None:
    """transformers' model type -> config class mapping, imported on first need (1.4 s, 64 MiB: the catalog's
    configs, already filled, never pay it); None where transformers is not installed."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # its import-time advice (no PyTorch) is not ours
    with _IMPORT_LOCK:
        try:
            from transformers import CONFIG_MAPPING
        except ImportError:
            return None
        return CONFIG_MAPPING


def filled_config(config: Mapping[str, Any], name: str = "model") -> Mapping[str, Any]:
    """`config` as vLLM sees it: built through transformers' config class of its model type, every default
    filled (module docstring). The core's first checks come first: transformers expands per-layer lists from the
    layer count (10**30 layers must be refused, not allocated), and a config no reading accepts should not pay
    transformers' import."""
    check_config(config, name)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type in VLLM_CONFIG_TYPES:
        return config
    classes = _config_classes()
    if classes is None:
        raise ModelGeometryUnknown(
            f"{name}: reading a config.json needs transformers=={TRANSFORMERS_VERSION} (vLLM fills its defaults "
            "through transformers' config classes, and without them the KV cache would be mis-sized); install it, "
            "or plan a catalog model id")
    if model_type not in classes:
        return config
    config_class = classes[model_type]
    try:
        built = config_class.from_dict(dict(config))
        filled = built.to_dict()
    except Exception as exc:  # noqa: BLE001 - transformers' validation raises many types; vLLM fails on each
        said = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
        raise ModelGeometryUnknown(f"{name}: transformers' {config_class.__name__} (what vLLM builds) refuses this "
                                   f"config.json: {said}"[:500]) from None
    return {**config, **filled}


@functools.lru_cache(maxsize=1)
def _transformers_model_classes() -> frozenset[str]:
    """The model class names of transformers' auto mappings (names only: no model module, no torch imported)."""
    if _config_classes() is None:
        return frozenset()
    with _IMPORT_LOCK:
        from transformers.models.auto import modeling_auto

    names: set[str] = set()
    for attribute in dir(modeling_auto):
        if attribute.startswith("MODEL_") and attribute.endswith("_MAPPING_NAMES"):
            for classes in getattr(modeling_auto, attribute).values():
                names.update([classes] if isinstance(classes, str) else classes)
    return frozenset(names)


def geometry_of(config: Mapping[str, Any], name: str = "model") -> ModelGeometry:
    """The geometry of a config.json as a user or a hub supplies it: filled as vLLM fills it, then read. An
    architecture outside vLLM's registry that transformers ships is read as vLLM's Transformers backend serves it
    (vllm/model_executor/models/registry.py falls back to it for a class transformers has)."""
    filled = filled_config(config, name)
    architectures = filled.get("architectures") if isinstance(filled, Mapping) else None
    architecture = architectures[0] if isinstance(architectures, list) and architectures else None
    known = isinstance(architecture, str) and architecture in _transformers_model_classes()
    return geometry_from_config(filled, name, transformers_class=known)


def _read_config_map(source: ModelSource, read_config_map: ConfigMapReader | None) -> dict[str, Any]:
    name, key = source.config_map or ("", "")
    if read_config_map is None:
        raise ModelGeometryUnknown(f"{source.name}: modelConfig.configMapRef {name} cannot be read here; "
                                   "pass the config.json with --model-config")
    text = read_config_map(name, key)
    if text is None:
        raise ModelGeometryUnknown(f"{source.name}: ConfigMap {name} with key {key} not found")
    return parse_config_text(text, f"{source.name}: ConfigMap {name} key {key}")
