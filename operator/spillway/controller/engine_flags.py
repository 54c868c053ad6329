"""Which vLLM flag, if any, an extraArgs entry sets, and the value it gives, read the way vLLM's parser reads it.

vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py, 0.33) rewrites `_` to `-` in a long flag's
name up to the first `.`, splits `--flag=value`, turns `--flag.key value` into `--flag '{"key": value}'`
and leaves the rest to argparse, which also takes any unique prefix of a long flag (allow_abbrev) and
`-tp=8` for short ones. So the name is normalised the same way and compared by prefix.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from ..core import vllm_api as api

# vllm/utils/argparse_utils.py human_readable_int: 8192, 8k (decimal), 8K (binary, whole numbers only)
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])?")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _name(arg: str) -> str:
    return arg.split("=", 1)[0].split(".", 1)[0]


def _long_name(arg: str) -> str | None:
    if not arg.startswith("--"):
        return None
    name = _name(arg).replace("_", "-")
    return None if name == "--" else name


def _short_name(arg: str) -> str | None:
    if arg.startswith("--") or not arg.startswith("-") or len(arg) < 2 or arg[1].isdigit() or arg[1] == ".":
        return None
    return _name(arg)


def _matching(arg: str, long_flags: Sequence[str], short_flags: Sequence[str]) -> str | None:
    name = _long_name(arg)
    if name is not None:
        return name if any(flag.startswith(name) for flag in long_flags) else None
    name = _short_name(arg)
    if name is not None:
        return name if any(flag.startswith(name) for flag in short_flags) else None
    return None


def planned_flag(arg: str) -> str | None:
    """The planned flag `arg` would set in vLLM (an abbreviation names the flags it could mean), or None."""
    return _matching(arg, api.PLAN_FLAGS, api.PLAN_SHORT_FLAGS)


def geometry_flag(arg: str) -> str | None:
    """The flag `arg` would set that changes the model's geometry or host memory outside the plan, or None."""
    return _matching(arg, api.GEOMETRY_FLAGS, api.GEOMETRY_SHORT_FLAGS)


def flag_values(args: Sequence[str], flag: str) -> list[str | None]:
    """Every value vLLM would read for the long `flag` in `args` (argparse keeps the last); None where the
    flag ends the command line without one."""
    values: list[str | None] = []
    for i, arg in enumerate(args):
        name = _long_name(arg)
        if name is None or not flag.startswith(name):
            continue
        if "=" in arg:
            values.append(arg.split("=", 1)[1])
        else:
            values.append(args[i + 1] if i + 1 < len(args) else None)
    return values


def human_readable_int(value: str) -> int | None:
    """vLLM's human_readable_int, or None where vLLM would refuse the value."""
    match = _HUMAN_INT.fullmatch(value.strip())
    if match is None:
        return None
    number, suffix = match.groups()
    if suffix is None:
        return int(number) if number.isdigit() else None
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    return int(number) * _BINARY[suffix] if number.isdigit() else None
