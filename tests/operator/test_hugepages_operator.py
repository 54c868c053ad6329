"""offload.size auto on a node's huge pages through the real operator (`kopf run`) against the kmock API emulator:
the status and the Deployment carry the pool the node's hugepages-2Mi hold, and a node class without them, once it
joins, brings every pod back to the memory pool."""
from __future__ import annotations

from spillway.adapters.model_config import resolve_geometry
from spillway.controller.facts import summarize_node
from spillway.controller.spec import parse_spec
from spillway.core import k8s_names as names
from spillway.core.planner import plan
from spillway.core.quantity import GiB, parse_bytes
from support.ms_api import Api
from support.ms_cluster import eventually
from support.ms_examples import LLAMA_8B, gpu_node


def hugepage_node(api: Api, name: str, hugepages: str | None) -> dict:
    body = gpu_node(f"{api.pool}-{name}", "400Gi", 8, labels={"pool": api.pool})
    if hugepages is not None:
        for part in ("capacity", "allocatable"):
            body["status"][part][names.HUGEPAGES_2MI_RESOURCE] = hugepages
    api.core.create_node(body)
    return body


def resources(api: Api) -> dict:
    return eventually(api.deployment)["spec"]["template"]["spec"]["containers"][0]["resources"]


def test_auto_takes_the_huge_page_share_and_gives_it_back_when_a_node_without_them_joins(api):
    hugepage_node(api, "a", "1600Gi")
    api.modelserver()
    api.planned(status="True")
    plan_status = api.get()["status"]["plan"]
    assert plan_status["offloadBytes"] == 200 * GiB, plan_status  # the memory share alone held 32.41 GiB
    assert plan_status["poolPages"].startswith("2 MiB huge pages: auto sized the pool from node "), plan_status
    limits = resources(api)["limits"]
    assert limits[names.HUGEPAGES_2MI_RESOURCE] == "204800Mi"
    assert 8 * parse_bytes(limits["memory"]) <= 400 * GiB

    plain = hugepage_node(api, "b", None)
    want = plan(resolve_geometry(LLAMA_8B), parse_spec(api.get()["spec"]).request, summarize_node(plain).facts())
    eventually(lambda: api.get()["status"]["plan"]["offloadBytes"] == want.pool.bytes, what="the memory pool")
    assert api.get()["status"]["plan"]["poolPages"].startswith("4 KiB pages: the hugepages-2Mi of node(s) ")
    eventually(lambda: names.HUGEPAGES_2MI_RESOURCE not in resources(api)["limits"], what="no huge pages asked")


def test_a_size_only_huge_pages_hold_is_planned_on_them_and_one_neither_holds_is_degraded_naming_both(api):
    hugepage_node(api, "a", "1600Gi")
    api.modelserver(offload={"size": "200Gi"})
    api.planned(status="True")
    plan_status = api.get()["status"]["plan"]
    assert plan_status["offloadBytes"] == 200 * GiB, plan_status  # the memory share alone holds 32.41 GiB
    assert "more than the 32.41 GiB its memory share holds" in plan_status["poolPages"], plan_status
    assert resources(api)["limits"][names.HUGEPAGES_2MI_RESOURCE] == "204800Mi"

    api.patch({"spec": {"offload": {"size": "500Gi"}}})
    refused = api.planned(status="False", reason="PoolDoesNotFit")
    assert refused["message"].endswith("the largest pool that fits is 32.41 GiB in memory and 200.0 GiB on its "
                                       "hugepages-2Mi (200.0 GiB per replica, whole 2 MiB pages of rows)"), refused
