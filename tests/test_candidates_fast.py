"""The frontier search's shortcuts (issue 29.5) against the plain computations they replace: the final candidates
built only for the sweep's survivors (_complete against _frontier of every _candidate), and the bounded search's
skipped tolerance tries (_Sure: a try it skips fails, so the frontier is the one without it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lynx_planner import policy
from lynx_planner.solvers import candidates

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_candidates_scale import _catalog_layer, _steps  # noqa: E402
from test_properties import blocks  # noqa: E402


@pytest.fixture(autouse=True)
def fresh():
    candidates.reset_caches()
    yield
    candidates.reset_caches()


def _final_partials(info):
    """Every complete partial policy of the uncapped exact search."""
    ops = [o for o in info.block.ops if not o.view][::-1]
    units, keepable = set(info.units), set(info.keepable)
    holds = {o.id for o in ops if o.id in info.needed_out or o.id in info.collective}
    states = candidates._start(info)
    for op in ops:
        states = candidates._step(info, op, states, units, keepable, holds)
    return [p for ps in states.values() for p in ps]


def _plain(info, partials):
    bits = candidates._bits(info)
    return candidates._frontier([candidates._candidate(info, bits, p) for p in partials])


@settings(max_examples=150, deadline=None, derandomize=True)
@given(blocks(), st.randoms(use_true_random=False))
def test_complete_is_the_frontier_of_every_candidate(block, rnd):
    """Any complete partial policies (the search's, and shuffled subsets of them with duplicated costs, so that runs
    of equal costs meet): the same candidates, in the same order."""
    info = policy.analyse(block)
    partials = _final_partials(info)
    assert candidates._complete(info, partials) == _plain(info, partials)
    some = rnd.sample(partials, rnd.randint(0, len(partials)))
    # a copy with another keep set and the same costs: a tie, which the least sorted keep set wins
    every = (1 << len(info.keepable)) - 1
    some += [(k, s, b, r, keep ^ (rnd.getrandbits(4) & every), rec) for k, s, b, r, keep, rec in some[:3]]
    assert candidates._complete(info, some) == _plain(info, some)


@pytest.mark.parametrize("name", ["llama3-8b", "qwen3-32b"])
def test_complete_on_catalog_layers(name):
    info = policy.analyse(_catalog_layer(name))
    partials = _final_partials(info)
    got = candidates._complete(info, partials)
    assert got == _plain(info, partials) and len(got) > 100


_partials = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40).map(lambda s: s / 8), st.integers(0, 40),
                               st.booleans(), st.integers(0, 63)), max_size=60)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(_partials, min_size=1, max_size=4), st.sampled_from([0.0, 0.5, 1.0, 3.0]),
       st.sampled_from([0.0, 1.0, 2.0, 5.0]))
def test_sure_survivors_are_kept(lists, tol_s, tol_b):
    """_Sure.count never exceeds what _prune_states keeps at those tolerances (so a try it calls failing fails)."""
    states = {}
    for i, ps in enumerate(lists):
        exact = candidates._prune([(k, s, b, r, keep, 0) for k, s, b, r, keep in ps])
        if exact:
            states[frozenset([str(i)])] = exact
    if not states:
        return
    sure = candidates._Sure.of(states)
    kept = sum(map(len, candidates._prune_states(states, tol_s, tol_b, None).values()))
    assert sure.count(tol_s, tol_b) <= kept
    if sure.count(tol_s, tol_b) > 0:
        assert candidates._prune_states(states, tol_s, tol_b, sure.count(tol_s, tol_b) - 1) is None


def test_sure_counts_a_replay_beaten_only_by_a_replay():
    """A partial policy replaying a collective is beaten by an earlier one that replays too: not kept for sure (the
    least before it counts every earlier one), while one replaying nothing is not beaten by it (kept for sure)."""
    states = {frozenset(): [(0, 0.0, 10, True, 1, 0), (1, 0.5, 9, True, 2, 0), (2, 0.5, 9, False, 4, 0)]}
    sure = candidates._Sure.of(states)
    assert sure.count(1.0, 2.0) == 2  # the first, and the last (replaying nothing: the replays before it do not count)
    assert len(candidates._prune_states(states, 1.0, 2.0, None)[frozenset()]) == 2


def test_skipped_tries_leave_the_bounded_frontier(monkeypatch):
    """A bounded search with the skipped tries gives the frontier it gives running them (and it does skip some):
    DeepSeek-V3's MoE layer at its benchmarks/heu_scaling.py layout."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import heu_scaling

    block = max(heu_scaling.catalog_profile("deepseek-v3")[0].blocks.values(), key=lambda b: len(b.ops))
    skipped = []
    real = candidates._Sure.count

    def count(self, tol_s, tol_b):
        got = real(self, tol_s, tol_b)
        skipped.append(got > candidates.STEP_CAP)
        return got

    monkeypatch.setattr(candidates._Sure, "count", count)
    got = candidates.frontier(block)
    assert not got.exact and any(skipped)
    candidates.reset_caches()
    monkeypatch.setattr(candidates._Sure, "of", staticmethod(lambda states: None))
    assert candidates.frontier(block) == got


def test_least_work_left_goes_on_where_it_stopped():
    """One _LeastLeft asked budget after budget (as an exact search's two tries ask it) answers each as the plain
    sums say (whether any passes the budget), at every sum and one below it."""
    info = policy.analyse(_catalog_layer("qwen3-32b"))
    ops, units, keepable, holds, steps = _steps(info)
    args = (info, ops, 2, steps[2][0], units, keepable, holds)
    sums = list(candidates._least_sums(*args))
    assert len(sums) > 10 and sums[-1] > 100
    budgets = sorted({b for x in sums for b in (x - 1, x)})
    left = candidates._LeastLeft(*args)
    for budget in budgets + budgets[::-1]:
        assert left.exceeds(budget) == any(x > budget for x in sums), budget
        assert candidates._work_exceeds(*args[:4], budget, *args[4:]) == any(x > budget for x in sums), budget


def test_a_search_goes_on_only_with_its_own_least_work_left():
    """A resumed exact search reuses the least work left only where it was computed from the same states: one
    computed elsewhere (here one that says every budget is passed) is not taken for its own."""

    class Elsewhere:
        states = {}

        def exceeds(self, budget):
            return True

    info = policy.analyse(_catalog_layer("qwen3-32b"))
    ops, units, keepable, holds, steps = _steps(info)
    k = 5
    stopped = candidates._OverWork((k, steps[k][0], sum(size for _, size in steps[:k + 1]), steps[k][1]), None,
                                   Elsewhere())
    got, eps = candidates._search(info, candidates.WORK_CAP, None, stopped)
    assert eps == 0 and got == candidates.frontier(info.block).candidates

