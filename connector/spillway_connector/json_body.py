"""A request body read with orjson where orjson reads it as json.loads does (plugin.py), else not at all.

Why the result is the same. orjson reads a body first; json.loads reads it, exactly as before, whenever orjson
could differ: orjson refuses NaN, Infinity, -Infinity, numbers beyond a float's range, invalid UTF-8, a BOM, lone
surrogate escapes and nesting beyond 1024 (and invalid JSON, whose exception therefore stays json.loads's own
json.JSONDecodeError: FastAPI answers 422 as before, or 400 for what json.loads raises otherwise). orjson does not
refuse an integer beyond 64 bits: it reads one as a float where json.loads reads an int, so a result that holds a
float at or beyond -2**63 or 2**64 (where such an integer's float lies) is read again by json.loads too. Where
orjson raises nothing else, its value equals json.loads's (duplicate keys: the last wins in both; floats: both
round correctly). Nesting deep enough for json.loads's RecursionError meets one in that check too, which hands
the body to json.loads, so it fails as before. Without orjson every body goes to json.loads. vLLM 0.32-0.34
depend on orjson. tests/connector/test_json_body.py compares the two reads on such bodies.
"""
from __future__ import annotations

from typing import Any

try:
    import orjson
except ImportError:  # every body goes to json.loads
    orjson = None

MISS = object()  # orjson did not read the body: json.loads does


def beyond_64_bits(value: Any) -> bool:
    """Whether `value` holds a float where orjson may have read an integer beyond 64 bits (json.loads: an int). A
    list of ints alone (a prompt's token ids) is summed in C instead of walked."""
    kind = type(value)
    if kind is float:
        return not -9223372036854775808.0 < value < 18446744073709551616.0
    if kind is list:
        try:
            if type(sum(value)) is int:
                return False
        except TypeError:
            pass
        return any(map(beyond_64_bits, value))
    if kind is dict:
        return any(map(beyond_64_bits, value.values()))
    return False


def orjson_loads(body: bytes) -> Any:
    """orjson's value of `body` where it equals json.loads's, else MISS."""
    if orjson is None:
        return MISS
    try:
        value = orjson.loads(body)
    except Exception:  # noqa: BLE001 - NaN, Infinity, invalid JSON or UTF-8, lone surrogates, deep nesting
        return MISS
    return MISS if beyond_64_bits(value) else value
