"""The error a plan that does not fit the model raises."""

from __future__ import annotations

from ..io import InputError


class PlanMismatchError(InputError):
    """The plan names a stage, module path or op the model does not have (the CLI exits with code 2)."""
