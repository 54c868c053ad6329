"""What every source patch of images/vllm/patches/ must do to a copied tree, checked one way for all of them.

A patch module (source_patch.SourcePatch's functions: target, patch_source, is_applied, apply, revert) is run on a
copy of the tree it patches, so that the venv's own packages are read and never written.
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest


def load_module(path: Path, name: str) -> ModuleType:
    """The module at `path` (a patch, or a bench script: neither is a package) under `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cli(patch_file: Path, *args: str) -> subprocess.CompletedProcess:
    """`python3 <patch>.py check|apply|revert [SITE]`, as the image build runs it."""
    return subprocess.run([sys.executable, str(patch_file), *args], check=False, capture_output=True, text=True,
                          timeout=60)


def assert_apply_twice_then_revert_restores_the_exact_bytes(patch: ModuleType, copy: Path) -> None:
    """Apply writes patch_source's text and drops the stale compiled module (Python would import it instead);
    a second apply changes nothing; revert restores the original bytes and removes the kept original."""
    path = patch.target(copy)
    original = path.read_bytes()
    cached = path.parent / "__pycache__" / f"{path.stem}.cpython-311.pyc"
    cached.parent.mkdir(exist_ok=True)
    cached.write_bytes(b"stale")

    assert patch.apply(copy) == "applied"
    patched = path.read_bytes()
    assert patched == patch.patch_source(original.decode()).encode()
    assert not cached.exists(), f"a stale compiled {path.stem} module would still be imported"
    assert patch.apply(copy) == "already applied"
    assert path.read_bytes() == patched

    assert patch.revert(copy) == "reverted"
    assert path.read_bytes() == original
    assert not path.with_name(path.name + ".orig").exists()
    assert patch.revert(copy) == "not applied"
    assert path.read_bytes() == original


def assert_the_cli_checks_applies_and_reverts(patch_file: Path, patch: ModuleType, copy: Path) -> None:
    """`check` says the patch applies and writes nothing; `apply` and `revert` do what the functions do."""
    original = patch.target(copy).read_bytes()
    check = cli(patch_file, "check", str(copy))
    assert check.returncode == 0 and check.stdout.strip().endswith(f"applies to {patch.target(copy)}"), check
    assert patch.target(copy).read_bytes() == original, "check wrote to the tree"
    assert cli(patch_file, "apply", str(copy)).returncode == 0
    assert patch.is_applied(patch.target(copy).read_text())
    assert cli(patch_file, "revert", str(copy)).returncode == 0
    assert patch.target(copy).read_bytes() == original


def assert_a_changed_source_is_refused(patch_file: Path, patch: ModuleType, copy: Path, changed: str,
                                       names: str) -> None:
    """A tree whose patched file reads `changed` (code the patch does not know) is refused and left as it is:
    PatchError from the functions, exit 1 and one line naming the patch and `names` from the CLI."""
    path = patch.target(copy)
    path.write_text(changed)
    with pytest.raises(patch.PatchError, match="does not read as"):
        patch.patch_source(changed)
    with pytest.raises(patch.PatchError):
        patch.apply(copy)
    assert path.read_text() == changed and not path.with_name(path.name + ".orig").exists()
    for command in ("check", "apply"):
        proc = cli(patch_file, command, str(copy))
        assert proc.returncode == 1, proc
        assert proc.stdout == "" and "Traceback" not in proc.stderr
        line, = proc.stderr.splitlines()
        assert line.startswith(f"{patch.NAME}: ") and names in line
    assert path.read_text() == changed


def assert_a_missing_tree_is_one_line(patch_file: Path, where: Path) -> None:
    proc = cli(patch_file, "check", str(where))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc


def copy_site(patch: ModuleType, site: Path, into: Path, *also: str) -> Path:
    """A site-packages folder at `into` holding a copy of the patched file (and of `also`, paths relative to the
    site), for a test to write to instead of the venv's own."""
    for relative in (patch.target(Path()), *map(Path, also)):
        (into / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / relative, into / relative)
    return into
