"""The vLLM image's compile-cache copier (images/vllm/compile_cache.py) on real directories, and the entrypoint that
runs it: a pod's cache root is seeded from the claim before vLLM starts and published to it once the server answers;
an entry is only ever seen whole, the first replica to publish one keeps it, and a broken claim never stops a start.

The built image runs the same entrypoint against a real vLLM in test_vllm_cpu_image.py.
"""
from __future__ import annotations

import http.server
import os
import re
import runpy
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from spillway.core import vllm_api
from support.tools import skip_or_fail
from support.vllm_trees import vllm_trees

IMAGE_DIR = Path(__file__).resolve().parents[2] / "images" / "vllm"
ENTRYPOINT = IMAGE_DIR / "entrypoint.sh"
COPIER = IMAGE_DIR / "compile_cache.py"
BACKEND_ENTRY = "torch_compile_cache/0c1d2e3f4a"  # backends.py: hash_factors(...)[:10]
AOT_ENTRY = "torch_compile_cache/torch_aot_compile/" + "9f" * 32  # decorators.py: a whole sha256


@pytest.fixture
def cc():
    """The copier's module, loaded as the image runs it (a script beside the entrypoint)."""
    return runpy.run_path(str(COPIER))


def make_entry(root: Path, entry: str, files: int = 3, size: int = 4096, tag: str = "a") -> Path:
    path = root / entry / "rank_0_0" / "backbone"
    path.mkdir(parents=True)
    for i in range(files):
        (path / f"artifact-{i}.bin").write_bytes(tag.encode() * size)
    (root / entry / "rank_0_0" / "vllm_compile_cache.py").write_text(f"{{'compiled': {tag!r}}}")
    return root / entry


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def copier(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(COPIER), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_publish_then_seed_carries_every_entry_of_both_layouts(tmp_path):
    pod_a, claim, pod_b = tmp_path / "a", tmp_path / "claim", tmp_path / "b"
    make_entry(pod_a, BACKEND_ENTRY)
    make_entry(pod_a, AOT_ENTRY, tag="z")
    (pod_a / "modelinfos").mkdir()
    (pod_a / "modelinfos" / "llama.json").write_text("{}")  # not compile output: stays in the pod
    published = copier("publish", str(claim), str(pod_a))
    assert published.returncode == 0 and "published 2 entries" in published.stderr, published.stderr
    seeded = copier("seed", str(claim), str(pod_b))
    assert seeded.returncode == 0 and "seeded 2 entries" in seeded.stderr, seeded.stderr
    assert tree(pod_b) == tree(claim) == {k: v for k, v in tree(pod_a).items() if not k.startswith("modelinfos")}
    again = copier("publish", str(claim), str(pod_b))
    assert "nothing in" in again.stderr and tree(claim) == tree(pod_b)


def test_a_seeded_pod_keeps_its_own_entries_and_gains_only_what_it_lacks(tmp_path, cc):
    claim, pod = tmp_path / "claim", tmp_path / "pod"
    make_entry(claim, BACKEND_ENTRY, tag="claim")
    make_entry(pod, BACKEND_ENTRY, tag="pod")
    make_entry(claim, AOT_ENTRY)
    assert cc["copy_missing"](claim, pod, "seeded") == 1
    assert (pod / BACKEND_ENTRY / "rank_0_0" / "vllm_compile_cache.py").read_text() == "{'compiled': 'pod'}"
    assert (pod / AOT_ENTRY).is_dir()


def test_the_first_replica_to_publish_an_entry_keeps_it(tmp_path, cc):
    claim = tmp_path / "claim"
    first, second = make_entry(tmp_path / "a", BACKEND_ENTRY, tag="a"), make_entry(tmp_path / "b", BACKEND_ENTRY, tag="b")
    assert cc["place"](first, claim, BACKEND_ENTRY) is True
    assert cc["place"](second, claim, BACKEND_ENTRY) is False
    assert tree(claim / BACKEND_ENTRY) == tree(first)
    assert sorted(p.name for p in (claim / "torch_compile_cache").iterdir()) == [Path(BACKEND_ENTRY).name]


def _slow_copy(copy2, pause_s: float):
    def copy(src, dst, *, follow_symlinks=True):
        time.sleep(pause_s)
        return copy2(src, dst, follow_symlinks=follow_symlinks)
    return copy


def _watch(cc, claim: Path, whole: dict[str, bytes], stop: threading.Event, seen: list) -> None:
    """What a starting replica would seed, looked at again and again: each entry it finds, as it would copy it."""
    while not stop.is_set():
        for path in cc["entries"](claim).values():
            try:
                seen.append(tree(path) == whole)
            except FileNotFoundError:
                continue  # a rename in between: the next look sees the entry where it now is


@pytest.mark.parametrize("atomic", [True, False])
def test_an_entry_under_way_is_never_seen_half_written(tmp_path, cc, atomic):
    """Two replicas publish the same entry at once while a third seeds from the claim. The copier's hidden
    directory and rename show the seeding replica either nothing or the whole entry; copying straight into the
    entry's name (vLLM's own way of writing its cache, the control) shows it half an entry."""
    import shutil

    sources = [make_entry(tmp_path / f"pod{i}", BACKEND_ENTRY, files=12) for i in range(2)]
    whole = tree(sources[0])
    claim = tmp_path / "claim"
    cc["place"].__globals__["copy_file"] = _slow_copy(shutil.copy2, 0.02)
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(cc, claim, whole, stop, seen))
    watcher.start()
    try:
        if atomic:
            publishers = [threading.Thread(target=cc["place"], args=(s, claim, BACKEND_ENTRY)) for s in sources]
            for p in publishers:
                p.start()
            for p in publishers:
                p.join(30)
        else:
            shutil.copytree(sources[0], claim / BACKEND_ENTRY, copy_function=cc["place"].__globals__["copy_file"])
        time.sleep(0.1)
    finally:
        stop.set()
        watcher.join(10)
    assert tree(claim / BACKEND_ENTRY) == whole
    assert seen and seen[-1] is True
    if atomic:
        assert all(seen), f"{seen.count(False)} of {len(seen)} looks saw a partial entry"
        assert not [p for p in (claim / "torch_compile_cache").iterdir() if p.name.startswith(".")]
    else:
        assert not all(seen), "the control never caught the copy under way: the check shows nothing"


def test_a_copy_left_by_a_killed_replica_is_never_seeded_and_goes_once_an_hour_old(tmp_path, cc):
    claim, pod = tmp_path / "claim", tmp_path / "pod"
    left = make_entry(claim, f"torch_compile_cache/.partial-{Path(BACKEND_ENTRY).name}-pod-7-41", files=1)
    fresh = make_entry(claim, f"torch_compile_cache/.partial-{Path(AOT_ENTRY).name}-pod-8-12", files=1)
    assert cc["copy_missing"](claim, pod, "seeded") == 0 and not (pod / "torch_compile_cache").exists()
    hour_ago = time.time() - cc["STALE_PARTIAL_S"] - 60
    os.utime(left, (hour_ago, hour_ago))
    cc["drop_stale_partials"](claim, time.time())
    assert not left.exists() and fresh.exists()


def test_an_unwritable_or_missing_claim_is_logged_and_never_fails(tmp_path):
    pod = tmp_path / "pod"
    make_entry(pod, BACKEND_ENTRY)
    assert copier("seed", str(tmp_path / "no-claim"), str(tmp_path / "empty")).returncode == 0
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    proc = copier("publish", str(blocked), str(pod))
    assert proc.returncode == 0 and "failed" in proc.stderr, proc.stderr


def test_publish_waits_for_the_server_to_answer(tmp_path):
    """Nothing is published while the health check fails: the entries may still be under vLLM's own writes."""
    pod, claim = tmp_path / "pod", tmp_path / "claim"
    make_entry(pod, BACKEND_ENTRY)
    proc = copier("publish", str(claim), str(pod), "--after-ready", "http://127.0.0.1:9/health", "--wait-s", "3")
    assert proc.returncode == 0 and "did not answer" in proc.stderr and not claim.exists()


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == vllm_api.HEALTH_PATH else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_entrypoint_seeds_before_vllm_and_publishes_once_it_answers(tmp_path):
    """A vllm stand-in lists what its cache root holds at start, then compiles an entry and waits (as a server
    does) until the entry is on the claim: the publisher ran beside it and copied it after the health check."""
    claim, root = tmp_path / "claim" / "key", tmp_path / "root"
    make_entry(claim, AOT_ENTRY)
    compiled = root / BACKEND_ENTRY
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(
        "#!/bin/sh\n"
        f'find "$VLLM_CACHE_ROOT" -name vllm_compile_cache.py | sort\n'
        f'mkdir -p {compiled}/rank_0_0 && echo compiled > {compiled}/rank_0_0/vllm_compile_cache.py\n'
        f"for i in $(seq 100); do [ -d {claim / BACKEND_ENTRY} ] && echo published && exit 0; sleep 0.2; done\n"
        "echo 'never published'; exit 1\n")
    (bin_dir / "vllm").chmod(0o755)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    shm = tmp_path / "shm"
    shm.mkdir()
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "SPILLWAY_SHM_DIR": str(shm),
           "VLLM_CACHE_ROOT": str(root), vllm_api.ENV_COMPILE_CACHE_DIR: str(claim),
           vllm_api.ENV_COMPILE_CACHE_READY_URL: f"http://127.0.0.1:{server.server_port}{vllm_api.HEALTH_PATH}"}
    try:
        proc = subprocess.run(["sh", str(ENTRYPOINT), "m"], capture_output=True, text=True, env=env, timeout=60,
                              check=False)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == str(root / AOT_ENTRY / "rank_0_0" / "vllm_compile_cache.py")
    assert proc.stdout.splitlines()[-1] == "published"
    assert "seeded 1 entry" in proc.stderr
    assert (claim / BACKEND_ENTRY / "rank_0_0" / "vllm_compile_cache.py").read_text() == "compiled\n"


def test_the_entrypoint_without_a_claim_copies_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text("#!/bin/sh\necho started\n")
    (bin_dir / "vllm").chmod(0o755)
    shm = tmp_path / "shm"
    shm.mkdir()
    proc = subprocess.run(["sh", str(ENTRYPOINT), "m"], capture_output=True, text=True, timeout=30, check=False,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SPILLWAY_SHM_DIR": str(shm),
                               "VLLM_CACHE_ROOT": str(tmp_path / "root")})
    assert proc.returncode == 0 and proc.stdout == "started\n" and proc.stderr == ""


def test_the_copier_knows_where_vllms_sources_put_compile_cache_entries(cc):
    """Both layouts, read from vLLM's own sources (the installed vLLM and SPILLWAY_VLLM_TREES): a release that
    moved its entries, or named them otherwise, would leave the copier carrying nothing."""
    import importlib.util

    roots = vllm_trees()
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).parents[1])
    sources = [r for r in roots if (r / "vllm" / "compilation" / "backends.py").is_file()]
    if not sources:
        skip_or_fail("no vLLM source tree is at hand")
    for root in sources:
        backends = (root / "vllm" / "compilation" / "backends.py").read_text()
        assert re.search(r'envs\.VLLM_CACHE_ROOT,\s*"torch_compile_cache",\s*hash_key', backends), root
        # 0.26: hashlib.sha256(str(factors).encode()).hexdigest()[:10]; 0.33+: hash_factors(all_factors)[:10]
        width = int(re.search(r"hash_key = \S+\)\[:(\d+)\]", backends).group(1))
        assert cc["HASH"].fullmatch("a" * width) and not cc["HASH"].fullmatch("a" * (width - 1)), root
        decorators = (root / "vllm" / "compilation" / "decorators.py").read_text()
        if "torch_aot_compile" in decorators:
            assert re.search(r'"torch_compile_cache",\s*"torch_aot_compile",\s*hash_key', decorators), root
