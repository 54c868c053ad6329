"""What a replica's start pays to compile Python it has no bytecode for: the imports of `vllm serve`'s processes
with current .pyc files, and with none, as on a read-only root filesystem whose image ships none.

The operator runs Spillway's vLLM image with a read-only root as a user that owns no site-packages, so Python can
write no bytecode at run time: a module without a .pyc in the image is compiled again, in memory, by every process
(the CLI, the engine core, each API server) at every start. Each case is a fresh interpreter importing what those
processes import before serving (SERVE_IMPORTS); "no bytecode" points Python's bytecode cache at an empty folder
and writes none (PYTHONPYCACHEPREFIX, PYTHONDONTWRITEBYTECODE), which is what such an image does. The cases
alternate, --reps times each; medians and ranges in seconds.

    .venv/bin/python bench/startup-bytecode/bytecode_imports.py [--reps 3] [--json OUT.json]

images/vllm/Dockerfile compiles every site directory for this reason; tests/images/test_vllm_cpu_image.py checks
that the image holds current bytecode for everything these imports load.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What a replica's processes import before serving (tests/images/test_vllm_cpu_image.py checks the image by it).
SERVE_IMPORTS = ("vllm.entrypoints.cli.main", "vllm.entrypoints.openai.api_server", "vllm.v1.engine.core",
                 "vllm.model_executor.models.llama", "spillway_connector.connector")


def import_seconds(env: dict[str, str]) -> float:
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *SERVE_IMPORTS], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "connector"), str(REPO / "operator")])}
    base.pop("PYTHONPYCACHEPREFIX", None)
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    times: dict[str, list[float]] = {"bytecode": [], "no_bytecode": []}
    with tempfile.TemporaryDirectory() as empty:
        import_seconds(base)  # writes any .pyc the environment lacks, and warms the page cache
        none = {**base, "PYTHONPYCACHEPREFIX": empty, "PYTHONDONTWRITEBYTECODE": "1"}
        for _ in range(args.reps):
            times["bytecode"].append(import_seconds(base))
            times["no_bytecode"].append(import_seconds(none))
    result = {
        "question": "imports of vllm serve's processes, with and without bytecode",
        "imports": list(SERVE_IMPORTS),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "vllm": version("vllm-cpu")
                    if _installed("vllm-cpu") else version("vllm"), "torch": version("torch")},
        "seconds": {case: {"median": round(statistics.median(v), 2), "min": round(min(v), 2),
                           "max": round(max(v), 2), "runs": [round(x, 2) for x in v]} for case, v in times.items()},
    }
    result["compile_seconds_per_process"] = round(
        result["seconds"]["no_bytecode"]["median"] - result["seconds"]["bytecode"]["median"], 2)
    for case, row in result["seconds"].items():
        print(f"{case:12} median {row['median']:6.2f} s  ({row['min']:.2f}-{row['max']:.2f}, {args.reps} runs)")
    print(f"compiling costs each process {result['compile_seconds_per_process']:.2f} s of its imports "
          f"({os.cpu_count()} cores, Python {platform.python_version()}, vLLM {result['machine']['vllm']})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


def _installed(name: str) -> bool:
    try:
        version(name)
    except Exception:  # noqa: BLE001 - PackageNotFoundError, or a broken distribution: not this one
        return False
    return True


if __name__ == "__main__":
    main()
