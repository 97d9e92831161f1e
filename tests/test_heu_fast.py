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


def test_group_merges_only_equal_policies():
    """evaluate.group (run per screening simulation; compares fields without model_dump) merges neighbours whose
    policies are equal but for their layers, and nothing else."""
    from lynx_planner import evaluate as ev
    from lynx_planner import policy

    prof = small_profile(tp=2, pp=1, m=1, layers=4)  # layers 1-4 are the transformer layers
    units = sorted(policy.analyse(prof.blocks[prof.layers[1].block]).units)
    same = [ev.layer_policy(prof, i, frozenset(units[:1])) for i in (1, 2)]
    other_keep = ev.layer_policy(prof, 3, frozenset(units[1:2]))
    other_at = ev.layer_policy(prof, 4, frozenset(units[1:2]), None, "layer_above")
    assert other_at.recompute and other_at.at == "layer_above"
    runs = ev.group([*same, other_keep, other_at])
    assert [r.layers for r in runs] == [(1, 3), (3, 4), (4, 5)]
    assert runs[0].keep == same[0].keep and runs[1].keep == other_keep.keep and runs[2].at == "layer_above"


def _by_units_loop(front: list[heu.Option], base: int, unit: float, r: int):
    """The plain form: per rounded memory, the first option of least exposure, keyed in order of first occurrence."""
    import math

    by_units: dict[int, int] = {}
    for i, o in enumerate(front):
        k = math.ceil((o.mem - base) / unit)
        if k < r and (k not in by_units or o.exposed_s < front[by_units[k]].exposed_s):
            by_units[k] = i
    return by_units


def test_knapsack_options_by_units_are_the_plain_loops():
    """The vectorised choice of one option per rounded memory equals the loop over the options, ties in exposure
    going to the first, on frontiers with repeated memories and exposures, in and out of order, some past r."""
    rng = np.random.default_rng(7)
    cand = candidates_of(small_profile(tp=2, pp=2, m=4, layers=4), "gpt_layer")[0]
    for trial in range(300):
        n = int(rng.integers(1, 40))
        mems = rng.integers(0, 60, n) * int(rng.choice([1, 7, 1 << 30]))
        if trial % 2:
            mems = np.sort(mems)
        front = [heu.Option(cand, "on_demand", int(m), float(rng.integers(0, 5)) * 0.1) for m in mems]
        base, unit, r = int(mems.min()), float(rng.choice([0.7, 1.0, 3.0])) * int(mems.max() or 1) / 50, 41
        want = _by_units_loop(front, base, unit, r)
        got = heu._by_units(front, base, unit, r)
        if not want:
            assert got is None
            continue
        units, option, exposed = got
        assert units.tolist() == list(want) and option == list(want.values())
        assert exposed.tolist() == [front[i].exposed_s for i in want.values()]
