"""Every strategy gives plans that `check` accepts; the Lynx solvers beat the baselines; edge cases."""

from __future__ import annotations

import pytest
from conftest import between, peak, small_profile, solve_all

from lynx_planner import solvers
from lynx_planner.evaluate import check, make_plan
from lynx_planner.solvers import Infeasible

BASELINES = ("full", "selective", "uniform", "block", "checkmate", "adapipe")
TOL = 1e-9


@pytest.mark.parametrize("frac", [0.15, 0.6])
def test_every_plan_passes_check_and_lynx_is_fastest(frac):
    prof = small_profile(tp=4, pp=2, m=4, hardware="a100-80g-pcie")
    times = solve_all(prof, between(prof, frac))
    assert "none" not in times  # the limit forces recomputation
    best_baseline = min(times[a] for a in BASELINES if a in times)
    assert times["heu"] <= best_baseline + TOL
    assert times["heu"] < times["full"]


def test_only_full_recomputation_fits():
    prof = small_profile(tp=2, pp=2, m=4)
    limit = peak(prof, "full") + 1
    times = solve_all(prof, limit)
    assert {"full", "heu", "opt"} <= set(times)
    assert times["heu"] <= times["full"] + TOL


def test_nothing_fits_names_the_minimum():
    prof = small_profile(tp=2, pp=2, m=4)
    limit = peak(prof, "full") // 2
    for algo in ("full", "heu", "opt", "checkmate"):
        with pytest.raises(Infeasible) as err:
            solvers.solve(prof, algo, limit)
        assert err.value.needed is not None and err.value.needed > limit
        assert "GiB" in str(err.value)


def test_one_stage_one_micro_batch():
    prof = small_profile(tp=2, pp=1, m=1)
    times = solve_all(prof, between(prof, 0.3))
    assert times["heu"] <= times["full"] + TOL


def test_zero_length_windows():
    """tp=1: no TP collectives, so layer_above has nothing to hide in; HEU must still match the best."""
    prof = small_profile(tp=1, pp=2, m=4, hardware="a100-80g-nvlink")
    times = solve_all(prof, between(prof, 0.4))
    assert times["heu"] <= min(times[a] for a in BASELINES if a in times) + TOL


def test_auto_partition_is_never_slower_than_even():
    prof = small_profile(tp=4, pp=4, m=8, layers=12, hardware="a100-80g-pcie")
    limit = between(prof, 0.3)
    auto = solvers.solve(prof, "heu", limit, partition="auto").evaluation.predicted.iteration_time_s
    even = solvers.solve(prof, "heu", limit, partition="even").evaluation.predicted.iteration_time_s
    assert auto <= even + TOL


def test_plans_are_deterministic():
    prof = small_profile(tp=2, pp=2, m=4)
    limit = between(prof, 0.4)
    for algo in ("heu", "opt", "checkmate"):
        a, b = (solvers.solve(prof, algo, limit, time_limit=30) for _ in range(2))
        assert [s.model_dump() for s in a.stages] == [s.model_dump() for s in b.stages]


def test_heu_pools_recomputation_into_pipeline_waits():
    """22B, PP 8 at a tight limit: the stages off the bottleneck wait for gradients; HEU hides recomputation there
    (grad_wait / prev_forward) and beats the best all-on-demand plan of the same search. (At 18 GiB the edge was
    0.23% while prev_forward was credited where the runtime never fires it; it is 0.01% now, 0.21% at 15 GiB.)"""
    from pathlib import Path

    from lynx_planner.io import parse_size
    from lynx_planner.schema import Profile
    from lynx_planner.solvers.heu import heu_strategy

    prof = Profile.model_validate_json(Path("profiles/gpt-22b-a100-80g-nvlink-tp4-pp8-mb2-m32.json").read_text())
    limit = parse_size("15GiB", "limit")
    solved = solvers.solve(prof, "heu", limit)
    pooled = {p.at for st in solved.stages for p in st.policies} & {"grad_wait", "prev_forward"}
    assert pooled
    _, _, on_demand = heu_strategy(prof, limit, "auto", ("on_demand",))
    assert solved.evaluation.predicted.iteration_time_s < on_demand.predicted.iteration_time_s * (1 - 0.001)
    assert not check(make_plan(prof, "p.json", "0" * 64, "heu", limit, solved.stages, solved.solver), prof)


def test_pool_placements_fill_the_roomier_pool_and_expose_the_overflow():
    from lynx_planner.solvers.candidates import Candidate
    from lynx_planner.solvers.heu import Option, pool_placements, stage_estimate
    from lynx_planner.solvers.stage_model import StageModel

    model = StageModel(stage=0, first=0, end=3, in_flight=1, budget=1 << 30, compute_s=1.0, grad_wait_s=0.5,
                       fwd_idle_s=0.2, slots=())
    opts = [Option(Candidate(frozenset(), ("x",), 0, 0, rec, False), "pool", 0, 0.0) for rec in (0.4, 0.3, 0.2)]
    at, overflow = pool_placements(model, opts)
    # largest first into the roomier pool: 0.4 -> grad_wait (0.1 left), 0.3 -> prev_forward (-0.1), 0.2 -> grad_wait
    assert at == ["grad_wait", "prev_forward", "grad_wait"]
    assert overflow == pytest.approx(0.1 + 0.1)
    assert stage_estimate(model, opts) == pytest.approx(1.0 + 0.2)


def test_gpipe_is_not_shortened():
    from lynx_planner.solvers.heu import shortened

    prof = small_profile(pp=2, m=12)
    assert shortened(prof).parallel.num_microbatches == 5
    gpipe = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"schedule": "gpipe"})})
    assert shortened(gpipe) is gpipe


def test_opt_returns_its_own_milp_plan_and_describes_it():
    """The MILP models the simulator's timeline closely enough that its own plan beats HEU's here (0.24%); the
    solver fields describe that plan. Fails if OPT skips its MILP or falls back to HEU's plan."""
    prof = small_profile(tp=4, pp=2, m=4, hardware="a100-80g-pcie")
    limit = between(prof, 0.15)
    heu = solvers.solve(prof, "heu", limit).evaluation.predicted.iteration_time_s
    opt = solvers.solve(prof, "opt", limit, time_limit=30)
    t = opt.evaluation.predicted.iteration_time_s
    assert opt.solver.source == "milp" and opt.solver.status == "optimal"
    assert t < heu * (1 - 1e-3)
    assert opt.solver.bound_s is not None and opt.solver.gap == pytest.approx(max(0.0, (t - opt.solver.bound_s) / t))
    ada = solvers.solve(prof, "adapipe", limit, time_limit=30)
    assert ada.solver.source == "milp" and ada.solver.status == "optimal"
    assert solvers.solve(prof, "heu", limit).solver.source is None


def test_opt_does_not_follow_a_worse_heu(monkeypatch):
    """With HEU degraded to full recomputation, OPT returns its MILP's plan, not HEU's, and does not call the
    degraded plan optimal."""
    from lynx_planner.solvers import heu as heu_module
    from lynx_planner.solvers import opt as opt_module

    prof = small_profile(tp=4, pp=2, m=4, hardware="a100-80g-pcie")
    limit = between(prof, 0.15)
    good = solvers.solve(prof, "opt", limit, time_limit=30)

    def degraded(profile, lim, partition, placements=heu_module.LYNX_PLACEMENTS):
        bounds, _, _ = heu_module.heu_strategy(profile, lim, partition, placements)
        full = solvers.solve(profile, "full", lim)
        return bounds, [p for st in full.stages for p in _per_layer(st)], full.evaluation

    monkeypatch.setattr(opt_module, "heu_strategy", degraded)
    got = solvers.solve(prof, "opt", limit, time_limit=30)
    assert got.solver.source == "milp"
    assert got.evaluation.predicted.iteration_time_s == pytest.approx(good.evaluation.predicted.iteration_time_s,
                                                                        rel=1e-3)


def _per_layer(stage):
    return [p.model_copy(update={"layers": (i, i + 1)}) for p in stage.policies for i in range(*p.layers)]


def test_returned_heu_plan_is_not_called_optimal():
    """When HEU's plan simulates faster than the MILP's, OPT returns it as 'feasible' (nothing proves it optimal)
    with its own gap from the MILP's bound."""
    from lynx_planner.evaluate import Evaluation
    from lynx_planner.schema import Predicted, StagePrediction
    from lynx_planner.solvers.milp import MilpResult
    from lynx_planner.solvers.milp_search import returned

    def ev(t: float) -> Evaluation:
        st = StagePrediction(stage=0, peak_memory_bytes=1, static_bytes=0, activation_bytes=1, busy_time_s=t,
                             exposed_recompute_s=0, hidden_recompute_s=0)
        return Evaluation(Predicted(iteration_time_s=t, ideal_iteration_time_s=t, stages=[st]), None)

    proven = MilpResult([], "optimal", 1.0, 1.0, 0.0)
    heu_wins = returned([0, 1], ["h"], ev(1.01), ([0, 1], ["m"], ev(1.02), proven), ["optimal"], [1.0], 10)
    assert (heu_wins.source, heu_wins.status, heu_wins.policies) == ("heu", "feasible", ["h"])
    assert heu_wins.gap == pytest.approx(0.01 / 1.01)
    milp_wins = returned([0, 1], ["h"], ev(1.03), ([0, 1], ["m"], ev(1.0), proven), ["optimal"], [1.0], 10)
    assert (milp_wins.source, milp_wins.status, milp_wins.policies) == ("milp", "optimal", ["m"])
    assert milp_wins.gap == pytest.approx(0.0)
    # proven in the MILP's model, but the simulation is 2% above the bound: the model erred, nothing is proven
    model_off = returned([0, 1], ["h"], ev(1.03), ([0, 1], ["m"], ev(1.02), proven), ["optimal"], [1.0], 10)
    assert (model_off.source, model_off.status) == ("milp", "feasible")
    assert model_off.gap == pytest.approx(0.02 / 1.02)
    not_proven = returned([0, 1], ["h"], ev(1.03), ([0, 1], ["m"], ev(1.02), proven), ["optimal"], [0.9], 10)
    assert not_proven.status == "feasible"  # another split's bound is lower than this plan's objective


def test_the_milps_memory_model_keeps_its_plan_within_the_limit():
    """One MILP solve (no simulated repair) on HEU's split at a tight limit: its plan fits and recomputes."""
    from lynx_planner.schema import PLACEMENTS
    from lynx_planner.solvers.heu import heu_strategy
    from lynx_planner.solvers.milp_search import refine

    prof = small_profile(tp=4, pp=2, m=4, hardware="a100-80g-pcie")
    limit = between(prof, 0.15)
    bounds, _, _ = heu_strategy(prof, limit, "auto")
    pols, evaluation, result = refine(prof, limit, bounds, [0.0, 0.0], PLACEMENTS, "iteration", 30, rounds=1)
    assert pols is not None and evaluation.fits(limit) and result.status == "optimal"
    assert sum(1 for p in pols if p.recompute) >= 4


def test_heu_judges_all_its_contenders():
    """6.7B at 8.875 GiB (bench/ci): HEU's first contender on the shortened pipeline is 0.96% slower on the full one
    than the one HEU returns; HEU stays within 1.2% of OPT's MILP plan (0.86% now)."""
    from pathlib import Path

    from lynx_planner.io import parse_size
    from lynx_planner.schema import Profile

    prof = Profile.model_validate_json(Path("profiles/gpt-6.7b-a100-40g-nvlink-tp4-pp4-mb1-m16.json").read_text())
    limit = parse_size("8.875GiB", "limit")
    heu = solvers.solve(prof, "heu", limit).evaluation.predicted.iteration_time_s
    opt = solvers.solve(prof, "opt", limit, time_limit=30)
    assert opt.solver.source == "milp"
    assert heu <= opt.evaluation.predicted.iteration_time_s * 1.012
