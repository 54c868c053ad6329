"""support/forked.py against a fresh interpreter: the same exit status, output and error for the same script,
and nothing one call changes is seen by the next."""
from __future__ import annotations

import subprocess
import sys

import pytest

from support.forked import Forked

SCRIPT = '''
import json, os, sys
state = sys.modules["json"]
print("seen", getattr(state, "marker", None), os.environ.get("FORKED_MARK"))
state.marker = "set by an earlier call"
os.environ["FORKED_MARK"] = "leaked"
data = sys.stdin.read()
if data == "boom":
    raise RuntimeError("boom")
print("stdin", data, file=sys.stderr)
sys.exit(int(sys.argv[1]))
'''


@pytest.fixture(scope="module")
def forked():
    server = Forked(["json"])
    yield server
    server.close()


@pytest.mark.parametrize("code, stdin", [("0", "x"), ("2", ""), ("3", "boom")])
def test_a_call_is_what_a_fresh_interpreter_gives(forked, tmp_path, code, stdin):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    fresh = subprocess.run([sys.executable, str(script), code], input=stdin, capture_output=True, text=True,
                           check=False)
    for _ in range(2):  # the second call sees nothing of the first
        done = forked.run(str(script), code, stdin=stdin)
        assert (done.returncode, done.stdout) == (fresh.returncode, fresh.stdout)
        assert done.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1], done.stderr


def test_a_call_past_its_time_is_stopped_and_the_server_goes_on(forked, tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(30)\n")
    assert forked.run(str(script), timeout=1).returncode < 0
    assert forked.run("json.tool", stdin='{"a": 1}').stdout.split() == ["{", '"a":', "1", "}"]


def test_a_memory_limit_holds_in_the_child(forked, tmp_path):
    script = tmp_path / "alloc.py"
    script.write_text("b = bytearray(3 << 30)\nprint('allocated')\n")
    limited = forked.run(str(script), rlimits={"RLIMIT_AS": 2 << 30})
    assert limited.returncode == 1 and limited.stderr.strip().endswith("MemoryError"), limited.stderr
    assert forked.run(str(script)).stdout == "allocated\n"  # the limit was that child's alone
