"""A small patch to starlette's Request.json, which vLLM's OpenAI server reads every request body with: orjson.

What it fixes. FastAPI reads a JSON body through starlette's `Request.json()`, which is the standard library's
`json.loads(body)`. A 131,008-token completion sent as token ids (a body of about 800 KB) spent ~15 ms of the
API server's ~37 ms for that request in json.loads, on the time-to-first-token path of every long prompt.
vLLM 0.33 depends on orjson (`Requires-Dist: orjson>=3.11.6`), which reads the same body several times faster
(bench/tail/json_body.py).

Why the result is the same. orjson reads a body first; json.loads reads it, exactly as before, whenever orjson
could differ: orjson refuses NaN, Infinity, -Infinity, numbers beyond a float's range, invalid UTF-8, a BOM, lone
surrogate escapes and nesting beyond 1024 (and invalid JSON, whose exception therefore stays json.loads's own
json.JSONDecodeError: FastAPI answers 422 as before, or 400 for what json.loads raises otherwise). orjson does not
refuse an integer beyond 64 bits: it reads one as a float where json.loads reads an int, so a result that holds a
float at or beyond -2**63 or 2**64 (where such an integer's float lies) is read again by json.loads too. Where
orjson raises nothing else, its value equals json.loads's (duplicate keys: the last wins in both; floats: both
round correctly). Nesting deep enough for json.loads's RecursionError (orjson reads up to 1024 levels) meets one
in that check too, which hands the body to json.loads, so it fails as before (to within the few frames by which
the two calls' depths differ). Without orjson (the CPU image may lack it) every body goes to json.loads.
tests/images/test_json_body_patch.py compares the patched and the original Request.json on such bodies.

When it can go. When starlette (or FastAPI) reads bodies with a faster parser itself: `apply` refuses a
Request.json that no longer reads as below (exit 1, one line). starlette is not vLLM: the patch is for every vLLM
release (vLLM 0.32 and 0.33 both ask for starlette>=1.0.1; 1.10.0 in the tests' venv and in bench/gpu's staged
0.33 tree), and its file is found where `import starlette` finds it, not under vLLM's folder.

Applied at image build time (images/vllm/Dockerfile) and by bench/gpu/serve_bench.py for an engine that asks
for it; never at run time. `python3 fast_json_body.py apply|revert|check [SITE_PACKAGES]`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# The shared apply/revert/check machinery lives beside this file (the image copies the folder whole).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from source_patch import PatchError, SourcePatch

__all__ = ["MARKER", "NAME", "PATCH", "PatchError", "apply", "is_applied", "patch_source", "revert", "site",
           "target"]

NAME = "fast_json_body"
PACKAGE = "starlette"
TARGET = Path("starlette/requests.py")
MARKER = f"# Spillway patch: {NAME}"

# starlette 1.10.0's Request.json (older releases annotate `-> typing.Any`).
ORIGINAL = re.compile(
    r'(?P<head>[ ]{4}async def json\(self\) -> (?:typing\.)?Any:\n'
    r'[ ]{8}if not hasattr\(self, "_json"\):(?:[ ]+\# pragma: no branch)?\n'
    r'[ ]{12}body = await self\.body\(\)\n)'
    r'[ ]{12}self\._json = json\.loads\(body\)\n'
    r'(?P<tail>[ ]{8}return self\._json\n)'
)
IMPORT_LINE = re.compile(r"^import json\n", re.MULTILINE)
# Where the module-level helpers go: before the class (generic in starlette 1.x).
CLASS_LINE = re.compile(r"^class Request\(HTTPConnection(?:\[\w+\])?\):\n", re.MULTILINE)

PATCHED_READ = f'''            {MARKER} (images/vllm/patches/{NAME}.py).
            parsed = _spillway_orjson_loads(body)
            self._json = json.loads(body) if parsed is _SPILLWAY_MISS else parsed
'''

HELPERS = f'''{MARKER} (images/vllm/patches/{NAME}.py).
# Request.json reads a body with orjson where orjson reads it as json.loads does (several times faster on a
# long prompt's token ids), else with json.loads as before.
try:
    import orjson as _spillway_orjson
except ImportError:  # every body goes to json.loads, as without the patch
    _spillway_orjson = None
_SPILLWAY_MISS = object()  # orjson did not read the body: json.loads does


def _spillway_beyond_64_bits(value):
    # orjson reads an integer beyond 64 bits as a float (json.loads: an int), which lies at or beyond -2**63 or
    # 2**64. A list of ints alone (a prompt's token ids) is summed in C instead of walked.
    kind = type(value)
    if kind is float:
        return not -9223372036854775808.0 < value < 18446744073709551616.0
    if kind is list:
        try:
            if type(sum(value)) is int:
                return False
        except TypeError:
            pass
        return any(map(_spillway_beyond_64_bits, value))
    if kind is dict:
        return any(map(_spillway_beyond_64_bits, value.values()))
    return False


def _spillway_orjson_loads(body):
    if _spillway_orjson is None:
        return _SPILLWAY_MISS
    try:
        value = _spillway_orjson.loads(body)
        return _SPILLWAY_MISS if _spillway_beyond_64_bits(value) else value
    except Exception:  # NaN, Infinity, invalid JSON or UTF-8, lone surrogates, deep nesting: json.loads reads it
        return _SPILLWAY_MISS


'''


def _transform(source: str) -> str:
    found = ORIGINAL.findall(source)
    imports = IMPORT_LINE.findall(source)
    classes = CLASS_LINE.findall(source)
    taken = [name for name in ("_spillway_orjson", "_SPILLWAY_MISS") if name in source]
    if len(found) != 1 or len(imports) != 1 or len(classes) != 1 or taken:
        raise PatchError(f"{TARGET}: Request.json does not read as starlette 1.10's ({len(found)} matches, "
                         f"{len(imports)} `import json`, {len(classes)} Request classes, names taken "
                         f"{taken}); this starlette needs its own look before the patch is carried")
    patched = ORIGINAL.sub(lambda m: m["head"] + PATCHED_READ + m["tail"], source, count=1)
    return CLASS_LINE.sub(lambda m: HELPERS + m[0], patched, count=1)


PATCH = SourcePatch(NAME, TARGET, _transform, package=PACKAGE)
site, target, is_applied, patch_source, apply, revert = (PATCH.site, PATCH.target, PATCH.is_applied,
                                                         PATCH.patch_source, PATCH.apply, PATCH.revert)


if __name__ == "__main__":
    sys.exit(PATCH.main(sys.argv[1:]))
