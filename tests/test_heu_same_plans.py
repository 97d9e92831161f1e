"""HEU's speed-ups of issue 29 return what the plain computations return (benchmarks/heu_identical.py checks whole
plans byte for byte over the catalog, the bench suites and the audit's suite): candidate searches that go on from an
earlier try and skip pruning lists a shift leaves pruned, option frontiers found with numpy, the knapsack traced
back from its dp rather than from kept tables, and plans simulated once per search."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import between, small_profile

from lynx_planner import policy
from lynx_planner.analytic import profile as analytic_profile
from lynx_planner.models.catalog import MODELS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import ParallelConfig
from lynx_planner.solvers import candidates, heu
from lynx_planner.solvers.partition import even_bounds
from lynx_planner.solvers.stage_model import candidates_of, exposure, p2p_wait_s, stage_model


@pytest.fixture(autouse=True)
def fresh():
    candidates.reset_caches()
    yield
    candidates.reset_caches()


def _moe_block():
    """Mixtral with EP 8, cut to 2 layers: its layer replays the all-to-all (partial policies of both kinds)."""
    spec = MODELS["mixtral-8x7b"].model_copy(update={"num_layers": 2})
    prof = analytic_profile(spec, ParallelConfig(tp=1, pp=1, dp=8, ep=8, seq_len=1024), HARDWARE["h100-80g-nvlink"])
    return max(prof.blocks.values(), key=lambda b: len(b.ops))


def _points(cands):
    return [(sorted(c.keep), c.recompute, c.kept_bytes, c.rec_bytes, c.rec_s, c.replays_collective) for c in cands]


@pytest.mark.parametrize("caps", [(400, 4000, 100), (2000, 10**7, 300)])  # bounded after both tries; exact after two
def test_resumed_searches_are_the_searches_from_the_start(caps, monkeypatch):
    """A block's second exact try and its bounded search go on from where the first try stopped: the frontier is the
    one a search from the start gives (exact at the work cap, else bounded at the step cap); and a state reached
    from one list is that list only where pruning it again would change nothing."""
    fold, work, step = caps
    monkeypatch.setattr(candidates, "FOLD_CAP", fold)
    monkeypatch.setattr(candidates, "WORK_CAP", work)
    monkeypatch.setattr(candidates, "STEP_CAP", step)
    block = _moe_block()
    info = policy.analyse(block)
    got = candidates.frontier(block)
    assert got.exact == (work > 10**6)
    fresh = candidates._search(info, work, None) if got.exact else candidates._search(info, None, step)
    assert _points(got.candidates) == _points(fresh[0]) and got.eps == fresh[1]
    candidates.reset_caches()
    monkeypatch.setattr(candidates, "_shift_keeps_order", lambda *a: False)  # every state pruned again
    pruned = candidates.frontier(block)
    assert _points(pruned.candidates) == _points(got.candidates) and pruned.eps == got.eps


def test_a_shift_that_ties_two_seconds_is_pruned_again():
    a, b = 0.1, 0.1 + 2 ** -56  # differ, but tie once 1.0 is added
    assert a != b and a + 1.0 == b + 1.0
    ps = [(10, b, 5, False, (), ()), (10, a, 7, False, (), ())]  # neither dominates the other
    ps = sorted(ps, key=lambda p: p[:4])
    assert candidates._prune(ps) == ps
    assert not candidates._shift_keeps_order(ps, 1.0, False)
    assert candidates._shift_keeps_order(ps, 1e-6, False)
    assert not candidates._shift_keeps_order(ps, 1e-6, True)  # a replay reaching those replaying nothing
    assert candidates._shift_keeps_order([(1, a, 1, True, (), ()), (2, b, 0, True, (), ())], 1e-6, True)


def _plain_options(model, slot, cands, placements, pool_price):
    """The option frontier as HEU computed it before numpy: each candidate at its best placement, a pooled point,
    sorted by (memory, exposure, seconds), walked with the tolerances."""
    points = []
    for c in cands:
        best = None
        for at in placements:
            e = exposure(slot, c, at)
            if e is not None and (best is None or e < best[1]):
                best = (at, e)
        held = model.in_flight * c.kept_bytes + model.awaiting_w * (c.kept_bytes + c.rec_bytes)
        points.append((held, best[1], best[0], c))
        if pool_price is not None and c.rec_s > 0 and not c.replays_collective:
            points.append((held + c.rec_bytes, pool_price * c.rec_s, "pool", c))
    frontier = []
    for mem, e, at, c in sorted(points, key=lambda x: (x[0], x[1], x[3].rec_s)):
        if not frontier or e < frontier[-1][3] - 1e-15 or (e <= frontier[-1][3] + 1e-15 and c.rec_s < frontier[-1][0].rec_s):
            frontier.append((c, at, mem, min(e, frontier[-1][3]) if frontier else e))
    return frontier


@pytest.mark.parametrize("schedule", ["1f1b", "zero-bubble"])  # zero bubble: graphs awaiting W count rec bytes
def test_options_are_the_plain_walk(schedule):
    prof = small_profile(tp=2, pp=4, m=8, layers=8).model_copy()
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"schedule": schedule})})
    limit = between(prof, 0.5)
    for s in range(4):
        model = stage_model(prof, s, 2 * s + 1, 2 * s + 3, limit, p2p_wait_s(prof, 2 * s + 1, 2 * s + 3))
        for slot in model.slots:
            cands = candidates_of(prof, slot.block)
            for placements in (heu.LYNX_PLACEMENTS, ("on_demand",)):
                for price in (None, 0.0, 0.5):
                    got = heu._options(model, slot, heu._placed(slot, cands, placements), price)
                    assert [(o.cand, o.at, o.mem, o.exposed_s) for o in got] == \
                        _plain_options(model, slot, cands, placements, price)
                    assert all(type(o.mem) is int and type(o.exposed_s) is float for o in got)


def test_knapsack_traced_from_its_dp_is_the_table_argmin(monkeypatch):
    """The knapsack's choice, traced back from each step's dp, is the one the kept tables gave: per slot the first
    option whose table column at the remaining budget is least (the tables rebuilt here in full)."""
    prof = small_profile(tp=2, pp=2, m=8, layers=12)
    limit = between(prof, 0.3)
    cache = heu.HullCache(heu.LYNX_PLACEMENTS)
    model = stage_model(prof, 0, 1, 7, limit, p2p_wait_s(prof, 1, 7))
    got, _ = heu._solve_knapsack(prof, model, cache)
    fronts = [heu._class_options(prof, model, j, cache) for j in range(len(model.slots))]
    top = next(j for j, sl in enumerate(model.slots) if sl.top)
    below = [j for j in range(len(model.slots)) if j != top]
    r = heu.MEMORY_UNITS + 1
    la = max((o.cand.rec_bytes for j in below for o in fronts[j] if o.at == "layer_above"), default=0)
    base = {j: fronts[j][0].mem for j in below}
    top_least = min(o.mem + heu._near_bytes(o) for o in fronts[top])
    spare = model.budget - sum(base.values()) - top_least - la
    unit = max(1, spare) / heu.MEMORY_UNITS
    dp = np.concatenate([np.full(r, np.inf, dtype=np.float32), np.zeros(r, dtype=np.float32)])
    tables = []
    for j in below:
        rows = {}
        for i, o in enumerate(fronts[j]):
            k = math.ceil((o.mem - base[j]) / unit)
            if k < r and (k not in rows or o.exposed_s < fronts[j][rows[k]].exposed_s):
                rows[k] = i
        table = np.array([[dp[r + b - k] for b in range(r)] for k in rows], dtype=np.float32)
        table += np.array([fronts[j][i].exposed_s for i in rows.values()], dtype=np.float32)[:, None]
        dp[r:] = table.min(axis=0)
        tables.append((table, list(rows.values())))
    b = min(int((spare + top_least - got[top].mem - heu._near_bytes(got[top])) // unit), r - 1)
    for j, (table, option) in zip(reversed(below), reversed(tables)):
        o = fronts[j][option[int(table[:, b].argmin())]]
        assert got[j] is o
        b -= math.ceil((o.mem - base[j]) / unit)


def test_opt_stopped_before_a_plan_says_time_limit(monkeypatch):
    """A MILP that HiGHS stops at the time limit before it finds any plan proves nothing and returns nothing: OPT
    returns HEU's plan with status time_limit (not heuristic, as if no MILP had been tried, nor infeasible)."""
    from types import SimpleNamespace

    from pyomo.contrib.solver.common.results import SolutionStatus, TerminationCondition

    from lynx_planner import solvers
    from lynx_planner.solvers import milp

    class Stopped:
        def solve(self, model, **opts):
            return SimpleNamespace(solution_status=SolutionStatus.noSolution,
                                   termination_condition=TerminationCondition.maxTimeLimit)

    monkeypatch.setattr(milp, "Highs", Stopped)
    prof = small_profile(tp=2, pp=2, m=4)
    limit = between(prof, 0.4)
    opt = solvers.solve(prof, "opt", limit, time_limit=30)
    heu = solvers.solve(prof, "heu", limit)
    assert opt.solver.status == "time_limit" and opt.solver.source == "heu" and opt.solver.bound_s is None
    assert opt.evaluation.predicted.iteration_time_s == heu.evaluation.predicted.iteration_time_s


@pytest.mark.parametrize("schedule, v, repeats", [("1f1b", 1, True), ("zero-bubble", 1, True),
                                                 ("interleaved-1f1b", 2, False)])
def test_a_plan_simulated_again_is_looked_up_and_the_search_is_the_same(schedule, v, repeats, monkeypatch):
    """HEU looks up a plan it simulated before in the same search (heu._simulations): its split, policies and figures
    are those of a search that simulates every time, and it simulates fewer times where that search repeats a plan."""
    from contextlib import nullcontext

    from lynx_planner import simulator

    prof = small_profile(tp=2, pp=4, m=16, layers=16)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(
        update={"schedule": schedule, "virtual_stages": v})})
    limit = between(prof, 0.3)
    calls, real = [], simulator.simulate
    monkeypatch.setattr(simulator, "simulate", lambda *a, **k: calls.append(1) or real(*a, **k))
    candidates.reset_caches()
    looked_up = heu.heu_strategy(prof, limit, "auto")
    n = len(calls)
    monkeypatch.setattr(heu, "_simulations", nullcontext)
    candidates.reset_caches()
    plain = heu.heu_strategy(prof, limit, "auto")
    assert looked_up[0] == plain[0] and looked_up[1] == plain[1]
    assert looked_up[2].predicted.model_dump_json() == plain[2].predicted.model_dump_json()  # (NaN ideal: not ==)
    assert (n < len(calls) - n) if repeats else (n == len(calls) - n)


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_a_chunks_runs_reused_within_a_search_give_a_fresh_simulations_figures(schedule, v):
    """Within a search (heu._simulations) a chunk's stage plan and layer runs are looked up by its place and its layers'
    policies: a plan that differs from one simulated before in one chunk only (its policy and where it recomputes)
    reuses the others', and its figures (per-rank static bytes included) are those of a fresh evaluation."""
    from lynx_planner import evaluate as ev

    prof = small_profile(tp=2, pp=2, m=8, layers=8)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(
        update={"schedule": schedule, "virtual_stages": v})})
    bounds = even_bounds(prof, 2 * v)
    n = len(prof.layers)
    none = [ev.none_policy(prof, i) for i in range(n)]
    full = [ev.layer_policy(prof, i, frozenset()) for i in range(n)]
    hid = [ev.layer_policy(prof, i, frozenset(), at="grad_wait") for i in range(n)]
    lo, hi = bounds[1], bounds[2]  # the second chunk's layers
    plans = [none, none[:lo] + full[lo:hi] + none[hi:], none[:lo] + hid[lo:hi] + none[hi:], none]
    fresh = [ev.evaluate(prof, ev.stage_plans(prof, bounds, pols), ideal=False).predicted.model_dump_json()
             for pols in plans]
    assert len(set(fresh[:3])) == 3  # the chunk's policy shows in the figures
    with heu._simulations():
        looked_up = [heu._simulate(prof, bounds, pols).predicted.model_dump_json() for pols in plans]
    assert looked_up == fresh
