"""The `spillway` command. Each subcommand lives in its own module with `add_parser()`."""
from __future__ import annotations

import argparse
import os
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


MAX_ERROR_CHARS = 1000  # one line a terminal shows whole; a message quoting hostile input can be megabytes


def _error(message: str) -> int:
    line = " ".join(message.split()) or "failed"
    print(f"spillway: error: {line[:MAX_ERROR_CHARS]}", file=sys.stderr)
    return 2


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed subcommand. Whatever it raises becomes one line on stderr and exit code 2, never a
    traceback: a SpillwayError says what was wrong with the input; anything else is named by its type (an
    input out of every range that no check foresaw: a 10**30-layer config.json overflows list sizes)."""
    try:
        return args.func(args) or 0
    except SpillwayError as exc:
        return _error(str(exc))
    except KeyboardInterrupt:
        print("spillway: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`| head`): nothing left to say, and the interpreter's own flush at
        # exit would raise again on the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 2
    except OSError as exc:  # a file the input names: unreadable, a name too long, a directory, ...
        where = f"{str(exc.filename)[:200]}: " if exc.filename is not None else ""
        return _error(f"{where}{exc.strerror or exc}")
    except (OverflowError, RecursionError, MemoryError) as exc:
        return _error(f"an input too large or too deeply nested to work with ({type(exc).__name__}: {exc})")
    except Exception as exc:  # noqa: BLE001 - the CLI's promise: one line, exit 2
        return _error(f"{type(exc).__name__}: {exc}")


def main(argv: list[str] | None = None) -> int:
    return dispatch(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
