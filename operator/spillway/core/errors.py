"""Errors a user can act on. Each carries one line that names the numbers."""
from __future__ import annotations


class SpillwayError(Exception):
    """Base class: a bad input, reported as one clear line (CLI exit code 2)."""

    reason = "InvalidSpec"


class InvalidSpec(SpillwayError):
    reason = "InvalidSpec"


class ModelGeometryUnknown(SpillwayError):
    reason = "ModelGeometryUnknown"


class PoolDoesNotFit(SpillwayError):
    reason = "PoolDoesNotFit"


class NoEligibleNodes(SpillwayError):
    reason = "NoEligibleNodes"


class NameConflict(SpillwayError):
    """An object of the name the operator would write exists and is not this ModelServer's."""

    reason = "NameConflict"


class InternalError(SpillwayError):
    """A failure nobody planned for (an operator bug): reported on the resource, contained to it."""

    reason = "InternalError"

    @classmethod
    def of(cls, exc: BaseException) -> InternalError:
        return cls(f"internal error ({type(exc).__name__}: {exc})"[:500])
