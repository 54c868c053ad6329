"""Write the chart's dashboards and rule files: `python -m spillway.observability`.

`make generate` writes them with the repository's other generated files, with the defaults;
this command also writes them with a site's own alert settings:

  --out DIR         write under DIR instead of charts/spillway/files
  --<setting> X     override an alert threshold or the runbook URL pattern (see alerts.Config)
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


def generated(config: alerts.Config = alerts.DEFAULT) -> dict[str, str]:
    """Relative path under the chart's files/ -> content."""
    files = {f"{DASHBOARD_DIR}/{d.filename}": dashboards.render(d.builder) for d in dashboards.dashboards()}
    files[f"{RULES_DIR}/{RECORDING_FILE}"] = rules.render_recording()
    files[f"{RULES_DIR}/{ALERTS_FILE}"] = rules.render_alerts(config)
    return files


def generated_files() -> dict[Path, str]:
    """For `make generate`: path in this tree -> content, with the default settings."""
    return {CHART_FILES / relative: content for relative, content in generated().items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spillway.observability", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CHART_FILES, help="the chart's files/ directory")
    for field in dataclasses.fields(alerts.Config):
        default = getattr(alerts.DEFAULT, field.name)
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(default), default=default,
                            metavar=type(default).__name__.upper())
    args = parser.parse_args(argv)
    config = alerts.Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(alerts.Config)})
    for relative, content in generated(config).items():
        path = args.out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
