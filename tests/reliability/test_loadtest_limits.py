"""The load tester against a server that accepts connections and never answers, and with numbers that
are not numbers: it stops soon with one clear line, and never writes NaN."""
from __future__ import annotations

import socket
import threading
import time

import pytest
from harness import LLAMA_8B, one_error_line, spillway


@pytest.fixture()
def silent_server():
    """Accepts every connection, reads nothing, answers nothing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    listener.close()


def test_a_server_that_never_answers_fails_discovery_within_a_minute(silent_server, tmp_path):
    started = time.monotonic()
    done = spillway("loadtest", "run", "--endpoint", silent_server, "--no-plot", "--progress", "log",
                    "-o", str(tmp_path / "r.json"), timeout=90)
    elapsed = time.monotonic() - started
    one_error_line(done, silent_server)
    assert elapsed < 60, elapsed


UNREACHABLE = "http://127.0.0.1:9"  # nothing listens: a flag the run accepted would fail later, on the endpoint


@pytest.mark.parametrize("flag, value", [
    ("--request-timeout-s", "-1"), ("--request-timeout-s", "0"), ("--request-timeout-s", "nan"),
    ("--request-timeout-s", "inf"), ("--settle-s", "nan"), ("--settle-s", "inf"),
])
def test_numeric_flags_are_checked_before_the_run(tmp_path, flag, value):
    done = spillway("loadtest", "run", "--endpoint", UNREACHABLE, "--no-plot", "-o", str(tmp_path / "r.json"),
                    f"{flag}={value}", timeout=60)
    one_error_line(done, flag)


@pytest.mark.parametrize("value", ["nan", "inf", "-3", "0"])
def test_plan_refuses_a_qualified_rate_that_is_not_a_rate(value):
    done = spillway("plan", "--model", LLAMA_8B, "--node-memory", "2Ti", "--gpus-per-node", "8",
                    f"--qualified-gbps={value}", "-o", "json")
    one_error_line(done, "--qualified-gbps")
    assert "NaN" not in done.stdout
