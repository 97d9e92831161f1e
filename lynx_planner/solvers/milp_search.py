"""Turning MILP solutions into simulated plans: build, simulate, tighten over-limit stages, keep the best."""

from __future__ import annotations

import time
from dataclasses import replace

from .. import evaluate as ev
from .. import schedules
from ..schema import LayerPolicy, Profile
from . import Strategy, milp
from .milp import REL_GAP
from .stage_model import chunk_limits, measured_grad_waits, rank_memory, stage_model


def policies(profile: Profile, models, choices) -> list[LayerPolicy]:
    return [_policy(profile, slot.layer, c, at)
            for model, picks in zip(models, choices) for slot, (c, at) in zip(model.slots, picks)]


def _policy(profile: Profile, layer: int, c, at: str) -> LayerPolicy:
    if isinstance(c, milp.Offloaded):  # keep everything, offload what the candidate it stands for drops
        return ev.layer_policy(profile, layer, c.keep, c.recompute, "on_demand").model_copy(
            update={"offload": list(c.offload)})
    return ev.layer_policy(profile, layer, c.keep, c.recompute, at)


def refine(profile: Profile, limit: int, bounds: list[int], waits: list[float], allowed: tuple[str, ...],
           objective: str, time_limit: float | None, rounds: int = 4, link=None):
    """Solve, simulate; a stage the simulation finds over its limit gets its budget cut by the excess, and the
    windows are re-measured on the new plan; up to `rounds` solves within `time_limit` seconds in all. Returns
    (policies, evaluation, MilpResult) of the best fitting plan, or (None, None, last MilpResult). Where that plan
    was solved with a cut budget, its MilpResult's `bound_s` is replaced by the least bound of the rounds solved at
    the full budget (a restricted problem's bound does not bound the problem) and its status is at most feasible."""
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    p = len(bounds) - 1
    v, pp = profile.parallel.virtual_stages, profile.parallel.pp
    cut = [0] * p
    frugal = None
    if v > 1:  # the rank budgets are calibrated at the simulated most frugal plan (stage_model.rank_memory)
        from .heu import HullCache, frugal_peaks

        frugal = frugal_peaks(profile, bounds, HullCache(("on_demand",)))
    best = None
    result = None
    full_budget_bounds = []
    for _ in range(rounds):
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left <= 0:
            break
        if v > 1:  # the rank's chunks share its memory in the MILP (rank_memory): each model at the whole limit
            models = [stage_model(profile, s, bounds[s], bounds[s + 1], limit, waits[s]) for s in range(p)]
            ranks = rank_memory(profile, models, limit, [sum(cut[c] for c in range(p) if c % pp == r)
                                                           for r in range(pp)], frugal)
        else:
            limits = chunk_limits(profile, bounds, limit)
            models = [stage_model(profile, s, bounds[s], bounds[s + 1], limits[s] - cut[s], waits[s])
                      for s in range(p)]
            ranks = None
        result = milp.solve(profile, models, allowed, objective, left, ranks, link)
        if result.status == "infeasible" or not result.choices:  # or stopped by the time limit before a plan
            break
        if not any(cut):
            full_budget_bounds.append(result.bound_s)
        else:  # a restricted problem: its bound does not bound the problem, its optimum is not the optimum
            result = replace(result, status="feasible" if result.status == "optimal" else result.status, bound_s=None)
        pols = policies(profile, models, result.choices)
        evaluation = ev.evaluate(profile, ev.stage_plans(profile, bounds, pols), ideal=False)
        over = {st.stage: st.peak_memory_bytes - limit for st in evaluation.predicted.stages
                if st.peak_memory_bytes > limit}
        if not over:
            if best is None or evaluation.predicted.iteration_time_s < best[1].predicted.iteration_time_s:
                best = (pols, evaluation, result)
            if not (set(allowed) & {"grad_wait", "layer_above"}):
                break  # on-demand plans do not depend on the windows
            new_waits = measured_grad_waits(profile, evaluation.sim)
            if all(abs(a - b) < 1e-6 for a, b in zip(new_waits, waits)):
                break
            waits = new_waits
        for rank, excess in over.items():  # the rank's chunks share the cut
            for c in range(p):
                if schedules.rank_of(profile.parallel.pp, c) == rank:
                    cut[c] += -(-excess // v)
    if best is None:
        return None, None, result
    if best[2].bound_s is None and full_budget_bounds and None not in full_budget_bounds:
        return best[0], best[1], replace(best[2], bound_s=min(full_budget_bounds))
    return best


def returned(heu_bounds, heu_pols, heu_eval, milp, statuses: list[str], bounds_s: list, limit: int) -> Strategy:
    """The MILP's plan (split, policies, evaluation, MilpResult) unless HEU's simulates better, as a Strategy whose
    status and gap describe the plan returned: `bound_s` the least proven bound of the modelled objective over the
    MILPs solved (`bounds_s`; None if one has none), `gap` the returned plan's simulated time above it relative to that
    time, `optimal` only for the MILP's own plan proven optimal in the model over all of them and
    simulated within the tolerance of the bound (a model error shows as `feasible` with its gap)."""
    use_milp = milp is not None and not heu_eval.better_than(milp[2], limit)
    bounds, pols, evaluation = (milp[0], milp[1], milp[2]) if use_milp else (heu_bounds, heu_pols, heu_eval)
    bound = min(bounds_s) if bounds_s and None not in bounds_s else None
    t = evaluation.predicted.iteration_time_s
    gap = None if bound is None else max(0.0, (t - bound) / t)
    if "time_limit" in statuses:
        status = "time_limit"
    elif not statuses:
        status = "heuristic"  # no MILP was solved: HEU's plan, nothing proven
    elif use_milp and bound is not None and milp[3].objective_s - bound <= REL_GAP * milp[3].objective_s \
            and gap <= REL_GAP:
        status = "optimal"  # proven for the MILP's model over the splits searched, and the simulation agrees
    else:
        status = "feasible"
    return Strategy(bounds, pols, status=status, gap=gap, bound_s=bound, source="milp" if use_milp else "heu")
