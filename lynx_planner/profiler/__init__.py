"""Profiles of real PyTorch models: `lynx profile path/to/model.py` (see the README, "Profiling your own model")."""

from .loading import load_model_file
from .profile import profile_model_file
from .tracing import trace_block

__all__ = ["load_model_file", "profile_model_file", "trace_block"]
