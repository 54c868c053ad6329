"""The plugin's request-body parse (spillway_connector/json_body.py, installed by plugin.py): starlette's
Request.json reads a body with orjson where orjson reads it as json.loads does, else with json.loads as before.

The behaviour is compared in subprocesses, stock and with the plugin's Request.json (support/json_body_probe.py):
the same value, or the same exception, for every body, through Request.json and through a FastAPI route; orjson
actually read the plain bodies; and without orjson every body is read as before. The plugin installs it only over
the Request.json it was verified against (starlette 1.10.0, this environment's).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from spillway_connector import plugin, source_guard
from support.tools import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "support" / "json_body_probe.py"


def test_this_starlette_reads_as_verified():
    from starlette.requests import Request

    assert not source_guard.differences({"Request.json": Request.json}, plugin.REQUEST_JSON_CODE)


def test_a_starlette_whose_request_json_moved_keeps_its_own(monkeypatch, caplog):
    from starlette import requests

    monkeypatch.setattr(source_guard, "_refused", set())
    monkeypatch.setattr(plugin, "REQUEST_JSON_CODE", {"Request.json": frozenset({"another release"})})
    before = requests.Request.json
    with caplog.at_level(logging.WARNING, logger="spillway_connector"):
        assert not plugin.install_fast_json_body()
    assert requests.Request.json is before
    assert any("Request.json" in r.getMessage() and "stock code runs" in r.getMessage() for r in caplog.records)


# -- behaviour: starlette with the plugin's Request.json against the stock one, in subprocesses ------------------------------------
def _bodies() -> dict[str, bytes]:
    rng = random.Random(7)
    ids = [rng.randrange(128256) for _ in range(131008)]
    completion = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": ids, "max_tokens": 16,
                  "temperature": 0.7, "top_p": 0.95, "seed": 12345, "stop": ["\n\n", "</s>"],
                  "logit_bias": {"128001": -100.0, "13": 2.5}, "stream": False, "logprobs": None}
    def floats(low: int, high: int) -> bytes:
        return ("[" + ", ".join(rng.choice([repr, lambda x: f"{x:.17g}", lambda x: f"{x:.25e}", lambda x: f"{x:.22f}"])(
            rng.uniform(-1e6, 1e6) * 10.0 ** rng.randrange(low, high)) for _ in range(2000)) + "]").encode()

    big = 2 ** 70
    return {
        "completion, 131008 token ids": json.dumps(completion).encode(),
        "chat, unicode and nesting": json.dumps({
            "messages": [{"role": "user", "content": "héllo ✓ 好 \u0000 \U0001f600"},
                         {"role": "assistant", "content": [{"type": "text", "text": "x" * 100}]}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"a": [1, 2.0, -0.0, True]}}},
        }, ensure_ascii=False).encode(),
        "batch of prompts": json.dumps({"prompt": [[1, 2, 3], [4, 5], []], "n": 2}).encode(),
        "floats of every kind below 2**63": floats(-330, 12)[:-1] + b", 1e-400, 5e-324, -0.0, 9.2e18]",
        "floats up to 1e308": floats(12, 302)[:-1] + b", 1.7976931348623157e308]",
        "NaN": b'{"prompt": [1, 2], "temperature": NaN}',
        "Infinity and -Infinity": b'{"top_p": Infinity, "min_p": -Infinity}',
        "2**70 integer": json.dumps({"prompt": [1, 2], "seed": big}).encode(),
        "2**70 in a token list": json.dumps({"prompt": [1, big, 3]}).encode(),
        "-2**63-1 integer": json.dumps({"seed": -2 ** 63 - 1}).encode(),
        "2**64 integer": json.dumps({"seed": 2 ** 64}).encode(),
        "2**64-1 and -2**63 (64 bits)": json.dumps({"a": 2 ** 64 - 1, "b": -2 ** 63}).encode(),
        "a float at 2**64": b'{"x": 1.8446744073709552e19}',
        "a 400-digit integer": b"1" * 400,
        "1e400": b'{"temperature": 1e400}',
        "duplicate keys": b'{"a": 1, "b": 2, "a": 3}',
        "lone surrogate escape": b'{"prompt": "\\ud800 x"}',
        "UTF-8 BOM": b'\xef\xbb\xbf{"prompt": "x"}',
        "UTF-16": '{"prompt": "x"}'.encode("utf-16"),
        "nested 100 deep": b'{"a": ' * 50 + b"[" * 50 + b"1" + b"]" * 50 + b"}" * 50,
        "nested 5000 deep": b"[" * 5000 + b"]" * 5000,
        "null": b"null",
        "a bare string": b'"x"',
        "invalid: trailing comma": b'{"prompt": [1, 2,]}',
        "invalid: truncated": b'{"prompt": [1, 2',
        "invalid: empty": b"",
        "invalid: bad UTF-8": b'{"prompt": "\xff"}',
        "invalid: control character": b'{"prompt": "a\x01b"}',
        "invalid: extra data": b'{"a": 1} {"b": 2}',
    }


# Bodies orjson reads itself: json.loads is not called for them (else the replacement would do nothing).
FAST = {"completion, 131008 token ids", "chat, unicode and nesting", "batch of prompts",
        "floats of every kind below 2**63", "2**64-1 and -2**63 (64 bits)", "duplicate keys", "nested 100 deep",
        "null", "a bare string"}


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict[str, dict]:
    if importlib.util.find_spec("orjson") is None:
        skip_or_fail("orjson is not installed (vLLM 0.32-0.34 require it; make setup)")
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("httpx") is None:
        skip_or_fail("fastapi or httpx is not installed (make setup)")
    root = tmp_path_factory.mktemp("json-body")
    bodies = root / "bodies.json"
    bodies.write_text(json.dumps({name: body.decode("latin-1") for name, body in _bodies().items()}))
    runs = {}
    for name, plugged, no_orjson in (("original", False, False), ("patched", True, False),
                                     ("patched, no orjson", True, True)):
        env = {**os.environ, "PYTHONPATH": str(REPO / "connector"), "PYTHONDONTWRITEBYTECODE": "1"}
        for key in ("SPILLWAY_PROBE_NO_ORJSON", "SPILLWAY_PROBE_PLUGIN"):
            env.pop(key, None)
        if plugged:
            env["SPILLWAY_PROBE_PLUGIN"] = "1"
        if no_orjson:
            env["SPILLWAY_PROBE_NO_ORJSON"] = "1"
        proc = subprocess.run([sys.executable, "-P", str(PROBE), str(bodies)], check=False, capture_output=True,
                              text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = json.loads(proc.stdout)
    assert not runs["original"]["patched"] and runs["patched"]["patched"] and runs["patched, no orjson"]["patched"]
    assert runs["patched"]["orjson"] and not runs["patched, no orjson"]["orjson"]
    return runs


def _without_calls(result: dict) -> dict:
    return {key: value for key, value in result.items() if key != "json_loads_calls"}


@pytest.mark.parametrize("run", ["patched", "patched, no orjson"])
def test_every_body_reads_as_before(probes, run):
    original, patched = probes["original"]["results"], probes[run]["results"]
    assert set(patched) == set(original) == set(_bodies())
    differ = {name: (original[name], patched[name]) for name in original
              if _without_calls(original[name]) != _without_calls(patched[name])}
    assert not differ, json.dumps(differ, indent=1)[:4000]


def test_the_cases_say_what_they_should(probes):
    original = probes["original"]["results"]
    assert "nan" in original["NaN"]["first"]["head"] and "inf" in original["Infinity and -Infinity"]["first"]["head"]
    assert str(2 ** 70) in original["2**70 integer"]["first"]["head"]
    assert str(2 ** 70) in original["2**70 in a token list"]["first"]["head"]
    for name in [name for name in original if name.startswith("invalid")]:
        assert original[name]["first"] == original[name]["again"], name  # a failed read fails again
        if name != "invalid: bad UTF-8":
            assert original[name]["first"]["raised"] == "json.decoder.JSONDecodeError", original[name]
            assert original[name]["fastapi"]["status"] == 422, original[name]
    assert original["invalid: bad UTF-8"]["first"]["raised"] == "builtins.UnicodeDecodeError"
    assert original["invalid: bad UTF-8"]["fastapi"]["status"] == 400
    # FastAPI takes a null body for a missing one (422); every other body that parses is answered.
    assert original["null"]["fastapi"]["status"] == 422
    assert original["nested 5000 deep"]["first"]["raised"] == "builtins.RecursionError"
    assert original["nested 5000 deep"]["fastapi"]["status"] == 400
    assert all(result["fastapi"]["status"] == 200 for name, result in original.items()
               if not name.startswith("invalid") and name not in ("null", "nested 5000 deep"))


def test_orjson_reads_the_plain_bodies_and_json_loads_the_rest(probes):
    patched, original = probes["patched"]["results"], probes["original"]["results"]
    assert {name for name, result in patched.items() if result["json_loads_calls"] == 0} == FAST
    assert all(result["json_loads_calls"] >= 1 for result in original.values())
    without = probes["patched, no orjson"]["results"]
    assert {name: r["json_loads_calls"] for name, r in without.items()} == \
        {name: r["json_loads_calls"] for name, r in original.items()}
