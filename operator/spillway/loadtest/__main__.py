"""`python -m spillway.loadtest ...`: the load test alone, without the other subcommands' imports."""
from __future__ import annotations

import argparse
import sys

from ..cli import dispatch
from .cli import add_subcommands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spillway.loadtest", description=__doc__)
    add_subcommands(parser.add_subparsers(dest="loadtest_command", required=True))
    return dispatch(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
