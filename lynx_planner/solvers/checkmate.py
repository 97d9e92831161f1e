"""Checkmate (Jain et al., MLSys 2020) adapted to the pipeline: the optimal keep/recompute choice per tensor under the
memory limit, minimising total recomputation time, all of it on demand; Megatron's even split.

Solved as the shared MILP (solvers/milp.py) with on-demand placement only and the summed-time objective.
"""

from __future__ import annotations

from . import Problem, Strategy
from .heu import heu_strategy
from .milp_search import refine
from .partition import even_bounds
from .stage_model import n_chunks

DEFAULT_TIME_LIMIT_S = 60.0


def search(problem: Problem, algo: str = "checkmate") -> Strategy:
    profile, limit = problem.profile, problem.memory_limit
    bounds = even_bounds(profile, n_chunks(profile))
    time_limit = problem.time_limit if problem.time_limit is not None else DEFAULT_TIME_LIMIT_S
    pols, _, result = refine(profile, limit, bounds, [0.0] * n_chunks(profile), ("on_demand",), "total",
                             time_limit)
    if pols is None:  # nothing fits: the most frugal on-demand plan, for solve() to report what it needs
        bounds, pols, _ = heu_strategy(profile, limit, "even", ("on_demand",))
        return Strategy(bounds, pols, status="heuristic", source="heu")
    # gap and bound are the MILP's, in its objective (summed stage time per micro-batch), for the plan it returned
    return Strategy(bounds, pols, status=result.status, gap=result.gap, bound_s=result.bound_s, source="milp")
