"""What the plugin's orjson body read saves (spillway_connector/plugin.py, json_body.py): starlette's Request.json
over a 131,008-token completion body.

vLLM's OpenAI server reads every request body through starlette's Request.json (json.loads); the connector's plugin
reads it with orjson where orjson reads it as json.loads does. This times, in one process on this machine's
starlette, `await Request(...).json()` of two copies of the installed starlette/requests.py, one stock and one with
the plugin's Request.json installed (the installed module stays as it is), and the bare parsers on the same bytes:
json.loads, orjson.loads, and the plugin's orjson read (orjson plus its check for integers beyond 64 bits). The body is a
completion request whose prompt is 131,008 random token ids below 128,256 (Llama 3's vocabulary), as
bench/gpu/serve_bench.py sends at 128K. Two bodies orjson does not read alone are timed too, as the price of the
fallback: NaN as the last field (orjson reads up to it, then json.loads reads it all) and a 2**70 seed (orjson,
the check, then json.loads). Medians of --reps repetitions (min-max), in milliseconds.

    .venv/bin/python bench/tail/json_body.py [--reps 31] [--tokens 131008] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "connector"))


def _module(name: str, source: str, path: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(path)
    # compiled under the file's own name, so that inspect (the plugin's check of the code it replaces) reads it
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - starlette's own source
    return module


def body_of(tokens: int, tail: str = "") -> bytes:
    rng = random.Random(0)
    request = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": [rng.randrange(128256) for _ in range(tokens)],
               "max_tokens": 1, "temperature": 0.0, "ignore_eos": True}
    text = json.dumps(request)
    return (text[:-1] + tail + "}").encode()


def time_ms(fn, reps: int) -> dict:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        kept = fn()
        times.append((time.perf_counter() - t0) * 1e3)
        del kept  # freed outside the clock, as Request.json's value is
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def request_json_ms(module: types.ModuleType, body: bytes, reps: int) -> dict:
    async def once() -> float:
        sent = []

        async def receive() -> dict:
            if sent:
                return {"type": "http.disconnect"}
            sent.append(True)
            return {"type": "http.request", "body": body, "more_body": False}

        request = module.Request({"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
                                  "headers": [(b"content-type", b"application/json")]}, receive)
        await request.body()  # read before the clock starts: only the parse is timed
        t0 = time.perf_counter()
        await request.json()
        return (time.perf_counter() - t0) * 1e3

    async def all_reps() -> list[float]:
        return [await once() for _ in range(reps)]

    times = asyncio.run(all_reps())
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=31)
    p.add_argument("--tokens", type=int, default=131008)
    p.add_argument("--json", type=Path, help="write the figures here too")
    a = p.parse_args()

    import orjson
    import starlette
    import starlette.requests
    from spillway_connector import json_body, plugin

    path = Path(starlette.requests.__file__)
    source = path.read_text()
    original = _module("starlette_requests_original", source, path)
    patched = _module("starlette_requests_plugin", source, path)
    if not plugin.install_fast_json_body(patched):
        print(f"{path}: the plugin refuses this starlette's Request.json (see the warning above)", file=sys.stderr)
        return 1
    patched._spillway_orjson_loads = json_body.orjson_loads

    bodies = {"plain": body_of(a.tokens), "NaN last": body_of(a.tokens, ', "top_p": NaN'),
              "2**70 seed": body_of(a.tokens, f', "seed": {2 ** 70}')}
    out: dict = {"tokens": a.tokens, "body_bytes": len(bodies["plain"]), "reps": a.reps,
                 "python": platform.python_version(), "starlette": starlette.__version__,
                 "orjson": orjson.__version__, "machine": platform.machine(), "ms": {}}
    plain = bodies["plain"]
    assert patched._spillway_orjson_loads(plain) == json.loads(plain)
    for name, body in bodies.items():
        row = out["ms"][name] = {
            "Request.json, original": request_json_ms(original, body, a.reps),
            "Request.json, plugin": request_json_ms(patched, body, a.reps),
        }
        if name == "plain":
            row["json.loads"] = time_ms(lambda: json.loads(plain), a.reps)
            row["orjson.loads"] = time_ms(lambda: orjson.loads(plain), a.reps)
            row["the plugin's orjson read (orjson + check)"] = time_ms(
                lambda: patched._spillway_orjson_loads(plain), a.reps)
        row["speedup"] = row["Request.json, original"]["median"] / row["Request.json, plugin"]["median"]

    print(f"{a.tokens:,}-token completion body, {out['body_bytes']:,} bytes; Python {out['python']}, starlette "
          f"{out['starlette']}, orjson {out['orjson']}; median (min-max) of {a.reps}, ms")
    for name, row in out["ms"].items():
        print(f"  {name}: x{row['speedup']:.2f}")
        for what, t in row.items():
            if what != "speedup":
                print(f"    {what:42s} {t['median']:7.2f}  ({t['min']:.2f}-{t['max']:.2f})")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
