"""Where in the disk tier's root one engine's chunk files live: a replica's own slot, a namespace per model identity.

    <root>/                                  the planned directory: nothing but the tier's own entries in it
      replica-<n>/.owner.lock                a slot, owned by the engine holding the lock (flock) on this file
      replica-<n>/<model>_<digest>/config.json        what the digest covers (human-readable)
      replica-<n>/<model>_<digest>_r0/<hhh>/<hh>_g<g>/<hash>.bin   vLLM's file mapper's tree, one chunk per file

Replicas that share one directory (a claim mounted without subPath) each take the first free slot, so no evictor
ever deletes another replica's chunks; a restarted engine takes the slot its predecessor freed and finds its
chunks there. Replicas of one share (SHARE_ENV: the operator sets the ModelServer's namespace/name) also read
each other's chunks, never writing or evicting there (SiblingFiles): the share is in the namespace digest, so a
slot of another share, model or revision never holds a path this engine looks for.

vLLM's file mapper names the namespace after the model path, the KV-cache dtype, block and group layout
(vllm/v1/kv_offload/file_mapper.py). That leaves out what else changes KV bytes under the same path: the weights
themselves (a new revision downloaded to the same directory), the model dtype and quantization, the KV layout,
the parallel layout, vLLM's release and this module's file format. `identity()` adds them, so a new revision
never reads an old one's chunks; the evictor reclaims a slot's other namespaces.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import blake3

from spillway_connector.chunk_integrity import MAGIC
from spillway_connector.transfer_config import EXTRA_MODEL_IDENTITY

SHARE_ENV = "SPILLWAY_DISK_TIER_SHARE"  # spillway.core.vllm_api.ENV_DISK_TIER_SHARE
SIBLINGS_TTL_S = 5.0  # how long a listing of the root's slots is used: a replica that joins is read from then on
SLOT_PREFIX = "replica-"
LOCK_NAME = ".owner.lock"
MAX_SLOTS = 256
LOST_AND_FOUND = "lost+found"  # a fresh ext4 volume's root holds it
# vLLM's namespace directory: <safe model name>_<12 hex digits of sha256> (file_mapper._compute_base_path)
NAMESPACE_DIR = re.compile(r"^.+_[0-9a-f]{12}$")
CONFIG_FILE = "config.json"
O_DIRECT_PROBE = ".o_direct_probe"  # vllm/v1/kv_offload/tiering/fs/io.py probe_o_direct's file, removed at once
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
FULL_HASH_BYTES = 1 << 30  # weights up to this size are hashed whole (BLAKE3: well under a second)
SAMPLES_PER_FILE, SAMPLE_BYTES = 256, 64 << 10  # larger ones: the header, the end and 256 windows per file
logger = logging.getLogger(__name__)


class TierRootError(ValueError):
    """The tier's root is not the tier's own: one line naming what is wrong."""


def check_root(root: str) -> None:
    """Refuse a root that holds anything but slots (and what vLLM's tier writes there on its own)."""
    try:
        entries = sorted(os.listdir(root))
    except OSError as exc:
        raise TierRootError(f"disk tier root {root} cannot be listed: {exc.strerror}") from exc
    for name in entries:
        path = os.path.join(root, name)
        if os.path.islink(path):
            raise TierRootError(f"disk tier root {root} holds a link {name!r}: point the tier at a directory of "
                                "its own")
        if name == LOST_AND_FOUND or name.startswith(O_DIRECT_PROBE):
            continue
        if name.startswith(SLOT_PREFIX) and name[len(SLOT_PREFIX):].isdigit() and os.path.isdir(path):
            continue
        if NAMESPACE_DIR.match(name) and os.path.isdir(path) and _only_config(path):
            continue  # vLLM's tier writes its namespace's config.json into the root before the connector moves it
        raise TierRootError(f"disk tier root {root} holds {name!r}, which the tier did not write: the evictor "
                            "deletes files there, so point the tier at an empty directory of its own")


def _only_config(path: str) -> bool:
    try:
        return all(name == CONFIG_FILE or name.startswith(O_DIRECT_PROBE) for name in os.listdir(path))
    except OSError:
        return False


class Slot:
    """A replica's sub-directory of the root, held (flock) while this engine runs."""

    def __init__(self, path: str, fd: int):
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def claim_slot(root: str) -> Slot:
    """The first slot no running engine holds, created if need be."""
    for index in range(MAX_SLOTS):
        path = os.path.join(root, f"{SLOT_PREFIX}{index}")
        lock = os.path.join(path, LOCK_NAME)
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)  # flock needs no write access: a read-only volume's
        except FileNotFoundError:                         # slots still load what they hold
            try:
                os.makedirs(path, exist_ok=True)
                fd = os.open(lock, os.O_CREAT | os.O_RDONLY | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise TierRootError(f"disk tier root {root}: cannot create the replica slot {path}: "
                                    f"{exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except OSError as exc:  # ENOLCK, EOPNOTSUPP: some network file systems keep no flock
            os.close(fd)
            raise TierRootError(f"disk tier root {root}: its volume cannot lock files ({exc.strerror}), so "
                                "replicas could not keep off each other's chunks: give each replica a directory "
                                "of its own (a claim per replica, or a node-local directory)") from exc
        return Slot(os.path.realpath(path), fd)
    raise TierRootError(f"disk tier root {root}: all {MAX_SLOTS} replica slots are held by running engines")


def orphaned_slots(root: str, own: str) -> Iterator[Slot]:
    """The root's slots that no running engine holds (a replica scaled away, or one restarting right now), each
    yielded locked, so no engine starting meanwhile takes the slot while it is emptied (it takes another one).
    The caller releases each."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return
    for name in names:
        path = os.path.join(root, name)
        if not _is_slot(root, name) or os.path.realpath(path) == os.path.realpath(own):
            continue
        try:
            fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        yield Slot(os.path.realpath(path), fd)


def weights_fingerprint(model_dir: str) -> str | None:
    """BLAKE3 of the model directory's weight files (names, sizes, contents; sampled above FULL_HASH_BYTES) and
    config.json; None when `model_dir` is not a directory (a hub name not resolved to local files)."""
    if not os.path.isdir(model_dir):
        return None
    files = sorted(name for name in os.listdir(model_dir)
                   if name.endswith(WEIGHT_SUFFIXES) or name == CONFIG_FILE)
    sizes = {name: os.path.getsize(os.path.join(model_dir, name)) for name in files}
    whole = sum(sizes.values()) <= FULL_HASH_BYTES
    hasher = blake3.blake3(b"whole" if whole else b"sampled")
    for name in files:
        size = sizes[name]
        hasher.update(f"{name}\0{size}\0".encode())
        with open(os.path.join(model_dir, name), "rb") as f:
            if whole:
                while block := f.read(8 << 20):
                    hasher.update(block)
                continue
            step = max(1, size // SAMPLES_PER_FILE)
            for offset in [*range(0, size, step), max(0, size - SAMPLE_BYTES)]:
                f.seek(offset)
                hasher.update(f.read(SAMPLE_BYTES))
    return hasher.hexdigest(16)


def resolve_model_dir(model: str, revision: str | None) -> str | None:
    """A local directory of the model's files: the path itself, or the hub cache's snapshot of `model`."""
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, revision=revision, local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the local cache, no hub library, not a hub name: no fingerprint
        return None


def share() -> str | None:
    """The replicas' share this engine reads sibling slots within (SHARE_ENV), or None: no sibling reads."""
    return os.environ.get(SHARE_ENV, "").strip() or None


def identity(offloading_config: Any, vllm_config: Any = None, extra_config: Any = None,
             file_format: str | None = None, share: str | None = None) -> dict[str, Any]:
    """Everything besides vLLM's own file-mapper fields that changes the KV bytes a chunk holds (or how a file
    holds them: `file_format`, chunk_integrity's trailer unless given); and the replicas' `share`, so that only
    its replicas' namespaces hold the paths a sibling read looks for."""
    import vllm

    model_config = getattr(vllm_config, "model_config", None)
    revision = getattr(model_config, "revision", None)
    model_dir = resolve_model_dir(offloading_config.model.name, revision)
    parallel = offloading_config.parallel
    fields: dict[str, Any] = {
        "format": file_format or MAGIC.decode(),
        "vllm": vllm.__version__,
        "weights": weights_fingerprint(model_dir) if model_dir else None,
        "revision": revision,
        "model_dtype": str(getattr(model_config, "dtype", "")).removeprefix("torch.") or None,
        "quantization": getattr(model_config, "quantization", None),
        "kv_cache_dtype": offloading_config.model.dtype,
        "kv_cache_layout": getattr(offloading_config, "kv_cache_layout", None),
        "tokens_per_block": [group.tokens_per_block for group in offloading_config.groups],
        "blocks_per_chunk": offloading_config.cache.blocks_per_chunk,
        "parallel": {"tp": parallel.tp_size, "pp": parallel.pp_size, "pcp": parallel.pcp_size,
                     "dcp": parallel.dcp_size, "agnostic": bool(parallel.is_parallelism_agnostic)},
    }
    operator_identity = (extra_config or {}).get(EXTRA_MODEL_IDENTITY)
    if operator_identity is not None:
        fields["operator"] = operator_identity
    if share is not None:
        fields["share"] = share
    return fields


def _is_slot(root: str, name: str) -> bool:
    return (name.startswith(SLOT_PREFIX) and name[len(SLOT_PREFIX):].isdigit()
            and not os.path.islink(os.path.join(root, name)))


class SiblingFiles:
    """vLLM's file mapper, its chunk's file looked up in the root's other slots too: this engine's own file where
    it exists, else a sibling slot's at the same place under the slot (the same namespace), else its own (a
    miss). vLLM's lookup asks it; the tier reads through it; stores, the bound and the evictor keep to the own
    slot (`own`). A sibling's evictor may delete a file between the lookup and the read: the read fails, and vLLM
    recomputes what it did not load, as for any failed load."""

    def __init__(self, mapper: Any, root: str, own_slot: str, clock: Any = None):
        import time

        self._mapper, self._root, self._own = mapper, root, own_slot.rstrip(os.sep)
        self._clock = clock or time.monotonic
        self._slots: list[str] = []
        self._listed_at: float | None = None
        self.own = mapper.get_file_name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mapper, name)

    def siblings(self) -> list[str]:
        now = self._clock()
        if self._listed_at is None or now - self._listed_at >= SIBLINGS_TTL_S:
            try:
                names = sorted(os.listdir(self._root))
            except OSError:
                names = []
            own = os.path.basename(self._own)
            self._slots = [os.path.join(self._root, n) for n in names if n != own and _is_slot(self._root, n)]
            self._listed_at = now
        return self._slots

    def get_file_name(self, key: Any) -> str:
        return self.locate(self.own(key))

    def locate(self, path: str) -> str:
        """Where the chunk whose own file is `path` can be read: `path` where it exists, else a sibling's."""
        if os.path.exists(path) or not path.startswith(self._own + os.sep):
            return path
        rest = path[len(self._own):]
        for slot in self.siblings():
            if os.path.exists(slot + rest):
                return slot + rest
        return path


def rebase(file_mapper: Any, slot_dir: str, fields: dict[str, Any]) -> str:
    """Move vLLM's file mapper into `slot_dir`, its namespace digest covering `fields` too; write the namespace's
    config.json there. Returns the new base path (<slot>/<model>_<digest>)."""
    mapper_fields = dict(file_mapper.fields)
    mapper_fields["spillway"] = fields
    canonical = json.dumps(mapper_fields, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]  # as vLLM names its own namespaces
    base = os.path.join(slot_dir, f"{mapper_fields['model_name'].replace('/', '_')}_{digest}")
    file_mapper.fields, file_mapper.base_path = mapper_fields, base
    config = file_mapper.get_config_file_path()
    try:
        os.makedirs(base, exist_ok=True)
        if not os.path.exists(config):
            tmp = f"{config}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(mapper_fields, f, indent=2, sort_keys=True, default=str)
            os.replace(tmp, config)
    except OSError as exc:  # a read-only or full volume: the evictor reports it and refuses stores
        logger.error("disk tier: cannot write %s: %s", config, exc.strerror)
    return base
