"""The committed dashboards type-check against Grafana's own schema types (`@grafana/schema` + `tsc --strict`)."""
from __future__ import annotations

import copy

from grafana_schema import typecheck
from obs_files import load_boards


def test_committed_dashboards_match_grafanas_schema(tmp_path):
    boards = load_boards()
    assert boards
    result = typecheck(boards, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_key_the_schema_lacks_fails_the_check(tmp_path):
    """What the generator once wrote: interval-variable fields on every template variable."""
    name, board = next(iter(load_boards().items()))
    board = copy.deepcopy(board)
    board["templating"]["list"][0]["auto_count"] = 30
    board["panels"][0]["gridPos"]["w"] = "24"
    result = typecheck({name: board}, tmp_path)
    assert result.returncode != 0
    assert "'\"auto_count\"' does not exist in type 'VariableModel'" in result.stdout, result.stdout
    assert "Type 'string' is not assignable to type 'number'" in result.stdout, result.stdout
