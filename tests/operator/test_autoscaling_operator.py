"""spec.autoscaling through the real operator (`kopf run`) against the emulated Kubernetes API, with and without
KEDA's API group: the provider auto asks the API server's discovery and renders a ScaledObject only where
keda.sh/v1alpha1 scaledobjects are served, an HPA otherwise, the Autoscaled condition says which and why, an
explicit provider wins, and a switch from the HPA to KEDA goes through KEDA's admission rule (emulated here as
KEDA v2.20.2's webhook applies it: no ScaledObject on a Deployment another HPA scales)."""
from __future__ import annotations

from pathlib import Path

import attrs
import kmock
import kubernetes
import pytest
from spillway.controller import autoscaling as S
from support.ms_api import Api
from support.ms_cluster import AUTOSCALERS, Apiserver, EmulatedCluster, eventually
from test_ms_operator import wait_planned

KEDA = f"{S.KEDA_GROUP}/{S.KEDA_VERSION}/{S.KEDA_PLURAL}"
ADDRESS = "http://prometheus.monitoring.svc:9090"


@attrs.define(kw_only=True)
class KedaApiserver(Apiserver):
    """The emulator plus KEDA's validating webhook's HPA rule (apis/keda/v1alpha1/scaledobject_webhook.go,
    verifyHpas): a ScaledObject is refused while an HPA it does not own scales the same workload."""

    async def _handle(self, request: kmock.Request):
        resource = request.resource
        if (resource is not None and resource.plural == S.KEDA_PLURAL and isinstance(request.data, dict)
                and request.action in (kmock.action.CREATE, kmock.action.UPDATE)):
            target = ((request.data.get("spec") or {}).get("scaleTargetRef") or {}).get("name")
            for (held, namespace, name), obj in list(self._objects.items()):
                if held.plural != "horizontalpodautoscalers" or namespace != request.namespace or obj.deleted:
                    continue
                owners = (obj.get("metadata") or {}).get("ownerReferences") or []
                if ((obj.get("spec") or {}).get("scaleTargetRef") or {}).get("name") == target and not any(
                        o.get("kind") == "ScaledObject" for o in owners):
                    raise kmock.KubernetesError(status=403, reason="Forbidden", message=(
                        f"admission webhook \"vscaledobject.kb.io\" denied the request: the workload '{target}' "
                        f"of type 'apps/v1.Deployment' is already managed by the hpa '{name}'"))
        return await super()._handle(request)


class AutoscalingCluster(EmulatedCluster):
    def __init__(self, tmp: Path, keda: bool):
        super().__init__(tmp, autoscalers={k: v for k, v in AUTOSCALERS.items() if keda or k != KEDA})
        self.keda = keda

    def new_emulator(self) -> kmock.KubernetesEmulator:
        return KedaApiserver() if self.keda else Apiserver()


@pytest.fixture(scope="module", params=[False, True], ids=["without-keda", "with-keda"])
def cluster(request, tmp_path_factory):
    with AutoscalingCluster(tmp_path_factory.mktemp("kmock"), keda=request.param) as emulated:
        yield emulated


# `operator` and `api` are the shared ones (support/operator_fixtures.py), over this module's `cluster`.


def autoscalers(api: Api, cluster: AutoscalingCluster) -> dict[str, list[str]]:
    """The HPAs and (where served) ScaledObjects in the test's namespace, by name."""
    hpas = kubernetes.client.AutoscalingV2Api(api.core.api_client).list_namespaced_horizontal_pod_autoscaler(
        api.namespace).items
    found = {"HorizontalPodAutoscaler": sorted(h.metadata.name for h in hpas), "ScaledObject": []}
    if cluster.keda:
        items = api.custom.list_namespaced_custom_object(S.KEDA_GROUP, S.KEDA_VERSION, api.namespace,
                                                         S.KEDA_PLURAL)["items"]
        found["ScaledObject"] = sorted(o["metadata"]["name"] for o in items)
    return found


def autoscaled(api: Api, status: str, reason: str, name: str = "llama") -> dict:
    def check():
        found = api.condition(S.AUTOSCALED, name)
        return found if found and (found["status"], found["reason"]) == (status, reason) else None
    return eventually(check, what=f"{name} Autoscaled={status} {reason}")


def test_auto_renders_keda_s_scaled_object_only_where_the_api_server_serves_it(api, cluster):
    api.node("a")
    api.modelserver(replicas=2, autoscaling={"maxReplicas": 4, "prometheusAddress": ADDRESS})
    wait_planned(api)
    if cluster.keda:
        found = autoscaled(api, "True", S.REASON_KEDA_SERVED)
        kind = "ScaledObject"
    else:
        found = autoscaled(api, "True", S.REASON_KEDA_NOT_SERVED)
        assert "serves no keda.sh/v1alpha1 scaledobjects" in found["message"]
        kind = "HorizontalPodAutoscaler"
    eventually(lambda: autoscalers(api, cluster)[kind] == ["llama"], what=f"the {kind}")
    assert autoscalers(api, cluster) == {k: (["llama"] if k == kind else []) for k in S.AUTOSCALER_KINDS}
    assert api.get()["status"]["autoscaler"] == kind
    assert "replicas" not in api.deployment()["spec"]  # the autoscaler owns the count


def test_an_explicit_provider_wins_over_discovery(api, cluster):
    api.node("a")
    api.modelserver(replicas=2, autoscaling={"maxReplicas": 4, "provider": "hpa"})
    autoscaled(api, "True", S.REASON_HPA_CHOSEN)
    eventually(lambda: autoscalers(api, cluster)["HorizontalPodAutoscaler"] == ["llama"], what="the HPA")
    api.patch({"spec": {"autoscaling": {"provider": "keda", "prometheusAddress": ADDRESS}}})
    if cluster.keda:
        autoscaled(api, "True", S.REASON_KEDA_CHOSEN)
        # the HPA went before the ScaledObject was applied: KEDA's webhook would refuse it beside the HPA
        eventually(lambda: autoscalers(api, cluster) == {"HorizontalPodAutoscaler": [], "ScaledObject": ["llama"]},
                   what="the HPA replaced by the ScaledObject")
    else:
        found = autoscaled(api, "False", S.REASON_KEDA_MISSING)
        assert "install KEDA" in found["message"]
        eventually(lambda: autoscalers(api, cluster)["HorizontalPodAutoscaler"] == [], what="the HPA pruned")
        # nothing scales the replicas, so the Deployment holds their count again
        eventually(lambda: api.deployment()["spec"].get("replicas") == 2, what="spec.replicas back")
        assert api.condition("Planned")["status"] == "True"


def test_no_prometheus_address_falls_back_to_the_hpa_then_autoscaling_goes(api, cluster):
    api.node("a")
    api.modelserver(replicas=2, autoscaling={"maxReplicas": 4})
    reason = S.REASON_NO_PROMETHEUS_ADDRESS if cluster.keda else S.REASON_KEDA_NOT_SERVED
    autoscaled(api, "True", reason)
    eventually(lambda: autoscalers(api, cluster)["HorizontalPodAutoscaler"] == ["llama"], what="the HPA")
    api.patch({"spec": {"autoscaling": None}})
    autoscaled(api, "False", S.REASON_NOT_AUTOSCALED)
    eventually(lambda: autoscalers(api, cluster) == {k: [] for k in S.AUTOSCALER_KINDS}, what="the HPA pruned")
    eventually(lambda: api.deployment()["spec"].get("replicas") == 2, what="spec.replicas back")
    assert not api.get()["status"].get("autoscaler")
