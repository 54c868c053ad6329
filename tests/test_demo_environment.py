"""`make demo` runs in a venv of the runtime dependencies only: its commands import nothing else.

The demo venv holds the two packages and exactly the operator image's lock (images/operator/requirements.txt,
the closure of their declared dependencies), not vLLM, torch or the test tools. Here each `spillway` command of
the Makefile's demo target runs with every other installed distribution made unimportable, as in that venv.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNTIME_LOCK = REPO / "images" / "operator" / "requirements.txt"
DEMO_COMMAND = re.compile(r"^DEMO_(?:PLAN|RENDER) := (.+)$", flags=re.MULTILINE)

# Runs `spillway ARGS` with a finder that refuses any top-level module outside the standard library, the
# two packages and the allowed distributions: ModuleNotFoundError, exactly what the lean venv would raise.
RUNNER = """
import importlib.abc, importlib.metadata, json, re, sys
allowed = set(json.loads(sys.argv[1]))
owners = importlib.metadata.packages_distributions()
own = {"spillway", "spillway_connector"}

def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()

class RuntimeOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top in own or top.startswith("__editable__"):
            return None
        if {canonical(d) for d in owners.get(top, [])} & allowed:
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (not a runtime dependency)", name=name)

sys.meta_path.insert(0, RuntimeOnly())
from spillway.cli import main
sys.exit(main(sys.argv[2:]))
"""


def runtime_distributions() -> list[str]:
    """The lock's names, canonical (the lock writes them so)."""
    lines = [line.strip() for line in RUNTIME_LOCK.read_text().splitlines()]
    return sorted(line.partition("==")[0] for line in lines if line and not line.startswith("#"))


def test_the_demo_installs_the_runtime_lock():
    assert "-r $(RUNTIME_LOCK)" in (REPO / "Makefile").read_text()
    assert {"kopf", "kubernetes", "pyyaml"} <= set(runtime_distributions())


def demo_commands() -> list[str]:
    return DEMO_COMMAND.findall((REPO / "Makefile").read_text())


def test_the_makefile_has_demo_commands():
    assert [command.split()[0] for command in demo_commands()] == ["plan", "render"]


@pytest.mark.parametrize("command", demo_commands(), ids=lambda c: c.split()[0])
def test_demo_command_needs_only_runtime_dependencies(command):
    result = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(runtime_distributions()), *command.split()],
                            cwd=REPO, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()


def test_a_module_outside_the_runtime_dependencies_is_refused():
    """The finder above can fail: with the allowed set emptied, even PyYAML cannot be imported."""
    result = subprocess.run([sys.executable, "-c", RUNNER, "[]", "plan", "--model", "meta-llama/Llama-3.1-8B-Instruct"],
                            cwd=REPO, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode != 0
    assert "not a runtime dependency" in result.stderr
