"""A hostPath disk tier only in the node directories the operator's administrator allows (none by default): the
setting from the operator's environment, the spec's own refusals (dot segments, `/`, system directories) in the
CRD and the operator, and the real operator (`kopf run`) planning an allowed directory and refusing the rest
with a condition."""
from __future__ import annotations

import json

import pytest
from spillway.controller.facts import summarize_node
from spillway.controller.manifests import desired
from spillway.controller.settings import OperatorSettings
from spillway.core import disk_tier as dt
from spillway.core import k8s_names as names
from spillway.core.errors import InvalidSpec, SpillwayError
from support.crd_schema import admit
from support.ms_cluster import Operator, eventually
from support.ms_examples import gpu_node, modelserver

ALLOWED = ("/mnt/nvme/spillway", "/data/kv")


def on_host(path: str) -> dict:
    return {"disk": {"enabled": True, "volume": {"hostPath": {"path": path, "capacity": "8Ti"}}}}


def test_the_setting_is_a_json_list_of_plain_directories_and_none_by_default():
    assert OperatorSettings.from_environ({}).disk_host_path_prefixes == ()
    given = OperatorSettings.from_environ({names.ENV_DISK_HOST_PATH_PREFIXES: json.dumps(list(ALLOWED))})
    assert given.disk_host_path_prefixes == ALLOWED
    for bad, words in (("/mnt/nvme", "a JSON list"), ('["relative"]', "absolute"), ('["/"]', "plainly"),
                       ('["/mnt/../etc"]', "plainly"), ('["/var/lib"]', "above the node's /var/lib/kubelet"),
                       ('["/etc/kv"]', "in the node's /etc"), ("[1]", "a JSON list")):
        with pytest.raises(SpillwayError) as caught:
            OperatorSettings.from_environ({names.ENV_DISK_HOST_PATH_PREFIXES: bad})
        message = str(caught.value)
        assert message.startswith(names.ENV_DISK_HOST_PATH_PREFIXES) and words in message and "\n" not in message


@pytest.mark.parametrize(("path", "words", "schema_refuses"), [
    ("/", "plainly", True),
    ("/mnt/../etc", "plainly", True),
    ("/mnt/./kv", "plainly", True),
    ("/mnt//kv", "plainly", True),
    ("/mnt/kv/", "plainly", True),
    ("/var/lib/kubelet", "in the node's /var/lib/kubelet", False),
    ("/var/lib/kubelet/pods/x", "in the node's /var/lib/kubelet", False),
    ("/var", "above the node's /var/lib/kubelet", False),
    ("/etc", "in the node's /etc", False),
    ("relative/kv", "absolute", True),
])
def test_the_spec_refuses_what_no_administrator_may_allow(path, words, schema_refuses):
    body = modelserver(offload=on_host(path))
    assert bool(admit(body)[1]) is schema_refuses
    with pytest.raises(InvalidSpec) as caught:
        desired(body, [summarize_node(gpu_node("gpu-a"))])
    assert words in str(caught.value) and len(str(caught.value).splitlines()) == 1


def test_only_directories_in_or_under_an_allowed_one_pass():
    def check(path: str, prefixes=ALLOWED) -> None:
        dt.check_host_path_allowed(dt.DiskVolume(dt.HOST_PATH, "8Ti", host_path=path), prefixes)

    for path in ("/mnt/nvme/spillway", "/mnt/nvme/spillway/llama", "/data/kv/a/b"):
        check(path)
    for path in ("/mnt/nvme", "/mnt/nvme/spillway-other", "/data", "/srv/kv"):
        with pytest.raises(dt.DiskHostPathNotAllowed, match="under none of the directories this operator allows"):
            check(path)
    with pytest.raises(dt.DiskHostPathNotAllowed, match=f"allows no node directory.*{names.CHART_VALUE_DISK_HOST_PATH_PREFIXES}"):
        check("/mnt/nvme/spillway", ())
    dt.check_host_path_allowed(dt.DiskVolume(dt.EMPTY_DIR), ())  # other volumes are not the setting's


# -- through the real operator, with the administrator's directories ---------------------------------------------

@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory):
    running = Operator(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "kopf.log",
                       {names.ENV_RETRY_SECONDS: "1",
                        names.ENV_DISK_HOST_PATH_PREFIXES: json.dumps(list(ALLOWED))}).start()
    yield running
    alive = running.alive()
    running.kill()
    assert alive, "the operator died during the tests:\n" + running.output()[-5000:]


def test_the_operator_plans_an_allowed_directory_and_refuses_another(api):
    api.node("a")
    api.modelserver("inside", offload=on_host("/mnt/nvme/spillway/llama"))
    api.planned("inside", status="True")
    volumes = eventually(lambda: api.deployment("inside"))["spec"]["template"]["spec"]["volumes"]
    assert {"name": dt.VOLUME_NAME, "hostPath": {"path": "/mnt/nvme/spillway/llama", "type": "DirectoryOrCreate"}} \
        in volumes

    api.modelserver("outside", offload=on_host("/srv/kv"))
    refused = api.planned("outside", status="False", reason="DiskHostPathNotAllowed")
    assert "/srv/kv is under none of the directories this operator allows for a disk tier (/mnt/nvme/spillway, /data/kv" \
        in refused["message"]
    assert api.deployment("outside") is None
