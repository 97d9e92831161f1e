"""AdaPipe (Sun et al., ASPLOS 2024): recomputation-aware stage partitioning plus, per stage, the optimal
keep/recompute choice with all recomputation on demand. It isolates what overlapping adds: it is OPT without
windows.

The split comes from the same dynamic programme HEU uses, with on-demand costs; the policies from the shared MILP
(solvers/milp.py) restricted to on-demand placement, minimising its model of the iteration time (AdaPipe's cost:
every stage once plus the slowest M - 1 more times). The MILP's plan is returned (`source: "milp"`) unless HEU's
all-on-demand plan of the same split simulates faster (`source: "heu"`); status and gap describe the plan returned
(milp_search.returned).
"""

from __future__ import annotations

from . import Problem, Strategy
from .heu import heu_strategy
from .milp_search import refine, returned
from .stage_model import n_chunks

DEFAULT_TIME_LIMIT_S = 60.0
ON_DEMAND = ("on_demand",)


def search(problem: Problem, algo: str = "adapipe") -> Strategy:
    profile, limit = problem.profile, problem.memory_limit
    bounds, pols, evaluation = heu_strategy(profile, limit, problem.partition, ON_DEMAND)
    time_limit = problem.time_limit if problem.time_limit is not None else DEFAULT_TIME_LIMIT_S
    got, got_eval, result = refine(profile, limit, bounds, [0.0] * n_chunks(profile), ON_DEMAND, "iteration",
                                   time_limit)
    solved = result is not None and result.status != "infeasible"
    milp = (bounds, got, got_eval, result) if got is not None else None
    return returned(bounds, pols, evaluation, milp, [result.status] if solved else [],
                    [result.bound_s] if solved else [], limit)
