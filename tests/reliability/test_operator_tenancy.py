"""The real operator (`kopf run`) over an emulated API that can be made slow: a status someone else wrote is
replaced within one resync, a ModelServer deleted during its reconcile is no longer written, and a read that
times out is retried to a plan rather than left an InternalError. Each test starts its own operator, with the
settings it is about (a short resync would mask the timeout's retry)."""
from __future__ import annotations

import asyncio
import time

import attrs
import kmock
import pytest
from harness import Api, eventually, names
from support.ms_cluster import Apiserver, EmulatedCluster, Operator
from support.operator_fixtures import free_port


@attrs.define(kw_only=True)
class SlowApiserver(Apiserver):
    """Requests whose method and path match a rule wait `seconds` before the answer, `count` times."""

    rules: list = attrs.field(factory=list)  # [method, path part, seconds, count left]

    async def _handle(self, request: kmock.Request):
        for rule in self.rules:
            method, part, seconds, left = rule
            if left > 0 and request.method == method and part in str(request.url.path):
                rule[3] -= 1
                await asyncio.sleep(seconds)
                break
        return await super()._handle(request)


class SlowCluster(EmulatedCluster):
    def new_emulator(self) -> kmock.KubernetesEmulator:
        return SlowApiserver()

    def slow(self, method: str, part: str, seconds: float, count: int = 1_000_000) -> None:
        self.call(lambda: self.emulator.rules.append([method, part, seconds, count]))

    def writes(self, part: str) -> list[tuple[str, str]]:
        return self.call(lambda: [(m, str(r.url.path)) for r in self.emulator for m in ("PATCH", "POST", "PUT")
                                  if r.method == m and part in str(r.url.path)])


@pytest.fixture()
def cluster(tmp_path):
    with SlowCluster(tmp_path) as emulated:
        yield emulated


def start(cluster: SlowCluster, tmp_path, **env: str) -> Operator:
    return Operator(cluster.kubeconfig, tmp_path / "kopf.log",
                    {names.ENV_RETRY_SECONDS: "1", names.ENV_METRICS_PORT: str(free_port()), **env}).start()


@pytest.fixture()
def operator_factory(cluster, tmp_path):
    started = []

    def make(**env: str) -> Operator:
        started.append(start(cluster, tmp_path, **env))
        return started[-1]
    yield make
    for running in started:
        alive = running.alive()
        output = running.output()
        running.kill()
        assert alive, "the operator died:\n" + output[-5000:]
        assert "Traceback" not in output, output[-5000:]


def test_a_forged_status_is_replaced_within_one_resync(cluster, operator_factory):
    operator_factory(**{names.ENV_RESYNC_SECONDS: "2"})
    api = Api(cluster)
    api.node("a")
    api.modelserver()
    planned = api.planned(status="True")
    honest = api.get()["status"]
    forged = {"status": {"plan": {"memoryLimit": "9999Gi", "cachedTokens": 1}, "conditions": [
        {**planned, "message": "forged: planned for a node it never saw"}]}}
    api.custom.patch_namespaced_custom_object_status(names.GROUP, names.VERSION, api.namespace, names.PLURAL,
                                                     "llama", forged)
    assert api.get()["status"]["plan"]["memoryLimit"] == "9999Gi"
    back = eventually(lambda: (s := api.get()["status"])["plan"]["memoryLimit"] == honest["plan"]["memoryLimit"]
                      and s, timeout=20, what="the planned status back")
    assert back["plan"]["cachedTokens"] == honest["plan"]["cachedTokens"]
    assert api.condition("Planned")["message"] == planned["message"]


def test_a_modelserver_deleted_during_its_reconcile_is_no_longer_written(cluster, operator_factory):
    operator_factory()
    api = Api(cluster)
    api.node("a")
    cluster.slow("PATCH", f"/namespaces/{api.namespace}/", 1.5)  # each apply and status write takes 1.5 s
    cluster.slow("POST", f"/namespaces/{api.namespace}/", 1.5)
    api.modelserver(networkPolicy={"enabled": True})
    eventually(lambda: cluster.writes(f"/namespaces/{api.namespace}/deployments"), timeout=30,
               what="the Deployment's apply")
    api.custom.delete_namespaced_custom_object(names.GROUP, names.VERSION, api.namespace, names.PLURAL, "llama")
    at_delete = len(cluster.writes(f"/namespaces/{api.namespace}/"))
    time.sleep(8)  # longer than the rest of the reconcile's writes would take (Service, NetworkPolicy, status)
    # Events and kopf's own bookkeeping patch of the ModelServer aside: the planned objects and the status.
    after = [(m, p) for m, p in cluster.writes(f"/namespaces/{api.namespace}/")[at_delete:]
             if not p.endswith("/events") and not p.endswith("/modelservers/llama")]
    written = {p.removesuffix("/llama") for _, p in after}
    assert len(written) <= 1, after  # at most the apply the operator had in flight as it was deleted
    assert not [p for _, p in after if p.endswith("/status")], after


def test_a_read_that_times_out_is_retried_to_a_plan(cluster, operator_factory):
    """The name-conflict check's read of the Deployment times out once (a slow API server): the reconcile is
    retried, not left InternalError until the next event."""
    operator_factory(**{names.ENV_API_TIMEOUT_SECONDS: "1", names.ENV_RESYNC_SECONDS: "3600"})
    api = Api(cluster)
    api.node("a")
    # the client retries a timed-out read 3 times itself (urllib3's Retry): all four time out
    cluster.slow("GET", f"/namespaces/{api.namespace}/deployments/llama", 3, count=4)
    api.modelserver()
    planned = api.planned(status="True", timeout=40)
    assert planned["reason"] == "Planned"
    assert api.condition("Degraded")["reason"] != "InternalError"
