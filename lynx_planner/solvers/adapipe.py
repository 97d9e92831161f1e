"""AdaPipe (Sun et al., ASPLOS 2024): recomputation-aware stage partitioning plus, per stage, the optimal
keep/recompute choice with all recomputation on demand. It isolates what overlapping adds: it is OPT without
windows.

The split comes from the same dynamic programme HEU uses, with on-demand costs; the policies from the shared MILP
(solvers/milp.py) restricted to on-demand placement, minimising the slowest stage.
"""

from __future__ import annotations

from . import Problem, Strategy
from .heu import heu_strategy
from .milp_search import refine

DEFAULT_TIME_LIMIT_S = 60.0
ON_DEMAND = ("on_demand",)


def search(problem: Problem, algo: str = "adapipe") -> Strategy:
    profile, limit = problem.profile, problem.memory_limit
    bounds, pols, evaluation = heu_strategy(profile, limit, problem.partition, ON_DEMAND)
    time_limit = problem.time_limit if problem.time_limit is not None else DEFAULT_TIME_LIMIT_S
    got, got_eval, result = refine(profile, limit, bounds, [0.0] * profile.parallel.pp, ON_DEMAND, "bottleneck",
                                   time_limit)
    if got is not None and got_eval.better_than(evaluation, limit):
        return Strategy(bounds, got, status=result.status, gap=result.gap, bound_s=result.bound_s)
    return Strategy(bounds, pols, status="heuristic")
