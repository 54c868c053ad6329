"""`python -m spillway.qualify ...`: the qualify subcommand alone (no operator dependencies imported)."""
from __future__ import annotations

import argparse
import sys

from ..errors import SpillwayError
from . import add_parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spillway-qualify")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["qualify", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args) or 0
    except SpillwayError as exc:
        print(f"spillway: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
