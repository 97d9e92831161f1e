"""lynx-planner: plans activation recomputation hidden in pipeline-parallel training (the Lynx method)."""

from __future__ import annotations

__version__ = "0.1.0"  # the one version string: pyproject.toml reads it (tool.setuptools.dynamic)


def __getattr__(name: str) -> object:
    # `apply_plan` pulls in torch; load it only when asked for, so `import lynx_planner` stays light.
    if name == "apply_plan":
        from .runtime import apply_plan

        return apply_plan
    raise AttributeError(f"module 'lynx_planner' has no attribute {name!r}")
