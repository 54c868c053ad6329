"""Each of the connector's replacements of vLLM (or starlette) code runs only over the exact code it replaces.

A replacement (the batched pin and release, the in-flight reservation, the detokenizer window, the request-body
parse, the parallel pre-fault) redoes or wraps a function of another package; PATCHES.md beside the package says
why each exists and when it goes. Instead of a version gate, each names the functions it depends on and the
fingerprints of their code in every release it was verified on: a release where any of them reads differently
keeps the stock code, and says so once in the log. A fingerprint is the function's syntax tree without its
docstring, so comments, blank lines and line numbers do not count and any change of code does.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import logging
import textwrap
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("spillway_connector")


def fingerprint(function: Any) -> str | None:
    """The fingerprint of `function`'s code (a function, method or property); None when its source is not at hand."""
    function = getattr(function, "fget", function)
    function = inspect.unwrap(getattr(function, "__func__", function))
    try:
        source = textwrap.dedent(inspect.getsource(function))
        node = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        node.body = body[1:] or [ast.Pass()]
    node.decorator_list = []
    return hashlib.sha256(canonical(node).encode()).hexdigest()[:16]


# Fields that a newer Python adds to the same code's tree (3.12: type_params on every def and class).
_VERSION_FIELDS = frozenset({"type_params"})


def canonical(node: Any) -> str:
    """A tree as text that reads the same on every Python: ast.dump does not (3.12 adds `type_params=[]` to each
    def, 3.13 leaves empty fields out), and vLLM's GPU image runs Python 3.12 where CI runs 3.11, so a dump's
    fingerprint turned every replacement off in the image. Empty fields and the version-added ones are left
    out; positions never count."""
    if isinstance(node, ast.AST):
        fields = [f"{name}={canonical(value)}" for name, value in ast.iter_fields(node)
                  if name not in _VERSION_FIELDS and value not in (None, [])]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(canonical(item) for item in node)}]"
    return repr(node)


def differences(functions: Mapping[str, Any], known: Mapping[str, frozenset[str]]) -> list[str]:
    """The names in `known` whose function in `functions` is missing or reads as none of its known fingerprints."""
    return [name for name, prints in known.items()
            if functions.get(name) is None or fingerprint(functions[name]) not in prints]


_refused: set[str] = set()


def verified(replacement: str, functions: Mapping[str, Any], known: Mapping[str, frozenset[str]]) -> bool:
    """Whether `replacement` may run: every function it depends on reads as in a verified release. When not, one
    warning per process names what differs and says that the stock code runs."""
    changed = differences(functions, known)
    if changed and replacement not in _refused:
        _refused.add(replacement)
        logger.warning("spillway_connector: %s is off: %s no longer read(s) as in the releases it was verified "
                       "on (see spillway_connector/PATCHES.md); the stock code runs", replacement, ", ".join(changed))
    return not changed
