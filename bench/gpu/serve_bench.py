#!/usr/bin/env python3
"""Exp. 1 (TTFT vs prompt length) and Exp. 2 (throughput vs CPU hit rate) against `vllm serve` over HTTP.

Each engine in the spec file starts with exactly the args/env `spillway plan` produces for this machine
(plus the flags that make a weightless benchmark: dummy weights, token-id prompts, GPU prefix
cache off), runs its experiments, and is stopped. Every phase records vLLM's /metrics before and after,
so the hit rate and bytes moved that the server counted sit next to what the client measured.

    python3 bench/gpu/serve_bench.py --spec bench/headline/engines.json --out /tmp/work --deadline-s 540
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from spillway.core import vllm_api as api
from spillway.core.vllm_api import Metric

HERE = Path(__file__).resolve().parent
BENCH_FLAGS = [api.FLAG_NO_ENABLE_PREFIX_CACHING]  # + the load format, eager and tokenizer per spec
MODEL_NAME = "llama"
NUDGE = 32  # tokens of the request that makes an idle engine take a step
RETRIES = [0]  # requests sent a second time after a dropped connection
TOKEN_LOW, TOKEN_HIGH = 1000, 120000  # ordinary vocabulary ids of Llama 3 (specials start at 128000)
COUNTERS = {
    "load_bytes": Metric.OFFLOAD_LOAD_BYTES, "load_time_s": Metric.OFFLOAD_LOAD_TIME,
    "store_bytes": Metric.OFFLOAD_STORE_BYTES, "store_time_s": Metric.OFFLOAD_STORE_TIME,
    "external_hits": Metric.EXTERNAL_HITS, "external_queries": Metric.EXTERNAL_QUERIES,
    "prefix_hits": Metric.PREFIX_HITS, "prefix_queries": Metric.PREFIX_QUERIES,
    "preemptions": Metric.PREEMPTIONS, "prompt_tokens": Metric.PROMPT_TOKENS,
    "ttft_sum_s": Metric.TTFT + "_sum", "ttft_count": Metric.TTFT + "_count",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- plan ----------------------------------------------------------------------------------------------
def spillway_plan(model: str, node_memory: str, flags: list[str]) -> dict[str, Any]:
    """The plan `spillway plan ... -o json` prints, from the same arguments through plan_from_args()."""
    from spillway.commands import plan as plan_cli

    parser = argparse.ArgumentParser(prog="spillway")
    plan_cli.add_parser(parser.add_subparsers(dest="command"))
    argv = ["plan", "--model", model, "--node-memory", node_memory, "--gpus-per-node", "1", "-o", "json", *flags]
    result = plan_cli.plan_from_args(parser.parse_args(argv))
    return {"command": "spillway " + " ".join(argv), "plan": json.loads(result.to_json())}


def node_memory() -> str:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1])}Ki"
    raise RuntimeError("no MemTotal in /proc/meminfo")


def env_accepted(name: str, value: str, extra_path: str) -> str | None:
    """None when this vLLM accepts the variable's value, else vLLM's own error line. vLLM reads only its own
    VLLM_ variables through vllm.envs; the others (PYTHONHASHSEED, SPILLWAY_PREFAULT_THREADS) pass as they are."""
    if not name.startswith("VLLM_"):
        return None
    code = f"import vllm.envs as e; getattr(e, {name!r})"
    env = {**os.environ, name: value, "PYTHONPATH": extra_path}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    if out.returncode == 0:
        return None
    return (out.stderr.strip().splitlines() or ["failed"])[-1][:300]


KNOBS = {"max_model_len": api.FLAG_MAX_MODEL_LEN, "max_num_seqs": api.FLAG_MAX_NUM_SEQS,
         "max_num_batched_tokens": api.FLAG_MAX_NUM_BATCHED_TOKENS}


def with_connector_extra_config(args: list[str], extra: dict[str, Any]) -> list[str]:
    """The plan's args with `extra` merged into its --kv-transfer-config's kv_connector_extra_config."""
    if api.FLAG_KV_TRANSFER_CONFIG not in args:
        raise ValueError("connector_extra_config needs an offload engine (the plan has no connector)")
    i = args.index(api.FLAG_KV_TRANSFER_CONFIG) + 1
    config = json.loads(args[i])
    config[api.KV_CONNECTOR_EXTRA_CONFIG_KEY] = {**config.get(api.KV_CONNECTOR_EXTRA_CONFIG_KEY, {}), **extra}
    return [*args[:i], api.flag_value(config), *args[i + 1:]]


def engine_argv(common: dict, engine: dict, node_memory: str, node_cpus: int,
                bench: list[str] | tuple = ()) -> tuple[dict, list[str], str]:
    """An engine's plan, its vLLM args (the plan's, then `bench`, then the engine's extra_args, which win) and
    the command that planned it.

    An engine with `stock_args` is not planned: it is vLLM as a user of another guide starts it (those args
    only, no environment of ours), the peer the planned engines are measured against.
    """
    if "stock_args" in engine:
        return {"vllm": {"args": list(engine["stock_args"]), "env": {}}, "pool": None}, \
            [*engine["stock_args"], *bench], "vllm serve (stock: not planned)"
    cpus = ["--node-cpus", str(node_cpus)] if common.get("plan_node_cpus") else []  # the plan's API servers
    planned = spillway_plan(common["model"], node_memory, [*cpus, *engine.get("plan_flags", [])])
    args = [*planned["plan"]["vllm"]["args"], *bench, *engine.get("extra_args", [])]
    if engine.get("connector_extra_config"):  # a connector setting the planner does not choose yet, to measure it
        args = with_connector_extra_config(args, engine["connector_extra_config"])
    return planned["plan"], args, planned["command"]


def knob_flags(cfg: dict[str, Any]) -> list[str]:
    """Engine knobs named in the spec file, as vLLM flags."""
    out = []
    for key, flag in KNOBS.items():
        if cfg.get(key) is not None:
            out += [flag, str(cfg[key])]
    return out


# -- the server ------------------------------------------------------------------------------------------
class Server:
    def __init__(self, model_dir: str, args: list[str], env: dict[str, str], port: int, log_path: Path,
                 entry: str = "serve"):
        # "serve" is `vllm serve`; "api_server" the module behind it (for CPU builds whose CLI will not load)
        head = (["vllm.entrypoints.cli.main", "serve", model_dir] if entry == "serve"
                else ["vllm.entrypoints.openai.api_server", "--model", model_dir])
        self.cmd = [sys.executable, "-m", *head, *args, api.FLAG_SERVED_MODEL_NAME, MODEL_NAME, api.FLAG_PORT, str(port)]
        self.env, self.port, self.log_path = env, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_file = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.started = time.time()
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    FATAL = ("Engine core initialization failed", "EngineCore failed to start", "Worker failed with error")

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float) -> float:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log_path.name}")
            self.log_file.flush()
            tail = self.log_path.read_text(errors="replace")[-20000:]
            fatal = next((line for line in tail.splitlines() if any(f in line for f in self.FATAL)), None)
            if fatal:
                raise RuntimeError(f"engine failed to start: {fatal.strip()[-300:]}")
            try:
                async with session.get(self.url + api.HEALTH_PATH) as r:
                    if r.status == 200:
                        return time.time() - self.started
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(1.0)
        raise TimeoutError(f"server not ready after {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log_file.close()
        self.proc = None


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + api.METRICS_PATH) as r:
        text = await r.text()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        name = m.group(1)
        if name.endswith("_created"):
            continue
        try:
            totals[name] = totals.get(name, 0.0) + float(m.group(3))
        except ValueError:
            continue
    out = {}
    for key, base in COUNTERS.items():
        value = totals.get(base + "_total", totals.get(base))
        if value is not None:
            out[key] = value
    for name, value in totals.items():  # the connector plugin's own series, whatever they are
        if name.startswith("spillway"):
            out[name] = value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    if d.get("load_time_s"):
        d["load_gbps"] = d.get("load_bytes", 0.0) / d["load_time_s"] / 1e9
    if d.get("store_time_s"):
        d["store_gbps"] = d.get("store_bytes", 0.0) / d["store_time_s"] / 1e9
    if d.get("external_queries"):
        d["external_hit_rate"] = d.get("external_hits", 0.0) / d["external_queries"]
    return d


async def settle(session, url: str, nudge: list[int], quiet_s: float = 0.6, timeout: float = 30.0) -> dict:
    """Wait until no store is running (the store byte counter stops moving); returns the last scrape.

    vLLM submits a finished request's store at the start of the next engine step, and an idle engine takes
    no step: a short request first makes sure the store is under way.
    """
    await batch(session, url, [nudge])
    last = await scrape(session, url)
    t_end = time.time() + timeout
    while time.time() < t_end:
        await asyncio.sleep(quiet_s)
        now = await scrape(session, url)
        if now.get("store_bytes") == last.get("store_bytes") and now.get("load_bytes") == last.get("load_bytes"):
            return now
        last = now
    return last


# -- requests --------------------------------------------------------------------------------------------
class Prompts:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def fresh(self, length: int) -> list[int]:
        return [self.rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(length)]


def body(tokens: list[int], stream: bool) -> bytes:
    return json.dumps({"model": MODEL_NAME, "prompt": tokens, "max_tokens": 1, "temperature": 0.0,
                       "ignore_eos": True, "stream": stream}).encode()


async def ttft(session, url: str, tokens: list[int]) -> float:
    """Seconds from sending to the first streamed token."""
    data = body(tokens, stream=True)
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", data=data, headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:300]}")
        first = None
        async for line in r.content:
            if first is None and line.startswith(b"data:") and b"[DONE]" not in line:
                first = time.perf_counter() - t0
        if first is None:
            raise RuntimeError("stream ended without a token")
        return first


async def batch(session, url: str, prompts: list[list[int]]) -> tuple[float, list[float]]:
    """Send all prompts at once (in this order); wall seconds until the last answer, and each latency."""
    bodies = [body(p, stream=False) for p in prompts]
    t0 = time.perf_counter()

    async def one(data: bytes) -> float:
        for attempt in range(2):  # one retry when a kept-alive connection was closed under us
            try:
                async with session.post(url + "/v1/completions", data=data,
                                        headers={"Content-Type": "application/json"}) as r:
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:300]}")
                    await r.read()
                return time.perf_counter() - t0
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                RETRIES[0] += 1
                if attempt:
                    raise
        raise AssertionError("unreachable")

    tasks = []
    for data in bodies:  # created in order so the server sees the hits first
        tasks.append(asyncio.ensure_future(one(data)))
        await asyncio.sleep(0)
    latencies = await asyncio.gather(*tasks)
    return time.perf_counter() - t0, list(latencies)


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    med = statistics.median(values)
    return {"median": med, "min": min(values), "max": max(values), "n": len(values),
            "spread_pct": (max(values) - min(values)) / med * 100 if med else 0.0}


# -- experiments -------------------------------------------------------------------------------------------
async def exp_ttft(session, url: str, cfg: dict, prompts: Prompts, offload: bool, deadline: float,
                   out: dict[str, Any]) -> dict:
    """Per length: a fresh prompt (recompute), then the same prompt again (served from CPU when offloading).
    Fills `out` as it goes, so a failure keeps what was measured."""
    out["lengths"] = {}
    for _ in range(2):  # warm-up, not recorded
        await ttft(session, url, prompts.fresh(1024))
    for length in cfg["lengths"]:
        rows: list[dict] = []
        out["lengths"][str(length)] = {"rows": rows}
        for rep in range(cfg["reps"]):
            if time.time() > deadline:
                out["cut_short"] = f"deadline reached at {length} tokens, repeat {rep}"
                break
            p = prompts.fresh(length)
            m0 = await scrape(session, url)
            first_t0 = time.time()
            first = await ttft(session, url, p)
            m1 = await settle(session, url, prompts.fresh(NUDGE)) if offload else await scrape(session, url)
            second_t0 = time.time()
            second = await ttft(session, url, p)
            m2 = await scrape(session, url)
            rows.append({"rep": rep, "recompute_s": first, "second_s": second, "first_t0": first_t0,
                         "second_t0": second_t0,
                         "first_metrics": delta(m1, m0), "second_metrics": delta(m2, m1)})
        r = out["lengths"][str(length)]
        r.update(recompute_s=stats([x["recompute_s"] for x in rows]), second_s=stats([x["second_s"] for x in rows]))
        if rows:
            log(f"  TTFT {length:6d}: recompute {r['recompute_s']['median'] * 1e3:7.1f} ms, second "
                f"{r['second_s']['median'] * 1e3:7.1f} ms ({'from CPU' if offload else 'recompute'})")
        if "cut_short" in out:
            break
    return out


async def exp_throughput(session, url: str, cfg: dict, prompts: Prompts, offload: bool, deadline: float,
                         out: dict[str, Any]) -> dict:
    """A working set W of n prompts is sent once (warm-up); then passes of n prompts, a fraction h from W
    (the most recently served ones, sent first) and the rest fresh."""
    n, length = cfg["n"], cfg["len"]
    working = [prompts.fresh(length) for _ in range(n)]
    m0 = await scrape(session, url)
    wall, _ = await batch(session, url, working)
    m1 = (await settle(session, url, prompts.fresh(NUDGE), timeout=60)) if offload else await scrape(session, url)
    out.update({"n": n, "len": length, "warm": {"wall_s": wall, "tok_s": n * length / wall,
                                                "metrics": delta(m1, m0)}, "passes": {}})
    log(f"  warm-up pass: {n * length / wall / 1e3:.1f}K prompt tok/s")
    recent = working
    for h in cfg["hits"]:
        rows = []
        for rep in range(cfg["reps"]):
            if time.time() > deadline:
                out["cut_short"] = f"deadline reached at hit rate {h}, repeat {rep}"
                break
            k = round(h * n)
            hits = recent[len(recent) - k:] if k else []
            sent = hits + [prompts.fresh(length) for _ in range(n - k)]
            m0 = await scrape(session, url)
            t_start = time.time()
            wall, lat = await batch(session, url, sent)
            m1 = (await settle(session, url, prompts.fresh(NUDGE), timeout=60)) if offload else await scrape(session, url)
            recent = hits if k else recent
            d = delta(m1, m0)
            rows.append({"rep": rep, "t0": t_start, "wall_s": wall, "tok_s": n * length / wall,
                         "latency_s": stats(lat),
                         "metrics": d})
            out["passes"][str(h)] = {"rows": rows, "tok_s": stats([r["tok_s"] for r in rows])}
            log(f"  hit {h:.0%} rep {rep}: {n * length / wall / 1e3:7.1f}K prompt tok/s, server-counted CPU hit "
                f"rate {d.get('external_hit_rate', 0):.2f}, load {d.get('load_gbps', 0):.1f} GB/s (GPU time)")
        out["passes"][str(h)] = {"rows": rows, "tok_s": stats([r["tok_s"] for r in rows])}
        if "cut_short" in out:
            break
    return out


async def run_loadtest(url: str, spec: dict, out_dir: Path, deadline: float) -> dict:
    """`spillway loadtest run` against this engine; its JSON lands beside ours."""
    path = out_dir / f"loadtest-{spec['name']}.json"
    cmd = [sys.executable, "-m", "spillway.loadtest", "run", "--endpoint", url, "-o", str(path), "--no-plot",
           "--progress", "log", "--label", f"engine={spec['name']}", *spec["loadtest"]]
    log(f"  spillway loadtest {' '.join(cmd[3:])}")
    t0 = time.time()
    rc, text = await run_subprocess(cmd, out_dir / f"loadtest-{spec['name']}.log", deadline)
    for line in text.splitlines()[-15:]:
        log("    " + line)
    return {"command": ["spillway", *cmd[3:]], "rc": rc, "seconds": time.time() - t0,
            "result_file": path.name if path.exists() else None}


# -- the connector's plugin and profiles ------------------------------------------------------------------
# The connector's vllm.general_plugins entry point (spillway_connector/plugin.py: the detokenizer window and the
# orjson body read), as the wheel declares it (connector/pyproject.toml). The staged trees run the connector from
# this checkout on PYTHONPATH, without the wheel's metadata: a dist-info folder beside it lets vLLM find the entry
# point, for the engines that measure Spillway. Every other engine runs with SPILLWAY_VLLM_PLUGIN=off, so a
# stock engine stays stock even where the wheel is installed.
PLUGIN_ENV = "SPILLWAY_VLLM_PLUGIN"  # spillway_connector.plugin.PLUGIN_ENV (the bench imports no connector code)


def plugin_site(out_dir: Path) -> Path:
    """A folder holding only the connector's dist-info (name, version, entry point), for PYTHONPATH."""
    import tomllib

    project = tomllib.loads((HERE.parent.parent / "connector" / "pyproject.toml").read_text())["project"]
    site = out_dir / "plugin-site"
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"]
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in entries.items())
        for group, entries in points.items()))
    return site


def wants_plugin(spec: dict) -> bool:
    """Spillway's engines (kind spillway, or an older engine set that listed the image's patches) load it."""
    if "spillway_plugin" in spec:
        return bool(spec["spillway_plugin"])
    return "stock_args" not in spec and (spec.get("kind") == "spillway" or bool(spec.get("vllm_patches")))


def engine_pids(server_pid: int) -> dict[str, int]:
    """The engine core's and an API server's pids (vLLM names its processes with setproctitle; with one API
    server the server process itself serves)."""
    import psutil

    found = {"api_server": server_pid}
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            title = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "EngineCore" in title and "engine_core" not in found:
            found["engine_core"] = child.pid
        if "APIServer" in title and found["api_server"] == server_pid:  # --api-server-count > 1: the first
            found["api_server"] = child.pid
    return found


def collapsed_summary(path: Path, top: int = 25) -> dict[str, Any]:
    """py-spy's collapsed stacks ("f1;f2;f3 count") as self and inclusive sample shares per function."""
    self_n: dict[str, int] = {}
    incl_n: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = [f.split(" (")[0] + (" " + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1]
                                      if " (" in f else "") for f in stack.split(";")]
        total += n
        self_n[frames[-1]] = self_n.get(frames[-1], 0) + n
        for f in set(frames):
            incl_n[f] = incl_n.get(f, 0) + n

    def share(counts: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(v / total, 4)) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": total, "self": share(self_n), "inclusive": share(incl_n)}


def start_spies(pids: dict[str, int], prof: dict, out_dir: Path, name: str) -> dict:
    spies = {}
    for role, pid in pids.items():
        path = out_dir / f"pyspy-{name}-{role}.txt"
        cmd = [prof.get("py_spy", "py-spy"), "record", "--pid", str(pid), "--format", "raw", "--rate",
               str(prof.get("rate", 100)), "--output", str(path)]
        spies[role] = (path, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    return spies


def stop_spies(spies: dict) -> dict:
    """SIGINT makes py-spy write what it sampled."""
    profiles = {}
    for role, (path, proc) in spies.items():
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        profiles[role] = (collapsed_summary(path) if path.exists()
                          else {"error": (err or b"").decode(errors="replace")[-400:]})
    return profiles


def profiles(spec: dict) -> list[dict]:
    """An engine's profiled runs: "profile" (one) or "profiles" (several, each with its own "name")."""
    return spec.get("profiles") or ([spec["profile"]] if "profile" in spec else [])


async def run_profiled(url: str, spec: dict, prof: dict, out_dir: Path, deadline: float, server: Server) -> dict:
    """A `spillway loadtest` run (prof["loadtest"]) with py-spy sampling the engine core and the API server
    meanwhile: where their time goes at that load."""
    name = spec["name"] + (f"-{prof['name']}" if prof.get("name") else "")
    pids = engine_pids(server.proc.pid)
    spies = start_spies(pids, prof, out_dir, name)
    await asyncio.sleep(1.0)
    run = await run_loadtest(url, {**spec, "name": name + "-profiled", "loadtest": prof["loadtest"]},
                             out_dir, deadline)
    out: dict[str, Any] = {"pids": pids, "loadtest": run}
    out["profiles"] = stop_spies(spies)
    return out


async def run_subprocess(cmd: list[str], log_path: Path, deadline: float) -> tuple[object, str]:
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=max(10.0, deadline - time.time()))
        rc: object = proc.returncode
    except TimeoutError:
        proc.kill()
        out, rc = b"", "killed at the deadline"
    text = (out or b"").decode(errors="replace")
    log_path.write_text(text)
    return rc, text


async def run_vllm_bench(url: str, common: dict, spec: dict, run: dict, out_dir: Path, deadline: float) -> dict:
    """vLLM's own load generator (`vllm bench serve`, random dataset) against the same engine: the cross-check."""
    name = f"vllm-bench-{spec['name']}-{run['name']}"
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
           "--base-url", url, "--model", MODEL_NAME, "--tokenizer", common["words_model_dir"],
           "--dataset-name", "random", "--ignore-eos", "--save-result", "--result-dir", str(out_dir),
           "--result-filename", f"{name}.json", *run["args"]]
    log(f"  vllm bench serve {' '.join(run['args'])}")
    t0 = time.time()
    rc, text = await run_subprocess(cmd, out_dir / f"{name}.log", deadline)
    for line in text.splitlines()[-28:]:
        log("    " + line)
    out: dict[str, Any] = {"name": run["name"], "command": ["vllm", *cmd[3:]], "rc": rc, "seconds": time.time() - t0}
    path = out_dir / f"{name}.json"
    if path.exists():
        full = json.loads(path.read_text())
        out["figures"] = {k: full[k] for k in ("duration", "completed", "total_input_tokens", "request_throughput",
                                               "median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms", "std_ttft_ms",
                                               "median_e2el_ms") if k in full}
        if full.get("duration"):
            out["figures"]["input_tok_s"] = full["total_input_tokens"] / full["duration"]
        out["figures"]["ttfts_ms"] = [t * 1e3 for t in full.get("ttfts", [])][:64]
    else:
        out["error"] = text.strip().splitlines()[-1:] if text.strip() else "no output"
    return out


async def run_loadtest_command(url: str, subcommand: list[str], stem: str, extra: list[str], out_dir: Path,
                               deadline: float, tail: int, label: str) -> dict:
    """`spillway loadtest <subcommand>` against this engine, its result file `<stem>.json` and log `<stem>.log`:
    the command as a user types it, its exit, its time and its result (None when it wrote none)."""
    path = out_dir / f"{stem}.json"
    cmd = [sys.executable, "-m", "spillway.loadtest", *subcommand, "--endpoint", url, "-o", str(path),
           "--label", label, *extra]
    log(f"  spillway loadtest {' '.join(cmd[3:])}")
    t0 = time.time()
    rc, text = await run_subprocess(cmd, out_dir / f"{stem}.log", deadline)
    for line in text.splitlines()[-tail:]:
        log("    " + line)
    return {"command": ["spillway", *cmd[3:]], "rc": rc, "seconds": time.time() - t0,
            "result": json.loads(path.read_text()) if path.exists() else None}


async def run_preemption(url: str, spec: dict, out_dir: Path, deadline: float) -> dict:
    """`spillway loadtest preemption` against this engine."""
    return await run_loadtest_command(url, ["preemption"], f"preemption-{spec['name']}",
                                      ["--progress", "log", *spec["preemption"]], out_dir, deadline, tail=6,
                                      label=f"engine={spec['name']}")


_PREEMPT_LOG = re.compile(r"Preemptions: (\d+)")


def engine_log_facts(path: Path) -> dict:
    """What the engine's own log says: preemptions of its periodic stats lines, errors."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    lines = text.splitlines()
    return {"preemptions_logged": sum(int(n) for n in _PREEMPT_LOG.findall(text)),
            "cuda_graphs_captured": "Graph capturing finished" in text,
            "kv_cache_lines": [line[-300:] for line in lines if _KV_LINE.search(line)][:30],
            "startup_lines": [line[-200:] for line in lines if _START_LINE.search(line)][:40],
            "error_lines": [line[-300:] for line in lines if "Error" in line or "Traceback" in line][-5:]}


# what the KV cache became (block and page sizes, GPU tokens, CPU pool) and when each start phase ended (the
# pool's file, pre-fault and registration among them), as the engine logs them with second timestamps
_KV_LINE = re.compile(r"KV cache|kv cache|block size|page size|[Mm]amba|Maximum concurrency|num_gpu_blocks|CPU blocks")
_START_LINE = re.compile(r"mmap|CPU tensors|[Rr]egister|offload|spillway_connector|Model loading took|Loading weights took|"
                         r"Graph capturing|torch.compile|init engine|KV cache size|Starting vLLM|Application startup")


async def run_verify(url: str, spec: dict, out_dir: Path, deadline: float) -> list[dict]:
    """`spillway loadtest verify run` against this engine, once per argument list of the spec's "verify"."""
    return [await run_loadtest_command(url, ["verify", "run"], f"verify-{spec['name']}-{i}", extra, out_dir, deadline,
                                       tail=12, label=f"engine={spec['name']}")
            for i, extra in enumerate(spec["verify"])]


def bench_flags(spec: dict) -> list[str]:
    """Dummy weights, unless the engine asks for seeded random ones (`random_weights`: verify needs weights under
    which the KV decides the output)."""
    return [api.FLAG_LOAD_FORMAT, "safetensors" if spec.get("random_weights") else "dummy", *BENCH_FLAGS]


def random_weights_dir(spec: dict, model_dir: str) -> tuple[str, float]:
    """The model directory with seeded random weights written beside its files (in /dev/shm: 16 GB for
    Llama-3.1-8B is read back at memory speed), and the seconds the write took."""
    t0 = time.time()
    dest = Path("/dev/shm") / f"spillway-random-{spec['name']}"
    # its own process: the CUDA context and the allocator's cache that drew the weights leave with it, before
    # vLLM sizes its KV cache from the GPU's free memory
    subprocess.run([sys.executable, str(HERE / "random_weights.py"), model_dir, str(dest),
                    "--seed", str(int(spec["random_weights"].get("seed", 0)))], check=True)
    return str(dest), time.time() - t0


async def run_engine(spec: dict, common: dict, out_dir: Path, deadline: float) -> dict:
    result: dict[str, Any] = {"name": spec["name"]}
    RETRIES[0] = 0
    plan, args, result["plan_command"] = engine_argv(common, spec, common["node_memory"], os.cpu_count() or 1,
                                                     [*bench_flags(spec), *knob_flags({**common, **spec})])
    if spec.get("eager", common.get("eager", False)):
        args.append(api.FLAG_ENFORCE_EAGER)
    if not common.get("words_model_dir"):
        args.append(api.FLAG_SKIP_TOKENIZER_INIT)
    env = dict(plan["vllm"]["env"])
    dropped = {}
    for name, value in list(env.items()):
        reason = env_accepted(name, value, common["pythonpath"])
        if reason:
            dropped[name] = {"value": value, "vllm_said": reason}
            del env[name]
    result.update(vllm_args=args, vllm_env=env, plan_env_dropped=dropped, plan_pool=plan.get("pool"),
                  plan_warnings=plan.get("warnings"))
    runner = spec.get("model_runner")
    if runner:  # vLLM 0.26: "v1" keeps the runner that builds cross-layer KV blocks
        env[api.ENV_USE_V2_MODEL_RUNNER] = "1" if runner == "v2" else "0"
        result["vllm_env"] = env
    full_env = {**os.environ, **common.get("env", {}), **env, **spec.get("extra_env", {})}
    if wants_plugin(spec):
        full_env["PYTHONPATH"] = f"{plugin_site(out_dir)}:{full_env.get('PYTHONPATH', '')}"
        full_env.pop(PLUGIN_ENV, None)
    else:
        full_env[PLUGIN_ENV] = "off"
    if spec.get("probe"):
        full_env["SPILLWAY_TRANSFER_LOG"] = str(out_dir / f"transfers-{spec['name']}")
        full_env["PYTHONPATH"] = f"{HERE / 'probe'}:{full_env.get('PYTHONPATH', '')}"
    model_dir = common.get("words_model_dir") or common["model_dir"]
    if spec.get("random_weights"):
        model_dir, result["random_weights_s"] = random_weights_dir(spec, model_dir)
        log(f"  seeded random weights in {model_dir} ({result['random_weights_s']:.0f} s)")
    server = Server(model_dir, args, full_env, common["port"], out_dir / f"serve-{spec['name']}.log",
                    common.get("entry", "serve"))
    result["command"] = server.cmd[1:]
    log(f"engine {spec['name']}: vllm serve {' '.join(args)}")
    log(f"  env {env} (dropped: {list(dropped)})")
    offload = plan.get("pool") is not None or api.FLAG_KV_OFFLOADING_SIZE in args
    result["spillway_plugin"] = wants_plugin(spec)
    log(f"  Spillway's vLLM plugin: {'on' if result['spillway_plugin'] else 'off'}")
    timeout = aiohttp.ClientTimeout(total=900)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # no keep-alive: no reuse of closed connections
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        server.start()
        try:
            result["startup_s"] = await server.wait_ready(session, common.get("start_timeout_s", 300))
            log(f"  ready after {result['startup_s']:.0f} s")
            result["metrics_at_start"] = await scrape(session, server.url)
            async with session.get(server.url + api.METRICS_PATH) as r:  # the engine's cache config, as it says it
                result["cache_config_info"] = [line for line in (await r.text()).splitlines()
                                               if line.startswith("vllm:cache_config_info")][:2]
            if "ttft" in spec and time.time() < deadline:
                result["ttft"] = {}
                await exp_ttft(session, server.url, spec["ttft"], Prompts(spec.get("seed", 1)), offload, deadline,
                               result["ttft"])
            if "throughput" in spec and time.time() < deadline:
                result["throughput"] = {}
                await exp_throughput(session, server.url, spec["throughput"], Prompts(spec.get("seed", 1) + 1000),
                                     offload, deadline, result["throughput"])
            if "loadtest" in spec and time.time() < deadline:
                m0 = await scrape(session, server.url)
                result["loadtest"] = await run_loadtest(server.url, spec, out_dir, deadline)
                result["loadtest"]["metrics"] = delta(await scrape(session, server.url), m0)
            for prof in profiles(spec):
                if time.time() < deadline:
                    result.setdefault("profiles", []).append(
                        await run_profiled(server.url, spec, prof, out_dir, deadline, server))
            for run in spec.get("vllm_bench", []):
                if time.time() < deadline:
                    m0 = await scrape(session, server.url)
                    out = await run_vllm_bench(server.url, common, spec, run, out_dir, deadline)
                    out["metrics"] = delta(await scrape(session, server.url), m0)
                    result.setdefault("vllm_bench", []).append(out)
            if "verify" in spec and time.time() < deadline:
                result["verify"] = await run_verify(server.url, spec, out_dir, deadline)
            if "preemption" in spec and time.time() < deadline:
                m0 = await scrape(session, server.url)
                result["preemption"] = await run_preemption(server.url, spec, out_dir, deadline)
                result["preemption"]["metrics"] = delta(await scrape(session, server.url), m0)
            result["metrics_at_end"] = await scrape(session, server.url)
            result["client_retries"] = RETRIES[0]
        except Exception as exc:  # noqa: BLE001 - keep what was measured, say what failed
            result["error"] = f"{type(exc).__name__}: {exc}"
            log(f"  FAILED: {result['error']}")
        finally:
            server.stop()
            result["engine_log"] = engine_log_facts(server.log_path)
            if spec.get("random_weights"):
                shutil.rmtree(model_dir, ignore_errors=True)
    return result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True, help="JSON: {common: {...}, engines: [...]}")
    p.add_argument("--out", required=True)
    p.add_argument("--deadline-s", type=float, default=540, help="stop starting work after this many seconds")
    p.add_argument("--only", help="comma-separated engine names to run")
    a = p.parse_args()
    t0 = time.time()
    spec = json.loads(Path(a.spec).read_text())
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    common = spec["common"]
    common.setdefault("node_memory", node_memory())
    common.setdefault("pythonpath", os.environ.get("PYTHONPATH", ""))
    common["model_dir"] = str(Path(common["model_dir"]).resolve())
    if common.get("words_tokenizer"):  # text clients (vllm bench serve) need a tokenizer; ids stay as they are
        sys.path.insert(0, str(HERE))
        from word_tokenizer import build

        common["words_model_dir"] = str(build(Path(common["model_dir"]), out_dir / "model-words"))
    results: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "common": common, "engines": []}
    only = set(a.only.split(",")) if a.only else None
    for engine in spec["engines"]:
        if only and engine["name"] not in only:
            continue
        budget = engine.get("min_seconds", 60)
        if time.time() - t0 + budget > a.deadline_s:
            results["engines"].append({"name": engine["name"], "skipped": "not enough time left in this run"})
            log(f"engine {engine['name']}: skipped (time)")
            continue
        res = asyncio.run(run_engine(engine, common, out_dir, t0 + a.deadline_s))
        results["engines"].append(res)
        (out_dir / "serve_bench.json").write_text(json.dumps(results, indent=1))
    results["seconds"] = time.time() - t0
    (out_dir / "serve_bench.json").write_text(json.dumps(results, indent=1))
    log(f"done in {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
