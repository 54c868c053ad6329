"""spec.autoscaling: the HPA validated against the Kubernetes API (kubernetes-validate, strict), the KEDA
ScaledObject admitted by KEDA's released CRD schema (v2.20.2, vendored in schemas/ with its provenance: strict
field validation, defaults and CEL rules as the API server applies them) and its prometheus triggers' metadata
decoded as KEDA's prometheus scaler decodes it, the provider chosen from what the API server serves, the
replica bound from the eligible nodes, the Deployment left to the autoscaler, and the triggers' PromQL run by
promtool against recorded series."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from spillway.controller import autoscaling as S
from spillway.controller.facts import summarize_node
from spillway.controller.manifests import desired
from spillway.core.errors import InvalidSpec
from support.crd_schema import admit
from support.ms_examples import gpu_node, modelserver
from support.tools import require_binary

KUBERNETES_VERSIONS = ("1.30", "1.37")
KEDA_SCHEMA = yaml.safe_load((Path(__file__).parent / "schemas" / "keda-v2.20.2-scaledobjects.schema.yaml").read_text())
# The trigger metadata KEDA v2.20.2's prometheus scaler reads (pkg/scalers/prometheus_scaler.go, its `keda:"name=..."`
# tags), the first three required; the CRD types metadata as map[string]string, so only the scaler checks names.
PROMETHEUS_REQUIRED = {"serverAddress", "query", "threshold"}
PROMETHEUS_OPTIONAL = {"queryParameters", "activationThreshold", "namespace", "customHeaders", "ignoreNullValues",
                       "unsafeSsl", "awsRegion", "timeout", "identityOwner"}
KEDA_ADDRESS = "http://prom.monitoring.svc:9090"


def result(autoscaling: dict, nodes=("g1", "g2"), gpus: int = 8, keda: bool | None = None, name: str = "llama",
           **spec):
    body = modelserver(name, replicas=2, autoscaling=autoscaling, **spec)
    body["metadata"]["uid"] = "0b8f5f5e-0000-4000-8000-000000000000"
    return desired(body, [summarize_node(gpu_node(n, gpus=gpus)) for n in nodes],
                   keda_served=None if keda is None else (lambda: keda))


def render(autoscaling: dict, nodes=("g1", "g2"), gpus: int = 8, keda: bool | None = None, **spec):
    return {(o["kind"], o["metadata"]["name"]): o for o in result(autoscaling, nodes, gpus, keda, **spec).objects}


def keda_errors(scaled: dict) -> list[str]:
    """What KEDA's CRD (as the API server applies it) and its prometheus scaler refuse in a ScaledObject."""
    _, errors = admit(scaled, KEDA_SCHEMA)
    for trigger in scaled["spec"]["triggers"]:
        if trigger.get("type") != "prometheus":
            continue
        meta = trigger["metadata"]
        errors += [f"trigger {trigger.get('name')}: {key} is not a prometheus scaler parameter"
                   for key in sorted(set(meta) - PROMETHEUS_REQUIRED - PROMETHEUS_OPTIONAL)]
        errors += [f"trigger {trigger.get('name')}: {key} is required" for key in sorted(PROMETHEUS_REQUIRED - set(meta))]
        for key in ("threshold", "activationThreshold"):
            try:  # the scaler's typed config decodes a float64 with json.Unmarshal
                if key in meta and not isinstance(json.loads(meta[key]), (int, float)):
                    raise ValueError
            except (ValueError, TypeError):
                errors.append(f"trigger {trigger.get('name')}: {key} {meta[key]!r} is not a float64")
    return errors


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


@pytest.mark.parametrize("autoscaling", [
    {"provider": "keda", "maxReplicas": 4, "prometheusAddress": KEDA_ADDRESS},
    {"maxReplicas": 4, "prometheusAddress": KEDA_ADDRESS},  # auto, KEDA served
    {"minReplicas": 3, "maxReplicas": 3, "queueDepthPerReplica": 2.5, "kvCacheUsage": 0.85,
     "prometheusAddress": "https://prometheus.example.com/"},
    {"minReplicas": 2, "maxReplicas": 100, "queueDepthPerReplica": 0.1, "kvCacheUsage": 0.05,
     "prometheusAddress": KEDA_ADDRESS},
])
def test_the_scaled_object_is_admitted_by_keda_s_released_crd(autoscaling):
    objects = render(autoscaling, keda=True)
    scaled = objects[("ScaledObject", "llama")]
    assert keda_errors(scaled) == []
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"}
    assert spec["minReplicaCount"] == autoscaling.get("minReplicas", 1)
    assert spec["maxReplicaCount"] == min(autoscaling["maxReplicas"], 16)  # 2 nodes x 8 GPUs
    thresholds = {t["name"]: float(t["metadata"]["threshold"]) for t in spec["triggers"]}
    assert thresholds == {"queue": autoscaling.get("queueDepthPerReplica", 4),
                          "kv-cache": autoscaling.get("kvCacheUsage", 0.9)}
    assert ("HorizontalPodAutoscaler", "llama") not in objects  # KEDA makes its own
    assert "replicas" not in objects[("Deployment", "llama")]["spec"]


@pytest.mark.parametrize("change, refused", [
    (lambda s: s.update(maxReplicas=s.pop("maxReplicaCount")), "Additional properties are not allowed ('maxReplicas'"),
    (lambda s: s["scaleTargetRef"].update(name=""), "should be non-empty"),
    (lambda s: s.update(minReplicaCount=5, maxReplicaCount=4), "minReplicaCount must be less than or equal to"),
    (lambda s: s.update(triggers=[]), "should be non-empty"),
    (lambda s: s["triggers"][0].update(metadata={**s["triggers"][0]["metadata"], "threshold": 4}),
     "4 is not of type 'string'"),
    (lambda s: s["triggers"][0].update(metadata={**s["triggers"][0]["metadata"], "threshold": "4000m"}),
     "threshold '4000m' is not a float64"),
    (lambda s: s["triggers"][1]["metadata"].update(serverAdress=s["triggers"][1]["metadata"].pop("serverAddress")),
     "serverAdress is not a prometheus scaler parameter"),
    (lambda s: s["triggers"][0].pop("type"), "'type' is a required property"),
])
def test_keda_s_crd_refuses_a_wrong_field(change, refused):
    """The check above can fail: each of these changes to a rendered ScaledObject is refused, with its reason."""
    scaled = render({"maxReplicas": 4, "prometheusAddress": KEDA_ADDRESS}, keda=True)[("ScaledObject", "llama")]
    change(scaled["spec"])
    errors = keda_errors(scaled)
    assert any(refused in e for e in errors), errors


@pytest.mark.parametrize("autoscaling, keda, name, kind, reason", [
    ({"maxReplicas": 4}, False, "llama", "HorizontalPodAutoscaler", S.REASON_KEDA_NOT_SERVED),
    ({"maxReplicas": 4, "prometheusAddress": KEDA_ADDRESS}, False, "llama", "HorizontalPodAutoscaler",
     S.REASON_KEDA_NOT_SERVED),
    ({"maxReplicas": 4, "prometheusAddress": KEDA_ADDRESS}, True, "llama", "ScaledObject", S.REASON_KEDA_SERVED),
    ({"maxReplicas": 4}, True, "llama", "HorizontalPodAutoscaler", S.REASON_NO_PROMETHEUS_ADDRESS),
    ({"maxReplicas": 4, "prometheusAddress": KEDA_ADDRESS}, True, "l" * 55, "HorizontalPodAutoscaler",
     S.REASON_NAME_TOO_LONG_FOR_KEDA),
    ({"maxReplicas": 4, "prometheusAddress": KEDA_ADDRESS}, True, "l" * 54, "ScaledObject", S.REASON_KEDA_SERVED),
    ({"maxReplicas": 4, "provider": "hpa"}, True, "llama", "HorizontalPodAutoscaler", S.REASON_HPA_CHOSEN),
    ({"maxReplicas": 4, "provider": "keda", "prometheusAddress": KEDA_ADDRESS}, True, "llama", "ScaledObject",
     S.REASON_KEDA_CHOSEN),
    ({"maxReplicas": 4, "provider": "keda", "prometheusAddress": KEDA_ADDRESS}, False, "llama", None,
     S.REASON_KEDA_MISSING),
    ({"maxReplicas": 4}, None, "llama", "HorizontalPodAutoscaler", S.REASON_KEDA_NOT_SERVED),  # spillway render
])
def test_the_provider_follows_the_spec_then_what_the_api_server_serves(autoscaling, keda, name, kind, reason):
    found = result(autoscaling, keda=keda, name=name)
    kinds = [o["kind"] for o in found.objects if o["kind"] in S.AUTOSCALER_KINDS]
    assert kinds == ([kind] if kind else [])
    assert found.autoscaling.reason == reason and found.autoscaling.ok == (kind is not None)
    deployment = next(o for o in found.objects if o["kind"] == "Deployment")
    # no autoscaler (provider keda, KEDA missing): spec.replicas stays the count, nothing else would set it
    assert ("replicas" in deployment["spec"]) == (kind is None)
    if kind == "ScaledObject":
        assert keda_errors(found.objects[-1]) == []
    elif kind is not None:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(found.objects[-1], version, strict=True)


def test_keda_is_asked_only_when_the_provider_is_auto_or_keda():
    asked = []

    def served():
        asked.append(1)
        return True
    body = modelserver(replicas=2, autoscaling={"maxReplicas": 2, "provider": "hpa"})
    desired(body, [summarize_node(gpu_node("g"))], keda_served=served)
    desired(modelserver(replicas=2), [summarize_node(gpu_node("g"))], keda_served=served)
    assert asked == []
    desired(modelserver(replicas=2, autoscaling={"maxReplicas": 2}), [summarize_node(gpu_node("g"))],
            keda_served=served)
    assert asked == [1]


def test_an_explicit_keda_name_keda_refuses_is_a_clear_error():
    with pytest.raises(InvalidSpec, match="KEDA refuses a ScaledObject named 'l{55}' .* at most 54 characters"):
        result({"provider": "keda", "maxReplicas": 2, "prometheusAddress": KEDA_ADDRESS}, keda=True, name="l" * 55)


@pytest.mark.parametrize("autoscaling, refused", [
    ({"maxReplicas": 2}, None),
    ({"maxReplicas": 2, "prometheusAddress": KEDA_ADDRESS}, None),
    ({"maxReplicas": 2, "provider": "keda", "prometheusAddress": KEDA_ADDRESS}, None),
    ({"maxReplicas": 2, "provider": "hpa"}, None),
    ({"maxReplicas": 2, "provider": "keda"}, "prometheusAddress is required with provider keda"),
    ({"maxReplicas": 2, "provider": "hpa", "prometheusAddress": KEDA_ADDRESS}, "not with provider hpa"),
])
def test_the_crd_defaults_the_provider_to_auto_and_holds_its_address_rules(autoscaling, refused):
    admitted, errors = admit(modelserver(autoscaling=autoscaling))
    if refused is None:
        assert errors == []
        assert admitted["spec"]["autoscaling"]["provider"] == autoscaling.get("provider", S.PROVIDER_AUTO)
    else:
        assert any(refused in e for e in errors), errors


@pytest.mark.parametrize("autoscaling, message", [
    ({"minReplicas": 2}, "maxReplicas is required"),
    ({"maxReplicas": 2, "minReplicas": 3}, "below minReplicas"),
    ({"maxReplicas": 0}, "maxReplicas must be"),
    ({"maxReplicas": 2, "kvCacheUsage": 1.5}, "kvCacheUsage"),
    ({"maxReplicas": 2, "queueDepthPerReplica": float("nan")}, "queueDepthPerReplica"),
    ({"maxReplicas": 2, "provider": "keda"}, "prometheusAddress must be"),
    ({"maxReplicas": 2, "provider": "keda", "prometheusAddress": 'http://x"}) or vector(1'}, "prometheusAddress"),
    ({"maxReplicas": 2, "provider": "hpa", "prometheusAddress": "http://p:9090"}, "KEDA's"),
    ({"maxReplicas": 2, "prometheusAddress": "ftp://p:9090"}, "prometheusAddress must be"),
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
