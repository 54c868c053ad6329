"""The coverage truth's configs as a publisher ships them: without the fields transformers fills.

A truth config is its config class's to_dict(), every default written out; a published config.json carries only
what its publisher set, and vLLM (through transformers' config class) fills the rest. `shipped(config)` drops, one
at a time, every field (top level, and inside a multimodal wrapper's language-model config) whose value the
class fills back identically when the field is absent, layer_types derived from the layer count and pattern
included. test_coverage.py fills each such config as the planner does (adapters.model_config.filled_config) and
checks the planner's answer against vLLM's again, so a default the reader misses cannot pass.

    python tests/planner/coverage/shipped.py          # rewrite the "shipped" entries of truth.json (make coverage-truth)
    python tests/planner/coverage/shipped.py ARCH ... # only these
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRUTH = HERE / "truth.json"
NESTED = ("text_config", "llm_config", "language_config", "thinker_config")
KEEP = {"architectures", "model_type"}  # what identifies the class: every published config.json carries them


def _filled(config: dict) -> dict:
    from spillway.adapters.model_config import filled_config

    return dict(filled_config(config))


def shipped(config: dict) -> dict | None:
    """The smallest config transformers fills back to `config` field by field, or None where transformers does not
    build it (a model type vLLM configures itself, or one transformers lacks: read as written, nothing to drop)."""
    from spillway.adapters.model_config import VLLM_CONFIG_TYPES, _config_classes

    model_type = config.get("model_type")
    classes = _config_classes()
    if classes is None or model_type in VLLM_CONFIG_TYPES or model_type not in classes:
        return None
    try:
        full = _filled(config)
    except Exception:  # noqa: BLE001 - a config its class refuses has no shipped form
        return None
    out = json.loads(json.dumps(config))
    wrapper = any(isinstance(out.get(key), dict) for key in NESTED)
    for key in list(out):
        if wrapper and key not in NESTED:
            continue  # a wrapper's own fields and towers keep no KV cache: only its language model's are dropped
        if key in KEEP:
            continue
        if key in NESTED and isinstance(out[key], dict):
            inner_type = out[key].get("model_type")
            if inner_type in classes and inner_type not in VLLM_CONFIG_TYPES:
                # the wrapper builds its language model's config with that model type's class: drop its filled
                # fields against that class alone (the whole wrapper, its towers too, costs 50x as much to build)
                inner = shipped(out[key])
                trial = {**out, key: inner} if inner else out
                # kept only where the wrapper fills it back to the same config (a wrapper may build its language
                # model with a class of its own, whose defaults differ from the nested model type's)
                if inner and _fills_back(trial, full, key, out[key]):
                    out = trial
            continue
        trial = {k: v for k, v in out.items() if k != key}
        if _same(trial, full, (key,)):
            out = trial
    return out


_ABSENT = object()


def _at(config: dict, path: tuple[str, ...]):
    for part in path:
        config = config.get(part, _ABSENT) if isinstance(config, dict) else _ABSENT
    return config


def _same(trial: dict, full: dict, path: tuple[str, ...]) -> bool:
    """Whether `trial` (one field fewer) fills back to that field's value in `full`."""
    try:
        filled = _filled(trial)
    except Exception:  # noqa: BLE001 - the class needs the field
        return False
    return _at(filled, path) == _at(full, path)


def _fills_back(trial: dict, full: dict, key: str, fields: dict) -> bool:
    try:
        filled = _filled(trial)
    except Exception:  # noqa: BLE001 - the wrapper needs what was dropped
        return False
    return all(_at(filled, (key, field)) == _at(full, (key, field)) for field in fields)


def recorded_config(arch: str, entry: dict) -> dict:
    """The config whose layers the truth recorded: a wrapper recorded from its language model (configs.py
    LANGUAGE_MODELS) was recorded from that model's own config."""
    from configs import LANGUAGE_MODELS, language_model_config

    if arch in LANGUAGE_MODELS and "language model" in (entry.get("specs_from") or ""):
        return language_model_config(arch, entry["config"])
    return entry["config"]


def main() -> None:
    truth = json.loads(TRUTH.read_text())
    only = set(sys.argv[1:])
    count = 0
    for arch, entry in truth["architectures"].items():
        if only and arch not in only:
            count += "shipped" in entry
            continue
        entry.pop("shipped", None)
        if "vllm" in entry and "config" in entry:
            form = shipped(recorded_config(arch, entry))
            if form is not None:
                entry["shipped"] = form
                count += 1
    TRUTH.write_text(json.dumps(truth, indent=0) + "\n")
    print(f"{count} shipped configs -> {TRUTH}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
