"""One model-source resolver for `spillway plan` and the operator: the same order, the same hub rule."""
from __future__ import annotations

import json

import pytest
from spillway.adapters.model_config import catalog_config, resolve_geometry
from spillway.controller.spec import parse_spec
from spillway.core.errors import InvalidSpec, ModelGeometryUnknown
from spillway.core.model_source import ModelSource, Origin, looks_like_hub_id, origin

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA = catalog_config(LLAMA_8B)


def layers(n: int) -> dict:
    return {**LLAMA, "num_hidden_layers": n}


def test_an_explicit_config_wins_over_the_catalog_and_the_hub():
    inline = ModelSource(LLAMA_8B, inline=layers(7))
    assert origin(inline, in_catalog=True, hub_allowed=True) is Origin.INLINE
    assert origin(ModelSource(LLAMA_8B, config_map=("cfg", "k")), True, True) is Origin.CONFIG_MAP
    assert origin(ModelSource(config_file="x/config.json"), False, True) is Origin.FILE
    assert origin(ModelSource(LLAMA_8B), in_catalog=True, hub_allowed=True) is Origin.CATALOG
    assert origin(ModelSource("acme/private"), in_catalog=False, hub_allowed=True) is Origin.HUB
    assert resolve_geometry(inline, fetch_hub=lambda m, r: pytest.fail("hub asked")).num_layers == 7


def test_the_spec_and_the_command_line_resolve_alike(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(layers(9)))
    from_file = resolve_geometry(ModelSource("acme/x", config_file=str(tmp_path)))
    spec = parse_spec({"model": "acme/x", "modelConfig": {"configMapRef": {"name": "cfg", "key": "c.json"}}})
    reads = []
    from_cm = resolve_geometry(spec.model_source(), lambda n, k: reads.append((n, k)) or json.dumps(layers(9)))
    assert from_file == from_cm and from_cm.num_layers == 9 and reads == [("cfg", "c.json")]
    assert resolve_geometry(parse_spec({"model": LLAMA_8B}).model_source()) == resolve_geometry(LLAMA_8B)


def test_config_map_failures_name_the_config_map():
    source = parse_spec({"model": "acme/x", "modelConfig": {"configMapRef": {"name": "cfg", "key": "c.json"}}})
    with pytest.raises(ModelGeometryUnknown, match="ConfigMap cfg with key c.json not found"):
        resolve_geometry(source.model_source(), lambda n, k: None)
    with pytest.raises(ModelGeometryUnknown, match="ConfigMap cfg key c.json: malformed JSON at line 1"):
        resolve_geometry(source.model_source(), lambda n, k: "{nope")
    with pytest.raises(ModelGeometryUnknown, match="cannot be read here"):
        resolve_geometry(source.model_source())
    with pytest.raises(ModelGeometryUnknown, match="must be a JSON object"):
        resolve_geometry(source.model_source(), lambda n, k: "[1, 2]")


def test_the_hub_is_asked_only_when_allowed_and_only_for_hub_ids():
    asked = []
    hub = lambda model, rev: asked.append((model, rev)) or layers(5)
    unknown = parse_spec({"model": "acme/private-70b", "revision": "v2"}).model_source()
    with pytest.raises(ModelGeometryUnknown, match="not in Spillway's catalog and hub fetches are off"):
        resolve_geometry(unknown)
    assert resolve_geometry(unknown, fetch_hub=hub).num_layers == 5 and asked == [("acme/private-70b", "v2")]
    for local in ("/models/llama", "./llama", "s3://bucket/llama", "llama"):
        assert not looks_like_hub_id(local)
        with pytest.raises(ModelGeometryUnknown, match="is not a hub id"):
            resolve_geometry(ModelSource(local), fetch_hub=hub)
    assert asked == [("acme/private-70b", "v2")]


def test_no_model_and_no_config_is_refused():
    with pytest.raises(InvalidSpec, match="no model given"):
        resolve_geometry(ModelSource())
