"""spec.autoscaling: the HPA validated against the Kubernetes API (kubernetes-validate, strict), the KEDA
ScaledObject checked for the structure of KEDA's v1alpha1 API (no schema of KEDA's is vendored here: its shape
is asserted field by field), the replica bound from the eligible nodes, the Deployment left to the autoscaler,
and the triggers' PromQL run by promtool against recorded series."""
from __future__ import annotations

import subprocess

import kubernetes_validate
import pytest
import yaml
from spillway.controller import autoscaling as S
from spillway.controller.facts import summarize_node
from spillway.controller.manifests import desired
from spillway.core.errors import InvalidSpec
from support.ms_examples import gpu_node, modelserver
from support.tools import require_binary

KUBERNETES_VERSIONS = ("1.30", "1.37")


def render(autoscaling: dict, nodes=("g1", "g2"), gpus: int = 8, **spec):
    body = modelserver(replicas=2, autoscaling=autoscaling, **spec)
    body["metadata"]["uid"] = "0b8f5f5e-0000-4000-8000-000000000000"
    return {(o["kind"], o["metadata"]["name"]): o
            for o in desired(body, [summarize_node(gpu_node(n, gpus=gpus)) for n in nodes]).objects}


def test_the_hpa_validates_and_scales_on_the_pods_signals():
    objects = render({"minReplicas": 2, "maxReplicas": 6, "queueDepthPerReplica": 3, "kvCacheUsage": 0.85})
    hpa = objects[("HorizontalPodAutoscaler", "llama")]
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(hpa, version, strict=True)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"] for m in hpa["spec"]["metrics"]}
    assert targets == {"vllm_num_requests_waiting": "3", "vllm_kv_cache_usage_perc": "850m"}
    assert "replicas" not in objects[("Deployment", "llama")]["spec"]  # the autoscaler owns the count
    assert hpa["metadata"]["ownerReferences"][0]["uid"]


def test_max_replicas_is_what_the_eligible_nodes_can_host():
    hpa = render({"maxReplicas": 100}, nodes=("a", "b", "c"), gpus=4)[("HorizontalPodAutoscaler", "llama")]
    assert hpa["spec"]["maxReplicas"] == 12  # 3 nodes x 4 GPUs, one GPU a replica
    hpa = render({"maxReplicas": 100}, nodes=("a", "b"), gpus=8, tensorParallelSize=4,
                 replicasPerNode=1)[("HorizontalPodAutoscaler", "llama")]
    assert hpa["spec"]["maxReplicas"] == 2
    with pytest.raises(InvalidSpec, match="more than the eligible nodes can host"):
        render({"minReplicas": 20, "maxReplicas": 30}, nodes=("a",), gpus=8)


def test_the_keda_scaled_object_has_keda_s_structure():
    objects = render({"provider": "keda", "maxReplicas": 4, "prometheusAddress": "http://prom.monitoring.svc:9090"})
    scaled = objects[("ScaledObject", "llama")]
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = scaled["spec"]
    assert set(spec) == {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "triggers"}
    assert spec["scaleTargetRef"]["name"] == "llama" and (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 4)
    for trigger in spec["triggers"]:
        assert trigger["type"] == "prometheus" and set(trigger) == {"type", "name", "metadata"}
        assert set(trigger["metadata"]) == {"serverAddress", "query", "threshold"}
        assert all(isinstance(v, str) for v in trigger["metadata"].values())  # KEDA's metadata is map[string]string
    assert ("HorizontalPodAutoscaler", "llama") not in objects  # KEDA makes its own
    assert "replicas" not in objects[("Deployment", "llama")]["spec"]


@pytest.mark.parametrize("autoscaling, message", [
    ({"minReplicas": 2}, "maxReplicas is required"),
    ({"maxReplicas": 2, "minReplicas": 3}, "below minReplicas"),
    ({"maxReplicas": 0}, "maxReplicas must be"),
    ({"maxReplicas": 2, "kvCacheUsage": 1.5}, "kvCacheUsage"),
    ({"maxReplicas": 2, "queueDepthPerReplica": float("nan")}, "queueDepthPerReplica"),
    ({"maxReplicas": 2, "provider": "keda"}, "prometheusAddress must be"),
    ({"maxReplicas": 2, "provider": "keda", "prometheusAddress": 'http://x"}) or vector(1'}, "prometheusAddress"),
    ({"maxReplicas": 2, "prometheusAddress": "http://p:9090"}, "KEDA's"),
    ({"maxReplicas": 2, "provider": "vpa"}, "provider must be"),
    ({"maxReplicas": 2, "speed": 1}, "speed"),
])
def test_bad_autoscaling_is_refused(autoscaling, message):
    with pytest.raises(InvalidSpec, match=message):
        render(autoscaling)


def test_the_triggers_promql_counts_this_modelservers_pods_only(tmp_path):
    """promtool evaluates the two queries over recorded series: two pods of this ModelServer, one of another
    whose name starts alike, one in another namespace."""
    found = S.queries("team-a", "llama")
    waiting, usage = "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
    series = []
    for metric, values in ((waiting, ("3", "5", "100", "100")), (usage, ("0.5", "0.75", "1", "1"))):
        for (namespace, pod), value in zip((("team-a", "llama-5d9c7b8f6-abcde"), ("team-a", "llama-5d9c7b8f6-fghij"),
                                            ("team-a", "llama-big-5d9c7b8f6-zzzzz"), ("team-b", "llama-5d9c7b8f6-abcde")),
                                           values):
            series.append({"series": f'{metric}{{namespace="{namespace}",pod="{pod}"}}', "values": f"{value}x5"})
    rules = {"groups": [{"name": "autoscaling", "rules": [{"record": "queue", "expr": found["queue"]},
                                                           {"record": "kv", "expr": found["kv"]}]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": found["queue"], "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": 8}]},
                             {"expr": found["kv"], "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": 1.25}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    promtool = require_binary("promtool")
    check = subprocess.run([promtool, "check", "rules", "rules.yaml"], check=False, cwd=tmp_path,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    done = subprocess.run([promtool, "test", "rules", "test.yaml"], check=False, cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
