"""The operator's settings from its pod's environment: defaults, the chart's values, one line for a bad value,
read when the operator starts (not when kopf imports its handlers)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from spillway.controller.settings import OperatorSettings
from spillway.core import k8s_names as names
from spillway.core.errors import SpillwayError
from support.ms_cluster import REPO, Operator


def test_an_empty_environment_gives_the_defaults():
    settings = OperatorSettings.from_environ({})
    assert settings == OperatorSettings()
    assert (settings.retry_seconds, settings.metrics_port, settings.allow_hub_fetch, settings.pod_monitors,
            settings.router_image) == (30.0, None, False, True, names.DEFAULT_ROUTER_IMAGE)


def test_each_variable_sets_its_field():
    settings = OperatorSettings.from_environ({
        names.ENV_RETRY_SECONDS: "1.5", names.ENV_METRICS_PORT: "8080", names.ENV_ALLOW_HUB_FETCH: "TRUE",
        names.ENV_POD_MONITORS: "false", names.ENV_ROUTER_IMAGE: "registry.example/router:1",
        names.ENV_RESYNC_SECONDS: "60", names.ENV_API_TIMEOUT_SECONDS: "5"})
    assert settings == OperatorSettings(retry_seconds=1.5, metrics_port=8080, allow_hub_fetch=True,
                                        pod_monitors=False, router_image="registry.example/router:1",
                                        resync_seconds=60.0, api_timeout_seconds=5.0)


@pytest.mark.parametrize(("name", "value"), [
    (names.ENV_RETRY_SECONDS, "soon"), (names.ENV_RETRY_SECONDS, "-1"), (names.ENV_METRICS_PORT, "80.5"),
    (names.ENV_POD_MONITORS, "yes"), (names.ENV_RESYNC_SECONDS, "0"), (names.ENV_RESYNC_SECONDS, "nan"),
    (names.ENV_API_TIMEOUT_SECONDS, "inf"), (names.ENV_API_TIMEOUT_SECONDS, "-3"),
])
def test_a_bad_value_is_one_line_naming_the_variable(name, value):
    with pytest.raises(SpillwayError) as caught:
        OperatorSettings.from_environ({name: value})
    message = str(caught.value)
    assert message.startswith(f"{name}=") and "\n" not in message


def test_importing_the_handlers_reads_no_setting():
    """kopf imports the module before it runs anything: the import must not read (or fail on) the environment."""
    env = dict(os.environ, **{names.ENV_RETRY_SECONDS: "soon"})
    done = subprocess.run([sys.executable, "-c", "import spillway.controller.handlers"], env=env, cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("name", "value"), [(names.ENV_RETRY_SECONDS, "soon"), (names.ENV_POD_MONITORS, "yes")])
def test_a_bad_setting_stops_the_operator_with_one_line(tmp_path, name, value):
    """The startup handler reads the settings: a bad one ends `kopf run` with status 1 and one line naming the
    variable, before any cluster is asked anything (the kubeconfig does not even exist)."""
    operator = Operator(tmp_path / "no-kubeconfig", tmp_path / "kopf.log", {name: value}).start()
    assert operator.process is not None
    try:
        status = operator.process.wait(120)
    finally:
        operator.kill()
    output = operator.output()
    assert status == 1, output
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if f"{name}=" in line]
    assert len(lines) == 1 and "the operator does not start" in lines[0], output
