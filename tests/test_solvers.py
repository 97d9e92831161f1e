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
