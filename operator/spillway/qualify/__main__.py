"""`python -m spillway.qualify ...`: the qualify subcommand alone (no operator dependencies imported)."""
from __future__ import annotations

import argparse
import sys

from ..cli import dispatch
from . import add_parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spillway-qualify")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    return dispatch(parser.parse_args(["qualify", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
