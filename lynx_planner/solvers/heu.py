"""HEU: solve one small problem per block type and window class, replicate it over identical layers, repair with
the simulator.

Per stage, layers of the same block type with the same window above them form a class: they share one option list
(a Pareto candidate of the block, placed layer_above when it may be, which hides it in the idle backward time of the
layer above). Options are reduced to the lower convex hull of (memory, exposed time); the memory budget is then spent
greedily on the steepest hull steps, so a class ends with at most two neighbouring policies (Megatron's `block` idea,
at op granularity). With `--partition auto` a dynamic programme picks the contiguous split whose slowest stage, under
this per-stage solution, is fastest. The plan is simulated; a stage over its limit steps one layer down its hull
until it fits.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .. import evaluate as ev
from ..schema import LayerPolicy, Profile
from . import Problem, Strategy
from .candidates import Candidate
from .partition import best_bounds, even_bounds
from ..simulator import in_flight
from .stage_model import StageModel, candidates_of, exposure, measured_grad_waits, p2p_wait_s, stage_model


@dataclass(frozen=True)
class Option:
    cand: Candidate
    at: str
    mem: int  # kept bytes of all in-flight micro-batches
    exposed_s: float


def _options(model: StageModel, slot, cands: tuple[Candidate, ...]) -> list[Option]:
    opts = []
    for c in cands:
        best = None
        for at in ("layer_above", "on_demand"):
            e = exposure(slot, c, at)
            if e is not None and (best is None or e < best[1]):
                best = (at, e)
        opts.append(Option(c, best[0], model.in_flight * c.kept_bytes, best[1]))
    return _hull(opts)


def _hull(opts: list[Option]) -> list[Option]:
    """Lower convex hull of (mem, exposed), from least memory to least exposure."""
    pts = sorted(opts, key=lambda o: (o.mem, o.exposed_s))
    frontier: list[Option] = []
    for o in pts:  # Pareto: strictly less exposure as memory grows
        if not frontier or o.exposed_s < frontier[-1].exposed_s - 1e-15:
            frontier.append(o)
    hull: list[Option] = []
    for o in frontier:
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is above the segment a-o: drop it
            if (b.exposed_s - a.exposed_s) * (o.mem - a.mem) >= (o.exposed_s - a.exposed_s) * (b.mem - a.mem):
                hull.pop()
            else:
                break
        hull.append(o)
    return hull


HullCache = dict  # (block, in-flight, window above, top) -> hull of options


def _class_hull(profile: Profile, model: StageModel, j: int, cache: HullCache) -> list[Option]:
    slot = model.slots[j]
    key = (slot.block, model.in_flight, round(slot.above_s, 12), slot.top)
    if key not in cache:
        cache[key] = _options(model, slot, candidates_of(profile, slot.block))
    return cache[key]


def solve_stage(profile: Profile, model: StageModel, cache: HullCache | None = None
                ) -> tuple[list[Option], float] | None:
    """One option per slot and the stage's estimated time per micro-batch; None if nothing fits."""
    cache = {} if cache is None else cache
    classes: dict[tuple, list[int]] = {}
    for j, slot in enumerate(model.slots):
        classes.setdefault((slot.block, round(slot.above_s, 12), slot.top), []).append(j)
    hulls = {key: _class_hull(profile, model, js[0], cache) for key, js in classes.items()}
    reserve = 2 * max(max(o.cand.rec_bytes for o in h) for h in hulls.values())
    level = {key: [0] * len(js) for key, js in classes.items()}
    used = reserve + sum(hulls[k][0].mem * len(js) for k, js in classes.items())
    if used > model.budget:
        return None
    heap = [(_ratio(hulls[k], 0), k, 0) for k in classes if len(hulls[k]) > 1]
    heapq.heapify(heap)
    while heap:
        _, key, j = heapq.heappop(heap)
        h, lv = hulls[key], level[key]
        step = h[j + 1].mem - h[j].mem
        movable = [i for i, x in enumerate(lv) if x == j]
        k = min(len(movable), int((model.budget - used) // step)) if step > 0 else len(movable)
        for i in movable[:k]:
            lv[i] = j + 1
        used += k * step
        if k and j + 2 < len(h):
            heapq.heappush(heap, (_ratio(h, j + 1), key, j + 1))
    chosen: list[Option] = [None] * len(model.slots)  # type: ignore[list-item]
    for key, js in classes.items():
        for slot_index, lv in zip(js, sorted(level[key], reverse=True)):
            chosen[slot_index] = hulls[key][lv]
    return chosen, model.compute_s + sum(o.exposed_s for o in chosen)


def _ratio(hull: list[Option], j: int) -> float:
    """Negative exposure saved per byte of the step j -> j+1 (heapq pops the steepest first)."""
    a, b = hull[j], hull[j + 1]
    return -(a.exposed_s - b.exposed_s) / max(1, b.mem - a.mem)


def policies_of(profile: Profile, models: list[StageModel], chosen: list[list[Option]]) -> list[LayerPolicy]:
    pols: list[LayerPolicy] = []
    for model, opts in zip(models, chosen):
        for slot, o in zip(model.slots, opts):
            pols.append(ev.layer_policy(profile, slot.layer, o.cand.keep, o.cand.recompute, o.at))
    return pols


def plan_for_bounds(profile: Profile, limit: int, bounds: list[int], waits: list[float], cache: HullCache):
    models = [stage_model(profile, s, bounds[s], bounds[s + 1], limit, waits[s]) for s in range(len(bounds) - 1)]
    solved = [solve_stage(profile, m, cache) for m in models]
    if any(x is None for x in solved):
        return None
    return models, [x[0] for x in solved]


def auto_bounds(profile: Profile, limit: int, cache: HullCache) -> list[int]:
    """The split whose slowest stage is fastest under HEU's per-stage estimate."""
    par = profile.parallel
    p, n = par.pp, len(profile.layers)
    blocks = [l.block for l in profile.layers]
    by_structure: dict[tuple, float] = {}

    def stage_time(s: int, first: int, end: int) -> float:
        # Stages with the same layers, in-flight count and position at the end share one solution.
        key = (in_flight(par.schedule, p, s, par.num_microbatches), tuple(blocks[first:end]), end == n, first == 0)
        if key not in by_structure:
            model = stage_model(profile, s, first, end, limit, p2p_wait_s(profile, first, end))
            solved = solve_stage(profile, model, cache)
            by_structure[key] = float("inf") if solved is None else solved[1]
        return by_structure[key]

    bounds, _ = best_bounds(n, p, stage_time)
    return bounds


def _simulate(profile: Profile, bounds: list[int], pols: list[LayerPolicy]) -> ev.Evaluation:
    return ev.evaluate(profile, ev.stage_plans(profile, bounds, pols))


def repair(profile: Profile, limit: int, bounds, models, chosen, cache: HullCache, max_steps: int = 64):
    """Step layers of over-limit stages down their hull until every stage fits (or nothing is left to give)."""
    for _ in range(max_steps):
        pols = policies_of(profile, models, chosen)
        result = _simulate(profile, bounds, pols)
        over = [st.stage for st in result.predicted.stages if st.peak_memory_bytes > limit]
        if not over:
            return pols, result
        for s in over:
            opts = chosen[s]
            hull_of = {j: _class_hull(profile, models[s], j, cache) for j in range(len(opts))}
            # the slot whose next step down frees the most memory per exposure added
            best = None
            for j, o in enumerate(opts):
                h = hull_of[j]
                i = next(i for i, x in enumerate(h) if x.cand == o.cand)
                if i > 0:
                    gain = (o.mem - h[i - 1].mem) / max(1e-12, h[i - 1].exposed_s - o.exposed_s)
                    if best is None or gain > best[0]:
                        best = (gain, j, h[i - 1])
            if best is None:
                return pols, result
            opts[best[1]] = best[2]
    return pols, result


def heu_strategy(profile: Profile, limit: int, partition: str) -> tuple[list[int], list[LayerPolicy], ev.Evaluation]:
    p = profile.parallel.pp
    cache: HullCache = {}
    splits = [even_bounds(profile, p)]
    if partition == "auto":
        auto = auto_bounds(profile, limit, cache)
        if auto and auto != splits[0]:
            splits.insert(0, auto)
    best = None
    for bounds in splits:
        waits = [p2p_wait_s(profile, bounds[s], bounds[s + 1]) for s in range(p)]
        for _ in range(2):  # second round: windows measured on the first round's plan
            built = plan_for_bounds(profile, limit, bounds, waits, cache)
            if built is None:
                break
            models, chosen = built
            pols, result = repair(profile, limit, bounds, models, chosen, cache)
            if best is None or _better(result, best[2], limit):
                best = (bounds, pols, result)
            waits = measured_grad_waits(profile, ev.runs_of(profile, ev.stage_plans(profile, bounds, pols)))
    if best is None:  # nothing fits even at the most frugal options: return them, solve() reports the need
        bounds = splits[-1]
        models = [stage_model(profile, s, bounds[s], bounds[s + 1], limit, 0.0) for s in range(p)]
        chosen = [[_options(m, sl, candidates_of(profile, sl.block))[0] for sl in m.slots] for m in models]
        pols = policies_of(profile, models, chosen)
        return bounds, pols, _simulate(profile, bounds, pols)
    return best


def _better(a: ev.Evaluation, b: ev.Evaluation, limit: int) -> bool:
    fa, fb = a.fits(limit), b.fits(limit)
    if fa != fb:
        return fa
    return a.predicted.iteration_time_s < b.predicted.iteration_time_s


def search(problem: Problem, algo: str = "heu") -> Strategy:
    bounds, pols, _ = heu_strategy(problem.profile, problem.memory_limit, problem.partition)
    return Strategy(bounds, pols, status="heuristic")
