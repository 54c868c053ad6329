"""Spillway's scheduler (spillway_connector/scheduler.py, --scheduler-cls) against vLLM's on a real engine.

SpillwayScheduler remembers the in-flight reservation of a request waiting for its KV load. The engine test runs
a real CPU vLLM with the host-memory pool, Spillway's scheduler, and an instrument (support/scheduler_probe.py, as
the engine's sitecustomize) that computes vLLM's and Spillway's sum side by side on every call. The unit tests
check the class choice (one name, both of vLLM's schedulers) and that a release whose method moved keeps vLLM's.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from spillway.core import vllm_api as V
from support import TinyLlama, VllmServer, require_vllm
from support import scheduler_probe as probe
from support.offload_workload import complete
from support.promtext import total

require_vllm(allow_module_level=True)

from spillway_connector import scheduler as S
from spillway_connector import source_guard
from spillway_connector.host_backend import cpu_offload_args


def _config(asynchronous: bool) -> SimpleNamespace:
    return SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=asynchronous))


def test_one_class_name_gives_vllms_scheduler_of_the_engines_kind():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    assert V.SCHEDULER_CLS == f"{S.__name__}.{S.SpillwayScheduler.__name__}"
    made = S.SpillwayScheduler.__new__(S.SpillwayScheduler, vllm_config=_config(True))
    assert type(made) is S.SpillwayAsyncScheduler and isinstance(made, AsyncScheduler)
    made = S.SpillwayScheduler.__new__(S.SpillwayScheduler, vllm_config=_config(False))
    assert type(made) is S.SpillwayScheduler and not isinstance(made, AsyncScheduler)


def test_the_memo_is_on_where_vllms_code_reads_as_verified():
    changed = source_guard.differences(S.reservation_functions(), S.RESERVATION_CODE)
    assert S.MEMO_ON == (not changed)
    assert ("_inflight_prefill_reserved_blocks" in vars(S._ReservationMemo)) == S.MEMO_ON


def test_a_scheduler_whose_method_moved_is_vllms(monkeypatch):
    """0.34.0's method reads otherwise (it caches a parked load's reservation itself): the guard says no."""
    monkeypatch.setattr(source_guard, "_refused", set())
    assert not source_guard.verified("test", S.reservation_functions(), {
        "Scheduler._inflight_prefill_reserved_blocks": frozenset({"0.34.0's"})})


# -- on a real engine ---------------------------------------------------------------------------------------
BLOCK_TOKENS = 32  # the CPU attention kernel takes multiples of 32
STORED_BLOCKS = 2  # each prompt's prefix, stored in the pool first: the later requests' CPU-pool hit
NEW_BLOCKS = 4  # fresh tokens after the prefix: a loading request still needs their blocks (a non-zero term)
OUTPUT_TOKENS = 2
PROMPTS = 16  # sent at once: admitted together, their loads wait side by side
ROUNDS = 3  # the prompts in three orders, each time with other fresh tokens (so the hit stays the prefix)
# More rounds only while too few calls saw two loads waiting: with both cores busy (another test file's compiling
# engine beside this one in CI; `yes` loops here) no call saw two, round after round. That lasts as long as the
# other work does: up to 30 rounds, each extra one after a pause, about two and a half minutes, then the test fails
# as before.
MAX_ROUNDS = 30
EXTRA_ROUND_PAUSE_S = 4
ENGINE_BLOCKS = PROMPTS * (STORED_BLOCKS + NEW_BLOCKS + 1) + 16  # room for all: the admission check reserves
POOL_CHUNKS = PROMPTS * (STORED_BLOCKS + MAX_ROUNDS * (STORED_BLOCKS + NEW_BLOCKS)) * 2  # no eviction
MIN_CALLS_WITH_TWO_WAITING = 8  # 2 CPU cores: 48 calls, 29-33 of them with 2 or more loads waiting (up to 13)


def probe_calls(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def two_waiting(calls: list[dict]) -> list[dict]:
    return [call for call in calls if call["waiting_for_remote_kvs"] >= 2]


@pytest.mark.engine
def test_spillways_reservation_equals_vllms_on_a_real_engine(tmp_path):
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
        extra_args=cpu_offload_args(POOL_CHUNKS * model.kv_bytes_per_token * BLOCK_TOKENS)
        + [V.FLAG_SCHEDULER_CLS, V.SCHEDULER_CLS],
        env={"PYTHONPATH": pythonpath, probe.LOG_ENV: str(log)},
    )
    with server:
        prefixes = [server.token_ids(STORED_BLOCKS * BLOCK_TOKENS, seed=seed) for seed in range(PROMPTS)]
        for prefix in prefixes:  # stores each prefix's blocks in the pool; nothing to load yet
            assert len(complete(server, prefix, OUTPUT_TOKENS)) == OUTPUT_TOKENS
        # One more request: its engine steps report the last prefix's store as done before the loads start.
        complete(server, server.token_ids(BLOCK_TOKENS, seed=PROMPTS), OUTPUT_TOKENS)
        stored = server.metrics_text()
        rounds = 0
        with ThreadPoolExecutor(PROMPTS) as pool:
            while rounds < ROUNDS or (rounds < MAX_ROUNDS
                                      and len(two_waiting(probe_calls(log))) < MIN_CALLS_WITH_TWO_WAITING):
                if rounds >= ROUNDS:
                    time.sleep(EXTRA_ROUND_PAUSE_S)
                prompts = [prefix + server.token_ids(NEW_BLOCKS * BLOCK_TOKENS, seed=1000 * (rounds + 1) + i)
                           for i, prefix in enumerate(prefixes)]
                order = [prompts, prompts[::-1], prompts[1::2] + prompts[::2]][rounds % 3]
                outputs = list(pool.map(lambda prompt: complete(server, prompt, OUTPUT_TOKENS), order))
                assert all(len(tokens) == OUTPUT_TOKENS for tokens in outputs)
                rounds += 1
        final = server.metrics_text()

    assert total(stored, V.Metric.EXTERNAL_HITS + "_total") == 0
    hits = total(final, V.Metric.EXTERNAL_HITS + "_total")
    assert hits == rounds * PROMPTS * STORED_BLOCKS * BLOCK_TOKENS, f"not every request hit its prefix: {hits} tokens"
    calls = probe_calls(log)
    errors = [call["error"] for call in calls if "error" in call]
    assert not errors, errors
    assert calls, "Spillway's scheduler was never asked for a reservation (no async loads, or not loaded)"
    differ = [call for call in calls if call["original"] != call["spillway"]]
    assert not differ, f"{len(differ)} of {len(calls)} calls differ, e.g. {differ[:5]}"
    exercised = two_waiting(calls)
    sums = {call["original"] for call in calls}
    report = (f"{rounds} rounds, {len(calls)} calls, {len(exercised)} with >= 2 loads waiting, "
              f"at most {max(call['waiting_for_remote_kvs'] for call in calls)} waiting, sums {sorted(sums)}, "
              f"{hits:.0f} tokens of CPU-pool hits")
    print(report)
    assert len(exercised) >= MIN_CALLS_WITH_TWO_WAITING, report
    # Waiting loads still need their fresh tokens' blocks: the sums are many and non-zero, not a constant.
    assert len(sums) >= 3 and max(sums) >= 2 * NEW_BLOCKS, report
