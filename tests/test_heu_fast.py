"""HEU's shortcuts (issue 15, depth) give what the plain computations give: option frontiers scaled by the in-flight
count, the DP's rows copied from a sliding window, auto_bounds's numbered block sequences."""

from __future__ import annotations

import numpy as np
from conftest import between, small_profile

from lynx_planner.solvers import heu
from lynx_planner.solvers.partition import best_bounds
from lynx_planner.solvers.stage_model import candidates_of, p2p_wait_s, stage_model


def _points(options: list[heu.Option]) -> list[tuple]:
    return [(o.cand, o.at, o.mem, o.exposed_s) for o in options]


def test_scaled_frontiers_are_the_frontiers_at_each_in_flight_count():
    """Without pools, a frontier found once and scaled by the in-flight count is the one _options finds there."""
    prof = small_profile(tp=2, pp=4, m=8, layers=8)
    limit = between(prof, 0.5)
    for regime in (heu.HullCache(heu.LYNX_PLACEMENTS), heu.HullCache(("on_demand",))):
        seen = set()
        for s in range(4):  # stage s holds 4 - s micro-batches at its peak
            model = stage_model(prof, s, 2 * s + 1, 2 * s + 3, limit, p2p_wait_s(prof, 2 * s + 1, 2 * s + 3))
            seen.add(model.in_flight)
            for j, slot in enumerate(model.slots):
                placements = regime.placements
                direct = heu._options(model, slot, heu._placed(slot, candidates_of(prof, slot.block), placements))
                got = heu._class_options(prof, model, j, regime)
                assert _points(got) == _points(direct)
                assert _points(heu._class_hull(prof, model, j, regime)) == _points(heu._hull(direct))
        assert len(seen) == 4


def test_knapsack_rows_are_the_gathered_table():
    """The DP's table built from whole rows of a sliding window equals gathering dp[r + b - units] entry by entry."""
    r = 9
    dp = np.concatenate([np.full(r, np.inf, dtype=np.float32), np.arange(r, dtype=np.float32)[::-1]])
    units = np.array([0, 3, 8], dtype=np.int64)
    gathered = dp[r + np.arange(r)[None, :] - units[:, None]]
    rows = np.lib.stride_tricks.sliding_window_view(dp, r)[r - units]
    assert np.array_equal(gathered, rows)


def test_auto_bounds_is_the_dp_over_block_sequences():
    """auto_bounds keys stages by numbered block sequences: the split is the one the DP finds keying by the sequences
    themselves."""
    prof = heu.shortened(small_profile(tp=2, pp=4, m=8, layers=10))
    limit = between(prof, 0.4)
    cache = heu.HullCache(heu.LYNX_PLACEMENTS)
    got = heu.auto_bounds(prof, limit, heu.HullCache(heu.LYNX_PLACEMENTS))
    n, p = len(prof.layers), 4
    blocks = [l.block for l in prof.layers]
    par = prof.parallel
    known: dict = {}

    def stage_time(s: int, first: int, end: int) -> float:
        key = (heu.in_flight(par.schedule, p, s, par.num_microbatches), tuple(blocks[first:end]), end == n, first == 0)
        if key not in known:
            model = stage_model(prof, s, first, end, limit, p2p_wait_s(prof, first, end))
            solved = heu._greedy(prof, model, cache, fill=False)
            known[key] = float("inf") if solved is None else solved[1]
        return known[key]

    assert got == best_bounds(n, p, stage_time, longest=max(2, 2 * -(-n // p)))[0]
