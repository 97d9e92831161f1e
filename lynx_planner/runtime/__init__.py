"""Applying a lynx plan in training: per-layer keep/recompute and early recomputation (docs/runtime.md)."""

from .apply import LynxRuntime, apply_plan, runtime_of
from .dryrun import dry_run
from .errors import PlanMismatchError
from .pipelining import attach

__all__ = ["LynxRuntime", "PlanMismatchError", "apply_plan", "attach", "dry_run", "runtime_of"]
