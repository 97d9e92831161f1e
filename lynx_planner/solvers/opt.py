"""OPT: the exact MILP over every stage's policies and placements (solvers/milp.py), on the split HEU chooses
(and, with --partition auto, also on the split priced on demand and on Megatron's even split), judged by the
simulator.

The MILP is solved to proven optimality (or to the time limit) for its model of the timeline; its plan is then
simulated, over-limit stages are tightened and the windows re-measured (solvers/milp_search.py). The returned plan is
the best simulated one among the MILP's and HEU's, so OPT is never worse than HEU. `status`, `gap` and `bound_s`
are the MILPs', over the splits searched: `bound_s` is the least proven lower bound on the slowest stage's time per
micro-batch, `gap` the best objective's distance from it, and `optimal` means that gap is within HiGHS's relative
tolerance (1e-4). `--time-limit` (default 60 s) bounds the whole search.
"""

from __future__ import annotations

import time

from ..schema import PLACEMENTS
from . import Problem, Strategy
from .heu import HullCache, auto_bounds, heu_strategy
from .milp import REL_GAP
from .milp_search import refine
from .partition import even_bounds
from .stage_model import measured_grad_waits

DEFAULT_TIME_LIMIT_S = 60.0


def search(problem: Problem, algo: str = "opt") -> Strategy:
    profile, limit = problem.profile, problem.memory_limit
    time_limit = problem.time_limit if problem.time_limit is not None else DEFAULT_TIME_LIMIT_S
    deadline = time.perf_counter() + time_limit  # --time-limit bounds the whole search
    bounds, pols, evaluation = heu_strategy(profile, limit, problem.partition)
    best = (bounds, pols, evaluation)
    splits = [bounds]
    if problem.partition == "auto":  # also the splits priced on demand (AdaPipe's) and Megatron's even one
        on_demand = auto_bounds(profile, limit, HullCache(("on_demand",)))
        for other in (on_demand, even_bounds(profile, profile.parallel.pp)):
            if other and other not in splits:
                splits.append(other)
    statuses, objectives, bounds_s = [], [], []
    for i, split in enumerate(splits):
        waits = measured_grad_waits(profile, evaluation.sim) if split == bounds else [0.0] * profile.parallel.pp
        left = deadline - time.perf_counter()
        if left <= 0:
            statuses.append("time_limit")
            break
        share = left / (len(splits) - i)  # the remaining time, shared by the remaining splits
        got, got_eval, result = refine(profile, limit, split, waits, PLACEMENTS, "bottleneck", share)
        if result is not None and result.status != "infeasible":
            statuses.append(result.status)
            objectives.append(result.objective_s)
            bounds_s.append(result.bound_s)
        if got is not None and got_eval.better_than(best[2], limit):
            best = (split, got, got_eval)
    # OPT minimises over the splits as well: its gap is the best objective's distance from the least bound.
    objective = min((o for o in objectives if o is not None), default=None)
    bound = min((b for b in bounds_s if b is not None), default=None)
    gap = None if objective is None or bound is None else max(0.0, (objective - bound) / max(objective, 1e-12))
    if gap is not None and gap <= REL_GAP:
        status = "optimal"
    else:
        status = "time_limit" if "time_limit" in statuses else (statuses[-1] if statuses else "heuristic")
    return Strategy(best[0], best[1], status=status, gap=gap, bound_s=bound)
