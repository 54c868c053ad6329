"""Status writes through the real operator (`kopf run` against the API emulator) when the API server fails a
write: a Deployment event is delivered once and never again, so a status write it loses would leave Ready wrong
until the next event; the operator retries the write instead."""
from __future__ import annotations

import threading

import aiohttp.web
import pytest
from harness import Api, EmulatedCluster, eventually
from support.ms_cluster import Apiserver

_failing = threading.Event()
_failed: list[str] = []


def _ready_write(request) -> bool:
    """The status write that says the replica is ready."""
    data = request.data if isinstance(request.data, dict) else {}
    return (request.method == "PATCH" and str(request.url.path).endswith("/status")
            and (data.get("status") or {}).get("ready") == "1/1")


class _FailingApiserver(Apiserver):
    """The emulator, failing the ready write while `_failing` is set, before anything is stored (kmock stores a
    write whatever a reaction of its own answers, so `<< 503` would not lose it)."""

    async def _handle(self, request):
        if _failing.is_set() and _ready_write(request):
            _failed.append(str(request.url.path))
            return aiohttp.web.json_response({"kind": "Status", "code": 503, "reason": "ServiceUnavailable"},
                                             status=503)
        return await super()._handle(request)


class _FailingCluster(EmulatedCluster):
    def new_emulator(self):
        return _FailingApiserver()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with _FailingCluster(tmp_path_factory.mktemp("kmock")) as emulated:
        yield emulated


def test_a_status_write_the_api_server_fails_is_retried(cluster, operator):
    api = Api(cluster)
    api.node("a")
    api.modelserver()
    api.planned(status="True")
    eventually(api.deployment)
    assert api.condition("Ready")["status"] == "False"

    _failing.set()
    api.apps.patch_namespaced_deployment_status("llama", api.namespace, {"status": {"replicas": 1, "readyReplicas": 1}})
    eventually(lambda: _failed, interval=0.02, what="the ready write answered 503")
    _failing.clear()  # the API server is back: only a retry of the lost write can bring the news
    ready = eventually(lambda: (c := api.condition("Ready")) and c["status"] == "True" and c, timeout=30,
                       what="Ready=True written after the failed write")
    assert ready["reason"] == "ReplicasReady" and api.get()["status"]["ready"] == "1/1"
    assert _failed == [f"/apis/spillway.dev/v1alpha1/namespaces/{api.namespace}/modelservers/llama/status"]
