"""The vLLM image's compile-cache copier (images/vllm/compile_cache.py) on real directories, and the entrypoint that
runs it: a pod's cache root is seeded from the newest snapshot on the claim before vLLM starts and published as a
new snapshot once the server answers; a snapshot is only ever seen whole, a root with nothing new publishes nothing,
old snapshots go, and a broken claim never stops a start.

The built image runs the same entrypoint against a real vLLM in test_vllm_cpu_image.py.
"""
from __future__ import annotations

import http.server
import os
import runpy
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from spillway.core import vllm_api

IMAGE_DIR = Path(__file__).resolve().parents[2] / "images" / "vllm"
ENTRYPOINT = IMAGE_DIR / "entrypoint.sh"
COPIER = IMAGE_DIR / "compile_cache.py"
AOT = "torch_compile_cache/torch_aot_compile/" + "9f" * 32  # decorators.py: a whole sha256
BACKEND = "torch_compile_cache/0c1d2e3f4a/rank_0_0/backbone"  # backends.py: hash_factors(...)[:10]


@pytest.fixture
def cc():
    """The copier's module, loaded as the image runs it (a script beside the entrypoint)."""
    return runpy.run_path(str(COPIER))


def compiled(root: Path, entry: str = AOT, files: int = 3, size: int = 4096, tag: str = "a") -> Path:
    path = root / entry
    path.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (path / f"artifact-{i}.bin").write_bytes(tag.encode() * size)
    return path


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def snapshot_names(claim: Path) -> list[str]:
    return sorted(p.name for p in (claim / "snapshots").iterdir())


def copier(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(COPIER), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_published_root_seeds_the_next_pod_whole_but_for_node_local_files(tmp_path):
    pod_a, claim, pod_b = tmp_path / "a", tmp_path / "claim", tmp_path / "b"
    compiled(pod_a, AOT)
    compiled(pod_a, BACKEND, tag="b")
    compiled(pod_a, "triton/QKZ3X7V2", files=1, tag="t")  # TRITON_CACHE_DIR below the root
    (pod_a / "gpu_p2p_access_cache_for_0,1.json").write_text("{}")  # this node's GPUs: never carried
    published = copier("publish", str(claim), str(pod_a))
    assert published.returncode == 0 and "published snapshot" in published.stderr, published.stderr
    seeded = copier("seed", str(claim), str(pod_b))
    assert seeded.returncode == 0 and "seeded 7 files" in seeded.stderr, seeded.stderr
    carried = {k: v for k, v in tree(pod_a).items() if not k.startswith("gpu_p2p")}
    assert tree(pod_b) == carried and len(carried) == 7


def test_a_root_with_nothing_new_publishes_nothing_and_a_grown_one_a_superset(tmp_path, cc):
    claim, pod = tmp_path / "claim", tmp_path / "pod"
    compiled(tmp_path / "first", AOT)
    first = cc["publish"](claim, tmp_path / "first", time.time())
    cc["seed"](claim, pod)
    assert cc["publish"](claim, pod, time.time()) is None and snapshot_names(claim) == [first.name]
    # a seeded start still writes beside what it loaded: the next snapshot holds both
    compiled(pod, "triton/AB12CD34", files=1, tag="t")
    second = cc["publish"](claim, pod, time.time() + 1)
    assert snapshot_names(claim) == sorted([first.name, second.name])
    assert set(tree(second)) == set(tree(first)) | {"triton/AB12CD34/artifact-0.bin"}
    fresh = tmp_path / "fresh"
    cc["seed"](claim, fresh)
    assert tree(fresh) == tree(second), "a pod seeds from the newest snapshot"


def test_a_file_vllm_rewrote_makes_a_new_snapshot(tmp_path, cc):
    claim, pod = tmp_path / "claim", tmp_path / "pod"
    cache = compiled(pod, BACKEND) / "vllm_compile_cache.py"
    cache.write_text("{(1, 8192): 'a'}")
    cc["publish"](claim, pod, time.time())
    cache.write_text("{(1, 8192): 'a', (8193, 16384): 'b'}")  # vLLM rewrites its index in place
    assert cc["publish"](claim, pod, time.time() + 1) is not None


def test_a_file_rewritten_unchanged_publishes_nothing_and_one_of_the_same_size_changed_does(tmp_path, cc):
    claim, pod = tmp_path / "claim", tmp_path / "pod"
    index = compiled(pod, AOT) / "cache_key_index.json"
    index.write_text('{"k": "aaaa"}')
    first = cc["publish"](claim, pod, time.time())
    later = time.time() + 10
    index.write_text('{"k": "aaaa"}')  # loading starts rewrite some files at their size (bench/compile-cache)
    os.utime(index, (later, later))
    assert cc["publish"](claim, pod, later) is None and snapshot_names(claim) == [first.name]
    index.write_text('{"k": "bbbb"}')  # same size, other bytes
    os.utime(index, (later + 1, later + 1))
    second = cc["publish"](claim, pod, later + 1)
    assert second is not None and (second / AOT / "cache_key_index.json").read_text() == '{"k": "bbbb"}'


def test_a_restarted_container_keeps_its_own_root_and_nothing_is_seeded(tmp_path, cc):
    claim, pod = tmp_path / "claim", tmp_path / "pod"
    compiled(tmp_path / "other", AOT, tag="claim")
    cc["publish"](claim, tmp_path / "other", time.time())
    mine = tree(compiled(pod, AOT, files=1, tag="pod").parent)
    assert cc["seed"](claim, pod) == 0
    assert tree(pod / AOT).keys() == {"artifact-0.bin"} and tree((pod / AOT).parent) == mine


def test_a_seed_under_way_leaves_no_root_until_the_whole_snapshot_is_there(tmp_path, cc):
    """vLLM in a container restarted mid-seed would load what it finds: half a copy could be half a file."""
    claim, pod = tmp_path / "claim", tmp_path / "cache" / "key"
    compiled(tmp_path / "first", AOT, files=12)
    whole = tree(cc["publish"](claim, tmp_path / "first", time.time()))
    left = compiled(pod.parent / ".partial-key-0badc0de", "x", files=1)  # a killed seed's
    cc["seed"].__globals__["copy_file"] = _slow_copy(shutil.copy2, 0.02)
    seen: list[bool] = []
    seeding = threading.Thread(target=cc["seed"], args=(claim, pod))
    seeding.start()
    while seeding.is_alive():
        if pod.exists():
            seen.append(tree(pod) == whole)
        time.sleep(0.005)
    assert tree(pod) == whole and all(seen), seen
    assert not left.exists() and [p.name for p in pod.parent.iterdir()] == ["key"]


def _slow_copy(copy2, pause_s: float):
    def copy(src, dst, *, follow_symlinks=True):
        time.sleep(pause_s)
        return copy2(src, dst, follow_symlinks=follow_symlinks)
    return copy


def _watch(cc, claim: Path, whole: dict[str, bytes], stop: threading.Event, seen: list) -> None:
    """What a starting replica would seed, looked at again and again: the newest snapshot, as it would copy it."""
    while not stop.is_set():
        found = cc["snapshots"](claim)
        if found:
            try:
                seen.append(tree(found[-1]) == whole)
            except FileNotFoundError:
                continue


@pytest.mark.parametrize("atomic", [True, False])
def test_a_snapshot_under_way_is_never_seen_half_written(tmp_path, cc, atomic):
    """Two replicas publish at once while a third would seed. The copier's hidden directory and rename show the
    seeding replica nothing or a whole snapshot; copying straight into a snapshot's name (vLLM's own way of writing
    its cache, the control) shows it half of one."""
    pods = [tmp_path / f"pod{i}" for i in range(2)]
    for pod in pods:
        compiled(pod, AOT, files=12)
    whole = tree(pods[0])
    claim = tmp_path / "claim"
    cc["publish"].__globals__["copy_file"] = _slow_copy(shutil.copy2, 0.02)
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(cc, claim, whole, stop, seen))
    watcher.start()
    try:
        if atomic:
            publishers = [threading.Thread(target=cc["publish"], args=(claim, p, time.time())) for p in pods]
            for p in publishers:
                p.start()
            for p in publishers:
                p.join(30)
        else:
            shutil.copytree(pods[0], claim / "snapshots" / "20261206T000000-pod0",
                            copy_function=cc["publish"].__globals__["copy_file"])
        time.sleep(0.1)
    finally:
        stop.set()
        watcher.join(10)
    assert seen and seen[-1] is True
    if atomic:
        assert all(seen), f"{seen.count(False)} of {len(seen)} looks saw a partial snapshot"
        names = snapshot_names(claim)
        assert len(names) == 2 and not [n for n in names if n.startswith(".")], names
    else:
        assert not all(seen), "the control never caught the copy under way: the check shows nothing"


def test_old_snapshots_and_unfinished_copies_go_once_an_hour_old(tmp_path, cc):
    claim = tmp_path / "claim"
    made = []
    for i in range(4):
        pod = tmp_path / f"pod{i}"
        compiled(pod, AOT, files=1, size=4096 + i, tag=str(i))
        made.append(cc["publish"](claim, pod, time.time() + i))
    left = compiled(claim / "snapshots" / ".partial-20261206T000000-gone-1", "x", files=1)
    hidden = left.parent
    assert cc["seed"](claim, tmp_path / "fresh") == 1
    assert (tmp_path / "fresh" / AOT / "artifact-0.bin").read_bytes()[:1] == b"3", "seeded from the newest"
    cc["prune"](claim, time.time())
    assert len(snapshot_names(claim)) == 5, "nothing is removed within the hour a seeding pod may be copying it"
    hour_ago = time.time() - cc["STALE_S"] - 60
    for path in [*made[:2], hidden]:
        os.utime(path, (hour_ago, hour_ago))
    cc["prune"](claim, time.time())
    assert snapshot_names(claim) == sorted(p.name for p in made[2:]), "the newest KEEP stay"


def test_an_unwritable_or_missing_claim_is_logged_and_never_fails(tmp_path):
    pod = tmp_path / "pod"
    compiled(pod)
    seeded = copier("seed", str(tmp_path / "no-claim"), str(tmp_path / "empty"))
    assert seeded.returncode == 0 and "no snapshot" in seeded.stderr
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    proc = copier("publish", str(blocked), str(pod))
    assert proc.returncode == 0 and "failed" in proc.stderr, proc.stderr


def test_publish_waits_for_the_server_to_answer(tmp_path):
    """Nothing is published while the health check fails: the root may still be under vLLM's own writes."""
    pod, claim = tmp_path / "pod", tmp_path / "claim"
    compiled(pod)
    for wait in ("3", "0"):  # the preStop hook's asks once
        proc = copier("publish", str(claim), str(pod), "--after-ready", "http://127.0.0.1:9/health", "--wait-s", wait)
        assert proc.returncode == 0 and "did not answer" in proc.stderr and not claim.exists()


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == vllm_api.HEALTH_PATH else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_entrypoint_seeds_before_vllm_and_publishes_once_it_answers(tmp_path, cc):
    """A vllm stand-in lists what its cache root holds at start, then compiles and waits (as a server does) until
    a second snapshot is on the claim: the publisher ran beside it and copied the root after the health check."""
    claim, root = tmp_path / "claim" / "key", tmp_path / "root"
    compiled(tmp_path / "earlier", AOT)
    cc["publish"](claim, tmp_path / "earlier", time.time() - 60)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(
        "#!/bin/sh\n"
        'find "$VLLM_CACHE_ROOT" -type f | sort\n'
        f'mkdir -p "$VLLM_CACHE_ROOT/{BACKEND}" && echo compiled > "$VLLM_CACHE_ROOT/{BACKEND}/vllm_compile_cache.py"\n'
        f'for i in $(seq 100); do [ "$(ls {claim}/snapshots | wc -l)" = 2 ] && echo published && exit 0\n'
        "sleep 0.2; done\n"
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
    seen_at_start = proc.stdout.splitlines()[:-1]
    assert seen_at_start == [str(root / AOT / f"artifact-{i}.bin") for i in range(3)]
    assert proc.stdout.splitlines()[-1] == "published"
    assert "seeded 3 files" in proc.stderr
    newest = cc["snapshots"](claim)[-1]
    assert (newest / BACKEND / "vllm_compile_cache.py").read_text() == "compiled\n"


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


def test_the_node_local_file_it_leaves_out_is_named_as_vllms_sources_name_it(cc):
    """vLLM's record of which GPUs reach each other is the node's, and is left out of every snapshot by name: a
    release that renamed it would have it carried to other nodes."""
    import importlib.util
    import re

    from support.tools import skip_or_fail
    from support.vllm_trees import vllm_trees

    roots = vllm_trees()
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).parents[1])
    sources = [r / "vllm" / "distributed" / "device_communicators" / "all_reduce_utils.py" for r in roots]
    sources = [s for s in sources if s.is_file()]
    if not sources:
        skip_or_fail("no vLLM source tree is at hand")
    for source in sources:
        name, = re.findall(r'f"(gpu_p2p_access_cache_for_\{cache_key\}\.json)"', source.read_text())
        assert cc["NODE_LOCAL"].fullmatch(name.replace("{cache_key}", "0,1,2,3")), source
