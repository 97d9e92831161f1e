"""Every strategy gives plans that `check` accepts; the Lynx solvers beat the baselines; edge cases."""

from __future__ import annotations

import pytest
from conftest import between, peak, small_profile

from lynx_planner import solvers
from lynx_planner.evaluate import check, make_plan
from lynx_planner.solvers import ALGOS, Infeasible

BASELINES = ("full", "selective", "uniform", "block", "checkmate", "adapipe")
TOL = 1e-9


def solve_all(profile, limit):
    out = {}
    for algo in ALGOS:
        try:
            s = solvers.solve(profile, algo, limit, time_limit=30)
        except Infeasible:
            continue
        plan = make_plan(profile, "p.json", "0" * 64, algo, limit, s.stages, s.solver, s.evaluation)
        assert check(plan, profile) == [], algo
        out[algo] = s.evaluation.predicted.iteration_time_s
    return out


@pytest.mark.parametrize("frac", [0.15, 0.6])
def test_every_plan_passes_check_and_lynx_is_fastest(frac):
    prof = small_profile(tp=4, pp=2, m=4, hardware="a100-80g-pcie")
    times = solve_all(prof, between(prof, frac))
    assert "none" not in times  # the limit forces recomputation
    best_baseline = min(times[a] for a in BASELINES if a in times)
    assert times["opt"] <= times["heu"] + TOL
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
    assert times["opt"] <= times["heu"] + TOL <= times["full"] + TOL


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
