"""`spillway qualify`: GPU<->pinned-CPU transfer qualification of a node (see cli.py)."""
from .cli import add_parser

__all__ = ["add_parser"]
