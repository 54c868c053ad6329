"""Errors a user can act on. Each carries one line that names the numbers."""


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
