"""Re-releases resolve to their base's geometry by an explicit alias table, never by matching names loosely."""
from __future__ import annotations

import pytest
from spillway.adapters.model_config import catalog_aliases, catalog_config, resolve_geometry
from spillway.core.errors import ModelGeometryUnknown
from spillway.core.groups import kv_groups

# Fields an alias may change: none of them is read for the KV geometry (core/model_facts.py), only for the
# default max_model_len the tokens held are counted at.
NON_GEOMETRY_FIELDS = {"max_position_embeddings"}


@pytest.mark.parametrize("alias", sorted(catalog_aliases()))
def test_an_alias_has_its_base_geometry(alias):
    entry = catalog_aliases()[alias]
    assert set(entry["differs"]) <= NON_GEOMETRY_FIELDS
    base = catalog_config(entry["base"])
    assert base is not None, f"{alias}: base {entry['base']} is not in the catalog"
    ours, theirs = resolve_geometry(alias), resolve_geometry(entry["base"])
    assert (ours.num_layers, ours.num_kv_heads, ours.head_dim, ours.attention) == \
        (theirs.num_layers, theirs.num_kv_heads, theirs.head_dim, theirs.attention)
    assert kv_groups(ours.facts, (0, 33)) == kv_groups(theirs.facts, (0, 33))
    for field, value in entry["differs"].items():
        assert catalog_config(alias)[field] == value


def test_ids_match_exactly_not_by_pattern():
    assert resolve_geometry("deepseek-ai/DeepSeek-R1-0528").num_layers == 61
    for near_miss in ("deepseek-ai/DeepSeek-R1-0529", "Qwen/Qwen3-235B-A22B-Instruct-2508", "Qwen/Qwen3-30B-A3B-2507"):
        with pytest.raises(ModelGeometryUnknown, match="not in Spillway's catalog"):
            resolve_geometry(near_miss)
