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
from dataclasses import dataclass, field

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


LYNX_PLACEMENTS = ("layer_above", "on_demand")


def _options(model: StageModel, slot, cands: tuple[Candidate, ...], placements: tuple[str, ...]) -> list[Option]:
    """Each candidate at its best allowed placement, reduced to the (memory, exposure) Pareto frontier."""
    opts = []
    for c in cands:
        best = None
        for at in placements:
            e = exposure(slot, c, at)
            if e is not None and (best is None or e < best[1]):
                best = (at, e)
        opts.append(Option(c, best[0], model.in_flight * c.kept_bytes, best[1]))
    frontier: list[Option] = []
    for o in sorted(opts, key=lambda o: (o.mem, o.exposed_s)):
        if not frontier or o.exposed_s < frontier[-1].exposed_s - 1e-15:
            frontier.append(o)
    return frontier


def _hull(frontier: list[Option]) -> list[Option]:
    """Lower convex hull of a frontier, from least memory to least exposure."""
    hull: list[Option] = []
    for o in frontier:
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (b.exposed_s - a.exposed_s) * (o.mem - a.mem) >= (o.exposed_s - a.exposed_s) * (b.mem - a.mem):
                hull.pop()  # b lies on or above the segment a-o
            else:
                break
        hull.append(o)
    return hull


@dataclass
class HullCache:
    """Option frontiers and hulls per (block, in-flight, window above, top), for one search."""

    placements: tuple[str, ...] = LYNX_PLACEMENTS
    table: dict = field(default_factory=dict)


def _class_options(profile: Profile, model: StageModel, j: int, cache: HullCache) -> tuple[list[Option], list[Option]]:
    """(frontier, hull) of the class of slot j."""
    slot = model.slots[j]
    key = (slot.block, model.in_flight, round(slot.above_s, 12), slot.top)
    if key not in cache.table:
        frontier = _options(model, slot, candidates_of(profile, slot.block), cache.placements)
        cache.table[key] = (frontier, _hull(frontier))
    return cache.table[key]


def _reserve(options) -> int:
    """Bytes regenerated around the backward's start (the two layers recomputed there)."""
    return 2 * max((o.cand.rec_bytes for o in options if o.at in ("on_demand", "layer_above")), default=0)


def solve_stage(profile: Profile, model: StageModel, cache: HullCache | None = None
                ) -> tuple[list[Option], float] | None:
    """One option per slot and the stage's estimated time per micro-batch; None if nothing fits."""
    cache = HullCache() if cache is None else cache
    classes: dict[tuple, list[int]] = {}
    for j, slot in enumerate(model.slots):
        classes.setdefault((slot.block, round(slot.above_s, 12), slot.top), []).append(j)
    hulls = {key: _class_options(profile, model, js[0], cache)[1] for key, js in classes.items()}
    chosen = [hulls[key][0] for key, js in classes.items() for _ in js]
    slot_of = [j for js in classes.values() for j in js]
    if sum(o.mem for o in chosen) + _reserve(chosen) > model.budget:
        return None
    for _ in range(2):  # the reserve shrinks as layers keep more: spend what it frees
        _climb(hulls, classes, chosen, model.budget - _reserve(chosen))
    _fill(profile, model, cache, chosen, slot_of)
    ordered: list[Option] = [None] * len(model.slots)  # type: ignore[list-item]
    for j, o in zip(slot_of, chosen):
        ordered[j] = o
    return ordered, model.compute_s + sum(o.exposed_s for o in ordered)


def _climb(hulls: dict, classes: dict, chosen: list[Option], budget: int) -> None:
    """Greedy along each class's hull, steepest step first, while the budget lasts (in place)."""
    pos, starts = 0, {}
    for key, js in classes.items():
        starts[key] = pos
        pos += len(js)
    used = sum(o.mem for o in chosen)
    level = {key: [hulls[key].index(chosen[starts[key] + i]) if chosen[starts[key] + i] in hulls[key] else 0
                   for i in range(len(js))] for key, js in classes.items()}
    heap = []
    for key in classes:
        for j in sorted(set(level[key])):
            if j + 1 < len(hulls[key]):
                heap.append((_ratio(hulls[key], j), key, j))
    heapq.heapify(heap)
    while heap:
        _, key, j = heapq.heappop(heap)
        h, lv = hulls[key], level[key]
        step = h[j + 1].mem - h[j].mem
        movable = [i for i, x in enumerate(lv) if x == j]
        k = min(len(movable), int((budget - used) // step)) if step > 0 else len(movable)
        for i in movable[:k]:
            lv[i] = j + 1
            chosen[starts[key] + i] = h[j + 1]
        used += k * step
        if k and j + 2 < len(h):
            heapq.heappush(heap, (_ratio(h, j + 1), key, j + 1))


def _fill(profile: Profile, model: StageModel, cache: HullCache, chosen: list[Option], slot_of: list[int]) -> None:
    """Spend leftover memory on frontier points between hull vertices, one layer at a time (in place)."""
    for i, j in enumerate(slot_of):
        left = model.budget - sum(o.mem for o in chosen) - _reserve(chosen)
        if left <= 0:
            return
        cur = chosen[i]
        best = cur
        for o in _class_options(profile, model, j, cache)[0]:
            if o.mem - cur.mem <= left and o.exposed_s < best.exposed_s:
                trial = chosen[:i] + [o] + chosen[i + 1:]
                if sum(x.mem for x in trial) + _reserve(trial) <= model.budget:
                    best = o
        chosen[i] = best


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


def plan_for_bounds(profile: Profile, limits: list[int], bounds: list[int], waits: list[float], cache: HullCache):
    models = [stage_model(profile, s, bounds[s], bounds[s + 1], limits[s], waits[s]) for s in range(len(bounds) - 1)]
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


def repair(profile: Profile, limit: int, bounds, models, chosen, cache: HullCache, max_rounds: int = 8):
    """Step layers of over-limit stages down their frontier until the simulation finds every stage within its
    limit (or nothing is left to give): each round frees at least the measured excess, cheapest steps first."""
    for _ in range(max_rounds):
        pols = policies_of(profile, models, chosen)
        result = _simulate(profile, bounds, pols)
        over = {st.stage: st.peak_memory_bytes - limit for st in result.predicted.stages
                if st.peak_memory_bytes > limit}
        if not over:
            return pols, result
        stepped = False
        for s, excess in over.items():
            while excess > 0 and (step := _cheapest_step_down(profile, models[s], chosen[s], cache)) is not None:
                j, lower = step
                excess -= chosen[s][j].mem - lower.mem
                chosen[s][j] = lower
                stepped = True
        if not stepped:
            return pols, result
    return policies_of(profile, models, chosen), _simulate(profile, bounds, policies_of(profile, models, chosen))


def _cheapest_step_down(profile: Profile, model: StageModel, opts: list[Option], cache: HullCache):
    """(slot, option) of the step down the frontier that frees the most memory per second of exposure added."""
    best = None
    for j, o in enumerate(opts):
        frontier = _class_options(profile, model, j, cache)[0]
        i = frontier.index(o)
        if i > 0:
            lower = frontier[i - 1]
            gain = (o.mem - lower.mem) / max(1e-12, lower.exposed_s - o.exposed_s)
            if best is None or gain > best[0]:
                best = (gain, j, lower)
    return None if best is None else (best[1], best[2])


def heu_strategy(profile: Profile, limit: int, partition: str, placements: tuple[str, ...] = LYNX_PLACEMENTS
                 ) -> tuple[list[int], list[LayerPolicy], ev.Evaluation]:
    p = profile.parallel.pp
    cache = HullCache(placements)
    splits = [even_bounds(profile, p)]
    if partition == "auto":
        auto = auto_bounds(profile, limit, cache)
        if auto and auto != splits[0]:
            splits.insert(0, auto)
    best = None
    for bounds in splits:
        waits = [p2p_wait_s(profile, bounds[s], bounds[s + 1]) for s in range(p)]
        limits = [limit] * p
        for _ in range(3):
            built = plan_for_bounds(profile, limits, bounds, waits, cache)
            if built is None:
                break
            models, chosen = built
            pols, result = repair(profile, limit, bounds, models, chosen, cache)
            if best is not None and best[0] == bounds and not result.better_than(best[2], limit):
                break  # the calibration round did not help
            if best is None or result.better_than(best[2], limit):
                best = (bounds, pols, result)
            # Next round: windows measured on this plan, and each stage's model budget corrected by the memory
            # the simulation found unused (the model's peak is conservative).
            waits = measured_grad_waits(profile, result.sim)
            limits = [lim + (limit - st.peak_memory_bytes) for lim, st in zip(limits, result.predicted.stages)]
    if best is None:  # nothing fits even at the most frugal options: return them, solve() reports the need
        bounds = splits[-1]
        models = [stage_model(profile, s, bounds[s], bounds[s + 1], limit, 0.0) for s in range(p)]
        chosen = [[_class_options(profile, m, j, cache)[0][0] for j in range(len(m.slots))] for m in models]
        pols = policies_of(profile, models, chosen)
        return bounds, pols, _simulate(profile, bounds, pols)
    return best


def search(problem: Problem, algo: str = "heu") -> Strategy:
    bounds, pols, _ = heu_strategy(problem.profile, problem.memory_limit, problem.partition)
    return Strategy(bounds, pols, status="heuristic")
