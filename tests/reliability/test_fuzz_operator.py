"""ModelServers generated from the CRD's own schema (hypothesis-jsonschema) and from the catalog's models,
admitted the way the API server admits them (defaults, OpenAPI validation, CEL rules), through the real
operator: every one ends with a Planned condition, none fails a handler or reports an InternalError, every
Deployment the operator applies is safe (restricted Pod Security for our image, no ServiceAccount token, a
memory limit its node holds), and the counts (inputs, planned, refused by reason, exceptions) are printed."""
from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from harness import Api, Operator, eventually, names
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from pss import violations
from spillway.adapters.model_config import catalog_config, catalog_ids
from support.crd_schema import admit, spec_schema

# Two generators, one operator run. "schema": specs drawn from the CRD's schema (every field, any value it
# admits), the model seeded from the catalog's ids (or its configs inline) so that most reach the planner;
# a few keep a model nobody knows, which must end in ModelGeometryUnknown. "catalog": each spec starts from
# a catalog model with the values a user writes (powers of two, sizes in Gi/Ti, each enum), so the planner
# and the manifests see the catalog's variety. SPILLWAY_FUZZ_EXAMPLES scales both.
# A planned ModelServer costs the operator a dozen API calls, a refused one two: 24 + 12 inputs, most of them
# planned, cost about what 60 mostly refused ones did.
EXAMPLES = int(os.environ.get("SPILLWAY_FUZZ_EXAMPLES", "24"))
CATALOG_EXAMPLES = EXAMPLES // 2
NODE_MEMORY = {"big": "2Ti", "small": "512Gi"}
UNKNOWN_MODEL = "acme/fuzzed"
NOT_IN_CATALOG = "is not in Spillway's catalog"  # core/model_source.py: no config.json at all for the model


def _reason(condition: dict) -> str:
    """The Planned reason; a model without any config.json apart from a geometry the planner refused."""
    if condition["reason"] == "ModelGeometryUnknown" and NOT_IN_CATALOG in condition["message"]:
        return "ModelGeometryUnknown(no config)"
    return condition["reason"]


def _model_source(model_draw: tuple[str, str]) -> dict:
    """(how, catalog id) -> the spec's model fields: the id itself, its config inline under another name, or
    an id no catalog holds."""
    how, model_id = model_draw
    if how == "catalog":
        return {"model": model_id}
    if how == "inline":
        return {"model": f"acme/{model_id.split('/')[-1].lower()}", "modelConfig": {"inline": catalog_config(model_id)}}
    return {"model": UNKNOWN_MODEL}


MODEL_DRAW = st.tuples(st.sampled_from(["catalog"] * 6 + ["inline"] + ["unknown"]), st.sampled_from(catalog_ids()))


def _admitted(bodies: list[dict]) -> list[dict]:
    admitted = []
    for body in bodies:
        try:
            obj, errors = admit(body)
        except ValueError as exc:  # cel-python's int64 overflow: the API server refuses such numbers too
            obj, errors = body, [str(exc)]
        if not errors:
            admitted.append(obj)
    return admitted


def _body(name: str, spec: dict) -> dict:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": name}, "spec": spec}


def _draw(strategy, examples: int) -> list:
    drawn: list = []

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(value=strategy)
    def draw(value):
        drawn.append(value)

    draw()
    return drawn


def schema_specs(pool: str) -> list[dict]:
    """Specs from the CRD's schema, the model seeded from the catalog, most on the test's nodes."""
    strategy = st.tuples(from_schema(spec_schema()), MODEL_DRAW, st.booleans(), st.booleans())
    specs = []
    for spec, model_draw, ours, selected in _draw(strategy, EXAMPLES):
        spec = {key: value for key, value in spec.items() if key not in ("model", "modelConfig")}
        spec.update(_model_source(model_draw))
        if selected:
            spec["nodeSelector"] = {"pool": pool}
        if ours:
            spec.pop("image", None)
        specs.append(spec)
    return specs


def catalog_specs(pool: str) -> list[dict]:
    """Specs that start from a catalog model with the values a user writes."""
    optional = {
        "tensorParallelSize": st.sampled_from([1, 2, 4, 8, 16]),
        "replicas": st.integers(0, 4),
        "replicasPerNode": st.sampled_from([1, 2, 4, 8]),
        "blockSize": st.sampled_from([16, 32, 64, 128, 256]),
        "kvCacheDtype": st.sampled_from(["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]),
        "vllmVersion": st.sampled_from(["0.26.0", "0.32.0", "0.33.0"]),
        "offload": st.fixed_dictionaries({}, optional={
            "enabled": st.booleans(),
            "size": st.sampled_from(["auto", "0", "500Mi", "10Gi", "64Gi", "200Gi", "1Ti", "4Ti"]),
            "evictionPolicy": st.sampled_from(["lru", "arc"]),
            "layout": st.sampled_from(["contiguous", "default"]),
            "connector": st.sampled_from(["spillway", "native"]),
            "blockSize": st.sampled_from([16, 64, 256, 1024])}),
        "routing": st.fixed_dictionaries({}, optional={"mode": st.sampled_from(["none", "kv-aware", "llm-d"])}),
    }
    strategy = st.tuples(st.sampled_from(catalog_ids()), st.booleans(), st.fixed_dictionaries({}, optional=optional))
    specs = []
    for model_id, inline, spec in _draw(strategy, CATALOG_EXAMPLES):
        specs.append({**spec, **_model_source(("inline" if inline else "catalog", model_id)),
                      "nodeSelector": {"pool": pool}})
    return specs


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


def _counts(generated: int, admitted: list[dict], planned: dict[str, dict]) -> dict:
    conditions = [planned[body["metadata"]["name"]] for body in admitted]
    refused = Counter(_reason(c) for c in conditions if c["status"] != "True")
    return {"inputs": generated, "admitted": len(admitted),
            "planned": sum(c["status"] == "True" for c in conditions), "refused": dict(sorted(refused.items())),
            "exceptions": refused.get("InternalError", 0)}


def _summary(counts: dict[str, dict], log: str) -> str:
    lines = [f"fuzz {name}: {c['inputs']} inputs, {c['admitted']} admitted by the API server's rules, "
             f"{c['planned']} planned, refused: "
             + (", ".join(f"{reason} {n}" for reason, n in c["refused"].items()) or "none")
             + f", exceptions {c['exceptions']}" for name, c in counts.items()]
    tracebacks = log.count("Traceback") + log.count("failed with an exception")
    return "\n".join(lines + [f"fuzz: operator log tracebacks {tracebacks}"])


def test_generated_modelservers_all_get_a_status_and_no_unsafe_deployment(cluster, tmp_path, record_property):
    api = Api(cluster)
    for node, memory in NODE_MEMORY.items():
        api.node(node, memory)
    generated = {"schema": schema_specs(api.pool), "catalog": catalog_specs(api.pool)}
    admitted = {name: _admitted([_body(f"{name[0]}{i}", spec) for i, spec in enumerate(specs)])
                for name, specs in generated.items()}
    assert len(admitted["schema"]) >= EXAMPLES // 4, \
        f"only {len(admitted['schema'])} of {EXAMPLES} generated ModelServers were admitted"
    bodies = admitted["schema"] + admitted["catalog"]
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
            planned = eventually(lambda: (found := statuses()) and all(found.values()) and found, timeout=600,
                                 interval=1, what="a Planned condition on every ModelServer")
        except AssertionError:
            waiting = [n for n, c in statuses().items() if c is None]
            specs = {b["metadata"]["name"]: b["spec"] for b in bodies if b["metadata"]["name"] in waiting}
            pytest.fail(f"no status on {waiting}: {json.dumps(specs)[:3000]}\n{operator.output()[-4000:]}")
        log = operator.output()
        counts = {name: _counts(len(generated[name]), admitted[name], planned) for name in generated}
        summary = _summary(counts, log)
        print("\n" + summary)
        record_property("summary", summary)  # conftest prints it in the run's summary
        internal = {n: c["message"] for n, c in planned.items() if c["reason"] == "InternalError"}
        assert not internal, internal
        assert operator.alive()
        assert "failed with an exception" not in log and "Traceback" not in log, log[-6000:]
        allocatable = max(2**40 * 2, 512 * 2**30)
        unsafe = {d["metadata"]["name"]: problems for d in api.deployments()
                  if (problems := _unsafe(d, allocatable))}
        assert not unsafe, json.dumps(unsafe)[:3000]
        # Aimed at the planner: only the model nobody knows ends without a config.json.
        unknown = {n for n, c in planned.items() if _reason(c) == "ModelGeometryUnknown(no config)"}
        seeded_unknown = {b["metadata"]["name"] for b in bodies if b["spec"]["model"] == UNKNOWN_MODEL
                          and "modelConfig" not in b["spec"]}
        assert unknown <= seeded_unknown, {n: planned[n]["message"] for n in unknown - seeded_unknown}
        for name, c in counts.items():
            assert c["planned"] > 0, f"no ModelServer of the {name} generator was planned"
        # Every catalog model has a config.json the reader takes, inline or by id: none of the catalog generator's
        # specs ends ModelGeometryUnknown but where a release itself refuses the model (vLLM 0.26 and Llama 4's
        # chunked attention). Before transformers' first import was serialized (adapters/model_config.py
        # _IMPORT_LOCK), the operator's parallel handlers raced it and refused the inline configs (5 of 11).
        geometry = {n: planned[n]["message"] for n in (b["metadata"]["name"] for b in admitted["catalog"])
                    if planned[n]["reason"] == "ModelGeometryUnknown" and "vLLM 0.26 cannot" not in planned[n]["message"]}
        assert not geometry, geometry
        assert counts["catalog"]["planned"] * 2 > counts["catalog"]["admitted"], counts["catalog"]
    finally:
        operator.kill()
