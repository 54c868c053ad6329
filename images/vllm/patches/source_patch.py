"""What every source patch of images/vllm/patches/ shares: find the site, apply, revert, check, one-line errors.

A patch is one file of vLLM's tree, or of a package vLLM's server imports (`package`: found wherever import
finds it), rewritten by a pure function (`transform`, source -> source) that raises PatchError when the code does
not read as the patch expects, so that the image build of a vLLM that changed it fails and someone decides
whether the patch is still needed. The original is kept beside the file for revert,
and the file's compiled bytecode is removed so that Python cannot import the stale one.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class PatchError(Exception):
    """The patched package's source does not read as the patch expects."""


def package_site(package: str) -> Path:
    """The site-packages folder of the `package` this interpreter imports (found as import finds it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(f"{package} is not importable here")
    return Path(next(iter(spec.submodule_search_locations))).parent


def vllm_site() -> Path:
    """The site-packages folder of the vLLM this interpreter imports."""
    return package_site("vllm")


def vllm_release(site: Path) -> str | None:
    """The vLLM release under `site` (its vllm/_version.py), None when it does not say."""
    try:
        found = re.search(r"""__version__\s*=\s*version\s*=\s*['"]([^'"]+)['"]""",
                          (Path(site) / "vllm" / "_version.py").read_text())
    except OSError:
        return None
    return found.group(1) if found else None


@dataclass(frozen=True)
class SourcePatch:
    name: str
    relative: Path  # the patched file, relative to site-packages
    transform: Callable[[str], str]  # the original source -> the patched one; PatchError when it does not read
    # The "major.minor" releases whose code needs the patch; another release is left as is (None: every one).
    releases: tuple[str, ...] | None = None
    package: str = "vllm"  # the package `relative` belongs to: its site is where `site()` looks

    def site(self) -> Path:
        """The site-packages folder of the patched package this interpreter imports (vLLM's, or starlette's)."""
        return package_site(self.package)

    def needed(self, site: Path) -> bool:
        release = vllm_release(site)
        return self.releases is None or release is None or ".".join(release.split(".")[:2]) in self.releases

    @property
    def marker(self) -> str:
        return f"# Spillway patch: {self.name}"

    def target(self, site: Path) -> Path:
        return Path(site) / self.relative

    def is_applied(self, source: str) -> bool:
        return self.marker in source

    def patch_source(self, source: str) -> str:
        return source if self.is_applied(source) else self.transform(source)

    def _drop_bytecode(self, path: Path) -> None:
        for cached in path.parent.glob(f"__pycache__/{path.stem}.*.pyc"):
            cached.unlink()

    def apply(self, site: Path) -> str:
        if not self.needed(site):
            return f"not needed on vLLM {vllm_release(site)} (for {', '.join(self.releases)}): left as is"
        path = self.target(site)
        source = path.read_text()
        if self.is_applied(source):
            return "already applied"
        patched = self.patch_source(source)
        path.with_name(path.name + ".orig").write_text(source)
        path.write_text(patched)
        self._drop_bytecode(path)
        return "applied"

    def revert(self, site: Path) -> str:
        path = self.target(site)
        original = path.with_name(path.name + ".orig")
        if not original.exists():
            return "not applied"
        path.write_text(original.read_text())
        original.unlink()
        self._drop_bytecode(path)
        return "reverted"

    def main(self, argv: list[str]) -> int:
        """`apply|revert|check [SITE_PACKAGES]`: exit 1 with one line on stderr when the patch does not apply."""
        if not argv or argv[0] not in ("apply", "revert", "check"):
            print(f"usage: {self.name}.py apply|revert|check [SITE_PACKAGES]", file=sys.stderr)
            return 2
        try:
            site = Path(argv[1]) if len(argv) > 1 else self.site()
            if argv[0] == "check" and not self.needed(site):
                print(f"{self.name}: not needed on vLLM {vllm_release(site)} (for {', '.join(self.releases)})")
            elif argv[0] == "check":
                self.patch_source(self.target(site).read_text())
                print(f"{self.name}: applies to {self.target(site)}")
            else:
                print(f"{self.name}: {(self.apply if argv[0] == 'apply' else self.revert)(site)} "
                      f"({self.target(site)})")
        except (PatchError, OSError) as exc:
            print(f"{self.name}: {exc}", file=sys.stderr)
            return 1
        return 0
