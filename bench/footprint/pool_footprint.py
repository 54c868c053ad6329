#!/usr/bin/env python3
"""Host-memory footprint of vLLM's CPU offload pool, against the bytes asked (run on the GPU machine).

Each case starts a fresh offline engine (dummy weights) in its own memory cgroup, the way a pod's container
is charged, and reads, before the engine starts and after the pool is pinned: /proc/meminfo (Shmem,
AnonPages, ...), the cgroup's memory.current and memory.stat (anon, file, shmem), /dev/shm usage, and the
RSS (anon/file/shmem) of every process in the cgroup. vLLM's own log lines say how many pool tensors it
allocated and their sizes (`Allocating N CPU tensors`, and at DEBUG `torch.zeros pinned tensor RxC`).

    python3 bench/footprint/pool_footprint.py --cases llama:16:v1,llama:48:v2 --json $OUT/footprint.json

A case is MODEL:GIB:RUNNER with MODEL a folder of bench/gpu (aliases below), RUNNER v1, v2 or auto
(VLLM_USE_V2_MODEL_RUNNER=0/1/unset).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = {"llama": "llama-3.1-8b", "mla": "deepseek-v2-lite-dense", "mamba": "nemotron-h-8b", "swa": "gemma-3-1b"}
CGROUP_ROOT = Path("/sys/fs/cgroup")
MEMINFO_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Shmem", "Cached", "AnonPages", "Mlocked", "Unevictable")
STAT_KEYS = ("anon", "file", "shmem", "file_mapped", "unevictable", "kernel", "sock",  # cgroup v2
             "rss", "cache", "mapped_file")  # cgroup v1 (its shmem key is "shmem" too)
V1_ROOT = CGROUP_ROOT / "memory"
TENSOR_LINE = re.compile(r"torch\.zeros pinned tensor (\d+)\D(\d+) \(([\d.]+) GB\): ([\d.]+) s")
COUNT_LINE = re.compile(r"Allocating (\d+) CPU tensors")
GIB = 1 << 30


def meminfo() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            if key in MEMINFO_KEYS:
                out[key] = int(value.split()[0]) * 1024
    return out


def dev_shm() -> dict[str, int]:
    files = [p for p in glob.glob("/dev/shm/*") if os.path.isfile(p)]
    st = os.statvfs("/dev/shm")
    return {"files": len(files), "apparent_bytes": sum(os.path.getsize(p) for p in files),
            "used_bytes": (st.f_blocks - st.f_bfree) * st.f_frsize}


def cgroup_read(cg: Path | None) -> dict[str, int]:
    if cg is None:
        return {}
    out = {}
    try:
        current = cg / "memory.current"
        if not current.exists():
            current = cg / "memory.usage_in_bytes"  # cgroup v1
        out["memory.current"] = int(current.read_text())
        for line in (cg / "memory.stat").read_text().splitlines():
            key, value = line.split()
            if key in STAT_KEYS:
                out[key] = int(value)
        if (cg / "memory.peak").exists():
            out["memory.peak"] = int((cg / "memory.peak").read_text())
    except OSError:
        pass
    return out


def rss(pids: list[int]) -> dict[str, int]:
    tot = {"RssAnon": 0, "RssFile": 0, "RssShmem": 0, "VmPin": 0, "VmLck": 0}
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                key = line.split(":")[0]
                if key in tot:
                    tot[key] += int(line.split()[1]) * 1024
        except OSError:
            continue
    tot["procs"] = len(pids)
    return tot


def cgroup_pids(cg: Path | None) -> list[int]:
    if cg is None:
        return [os.getpid()]
    try:
        return [int(x) for x in (cg / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def snapshot(cg: Path | None) -> dict:
    return {"t": time.time(), "meminfo": meminfo(), "cgroup": cgroup_read(cg), "dev_shm": dev_shm(),
            "rss": rss(cgroup_pids(cg))}


def make_cgroup(name: str) -> Path | None:
    """A child memory cgroup of the root (a container's view); None where none is writable."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists() and V1_ROOT.is_dir():
        try:
            cg = V1_ROOT / name
            cg.mkdir(exist_ok=True)
            return cg
        except OSError as exc:
            print(f"no cgroup (v1): {exc}", flush=True)
            return None
    try:
        controllers = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
        if "memory" not in controllers:
            return None
        sub = CGROUP_ROOT / "cgroup.subtree_control"
        if "memory" not in sub.read_text().split():
            sub.write_text("+memory")
        cg = CGROUP_ROOT / name
        cg.mkdir(exist_ok=True)
        return cg
    except OSError as exc:
        print(f"no cgroup: {exc}", flush=True)
        return None


def child(case: dict) -> None:
    cg = Path(case["cgroup"]) if case.get("cgroup") else None
    if cg is not None:
        (cg / "cgroup.procs").write_text(str(os.getpid()))
    start = snapshot(cg)
    from vllm import LLM, SamplingParams  # imported inside the cgroup: its pages are charged there too
    from vllm.config import KVTransferConfig

    imported = snapshot(cg)
    kw = {"model": case["model_dir"], "load_format": "dummy", "skip_tokenizer_init": True, "enforce_eager": True,
          "max_model_len": 4096, "gpu_memory_utilization": 0.6, "enable_prefix_caching": case["prefix_caching"],
          "kv_transfer_config": KVTransferConfig(
              kv_connector="OffloadingConnector", kv_role="kv_both",
              kv_connector_extra_config={"cpu_bytes_to_use": case["pool_bytes"]})}
    t0 = time.time()
    llm = LLM(**kw)
    init_s = time.time() - t0
    pinned = snapshot(cg)
    prompts = [{"prompt_token_ids": [1000 + (i * 7919 + j) % 90000 for j in range(2048)]} for i in range(32)]
    llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
    time.sleep(2)
    used = snapshot(cg)
    print("RESULT " + json.dumps({"init_s": init_s, "start": start, "imported": imported, "pinned": pinned,
                                  "used": used}), flush=True)
    os._exit(0)  # the engine's processes are stopped by the parent (killing the cgroup)


def kill_cgroup(cg: Path | None, proc: subprocess.Popen) -> None:
    if cg is not None and not (cg / "cgroup.kill").exists():
        for pid in cgroup_pids(cg):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    if cg is not None and (cg / "cgroup.kill").exists():
        try:
            (cg / "cgroup.kill").write_text("1")
        except OSError:
            pass
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait()
    for _ in range(60):
        if cg is None or not cgroup_pids(cg):
            break
        time.sleep(0.5)
    if cg is not None:
        try:
            cg.rmdir()
        except OSError:
            pass


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def parse_log(text: str) -> dict:
    tensors = [{"rows": int(r), "row_bytes": int(c), "bytes": int(r) * int(c), "pin_s": float(s)}
               for r, c, _gb, s in TENSOR_LINE.findall(text)]
    count = COUNT_LINE.findall(text)
    out = {"tensors_logged": int(count[-1]) if count else None, "tensors": tensors[:4], "n_tensors": len(tensors)}
    if tensors:
        out["tensor_bytes"] = sum(t["bytes"] for t in tensors)
        out["pow2_bytes"] = sum(next_pow2(t["bytes"]) for t in tensors)
        out["pin_s"] = sum(t["pin_s"] for t in tensors)
    errors = [line.strip()[-400:] for line in text.splitlines()
              if re.search(r"Error|error:|Exception|NotImplemented|not supported", line) and "DEBUG" not in line]
    out["error_lines"] = errors[-6:]
    return out


def diff(a: dict, b: dict) -> dict:
    return {k: b.get(k, 0) - a.get(k, 0) for k in b if isinstance(b.get(k), int)}


def summarize(r: dict) -> dict:
    base, pinned = r["before"], r["child"]["pinned"]
    start = r["child"]["start"]
    s = {"meminfo": diff(base["meminfo"], pinned["meminfo"]), "dev_shm": diff(base["dev_shm"], pinned["dev_shm"]),
         "cgroup_at_start": start["cgroup"], "cgroup_pinned": pinned["cgroup"], "rss_pinned": pinned["rss"],
         "cgroup_used": r["child"]["used"]["cgroup"]}
    s["shmem_over_asked"] = s["meminfo"].get("Shmem", 0) / r["pool_bytes"]
    if pinned["cgroup"]:
        s["cgroup_shmem_over_asked"] = pinned["cgroup"].get("shmem", 0) / r["pool_bytes"]
        s["cgroup_current_over_asked"] = pinned["cgroup"].get("memory.current", 0) / r["pool_bytes"]
    return s


def run_case(spec: str, deadline: float, log_dir: Path) -> dict:
    model, gib, runner = spec.split(":")
    pool = int(float(gib) * GIB)
    name = f"{model}-{gib}-{runner}"
    cg = make_cgroup(f"footprint-{name}")
    case = {"name": name, "model": MODELS.get(model, model), "model_dir": str(HERE.parent / "gpu" / MODELS.get(model, model)),
            "pool_bytes": pool, "runner": runner, "cgroup": str(cg) if cg else None,
            "prefix_caching": model in ("mamba", "swa")}
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "DEBUG"}
    if runner in ("v1", "v2"):
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    else:
        env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    before = snapshot(None)
    log_path = log_dir / f"footprint-{name}.log"
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, __file__, "child", json.dumps(case)], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        rc = None
        while time.time() < deadline:
            rc = proc.poll()
            if rc is not None:
                break
            time.sleep(0.5)
            if "RESULT " in log_path.read_text(errors="replace")[-400000:]:
                rc = 0
                break
    text = log_path.read_text(errors="replace")
    kill_cgroup(cg, proc)
    out = {**case, "rc": rc if rc is not None else "deadline", "seconds": time.time() - t0, "before": before,
           "vllm_log": parse_log(text)}
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    if lines:
        out["child"] = json.loads(lines[-1][7:])
        out["summary"] = summarize(out)
    return out


def wait_released(base_shmem: int, timeout: float = 30) -> None:
    end = time.time() + timeout
    while time.time() < end and meminfo()["Shmem"] > base_shmem + GIB:
        time.sleep(0.5)


def line(r: dict) -> str:
    v = r["vllm_log"]
    head = f"{r['name']:<22} asked {r['pool_bytes'] / GIB:5.1f} GiB"
    if "summary" not in r:
        return f"{head}: FAILED rc={r['rc']} {' | '.join(v['error_lines'][-2:])[:600]}"
    s = r["summary"]
    cg = s["cgroup_pinned"]
    tens = f"{v['n_tensors']} tensors of {v['tensors'][0]['bytes'] / GIB:.3f} GiB" if v["tensors"] else "tensors ?"
    return (f"{head} init {r['child']['init_s']:4.0f}s {tens} -> pow2 {v.get('pow2_bytes', 0) / GIB:6.2f} GiB | "
            f"dShmem {s['meminfo'].get('Shmem', 0) / GIB:6.2f} ({s['shmem_over_asked']:.3f}x) "
            f"cg.current {cg.get('memory.current', 0) / GIB:6.2f} cg.shmem {cg.get('shmem', 0) / GIB:6.2f} "
            f"cg.anon {cg.get('anon', 0) / GIB:5.2f} cg.file {cg.get('file', 0) / GIB:5.2f} "
            f"/dev/shm {s['dev_shm'].get('used_bytes', 0) / GIB:5.2f} RssShmem {s['rss_pinned']['RssShmem'] / GIB:6.2f} "
            f"RssAnon {s['rss_pinned']['RssAnon'] / GIB:5.2f}")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(json.loads(sys.argv[2]))
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("--cases", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--logs", default="/tmp/work")
    p.add_argument("--deadline-s", type=float, default=540)
    a = p.parse_args()
    t_end = time.time() + a.deadline_s
    log_dir = Path(a.logs)
    log_dir.mkdir(parents=True, exist_ok=True)
    results = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": []}
    base_shmem = meminfo()["Shmem"]
    for spec in a.cases.split(","):
        if time.time() > t_end - 45:
            results["cases"].append({"name": spec, "skipped": "deadline"})
            continue
        r = run_case(spec, t_end, log_dir)
        results["cases"].append(r)
        print(line(r), flush=True)
        Path(a.json).write_text(json.dumps(results, indent=1))
        wait_released(base_shmem)
    Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
