"""operator.diskTier.hostPathPrefixes: none by default, the operator's setting when given (rendered by Helm 4 and
Helm 3, read back by the operator's own settings parser), refused by the values schema when not a plain directory."""
from __future__ import annotations

import pytest
from spillway.controller.settings import OperatorSettings
from spillway.core import k8s_names as names
from support.chart_render import operator_container, render, render_failure


def env(docs: list[dict]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in operator_container(docs)["env"]}


def test_no_directory_is_allowed_by_default(helm):
    rendered = env(render(helm))
    assert names.ENV_DISK_HOST_PATH_PREFIXES not in rendered
    assert OperatorSettings.from_environ(rendered).disk_host_path_prefixes == ()


def test_the_listed_directories_reach_the_operator(helm):
    listed = ["/mnt/nvme/spillway", "/data/kv cache"]
    rendered = env(render(helm, {"operator": {"diskTier": {"hostPathPrefixes": listed}}}))
    assert OperatorSettings.from_environ(rendered).disk_host_path_prefixes == tuple(listed)


@pytest.mark.parametrize("bad", ["/", "/mnt/../etc", "/mnt/./kv", "relative", "/mnt/kv/", "//mnt"])
def test_the_schema_refuses_a_directory_not_named_plainly(helm, bad):
    assert "hostPathPrefixes" in render_failure(helm, {"operator": {"diskTier": {"hostPathPrefixes": [bad]}}})
