"""The `spillway` command. Each subcommand lives in its own module with `add_parser()`."""
from __future__ import annotations

import argparse
import importlib
import sys

from .core.errors import SpillwayError

# modules under spillway/ that provide add_parser(subparsers)
SUBCOMMANDS = ["commands.plan", "commands.render", "commands.route", "qualify", "loadtest"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spillway", description="vLLM KV offloading to CPU DRAM, sized for Kubernetes")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"spillway.{name}").add_parser(sub)
    return parser


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed subcommand; a SpillwayError becomes one line on stderr and exit code 2."""
    try:
        return args.func(args) or 0
    except SpillwayError as exc:
        print(f"spillway: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    return dispatch(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
