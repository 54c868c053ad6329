#!/usr/bin/env python3
"""Carry vLLM's compile cache between pods through a shared volume, never handing a pod half of one.

vLLM's cache root (VLLM_CACHE_ROOT, the pod's emptyDir) outlives a container restart, not the pod: a rolled or
rescheduled pod compiles again, which doubles its start (bench/compile-cache). With `compileCache.claimName` the
operator also mounts a claim and names this pod's directory on it (SPILLWAY_COMPILE_CACHE_DIR, keyed by model,
revision, release, TP and image: controller/manifests.py). vLLM never reads or writes the claim itself:

  seed     before vLLM starts, the newest snapshot on the claim becomes the cache root (a root that holds files
           already is a restarted container's, and is kept);
  publish  once the server answers its health check, and again when the pod stops (its preStop hook, only while
           the server still answers: a root vLLM was still compiling into is never published), the whole cache
           root becomes a new snapshot, if it holds a file the newest snapshot lacks or holds otherwise (another
           size, or other bytes: vLLM rewrote it).

A snapshot is the whole root, not each entry apart: a start given the compiled graphs alone loads them but then
builds Triton's kernels again (253 files for Llama-3.1-8B on vLLM 0.34: stock's first restart took 9.6 s of memory
profile and 15.9 s of graph capture, against 1.1 s and 6.4 s once they were there; bench/compile-cache), so what is
carried is what the last start left below the root, all of it, Triton's cache included (the operator points it
there). vLLM keys everything below the root by config, code, torch, Triton and the GPU
(vllm/compilation/backends.py, compiler_interface.py, v1/worker/startup_plan.py), so a snapshot is only ever read
for the engine it was made by. vLLM writes its files in place, without renames (backends.py: save_to_file), so
replicas sharing vLLM's root directly could read a half-written file; a snapshot is copied to a hidden directory and
renamed into place, so it is whole or absent, and each publisher's name is its own. Only the newest KEEP snapshots
stay once an hour old; hidden directories a killed copy left go too.

    compile_cache.py seed SHARED LOCAL
    compile_cache.py publish SHARED LOCAL [--after-ready URL] [--wait-s S]

Every failure is logged and leaves vLLM to compile: the cache saves time and never stops a start or a stop.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import re
import shutil
import socket
import sys
import time
import urllib.request
import uuid
from pathlib import Path

SNAPSHOTS = "snapshots"
PARTIAL = ".partial-"
KEEP = 2
STALE_S = 3600
# What a node's own hardware decides, never carried: which GPUs reach each other (all_reduce_utils.py).
NODE_LOCAL = re.compile(r"gpu_p2p_access_cache_for_.*\.json")
LOG_PREFIX = "spillway-vllm:"
copy_file = shutil.copy2  # looked up at each copy (tests slow it down to watch a copy under way)


def log(message: str) -> None:
    print(f"{LOG_PREFIX} compile cache: {message}", file=sys.stderr, flush=True)


def files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file below root that a snapshot carries, by its path under root: its size and whole seconds of mtime
    (a copy keeps both, so a seeded file matches its snapshot's without being read)."""
    if not root.is_dir():
        return {}
    out = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and not NODE_LOCAL.fullmatch(path.name):
            st = path.stat()
            out[str(path.relative_to(root))] = (st.st_size, int(st.st_mtime))
    return out


def snapshots(shared: Path) -> list[Path]:
    """The whole snapshots, oldest first (their names begin with the time they were published)."""
    folder = shared / SNAPSHOTS
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def seed(shared: Path, local: Path) -> int:
    """The newest snapshot becomes the root, whole: copied beside it and renamed into place, so a container killed
    while seeding leaves no half-copied file for the next one to load. A root that holds files already is a
    restarted container's, kept as vLLM left it."""
    if files(local):
        log(f"{local} holds a restarted container's cache: kept, nothing seeded")
        return 0
    found = snapshots(shared)
    if not found:
        log(f"no snapshot in {shared} yet: vLLM compiles, and this pod publishes once it is up")
        return 0
    t0, newest = time.monotonic(), found[-1]
    for left in local.parent.glob(f"{PARTIAL}{local.name}-*"):  # a killed seed's
        shutil.rmtree(left, ignore_errors=True)
    staging = local.parent / f"{PARTIAL}{local.name}-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(newest, staging, symlinks=True, copy_function=copy_file)
        if local.exists():
            shutil.rmtree(local)  # empty but for directories: nothing of vLLM's
        os.rename(staging, local)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    carried = files(local)
    log(f"seeded {len(carried)} files ({sum(s for s, _ in carried.values()) / 2**20:.1f} MiB) from snapshot "
        f"{newest.name} in {time.monotonic() - t0:.2f} s")
    return len(carried)


def differing(local: Path, mine: dict[str, tuple[int, int]], snapshot: Path | None) -> list[str]:
    """The files of the root that the snapshot lacks or holds otherwise. A file of the same size but another time is
    compared byte for byte: every start over a loaded cache rewrote 15 of its 445 files at their old size (Llama-3.1-8B
    on vLLM 0.34, bench/compile-cache), and a pod that published on a new time alone would copy the whole root to
    the claim on every start. `mine` is files(local)."""
    theirs = files(snapshot) if snapshot is not None else {}
    out = []
    for name, (size, mtime) in sorted(mine.items()):
        kept = theirs.get(name)
        if kept == (size, mtime):
            continue
        if kept is not None and kept[0] == size and filecmp.cmp(local / name, snapshot / name, shallow=False):
            continue
        out.append(name)
    return out


def publish(shared: Path, local: Path, now: float) -> Path | None:
    t0, found = time.monotonic(), snapshots(shared)
    mine = files(local)
    new = differing(local, mine, found[-1] if found else None)
    if not new:
        log(f"published nothing: {local} holds nothing the newest snapshot lacks")
        return None
    folder = shared / SNAPSHOTS
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}-{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    partial = folder / f"{PARTIAL}{name}"
    try:
        shutil.copytree(local, partial, symlinks=True, copy_function=copy_file,
                        ignore=lambda _, names: [n for n in names if NODE_LOCAL.fullmatch(n)])
        os.rename(partial, folder / name)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    size = sum(s for s, _ in mine.values())
    log(f"published snapshot {name}: {len(mine)} files ({size / 2**20:.1f} MiB), {len(new)} of them new, in "
        f"{time.monotonic() - t0:.2f} s")
    prune(shared, now)
    return folder / name


def prune(shared: Path, now: float) -> None:
    """Snapshots older than the newest KEEP, and copies left unfinished, once an hour old: a seeding pod copies a
    snapshot within seconds, so none is removed under one."""
    folder = shared / SNAPSHOTS
    old = snapshots(shared)[:-KEEP]
    left = [p for p in folder.iterdir() if p.name.startswith(PARTIAL)] if folder.is_dir() else []
    for path in [*old, *left]:
        try:
            if now - path.stat().st_mtime > STALE_S:
                shutil.rmtree(path)
                log(f"removed {path.name}")
        except OSError:
            continue  # another replica removed it first


def wait_ready(url: str, wait_s: float) -> bool:
    """Whether the server answers within wait_s (asked at least once)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("seed", "publish"))
    p.add_argument("shared", type=Path, help="this pod's directory on the claim")
    p.add_argument("local", type=Path, help="vLLM's cache root (VLLM_CACHE_ROOT)")
    p.add_argument("--after-ready", metavar="URL", help="publish once this answers 200 (the server's health)")
    p.add_argument("--wait-s", type=float, default=3600, help="give up waiting for --after-ready after this long")
    a = p.parse_args(argv)
    try:
        if a.action == "seed":
            seed(a.shared, a.local)
            return 0
        if a.after_ready and not wait_ready(a.after_ready, a.wait_s):
            log(f"{a.after_ready} did not answer within {a.wait_s:.0f} s; nothing published")
            return 0
        publish(a.shared, a.local, time.time())
    except OSError as exc:  # the claim unreadable or full: vLLM compiles as it would without it
        log(f"{a.action} failed ({exc}); vLLM keeps its own cache root")
    return 0


if __name__ == "__main__":
    sys.exit(main())
