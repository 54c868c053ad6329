"""images/vllm/patches/fast_json_body.py: starlette's Request.json reads a body with orjson where orjson reads it
as json.loads does, else with json.loads as before.

The transform runs on the real starlette of this environment (the one `import starlette` finds: the venv's,
1.10.0, the release bench/gpu's staged vLLM 0.33 tree carries too). The behaviour is compared in subprocesses on
copies of that starlette, one patched and one not (support/json_body_probe.py): the same value, or the same
exception, for every body, through Request.json and through a FastAPI route; orjson actually read the plain
bodies; and without orjson the patched starlette reads every body as the original does.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import source_patch_checks as checks
from support.tools import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
PATCH_FILE = REPO / "images" / "vllm" / "patches" / "fast_json_body.py"
PROBE = REPO / "tests" / "support" / "json_body_probe.py"
ORIGINAL_READ = "            self._json = json.loads(body)\n"


patch = checks.load_module(PATCH_FILE, "fast_json_body")


@pytest.fixture(scope="module")
def site() -> Path:
    if importlib.util.find_spec("starlette") is None:
        skip_or_fail("starlette is not installed (make setup)")
    found = patch.site()
    assert patch.target(found).is_file(), f"{patch.target(found)}: no starlette requests module"
    return found


def _copy_site(site: Path, into: Path) -> Path:
    return checks.copy_site(patch, site, into)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return checks.cli(PATCH_FILE, *args)


def test_the_patch_finds_starlette_where_import_finds_it(site):
    import starlette

    assert site == Path(starlette.__file__).resolve().parent.parent
    assert patch.PATCH.package == "starlette" and patch.PATCH.releases is None


@pytest.mark.parametrize("release", ["0.26.0", "0.32.0", "0.33.0"])
def test_it_applies_beside_any_vllm_release(site, tmp_path, release):
    # The image's site-packages holds vLLM beside starlette: its release does not matter to this patch.
    copy = _copy_site(site, tmp_path / "site")
    (copy / "vllm").mkdir()
    (copy / "vllm" / "_version.py").write_text(f"__version__ = version = '{release}'\n")
    assert patch.apply(copy) == "applied"


def test_the_patch_changes_only_request_json_and_adds_its_helpers(site):
    source = patch.target(site).read_text()
    assert not patch.is_applied(source)
    patched = patch.patch_source(source)
    assert patch.is_applied(patched) and patched != source
    # Take the helpers and the new read out again: the original, byte for byte.
    assert patched.count(patch.HELPERS) == 1 and patched.count(patch.PATCHED_READ) == 1
    assert patched.replace(patch.HELPERS, "", 1).replace(patch.PATCHED_READ, ORIGINAL_READ, 1) == source
    tree = ast.parse(patched)
    request, = (node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Request")
    method, = (node for node in request.body if isinstance(node, ast.AsyncFunctionDef) and node.name == "json")
    text = ast.get_source_segment(patched, method)
    assert patch.MARKER in text and "json.loads(body)" in text and "_spillway_orjson_loads(body)" in text
    helpers = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)} - {
        node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    assert helpers == {"_spillway_beyond_64_bits", "_spillway_orjson_loads"}
    compile(patched, str(patch.target(site)), "exec")


def test_patching_twice_is_idempotent(site):
    patched = patch.patch_source(patch.target(site).read_text())
    assert patch.patch_source(patched) == patched


def test_apply_twice_then_revert_restores_the_exact_bytes(site, tmp_path):
    checks.assert_apply_twice_then_revert_restores_the_exact_bytes(patch, _copy_site(site, tmp_path / "site"))


def test_the_cli_checks_applies_and_reverts(site, tmp_path):
    # Without a folder, `check` looks where `import starlette` finds it (the venv's; read, never written).
    check = _cli("check")
    assert check.returncode == 0 and check.stdout.strip().endswith(f"applies to {patch.target(site)}"), check
    checks.assert_the_cli_checks_applies_and_reverts(PATCH_FILE, patch, _copy_site(site, tmp_path / "site"))


def _one_character_changed(source: str, anchor: str, start: str) -> str:
    at = source.index(anchor, source.index(start)) + len(anchor) // 2
    replacement = "x" if source[at] != "x" else "y"
    return source[:at] + replacement + source[at + 1:]


JSON_METHOD = "    async def json(self)"


@pytest.mark.parametrize("anchor, start", [
    ("async def json", JSON_METHOD), ('"_json"', JSON_METHOD), ("await self.body()", JSON_METHOD),
    ("json.loads(body)", JSON_METHOD), ("return self._json", JSON_METHOD),
    ("import json\n", "import json\n"), ("class Request(", "class Request("),
])
def test_a_starlette_whose_code_changed_is_refused(site, tmp_path, anchor, start):
    copy = _copy_site(site, tmp_path / "site")
    changed = _one_character_changed(patch.target(copy).read_text(), anchor, start)
    checks.assert_a_changed_source_is_refused(PATCH_FILE, patch, copy, changed, "Request.json")


def test_a_starlette_that_already_has_the_helpers_names_is_refused(site):
    source = patch.target(site).read_text() + "\n_spillway_orjson = None\n"
    with pytest.raises(patch.PatchError, match="names taken"):
        patch.patch_source(source)


SERVE_BENCH_SITES = """
import json, sys
sys.path.insert(0, sys.argv[1])
import serve_bench
patches = [serve_bench.load_patch(name) for name in ("inflight_reservation", "fast_json_body")]
sites = {p.NAME: p.PATCH.site() for p in patches}  # as serve_bench.run_engine looks them up
json_body = patches[1]
print(json.dumps({"sites": {k: str(v) for k, v in sites.items()},
                  "apply": json_body.apply(sites["fast_json_body"]), "revert": json_body.revert(sites["fast_json_body"])}))
"""


def test_serve_bench_patches_starlette_where_import_finds_it_not_beside_vllm(site, tmp_path):
    # bench/gpu's staged tree may hold starlette apart from vLLM: a copy first on PYTHONPATH stands for that.
    staged = tmp_path / "staged"
    shutil.copytree(site / "starlette", staged / "starlette", ignore=shutil.ignore_patterns("__pycache__"))
    original = patch.target(staged).read_bytes()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(staged), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", SERVE_BENCH_SITES, str(REPO / "bench" / "gpu")], check=False,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["sites"]["fast_json_body"] == str(staged) != out["sites"]["inflight_reservation"], out
    assert (out["apply"], out["revert"]) == ("applied", "reverted")
    assert patch.target(staged).read_bytes() == original
    # The CLI without a folder looks there too.
    check = subprocess.run([sys.executable, str(PATCH_FILE), "check"], check=False, capture_output=True, text=True,
                           timeout=60, env=env)
    assert check.returncode == 0 and check.stdout.strip().endswith(f"applies to {patch.target(staged)}"), check


def test_the_cli_reports_a_missing_tree_in_one_line(tmp_path):
    checks.assert_a_missing_tree_is_one_line(PATCH_FILE, tmp_path / "nowhere")


# -- behaviour: the patched starlette against the original, in subprocesses ------------------------------------
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


# Bodies orjson reads itself: json.loads is not called for them (else the patch would do nothing).
FAST = {"completion, 131008 token ids", "chat, unicode and nesting", "batch of prompts",
        "floats of every kind below 2**63", "2**64-1 and -2**63 (64 bits)", "duplicate keys", "nested 100 deep",
        "null", "a bare string"}


@pytest.fixture(scope="module")
def probes(site, tmp_path_factory) -> dict[str, dict]:
    if importlib.util.find_spec("orjson") is None:
        skip_or_fail("orjson is not installed (vLLM 0.33 requires it; make setup)")
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("httpx") is None:
        skip_or_fail("fastapi or httpx is not installed (make setup)")
    root = tmp_path_factory.mktemp("json-body")
    bodies = root / "bodies.json"
    bodies.write_text(json.dumps({name: body.decode("latin-1") for name, body in _bodies().items()}))
    copies = {}
    for name in ("original", "patched"):
        copies[name] = root / name
        shutil.copytree(site / "starlette", copies[name] / "starlette",
                        ignore=shutil.ignore_patterns("__pycache__", "*.orig"))
    assert patch.apply(copies["patched"]) == "applied"
    runs = {}
    for name, copy, no_orjson in (("original", copies["original"], False), ("patched", copies["patched"], False),
                                  ("patched, no orjson", copies["patched"], True)):
        env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("SPILLWAY_PROBE_NO_ORJSON", None)
        if no_orjson:
            env["SPILLWAY_PROBE_NO_ORJSON"] = "1"
        proc = subprocess.run([sys.executable, "-P", str(PROBE), str(bodies)], check=False, capture_output=True,
                              text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = json.loads(proc.stdout)
        assert Path(runs[name]["starlette"]).is_relative_to(copy), runs[name]["starlette"]
    assert not runs["original"]["patched"] and runs["patched"]["patched"] and runs["patched, no orjson"]["patched"]
    assert runs["patched"]["orjson"] and not runs["patched, no orjson"]["orjson"]
    assert patch.target(site).read_bytes() == (site / "starlette" / "requests.py").read_bytes()
    assert not patch.is_applied(patch.target(site).read_text()), "the venv's own starlette was patched"
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
