"""The emulated cluster, the running operator and a client for one test's namespace that the operator-level
suites share (a pytest plugin, registered in tests/conftest.py). A module that needs other operator settings
defines its own `operator`; `api` then talks to that one."""
from __future__ import annotations

import socket

import pytest
from spillway.core import k8s_names as names

from support.ms_api import Api
from support.ms_cluster import EmulatedCluster, Operator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EmulatedCluster(tmp_path_factory.mktemp("kmock")) as emulated:
        yield emulated


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory):
    """`kopf run` with a one-second retry (tests wait on re-plans) and its /metrics on `operator.metrics_port`."""
    port = free_port()
    running = Operator(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "kopf.log",
                       {names.ENV_RETRY_SECONDS: "1", names.ENV_METRICS_PORT: str(port)}).start()
    running.metrics_port = port
    yield running
    alive = running.alive()
    running.kill()
    # A handler may fail a resource, never the process: a dead operator fails the module that killed it.
    assert alive, "the operator died during the tests:\n" + running.output()[-5000:]


@pytest.fixture()
def api(cluster, operator):
    """A fresh namespace and node pool of the running operator's cluster, for one test."""
    return Api(cluster)
