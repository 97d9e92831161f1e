"""HEU never returns a plan slower than keeping everything where keeping everything fits (found on zero bubble,
where the stage model over-counts the tensors deferred weight passes hold and HEU recomputed for nothing)."""

from __future__ import annotations

from lynx_planner.build import build_profile
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import ParallelConfig
from lynx_planner.solvers import solve

GiB = 1 << 30


def test_heu_is_no_slower_than_keeping_everything_where_that_fits():
    par = ParallelConfig(tp=4, pp=4, num_microbatches=16, schedule="zero-bubble", virtual_stages=2)
    profile = build_profile("gpt-13b", par, HARDWARE["a100-80g-pcie"])
    limit = 24 * GiB
    none, heu = solve(profile, "none", limit), solve(profile, "heu", limit)
    assert none.evaluation.fits(limit)
    assert heu.evaluation.fits(limit)
    assert heu.evaluation.predicted.iteration_time_s <= none.evaluation.predicted.iteration_time_s + 1e-12
