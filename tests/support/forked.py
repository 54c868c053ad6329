"""A command run as `python -m MODULE ARGS` would run it, in a child forked from a Python that imported the
module's dependencies once.

A fresh interpreter per call pays the imports each time (about a second for `spillway`, several for vLLM's
argument parser on two busy cores); the tests that run a command dozens of times pay them once here. Each call
still gets a process of its own: its own exit status, its own stdin/stdout/stderr, and module state (caches,
argument parsers, environment) that dies with it, so a call sees nothing of the one before.
"""
from __future__ import annotations

import atexit
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SERVER = r'''
import importlib, json, os, resource, runpy, signal, sys, tempfile, traceback
for name in sys.argv[1:]:
    importlib.import_module(name)
requests, replies = sys.stdin, sys.stdout
for line in requests:
    call = json.loads(line)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {k: os.path.join(tmp, k) for k in ("stdin", "stdout", "stderr")}
        with open(paths["stdin"], "w") as f:
            f.write(call["stdin"] or "")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(call["timeout"])  # a child past its time dies of SIGALRM, as a killed command would
                for name, limit in call["rlimits"].items():
                    resource.setrlimit(getattr(resource, name), (limit, limit))
                for fd, key, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY | os.O_CREAT),
                                      (2, "stderr", os.O_WRONLY | os.O_CREAT)):
                    os.dup2(os.open(paths[key], mode, 0o600), fd)
                sys.stdin = open(0, closefd=False)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                os.environ.clear()
                os.environ.update(call["env"])
                os.chdir(call["cwd"])
                sys.argv = [call["module"], *call["args"]]
                try:
                    if call["module"].endswith(".py"):
                        runpy.run_path(call["module"], run_name="__main__")
                    else:
                        sys.modules.pop(call["module"], None)  # run as __main__, as `python -m` does, not as imported
                        runpy.run_module(call["module"], run_name="__main__", alter_sys=True)
                    code = 0
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                    if not isinstance(exc.code, (int, type(None))):
                        print(exc.code, file=sys.stderr)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out = {"returncode": os.waitstatus_to_exitcode(status)}
        for key in ("stdout", "stderr"):
            with open(paths[key], errors="replace") as f:
                out[key] = f.read()
    replies.write(json.dumps(out) + "\n")
    replies.flush()
'''


class Forked:
    """One server process; `run` forks a child of it per call (`module`: a module name, or a script's path).
    Safe to share between the tests of a session."""

    def __init__(self, preload: list[str]):
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives as long as the server; its output if it dies
        self._proc = subprocess.Popen([sys.executable, "-c", SERVER, *preload], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._lock = threading.Lock()
        atexit.register(self.close)

    def _died(self) -> str:
        self._log.seek(0)
        return f"the fork server exited ({self._proc.returncode}): {self._log.read()[-3000:]}"

    def run(self, module: str, *args: str, stdin: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 300, rlimits: dict[str, int] | None = None) -> subprocess.CompletedProcess:
        """`rlimits`: resource limits set in the child before it runs, by name ({"RLIMIT_AS": bytes})."""
        call = {"module": module, "args": list(args), "stdin": stdin, "env": dict(os.environ if env is None else env),
                "cwd": str(Path.cwd()), "timeout": max(1, math.ceil(timeout)), "rlimits": rlimits or {}}
        with self._lock:
            assert self._proc.poll() is None, self._died()
            self._proc.stdin.write(json.dumps(call) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        assert line, self._died()
        done = json.loads(line)
        argv = [sys.executable, module] if module.endswith(".py") else [sys.executable, "-m", module]
        return subprocess.CompletedProcess([*argv, *args], done["returncode"],
                                           done["stdout"], done["stderr"])

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


# What `python -m spillway.cli` imports for its commands, and transformers' config registry (the planner reads a
# --model-config through it): a fresh interpreter pays about a second for the first and several for the second.
CLI_IMPORTS = ["spillway.cli", "spillway.commands.plan", "spillway.commands.render", "spillway.loadtest.cli",
               "spillway.adapters.model_config", "transformers.models.auto.configuration_auto"]


@functools.cache
def _cli_server() -> Forked:
    return Forked(CLI_IMPORTS)


def spillway_cli(*args: str, stdin: str | None = None, timeout: float = 120, env: dict | None = None,
                 rlimits: dict[str, int] | None = None) -> subprocess.CompletedProcess:
    """`python -m spillway.cli ARGS` in a process of its own, forked from one server per test process."""
    return _cli_server().run("spillway.cli", *args, stdin=stdin, env=env, timeout=timeout, rlimits=rlimits)
