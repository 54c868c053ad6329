"""What spec.apiKeySecretRef covers. vLLM's own key check guards /v1, /v2, /inference and /cohere only; every other
route its API server serves (read from the 0.33.0 and 0.34.0 sources, each route's path as written) answers
without the key under vLLM's check alone, and with Spillway's guard (rendered as `--middleware`) asks for it,
/health and /metrics aside. The app here carries the routes and both middlewares the way vLLM's build_app adds
them (vllm/entrypoints/serve/middleware/register.py); no engine behind it."""
from __future__ import annotations

import ast
import importlib
import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from harness import container_args, modelserver, parse_with_vllm, render, rendered
from spillway.core import vllm_api as api
from spillway_connector import api_guard
from support.vllm_trees import vllm_tree
from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

KEY = "s3cret-key"
ROUTE_CALLS = {"post", "get", "put", "delete", "api_route", "add_api_route", "patch"}


def served_paths(version: str) -> set[str]:
    """Every literal route path registered under vllm/entrypoints of that release."""
    tree = vllm_tree(version)
    if tree is None:
        pytest.skip(f"the vLLM {version} source tree is not unpacked (SPILLWAY_VLLM_TREES)")
    paths = set()
    for source in (tree / "vllm" / "entrypoints").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ROUTE_CALLS
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and node.args[0].value.startswith("/")):
                paths.add(node.args[0].value)
    return paths


def guarded_prefixes(version: str) -> tuple[str, ...]:
    text = (vllm_tree(version) / "vllm/entrypoints/serve/middleware/authenticate.py").read_text()
    return tuple(re.findall(r'"(/[a-z0-9]+)"', re.search(r"GUARDED_PREFIX = \((.*?)\)", text).group(1)))


def app_of(paths: set[str], ours: bool) -> TestClient:
    app = FastAPI()
    for path in sorted(paths):
        app.add_api_route(path, lambda: {"ok": True}, methods=["GET", "POST"])
    app.add_middleware(AuthenticationMiddleware, tokens=[KEY])  # vLLM's, as register.py adds it
    if ours:
        app.middleware("http")(importlib.import_module(api.API_KEY_MIDDLEWARE.rsplit(".", 1)[0]).require_api_key)
    return TestClient(app)


@pytest.fixture()
def keyed(monkeypatch):
    monkeypatch.setenv(api_guard.ENV_API_KEY, KEY)


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_vllms_own_check_leaves_generation_open(version, keyed):
    """The gap docs/security.md names, measured: which routes answer without the key under vLLM's check."""
    assert guarded_prefixes(version) == ("/v1", "/v2", "/inference", "/cohere")
    paths = {p for p in served_paths(version) if "{" not in p}
    client = app_of(paths, ours=False)
    open_ = {p for p in paths if client.post(p).status_code == 200}
    assert {"/invocations", "/tokenize", "/pooling", "/score", "/rerank", "/classify"} <= open_
    assert not any(p.startswith(guarded_prefixes(version)) for p in open_)


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_the_guard_asks_every_route_but_health_and_metrics_for_the_key(version, keyed):
    paths = {p for p in served_paths(version) if "{" not in p} | {"/metrics"}
    client = app_of(paths, ours=True)
    for path in sorted(paths):
        without = client.post(path).status_code
        wrong = client.post(path, headers={"Authorization": "Bearer nope"}).status_code
        right = client.post(path, headers={"Authorization": f"Bearer {KEY}"}).status_code
        if path in api_guard.OPEN_PATHS:
            assert without == 200, path
        else:
            assert (without, wrong, right) == (401, 401, 200), path


@pytest.mark.parametrize("spelling", ["/health/../invocations", "/v1/%2e%2e/invocations", "/metrics/", "//invocations",
                                      "/INVOCATIONS", "/health%2f..%2finvocations"])
def test_no_spelling_of_a_path_walks_around_the_guard(spelling, keyed):
    client = app_of({"/invocations", "/health", "/metrics"}, ours=True)
    assert client.post(spelling).status_code == 401, spelling


def test_without_a_key_set_the_guard_lets_all_through(monkeypatch):
    monkeypatch.delenv(api_guard.ENV_API_KEY, raising=False)
    client = TestClient(FastAPI())
    client.app.add_api_route("/invocations", lambda: {"ok": True}, methods=["POST"])
    client.app.middleware("http")(api_guard.require_api_key)
    assert client.post("/invocations").status_code == 200


def test_the_pod_loads_the_guard_when_a_key_is_set(tmp_path):
    args = container_args(render(tmp_path, modelserver(apiKeySecretRef={"name": "vllm-key"})))
    assert args[args.index(api.FLAG_MIDDLEWARE) + 1] == api.API_KEY_MIDDLEWARE
    parsed, = parse_with_vllm([args])
    assert "error" not in parsed, parsed
    plain = container_args(render(tmp_path, modelserver()))
    assert api.FLAG_MIDDLEWARE not in plain
    other = rendered(render(tmp_path, modelserver(apiKeySecretRef={"name": "k"}, image="vllm/vllm-openai:v0.33.0")))
    container, = other["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert api.FLAG_MIDDLEWARE not in container["args"]  # another image need not hold Spillway's connector package
