#!/usr/bin/env python3
"""Carry vLLM's compile cache between pods through a shared volume, never handing a pod half of an entry.

vLLM's cache root (VLLM_CACHE_ROOT, the pod's emptyDir) outlives a container restart, not the pod: a rolled or
rescheduled pod compiles again, which doubles its start (bench/compile-cache). With `compileCache.claimName` the
operator also mounts a claim and names this pod's directory on it (SPILLWAY_COMPILE_CACHE_DIR, keyed by model,
revision, release, TP and image: controller/manifests.py). vLLM never reads or writes the claim itself:

  seed     before vLLM starts, every entry the claim holds that the local root lacks is copied in;
  publish  once the server answers its health check (so every entry it used loaded or compiled whole), every local
           entry the claim lacks is copied to a hidden directory on the claim and renamed into place.

An entry is one directory named by a hash below torch_compile_cache (entries() says where), vLLM's own key over config, code, torch, Triton and the GPU
(vllm/compilation/backends.py: hash_factors; compiler_interface.py: get_inductor_factors), so an entry is only ever
loaded by the engine it was compiled for. vLLM writes an entry's files in place and without renames
(backends.py: save_to_file), so replicas sharing vLLM's root directly could read another's half-written file; a
rename of a whole directory is atomic, and the first replica to publish an entry keeps it (a later rename onto a
non-empty directory fails, and that replica drops its copy). Hidden directories a killed copy left are never read
and are removed once an hour old.

    compile_cache.py seed SHARED LOCAL
    compile_cache.py publish SHARED LOCAL [--after-ready URL] [--wait-s S]

Every failure is logged and leaves vLLM to compile: the cache saves time and never stops a start.
"""
from __future__ import annotations

import argparse
import errno
import os
import re
import shutil
import socket
import sys
import time
import urllib.request
import uuid
from pathlib import Path

ENTRIES = "torch_compile_cache"  # vllm/compilation/backends.py: VLLM_CACHE_ROOT/torch_compile_cache/<hash>
HASH = re.compile(r"[0-9a-f]{10,}")  # backends.py: hash_factors(...)[:10]; decorators.py: a whole sha256
LOG_PREFIX = "spillway-vllm:"
PARTIAL = ".partial-"
STALE_PARTIAL_S = 3600
copy_file = shutil.copy2  # looked up at each copy (tests slow it down to watch a copy under way)


def log(message: str) -> None:
    print(f"{LOG_PREFIX} compile cache: {message}", file=sys.stderr, flush=True)


def entries(root: Path) -> dict[str, Path]:
    """The whole entries below root, by their path under it. An entry is a directory named by a hash: vLLM keeps
    them at torch_compile_cache/<hash> (backends.py) and torch_compile_cache/torch_aot_compile/<hash> (0.32+:
    decorators.py); other directories are walked. Hidden names are copies under way, or left by a killed one."""
    found: dict[str, Path] = {}

    def walk(folder: Path) -> None:
        for p in sorted(folder.iterdir()):
            if not p.is_dir() or p.is_symlink() or p.name.startswith("."):
                continue
            if HASH.fullmatch(p.name):
                found[str(p.relative_to(root))] = p
            else:
                walk(p)

    if (root / ENTRIES).is_dir():
        walk(root / ENTRIES)
    return found


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def place(source: Path, target_root: Path, name: str) -> bool:
    """Copy source to target_root/name through a hidden directory beside it and one rename. False when an entry of
    that name got there first (another replica's, whole: it is kept and this copy dropped)."""
    final = target_root / name
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.parent / f"{PARTIAL}{final.name}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        shutil.copytree(source, partial, symlinks=True, copy_function=copy_file)
        os.rename(partial, final)
        return True
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY) and final.is_dir():
            return False
        raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def drop_stale_partials(root: Path, now: float) -> None:
    if not (root / ENTRIES).is_dir():
        return
    for p in sorted((root / ENTRIES).rglob(f"{PARTIAL}*")):
        try:
            if p.is_dir() and now - p.stat().st_mtime > STALE_PARTIAL_S:
                shutil.rmtree(p, ignore_errors=True)
                log(f"removed {p.relative_to(root)}, a copy left unfinished over an hour ago")
        except OSError:
            continue  # another replica removed it first


def copy_missing(source: Path, target: Path, verb: str) -> int:
    t0 = time.monotonic()
    have = entries(target)
    copied, nbytes = [], 0
    for name, path in entries(source).items():
        if name in have:
            continue
        try:
            if place(path, target, name):
                copied.append(name)
                nbytes += size(target / name)
        except OSError as exc:
            log(f"{verb} of entry {name} failed ({exc}); it is left out")
    if copied:
        log(f"{verb} {len(copied)} entr{'y' if len(copied) == 1 else 'ies'} ({', '.join(copied)}, "
            f"{nbytes / 2**20:.1f} MiB) from {source} to {target} in {time.monotonic() - t0:.2f} s")
    else:
        log(f"{verb}: nothing in {source} that {target} lacks")
    return len(copied)


def wait_ready(url: str, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(2)
    return False


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
            copy_missing(a.shared, a.local, "seeded")
            return 0
        if a.after_ready and not wait_ready(a.after_ready, a.wait_s):
            log(f"{a.after_ready} did not answer within {a.wait_s:.0f} s; nothing published")
            return 0
        drop_stale_partials(a.shared, time.time())
        copy_missing(a.local, a.shared, "published")
    except OSError as exc:  # the claim unreadable or full: vLLM compiles as it would without it
        log(f"{a.action} failed ({exc}); vLLM keeps its own cache root")
    return 0


if __name__ == "__main__":
    sys.exit(main())
