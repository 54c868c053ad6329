"""Regenerate the chart's dashboards and rule files: `python -m spillway.observability`.

  --check           exit 1 (listing the files) when a committed file differs from what
                    the generator writes now, instead of writing
  --out DIR         write under DIR instead of charts/spillway/files
  --<threshold> X   override an alert threshold (see alerts.Thresholds)
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from . import alerts, dashboards, rules

REPO = Path(__file__).resolve().parents[3]
CHART_FILES = REPO / "charts" / "spillway" / "files"
DASHBOARD_DIR = "dashboards"
RULES_DIR = "rules"
RECORDING_FILE = "spillway-recording.yaml"
ALERTS_FILE = "spillway-alerts.yaml"


def generated(thresholds: alerts.Thresholds = alerts.DEFAULT) -> dict[str, str]:
    """Relative path under the chart's files/ -> content."""
    files = {f"{DASHBOARD_DIR}/{d.filename}": dashboards.render(d.builder) for d in dashboards.dashboards()}
    files[f"{RULES_DIR}/{RECORDING_FILE}"] = rules.render_recording()
    files[f"{RULES_DIR}/{ALERTS_FILE}"] = rules.render_alerts(thresholds)
    return files


def stale(out: Path, files: dict[str, str]) -> list[str]:
    return [
        relative for relative, content in files.items()
        if not (out / relative).is_file() or (out / relative).read_text() != content
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spillway.observability", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the committed files are stale")
    parser.add_argument("--out", type=Path, default=CHART_FILES, help="the chart's files/ directory")
    defaults = alerts.DEFAULT
    for field in dataclasses.fields(alerts.Thresholds):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=float, default=getattr(defaults, field.name))
    args = parser.parse_args(argv)
    thresholds = alerts.Thresholds(**{f.name: getattr(args, f.name) for f in dataclasses.fields(alerts.Thresholds)})
    files = generated(thresholds)
    if args.check:
        outdated = stale(args.out, files)
        for relative in outdated:
            print(f"stale: {args.out / relative} (run `make dashboards`)", file=sys.stderr)
        return 1 if outdated else 0
    for relative, content in files.items():
        path = args.out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
