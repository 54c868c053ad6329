"""The `spillway` command. Each subcommand lives in its own module with `add_parser()`."""
from __future__ import annotations

import argparse
import sys

from . import loadtest, qualify
from .commands import plan, render, route
from .core.errors import SpillwayError

# Each provides add_parser(subparsers); imported by name so readers and import-linter see every arrow.
SUBCOMMANDS = (plan, render, route, qualify, loadtest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spillway", description="vLLM KV offloading to CPU DRAM, sized for Kubernetes")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
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
