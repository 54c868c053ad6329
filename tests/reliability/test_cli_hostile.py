"""A sweep of hostile values through `spillway plan` and `spillway render`: every invocation ends in exit 0 or
in exit 2 with one line on stderr (argparse's own refusals: its usage and one error line), never a traceback.

In process (spillway.cli.main, the code the console script runs): some 800 invocations in seconds; one
subprocess case checks the real interpreter's exit for the input that used to end in an OverflowError."""
from __future__ import annotations

import contextlib
import io
import itertools
import json
import re

import pytest
import yaml
from harness import LLAMA_8B, modelserver, one_error_line, spillway
from spillway import cli
from test_model_config import LLAMA

NODE = ["--node-memory", "2Ti", "--gpus-per-node", "8"]
VALUES = ["NaN", "nan", "inf", "-inf", "-1", "0", "1e400", "1e-400", "9" * 5000, "", " ", "0x10", "1.5", "-2Ti",
          "99999Ei", "1e18", "../../x", "/dev/zero", "/", "\u00e9\u0301", "$(HOME)", "1/0"]
PLAN_FLAGS = ["--tensor-parallel-size", "--block-size", "--kv-cache-dtype", "--node-memory", "--gpus-per-node",
              "--node-cpus", "--offload-size", "--offload-block-size", "--replicas-per-node", "--vllm-version",
              "--qualified-gbps", "--revision", "--model-config"]
DISK_FLAGS = ["--disk-size", "--disk-capacity", "--node-ephemeral-storage", "--qualified-disk-gbps", "--disk-path",
              "--disk-root-dir"]
# config.json values no model has: huge, not finite, of the wrong type, nested
CONFIG_VALUES = [10**30, 2**63, -(2**63), float("nan"), float("inf"), 0, -1, 1.5, "32", None, True, [32], {"a": 1},
                 [[[[[]]]]], "x" * 10000]
CONFIG_FIELDS = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "max_position_embeddings", "vocab_size", "torch_dtype", "sliding_window", "layer_types"]
SPEC_VALUES = [None, "", "\x00", "a\x00b", "$(SECRET)", 10**30, -1, 1.5, float("nan"), [], {}, [[]], {"a": {"b": []}},
               "x" * 70000, "../../victim/configmaps/private", True]
SPEC_FIELDS = ["model", "revision", "servedModelName", "tensorParallelSize", "replicas", "replicasPerNode",
               "blockSize", "kvCacheDtype", "image", "vllmVersion", "extraArgs", "env", "resources", "nodeSelector",
               "tolerations", "affinity", "offload", "apiKeySecretRef", "hfTokenSecretRef", "modelConfig",
               "networkPolicy", "imagePullSecrets", "routing"]


def run(argv: list[str]) -> tuple[object, str]:
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code: object = cli.main(argv)
    except SystemExit as exc:  # argparse's refusals
        code = exc.code
    return code, err.getvalue()


def refused_cleanly(code: object, stderr: str) -> bool:
    """Exit 0, or exit 2 with one line that says what was wrong: not the CLI's last resort, which names only an
    exception's type (`spillway: error: TypeError: ...`), a check that is missing."""
    lines = stderr.strip().splitlines()
    if code == 0:
        return True
    if code != 2 or "Traceback" in stderr:
        return False
    if lines and lines[0].startswith("usage:"):
        return True
    line = lines[0] if len(lines) == 1 else ""
    said = line.removeprefix("spillway: error: ")
    return line.startswith("spillway: error: ") and not re.match(r"\w+Error: |an input too large", said)


def sweep(argvs: list[list[str]]) -> list[str]:
    failures = []
    for argv in argvs:
        code, stderr = run(argv)
        if not refused_cleanly(code, stderr):
            failures.append(f"{[a[:40] for a in argv]}: exit {code}: {stderr[-400:]}")
    return failures


def test_hostile_plan_flags():
    argvs = []
    for flag, value in itertools.product(PLAN_FLAGS, VALUES):
        argv = ["plan", "--model", LLAMA_8B, *NODE] if flag != "--model-config" else ["plan", *NODE]
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        argvs.append(argv)
    for flag, value in itertools.product(DISK_FLAGS, VALUES):
        volume = ["--disk-volume", "hostPath", "--disk-path", "/mnt/x"] if flag == "--disk-capacity" else []
        volume = ["--disk-volume", "hostPath", "--disk-capacity", "1Ti"] if flag == "--disk-path" else volume
        argvs.append(["plan", "--model", LLAMA_8B, *NODE, "--disk-tier", *volume, flag, value])
    assert sweep(argvs) == []


def test_hostile_config_json_values(tmp_path):
    argvs = []
    for i, (field, value) in enumerate(itertools.product(CONFIG_FIELDS, CONFIG_VALUES)):
        path = tmp_path / f"config-{i}.json"
        path.write_text(json.dumps({**LLAMA, field: value}))  # NaN and Infinity as Python's json writes them
        argvs += [["plan", "--model-config", str(path), *NODE], ["plan", "--model-config", str(path)]]
    assert sweep(argvs) == []


def test_hostile_modelserver_fields(tmp_path):
    argvs = []
    for i, (field, value) in enumerate(itertools.product(SPEC_FIELDS, SPEC_VALUES)):
        body = modelserver(**{field: value})
        for variant, spec in enumerate((body["spec"], {**body["spec"], "extraArgs": [value]},
                                        {**body["spec"], "offload": {"disk": {"enabled": True, "volume": value}}})):
            path = tmp_path / f"ms-{i}-{variant}.yaml"
            path.write_text(yaml.safe_dump({**body, "spec": spec}, allow_unicode=True))
            argvs.append(["render", "-f", str(path), *NODE])
    assert sweep(argvs) == []


def test_a_config_of_10_to_the_30_layers_is_one_line_from_the_installed_cli(tmp_path):
    """It used to end in an OverflowError's traceback (a list of one entry per layer)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "num_hidden_layers": 10**30}))
    one_error_line(spillway("plan", "--model-config", str(path), *NODE, timeout=60))


@pytest.mark.parametrize("args", [["plan", "--model", LLAMA_8B, "--node-memory", "2Ti", "--gpus-per-node", "8"]])
def test_a_reader_that_goes_away_is_no_traceback(args):
    """`spillway plan ... | head -1`: the closed pipe ends the command quietly."""
    import subprocess
    import sys
    done = subprocess.run(f"{sys.executable} -m spillway.cli {' '.join(args)} | head -c 1 >/dev/null",
                          shell=True, capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
