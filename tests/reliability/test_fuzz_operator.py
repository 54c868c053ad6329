"""ModelServers generated from the CRD's own schema (hypothesis-jsonschema), admitted the way the API server
admits them (defaults, OpenAPI validation, CEL rules), through the real operator: every one ends with a
Planned condition, none fails a handler or reports an InternalError, and every Deployment the operator applies
is safe (restricted Pod Security for our image, no ServiceAccount token, a memory limit its node holds)."""
from __future__ import annotations

import copy
import json
import os

import pytest
from harness import LLAMA_8B, Api, EmulatedCluster, Operator, eventually, names
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from pss import violations

EXAMPLES = int(os.environ.get("SPILLWAY_FUZZ_EXAMPLES", "60"))
NODE_MEMORY = {"big": "2Ti", "small": "512Gi"}


def _spec_schema() -> dict:
    from support.crd_schema import _strict, version_schema  # the CRD as JSON Schema, unknown fields refused

    schema = copy.deepcopy(_strict(version_schema())["properties"]["spec"])
    schema.pop("required", None)  # model is set below
    return schema


def _generate(pool: str) -> list[dict]:
    from support.crd_schema import admit

    admitted: list[dict] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(spec=from_schema(_spec_schema()), catalog=st.booleans(), ours=st.booleans())
    def draw(spec, catalog, ours):
        spec = dict(spec)
        if catalog:  # half the examples name a model the operator can size, on nodes it can select
            spec.update(model=LLAMA_8B, nodeSelector={"pool": pool})
            spec.pop("modelConfig", None)
        else:
            spec.setdefault("model", "acme/fuzzed")
        if ours:
            spec.pop("image", None)
        body = {"apiVersion": names.API_VERSION, "kind": names.KIND,
                "metadata": {"name": f"f{len(admitted)}"}, "spec": spec}
        try:
            obj, errors = admit(body)
        except ValueError as exc:  # cel-python's int64 overflow: the API server refuses such numbers too
            obj, errors = body, [str(exc)]
        if not errors:
            admitted.append(obj)

    draw()
    return admitted


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EmulatedCluster(tmp_path_factory.mktemp("kmock")) as emulated:
        yield emulated


def _unsafe(deployment: dict, allocatable: int) -> list[str]:
    from spillway.core.quantity import parse_bytes

    pod = deployment["spec"]["template"]["spec"]
    container, = pod["containers"]
    found = []
    if container["image"] == names.DEFAULT_VLLM_IMAGE:
        found += violations(pod)
    if pod.get("automountServiceAccountToken") is not False:
        found.append("a ServiceAccount token is mounted")
    security = container.get("securityContext") or {}
    if security.get("allowPrivilegeEscalation") is not False or security.get("privileged"):
        found.append("privilege escalation allowed")
    if parse_bytes(container["resources"]["limits"]["memory"]) > allocatable:
        found.append(f"memory limit {container['resources']['limits']['memory']} exceeds every node")
    env = {e.get("name") for e in container.get("env") or []}
    found += [f"reserved env {n}" for n in env & {"VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING"}]
    return found


def test_generated_modelservers_all_get_a_status_and_no_unsafe_deployment(cluster, tmp_path, record_property):
    api = Api(cluster)
    for node, memory in NODE_MEMORY.items():
        api.node(node, memory)
    bodies = _generate(api.pool)
    assert len(bodies) >= EXAMPLES // 4, f"only {len(bodies)} of {EXAMPLES} generated ModelServers were admitted"
    operator = Operator(cluster.kubeconfig, tmp_path / "kopf.log", {names.ENV_RETRY_SECONDS: "1"}).start()
    try:
        for body in bodies:
            body["metadata"]["namespace"] = api.namespace
            api.custom.create_namespaced_custom_object(names.GROUP, names.VERSION, api.namespace, names.PLURAL, body)

        def statuses() -> dict:
            listed = api.custom.list_namespaced_custom_object(names.GROUP, names.VERSION, api.namespace, names.PLURAL)
            return {ms["metadata"]["name"]: next((c for c in (ms.get("status") or {}).get("conditions") or []
                                                  if c["type"] == "Planned"), None) for ms in listed["items"]}
        try:
            planned = eventually(lambda: (found := statuses()) and all(found.values()) and found, timeout=300,
                                 interval=1, what="a Planned condition on every ModelServer")
        except AssertionError:
            waiting = [n for n, c in statuses().items() if c is None]
            specs = {b["metadata"]["name"]: b["spec"] for b in bodies if b["metadata"]["name"] in waiting}
            pytest.fail(f"no status on {waiting}: {json.dumps(specs)[:3000]}\n{operator.output()[-4000:]}")
        reasons = sorted({c["reason"] for c in planned.values()})
        summary = (f"fuzz: {len(bodies)} ModelServers generated from the CRD's schema ran through the operator; "
                   "Planned reasons: " + ", ".join(f"{r} {sum(c['reason'] == r for c in planned.values())}"
                                                   for r in reasons))
        print("\n" + summary)
        record_property("summary", summary)  # conftest prints it in the run's summary
        internal = {n: c["message"] for n, c in planned.items() if c["reason"] == "InternalError"}
        assert not internal, internal
        assert operator.alive()
        log = operator.output()
        assert "failed with an exception" not in log and "Traceback" not in log, log[-6000:]
        allocatable = max(2**40 * 2, 512 * 2**30)
        unsafe = {d["metadata"]["name"]: problems for d in api.deployments()
                  if (problems := _unsafe(d, allocatable))}
        assert not unsafe, json.dumps(unsafe)[:3000]
        assert any(c["status"] == "True" for c in planned.values()), "no generated ModelServer was planned"
    finally:
        operator.kill()
