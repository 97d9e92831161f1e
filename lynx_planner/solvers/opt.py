"""OPT: the exact MILP over every stage's policies and placements (solvers/milp.py), on the split HEU chooses
(and, with --partition auto, also on the split priced on demand and on Megatron's even split), judged by the
simulator.

The MILP minimises its model of the iteration time (the slowest stage M - 1 times plus every stage once, per stage the
compute and the exposed recomputation; solvers/stage_model.py) and is solved to proven optimality (or to the time
limit); its plan is then simulated, over-limit stages are tightened and the windows re-measured
(solvers/milp_search.py). The MILP's best simulated plan is returned (`source: "milp"`) unless HEU's simulates
faster, or the MILP found none that fits (`source: "heu"`). The solver fields describe the returned plan: `bound_s`
is the least proven lower bound of the modelled iteration time over the splits searched; `gap` is the returned plan's
simulated time above that bound, relative to the simulated time (so it includes the model's error); `optimal` means
the returned plan is the MILP's and its modelled time is within HiGHS's relative tolerance (1e-4) of the bound over
all splits; `time_limit` that some split's MILP was stopped by the time limit (before or after it found a plan, or
before it started); otherwise `feasible`. `--time-limit` (default 60 s) bounds the whole search.

opt-offload: the same MILP with the third choice, offload (solvers/milp.py says what it states of the copy engine),
on the rank's host link; judged against HEU with offload's plan (`source: "heu"` when that one simulates faster).
Its model restricts a layer's offload to what one of its candidates drops, and states the copy queue by its windows,
not its exact timing: its bound bounds that model only, so opt-offload is never `optimal`, at best `feasible`.
"""

from __future__ import annotations

import time

from .. import offload
from ..evaluate import evaluate, stage_plans
from ..io import InputError
from ..schema import PLACEMENTS
from . import Problem, Strategy
from .heu import HullCache, auto_bounds, heu_strategy
from .milp_search import refine, returned
from .partition import even_bounds
from .stage_model import measured_grad_waits, n_chunks

DEFAULT_TIME_LIMIT_S = 60.0


def search(problem: Problem, algo: str = "opt") -> Strategy:
    profile, limit = problem.profile, problem.memory_limit
    link = None
    if algo == "opt-offload":
        link = offload.rank_link(profile)
        if link is None:
            raise InputError(f"{profile.hardware.name}: no host link to offload to (a CPU rank, or hardware without "
                             "host_link fields: set them in the hardware file or run `lynx hardware calibrate`)")
    time_limit = problem.time_limit if problem.time_limit is not None else DEFAULT_TIME_LIMIT_S
    deadline = time.perf_counter() + time_limit  # --time-limit bounds the whole search
    heu_bounds, heu_pols, heu_eval = heu_strategy(profile, limit, problem.partition)
    splits = [heu_bounds]
    if problem.partition == "auto":  # also the splits priced on demand (AdaPipe's) and Megatron's even one
        on_demand = auto_bounds(profile, limit, HullCache(("on_demand",)))
        for other in (on_demand, even_bounds(profile, n_chunks(profile))):
            if other and other not in splits:
                splits.append(other)
    statuses, bounds_s = [], []
    milp = None  # (split, policies, evaluation, MilpResult) of the MILP's best simulated plan
    for i, split in enumerate(splits):
        waits = measured_grad_waits(profile, heu_eval.sim) if split == heu_bounds else [0.0] * n_chunks(profile)
        left = deadline - time.perf_counter()
        if left <= 0:
            statuses.append("time_limit")
            break
        share = left / (len(splits) - i)  # the remaining time, shared by the remaining splits
        got, got_eval, result = refine(profile, limit, split, waits, PLACEMENTS, "iteration", share, link=link)
        if result is None:  # the time ran out before this split's MILP was solved
            statuses.append("time_limit")
            continue
        if result.status == "infeasible":
            continue  # no policies fit this split in the model: it bounds nothing
        statuses.append(result.status)
        bounds_s.append(result.bound_s)
        if got is not None and (milp is None or got_eval.better_than(milp[2], limit)):
            milp = (split, got, got_eval, result)
    if link is None:
        return returned(heu_bounds, heu_pols, heu_eval, milp, statuses, bounds_s, limit)
    from .offload import search as offload_search

    base = offload_search(problem, "heu-offload")  # the baseline: HEU with offload
    base_eval = evaluate(profile, stage_plans(profile, base.bounds, base.policies), ideal=False)
    got = returned(base.bounds, base.policies, base_eval, milp, statuses, bounds_s, limit)
    if got.status == "optimal":  # of the restricted model only (module docstring)
        got.status = "feasible"
    return got
