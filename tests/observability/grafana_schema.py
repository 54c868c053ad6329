"""Type-check dashboard JSON against Grafana's published schema types (@grafana/schema) with tsc.

Grafana has no offline validator for a dashboard's JSON, but its schema package ships TypeScript types
generated from the schema Grafana itself loads dashboards with. A dashboard pasted as a `Dashboard`-typed
object literal fails `tsc --strict` on every unknown key (excess-property checks) and every wrong type.
The npm packages are pinned by package-lock.json beside this file; `npm ci` installs them once.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support.tools import require_binary

PACKAGE = Path(__file__).resolve().parent / "grafana-schema"
NODE_MODULES = PACKAGE / "node_modules"
# npm records what it installed here; older than the lock means the lock changed since.
INSTALLED = NODE_MODULES / ".package-lock.json"
LOCK = PACKAGE / "package-lock.json"
TSC = NODE_MODULES / ".bin" / "tsc"
COMPILER_OPTIONS = {
    "strict": True,
    "noEmit": True,
    "module": "nodenext",
    "moduleResolution": "nodenext",
    "target": "es2022",
}


def install() -> Path:
    """node_modules as the lock pins it; `--prefer-offline` lets a warm npm cache serve it without a network."""
    require_binary("node")
    npm = require_binary("npm")
    if not INSTALLED.is_file() or INSTALLED.stat().st_mtime < LOCK.stat().st_mtime:
        subprocess.run([npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=PACKAGE, check=True, timeout=600)
    return TSC


def typecheck(boards: dict[str, dict], workdir: Path) -> subprocess.CompletedProcess:
    """Run tsc over one `<name>.ts` per dashboard in workdir; the result's stdout lists the errors."""
    tsc = install()
    sources = []
    for name, board in boards.items():
        source = workdir / f"{Path(name).stem}.ts"
        source.write_text('import type { Dashboard } from "@grafana/schema";\n\n'
                          f"export const dashboard: Dashboard = {json.dumps(board, indent=2)};\n")
        sources.append(source.name)
    (workdir / "tsconfig.json").write_text(json.dumps({"compilerOptions": COMPILER_OPTIONS, "files": sources}))
    link = workdir / "node_modules"
    if not link.exists():
        os.symlink(NODE_MODULES, link, target_is_directory=True)
    return subprocess.run([str(tsc), "--noEmit", "--strict", "-p", str(workdir)], cwd=workdir,
                          capture_output=True, text=True, check=False, timeout=300)
