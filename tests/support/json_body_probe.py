"""Test-only probe for the plugin's request-body parse (spillway_connector/plugin.py install_fast_json_body): what
starlette's Request.json and a FastAPI route make of each body, printed as one JSON document on stdout.

Run as a script (`python -P json_body_probe.py BODIES.json`); SPILLWAY_PROBE_PLUGIN=1 installs the plugin's
Request.json first (as vLLM's plugin loading does in the API server), otherwise starlette stays stock. BODIES.json maps a case's name to its body
as latin-1 text (any bytes). For each body: Request.json()'s value (its repr, hashed, with a short head) or the
exception it raised (type, message, and for a JSONDecodeError its msg, pos and doc), asked twice (a failed read
must fail again, as before); how many times starlette's module called json.loads for it; and what a FastAPI
route that takes a JSON body answers (status, body). SPILLWAY_PROBE_NO_ORJSON=1 makes orjson unimportable.

Self-contained on purpose: the standard library, starlette, FastAPI and, with the plugin, spillway_connector.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import types
from typing import Any

if os.environ.get("SPILLWAY_PROBE_NO_ORJSON"):
    sys.modules["orjson"] = None  # `import orjson` raises ImportError

import starlette.requests
from fastapi import Body, FastAPI
from fastapi.testclient import TestClient

if os.environ.get("SPILLWAY_PROBE_PLUGIN"):
    from spillway_connector import json_body, plugin

    assert plugin.install_fast_json_body(), "the plugin refused this starlette"


def _value(value) -> dict:
    text = repr(value)
    return {"repr_sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), "head": text[:120]}


def _exception(exc: BaseException) -> dict:
    out = {"raised": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": str(exc)[:300]}
    if isinstance(exc, json.JSONDecodeError):
        out.update(msg=exc.msg, pos=exc.pos, doc_sha256=hashlib.sha256(exc.doc.encode("utf-8", "surrogatepass"))
                   .hexdigest())
    return out


async def _read(request: starlette.requests.Request) -> dict:
    try:
        return _value(await request.json())
    except Exception as exc:  # noqa: BLE001 - what it raised is the answer
        return _exception(exc)


def request_json(body: bytes, calls: list) -> dict:
    sent = []

    async def receive() -> dict:
        if sent:
            return {"type": "http.disconnect"}
        sent.append(True)
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"content-type", b"application/json")],
             "query_string": b""}
    request = starlette.requests.Request(scope, receive)
    before = len(calls)
    first = asyncio.run(_read(request))
    again = asyncio.run(_read(request))
    return {"first": first, "again": again, "json_loads_calls": len(calls) - before}


def main(bodies_path: str) -> None:
    with open(bodies_path) as file:
        bodies = {name: text.encode("latin-1") for name, text in json.load(file).items()}
    calls: list = []
    real_json = starlette.requests.json

    def counted_loads(*args, **kwargs):
        calls.append(1)
        return real_json.loads(*args, **kwargs)

    # starlette's module reads `json.loads` through its global `json`: count its calls there only.
    starlette.requests.json = types.SimpleNamespace(**{k: getattr(real_json, k) for k in dir(real_json)
                                                       if not k.startswith("__")})
    starlette.requests.json.loads = counted_loads

    app = FastAPI()

    @app.post("/body")
    async def echo(body: Any = Body(...)) -> dict:  # noqa: B008
        return {"repr": repr(body)[:200]}

    client = TestClient(app, raise_server_exceptions=False)
    results = {}
    for name, body in bodies.items():
        result = request_json(body, calls)
        answer = client.post("/body", content=body, headers={"content-type": "application/json"})
        result["fastapi"] = {"status": answer.status_code, "body": answer.text[:300]}
        results[name] = result
    print(json.dumps({"starlette": starlette.requests.__file__,
                      "patched": getattr(starlette.requests.Request.json, "_spillway_replacement", False),
                      "orjson": "json_body" in globals() and json_body.orjson is not None,
                      "results": results}))


if __name__ == "__main__":
    main(sys.argv[1])
