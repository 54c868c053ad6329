"""Which planned vLLM flag, if any, an extraArgs entry sets, read the way vLLM's parser reads it.

vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py, 0.33) rewrites `_` to `-` in a long flag's
name up to the first `.`, splits `--flag=value`, turns `--flag.key value` into `--flag '{"key": value}'`
and leaves the rest to argparse, which also takes any unique prefix of a long flag (allow_abbrev) and
`-tp=8` for short ones. So the name is normalised the same way and compared by prefix.
"""
from __future__ import annotations

from ..core import vllm_api as api


def _name(arg: str) -> str:
    return arg.split("=", 1)[0].split(".", 1)[0]


def planned_flag(arg: str) -> str | None:
    """The planned flag `arg` would set in vLLM (an abbreviation names the flags it could mean), or None."""
    if arg.startswith("--"):
        name = _name(arg).replace("_", "-")
        if name == "--":
            return None
        hits = [flag for flag in api.PLAN_FLAGS if flag.startswith(name)]
    elif arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit() and arg[1] != ".":
        name = _name(arg)
        hits = [flag for flag in api.PLAN_SHORT_FLAGS if flag.startswith(name)]
    else:
        return None
    return name if hits else None
