"""Both experiments end to end against a real vLLM (CPU) with offloading to a host-memory pool; last, the test
harness's own stop of the whole server.

The server is tiny and its KV cache small (48 blocks of 32 tokens; the CPU attention backend wants
multiples of 32 without AVX-512), so repeats must come from the CPU
pool. The hit rates checked here are the ones the server reports on /metrics, not the ones asked for.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spillway.core.vllm_api import ENV_SERVER_DEV_MODE
from support import VllmServer, vllm_server_fixture

pytestmark = pytest.mark.engine

BLOCK = 32
GPU_BLOCKS = 48
PREEMPT_OUTPUT = 448  # tokens each preemption request decodes
CPU_POOL_BYTES = 8 * 2**20  # 512 blocks of 16 KiB: holds every prompt of this module


def offload_args() -> list[str]:
    from spillway_connector.host_backend import cpu_offload_args

    return cpu_offload_args(CPU_POOL_BYTES)


# Dev mode serves POST /reset_prefix_cache: the TTFT test evicts GPU copies with it, the throughput test
# with a flush of never-seen prompts.
server = vllm_server_fixture(num_gpu_blocks=GPU_BLOCKS, block_size=BLOCK, max_model_len=1024, max_num_seqs=8,
                             extra_args=offload_args(), env={ENV_SERVER_DEV_MODE: "1"})


def loadtest(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", *args], check=False, capture_output=True, text=True,
                          timeout=timeout)


def test_ttft_repeat_is_served_from_the_cpu_pool(server: VllmServer, tmp_path: Path):
    out = loadtest("run", "--endpoint", server.base_url, "--experiment", "ttft", "--ttft-lengths", "128,512,max",
                   "--ttft-repetitions", "2", "-o", str(tmp_path / "ttft.json"), "--label", "gpu=none")
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "ttft.json").read_text())
    assert result["status"] == "complete"
    env = result["environment"]
    assert env["model"] == server.model and env["vllm_version"] and env["block_size"] == BLOCK
    assert env["gpu_kv_tokens"] == GPU_BLOCKS * BLOCK
    assert env["evict_gpu"] == "reset"
    assert result["ttft"]["evictions"] == [{"method": "reset"}] * 2
    samples = result["ttft"]["samples"]
    longest = (1024 - 1) // BLOCK * BLOCK  # "max": whole blocks under max_model_len, room for the output token
    assert len(samples) == 3 * 2 * 2
    for sample in samples:
        achieved = sample["achieved"]
        assert sample["ok"] and sample["ttft_s"] > 0
        if sample["phase"] == "cold":
            assert achieved["cpu_hit_tokens"] == 0 and achieved["gpu_hit_tokens"] == 0
        else:
            hittable = (sample["length"] - 1) // BLOCK * BLOCK  # vLLM may recompute the last block
            assert achieved["gpu_hit_tokens"] == 0, "the reset left the prompt in the GPU cache"
            assert hittable <= achieved["cpu_hit_tokens"] <= sample["length"], sample
            assert achieved["offload_load_bytes"] > 0
    summary = {row["length"]: row for row in result["ttft"]["summary"]}
    assert set(summary) == {128, 512, longest}
    assert summary[longest]["repeat_cpu_hit_rate"] >= (longest - BLOCK) / longest
    assert summary[512]["recompute_s"]["n"] == 2 and summary[512]["repeat_cpu_hit_rate"] >= 480 / 512
    assert "TTFT, ms" in out.stdout and "512" in out.stdout
    assert (tmp_path / "ttft.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one request at a time: the server's phase histograms count each request alone, and its phases nest inside
    # what the client saw (a pool hit waits in the queue for its copy)
    for sample in samples:
        phases = sample["server"]
        assert phases is not None, sample["counters"]
        assert 0 < phases["ttft_s"] <= sample["ttft_s"]
        assert phases["queue_s"] >= 0 and phases["prefill_s"] > 0 and phases["intake_s"] > -1e-3
        assert phases["queue_s"] + phases["prefill_s"] <= phases["ttft_s"] + 1e-3
        if sample["phase"] == "warm":
            assert 0 < phases["copy_s"] <= phases["queue_s"], phases
    for row in summary.values():
        assert set(row["repeat_server_s"]) == {"ttft_s", "queue_s", "prefill_s", "copy_s", "intake_s"}
    assert "Where a repeat's time to first token went" in out.stdout


def test_throughput_achieves_the_target_hit_rates(server: VllmServer, tmp_path: Path):
    out = loadtest("run", "--endpoint", server.base_url, "--experiment", "throughput", "--num-prompts", "24",
                   "--prompt-len", "128", "--hit-rates", "0,0.5,1", "--concurrency", "8", "--evict-gpu", "flush", "-o",
                   str(tmp_path / "tp.json"), "--no-plot")
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "tp.json").read_text())
    points = result["throughput"]["points"]
    assert [p["target_hit_rate"] for p in points] == [0.0, 0.5, 1.0]
    for p in points:
        achieved = p["achieved"]
        assert p["errors"] == 0 and p["ok"] == 24 and p["prompt_tokens"] == 24 * 128
        assert p["prompt_tokens_per_s"] > 0 and p["requests_per_s"] > 0
        assert achieved["gpu_hit_rate"] == 0, p  # hits come from the CPU pool, not the GPU prefix cache
        assert p["hittable_rate"] - 0.02 <= achieved["cpu_hit_rate"] <= p["placed_rate"], p
    assert points[0]["achieved"]["cpu_hit_rate"] == 0
    assert points[1]["prefix_tokens"] == 64 and points[1]["warmup"]["tokens"] == 24 * 64
    # 24 x 64 tokens fit the GPU cache (1536 tokens): flushed with 1.25x its size; 24 x 128 evict themselves
    assert points[1]["warmup"]["eviction"]["method"] == "flush"
    assert points[1]["warmup"]["eviction"]["tokens"] >= 1.25 * GPU_BLOCKS * BLOCK
    assert points[2]["warmup"]["eviction"] == {"method": "flush", "tokens": 0}
    assert points[2]["achieved"]["cpu_hit_rate"] >= 96 / 128
    assert points[2]["achieved"]["offload_load_bytes"] > points[1]["achieved"]["offload_load_bytes"] > 0
    assert "Throughput" in out.stdout


def test_model_not_served(server: VllmServer, tmp_path: Path):
    out = loadtest("run", "--endpoint", server.base_url, "--model", "nope", "-o", str(tmp_path / "r.json"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        f"spillway: error: model 'nope' is not served by {server.base_url} (served: {server.model})")


def test_prompt_longer_than_the_server_takes(server: VllmServer, tmp_path: Path):
    out = loadtest("run", "--endpoint", server.base_url, "--experiment", "ttft", "--ttft-lengths", "128,4096",
                   "-o", str(tmp_path / "r.json"))
    assert out.returncode == 2
    assert ("TTFT prompt length 4096 + 1 output tokens exceeds the server's max_model_len 1024"
            in out.stderr.strip().splitlines()[-1])


def test_server_refusing_requests(server: VllmServer, tmp_path: Path):
    """This server has no tokenizer: text prompts are answered with an error."""
    out = loadtest("run", "--endpoint", server.base_url, "--prompt-format", "text", "--ttft-lengths", "128",
                   "--prompt-len", "128", "-o", str(tmp_path / "r.json"))
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"spillway: error: {server.base_url}/v1/completions refused a 16-token completion")
    assert "text prompt: HTTP 4" in last or "text prompt: HTTP 5" in last
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "failed"


def test_interrupted_run_keeps_finished_points(server: VllmServer, tmp_path: Path):
    path = tmp_path / "partial.json"
    points = 200  # far more than can finish between the first point landing and the interrupt, on any machine
    proc = subprocess.Popen([sys.executable, "-m", "spillway.cli", "loadtest", "run", "--endpoint", server.base_url,
                             "--experiment", "throughput", "--num-prompts", "8", "--prompt-len", "64",
                             "--hit-rates", ",".join(["0"] * points), "--concurrency", "4", "-o", str(path),
                             "--no-plot"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if path.exists() and json.loads(path.read_text())["throughput"]["points"]:
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    assert f"interrupted; partial result kept in {path}" in stderr
    result = json.loads(path.read_text())
    assert result["status"] == "interrupted"
    assert 1 <= len(result["throughput"]["points"]) < points
    assert all(p["ok"] == 8 for p in result["throughput"]["points"])


def test_job_mode_takes_the_result_from_the_pod_log(server: VllmServer, tmp_path: Path):
    """A real run's log, served as the Job pod's log by an emulated API server, becomes the local result."""
    from kube_emulator import KubeEmulator, job_pod, modelserver

    pod = loadtest("run", "--endpoint", server.base_url, "--experiment", "ttft", "--ttft-lengths", "64",
                   "--ttft-repetitions", "1", "--emit-result", "--progress", "log", "--no-plot",
                   "-o", str(tmp_path / "pod.json"))
    assert pod.returncode == 0, pod.stderr
    with KubeEmulator(tmp_path) as cluster:
        cluster.create(modelserver("tiny", "ns"))
        cluster.create(job_pod("tiny-loadtest", "ns"))
        cluster.serve_log("ns", "tiny-loadtest-x1", pod.stderr + pod.stdout)
        env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
        env.pop("KUBERNETES_SERVICE_HOST", None)
        out = subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", "job", "--modelserver", "tiny",
                              "--experiment", "ttft", "-o", str(tmp_path / "job.json")], check=False,
                             capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "job.json").read_text()) == json.loads((tmp_path / "pod.json").read_text())
    assert "TTFT, ms" in out.stdout
    assert (tmp_path / "job.png").read_bytes()[:4] == b"\x89PNG"
    # a saved `kubectl logs` works as a result file too
    (tmp_path / "pod.log").write_text(pod.stderr + pod.stdout)
    report = loadtest("report", str(tmp_path / "pod.log"), "--plot", str(tmp_path / "from-log.png"))
    assert report.returncode == 0, report.stderr
    assert report.stdout.strip() == out.stdout.strip()  # the same table
    assert (tmp_path / "from-log.png").exists()


def test_no_request_fails_on_a_connection_the_server_is_closing(server: VllmServer):
    """vLLM (uvicorn) closes keep-alive connections idle for 5 s. A phase starting right then must not reuse
    them: with aiohttp's default 15 s pool, some of these requests fail with "Server disconnected"."""
    import asyncio

    from spillway.loadtest.client import OpenAIClient

    async def phases() -> list:
        results = []
        async with OpenAIClient(server.base_url, concurrency=32) as client:
            await client.resolve_model(None)
            for n, pause in enumerate((4.96, 4.98, 5.0, 5.02, 5.04)):
                results += await asyncio.gather(*(client.complete(server.token_ids(10, 1000 * n + i)) for i in range(32)))
                await asyncio.sleep(pause)
            results += await asyncio.gather(*(client.complete(server.token_ids(10, i)) for i in range(32)))
            await client.metrics_text()
        return results

    results = asyncio.run(phases())
    assert [r.error for r in results if not r.ok] == []


def test_preemption_reloads_are_counted_by_vllm_and_by_the_connector(server: VllmServer, tmp_path: Path):
    # 8 sequences growing to 704 tokens need 22 blocks of 32 each; the engine has 48: any 3 running at once must
    # preempt, and a preempted request's stored blocks come back from the CPU pool when it resumes. (Growing to 448
    # needed 4 at once, and one CI run on a loaded machine sent them too far apart to overlap: no preemption.)
    out = loadtest("preemption", "run", "--endpoint", server.base_url, "--requests", "8", "--prompt-len", "256",
                   "--output-tokens", str(PREEMPT_OUTPUT), "--concurrency", "8", "--seed", "3", "-o",
                   str(tmp_path / "p.json"), "--progress", "none")
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["status"] == "complete" and result["schema"] == "spillway.loadtest.preemption/v1"
    (run,) = result["runs"]
    assert run["role"] == "offload" and run["ok"] == 8 and run["output_tokens"] == 8 * PREEMPT_OUTPUT
    achieved = run["achieved"]
    assert achieved["preemptions"] > 0
    assert 0 < achieved["preempted_reload_requests"] <= achieved["preemptions"]
    assert run["preempted_reload_tokens"] >= BLOCK * achieved["preempted_reload_requests"]
    assert achieved["offload_load_bytes"] > 0
    assert run["latency_s"]["p99"] >= run["latency_s"]["p50"] > 0
    assert "Preemption: 8 requests" in out.stdout and "offload" in out.stdout


def test_stop_kills_the_whole_process_group(server: VllmServer):
    """The harness's own promise, checked on this module's engine rather than on one started for it alone (an
    engine start is a minute of the suite's two cores): the engine core and its workers live in the server's
    process group, and stop() leaves none of them. Runs last in this module."""
    from support.vllm_server import _group_alive, _is_live_member, _pids

    pgid = server.pid
    members = [pid for pid in _pids() if _is_live_member(pid, pgid)]
    assert len(members) >= 2, f"expected the API server and its engine core, found {members}"
    server.stop()
    assert not _group_alive(pgid)
    assert not server.running
