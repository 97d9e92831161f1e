"""HEU's fill (steps layers up their frontier where the simulation leaves a rank room) spends its simulations where
they can pay: a rank whose step changed nothing is passed over until a kept step changes the timeline, and FILL_IDLE
steps in a row that fit without being faster end it. Each trial's rank is found here from the policies themselves
(the layer that differs from the fill's current plan, its chunk by the split), not from fill's own bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from lynx_planner import schedules, solvers
from lynx_planner.io import parse_size
from lynx_planner.schema import Profile
from lynx_planner.solvers import heu

ROOT = Path(__file__).resolve().parent.parent
REAL = heu.fill, heu._on_demand_ranks, heu._simulate


def _trace_fills(monkeypatch, prof: Profile, limit: int, partition: str) -> list[dict]:
    """Per fill of the search: its start and end evaluations and its trials after the on-demand re-solve, each as
    (rank stepped, 'over' | 'faster' | 'same' | 'slower')."""
    fills: list[dict] = []
    real_fill, real_odr, real_sim = REAL
    state: dict = {"fill": None}

    def odr(profile, lim, got, chosen, pols, cur):
        out = real_odr(profile, lim, got, chosen, pols, cur)
        state["fill"]["cur"] = (out[1], out[2])  # the plan the steps start from
        return out

    def sim(profile, bounds, pols, lim=None):
        got = real_sim(profile, bounds, pols, lim)
        f = state["fill"]
        if f is not None and "cur" in f:
            cur_pols, cur = f["cur"]
            changed = [i for i, (a, b) in enumerate(zip(pols, cur_pols)) if a != b]
            assert len(changed) == 1, "a fill trial steps one layer of the current plan"
            chunk = next(c for c in range(len(bounds) - 1) if bounds[c] <= changed[0] < bounds[c + 1])
            rank = schedules.rank_of(profile.parallel.pp, chunk)
            if got is None or not got.fits(lim):
                f["trials"].append((rank, "over"))
            elif got.predicted.iteration_time_s < cur.predicted.iteration_time_s - 1e-12:
                f["trials"].append((rank, "faster"))
                f["cur"] = (pols, got)
            else:
                same = got.predicted.iteration_time_s == cur.predicted.iteration_time_s
                f["trials"].append((rank, "same" if same else "slower"))
        return got

    def fill(profile, lim, got, *a, **k):
        state["fill"] = {"trials": [], "start": got.evaluation}
        out = real_fill(profile, lim, got, *a, **k)
        state["fill"]["end"] = out.evaluation
        fills.append(state["fill"])
        state["fill"] = None
        return out

    monkeypatch.setattr(heu, "fill", fill)
    monkeypatch.setattr(heu, "_on_demand_ranks", odr)
    monkeypatch.setattr(heu, "_simulate", sim)
    solvers.solve(prof, "heu", limit, None, partition)
    return fills


CASES = [  # (profile, limit, split): the README's 13B (its fill's steps change nothing), a 1.3B whose fill gains
    ("profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json", "16.1875GiB", "auto"),
    ("profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json", "16.1875GiB", "even"),
    ("bench/ci/gpt-1.3b-a100-80g-pcie-tp2-pp2-dp2-mb2-m8.json", "5.75GiB", "even"),
    ("profiles/llama3-8b-h100-80g-nvlink-tp2-pp4-v2-mb1-m16.json", "21.5625GiB", "auto"),
]


@pytest.mark.parametrize("path,limit,partition", CASES)
def test_fill_passes_over_ranks_off_the_critical_path_and_stops_when_idle(path, limit, partition, monkeypatch):
    prof = Profile.model_validate_json((ROOT / path).read_text())
    lim = parse_size(limit)
    fills = _trace_fills(monkeypatch, prof, lim, partition)
    assert fills, "the search fills its best plan"
    for f in fills:
        trials = f["trials"]
        assert len(trials) <= heu.FILL_SIMULATIONS
        off_path: set[int] = set()
        idle = 0
        for rank, outcome in trials:
            assert rank not in off_path, f"a step on rank {rank}, whose last step changed nothing: {trials}"
            assert idle < heu.FILL_IDLE, f"a step after {idle} idle ones: {trials}"
            if outcome == "faster":
                off_path.clear()
                idle = 0
            elif outcome in ("same", "slower"):
                idle += 1
                if outcome == "same":
                    off_path.add(rank)
        # the fill keeps only plans that fit and are faster: it never ends worse than it started
        assert f["end"].fits(lim)
        assert f["end"].predicted.iteration_time_s <= f["start"].predicted.iteration_time_s


def test_fill_spends_at_most_its_idle_steps_where_nothing_pays(monkeypatch):
    """The README's 13B case at 16.1875 GiB on its auto split: no step its fill tries is faster. Without the idle
    rule the fill simulates FILL_SIMULATIONS of them; with it, FILL_IDLE, and the search's plan is the same."""
    prof = Profile.model_validate_json((ROOT / CASES[0][0]).read_text())
    lim = parse_size(CASES[0][1])
    fills, idle = _trace_fills(monkeypatch, prof, lim, "auto"), heu.FILL_IDLE
    monkeypatch.setattr(heu, "FILL_IDLE", heu.FILL_SIMULATIONS + 1)
    unbounded = _trace_fills(monkeypatch, prof, lim, "auto")
    assert len(fills) == len(unbounded) == 1
    assert all(o in ("same", "slower") for _, o in unbounded[0]["trials"]), unbounded[0]["trials"]
    assert len(unbounded[0]["trials"]) == heu.FILL_SIMULATIONS
    assert len(fills[0]["trials"]) == idle
    assert fills[0]["trials"] == unbounded[0]["trials"][:idle]
    assert fills[0]["end"].predicted.iteration_time_s == unbounded[0]["end"].predicted.iteration_time_s


def _trace_on_demand(monkeypatch, prof: Profile, limit: int, partition: str) -> list[dict]:
    """Per on-demand re-solve of the search: its trials as (ranks whose policies changed, 'over' | 'faster' | 'not')
    and its start and end evaluations."""
    calls: list[dict] = []
    _, real_odr, real_sim = REAL
    state: dict = {"call": None}

    def sim(profile, bounds, pols, lim=None):
        got = real_sim(profile, bounds, pols, lim)
        call = state["call"]
        if call is not None:
            cur_pols, cur = call["cur"]
            chunks = {c for i, (a, b) in enumerate(zip(pols, cur_pols)) if a != b
                      for c in range(len(bounds) - 1) if bounds[c] <= i < bounds[c + 1]}
            ranks = sorted({schedules.rank_of(profile.parallel.pp, c) for c in chunks})
            if got is None or not got.fits(lim):
                call["trials"].append((ranks, "over"))
            elif got.better_than(cur, lim):
                call["trials"].append((ranks, "faster"))
                call["cur"] = (pols, got)
            else:
                call["trials"].append((ranks, "not"))
        return got

    def odr(profile, lim, got, chosen, pols, cur):
        state["call"] = {"trials": [], "cur": (pols, cur), "start": cur}
        out = real_odr(profile, lim, got, chosen, pols, cur)
        state["call"]["end"] = out[2]
        calls.append(state["call"])
        state["call"] = None
        return out

    monkeypatch.setattr(heu, "_on_demand_ranks", odr)
    monkeypatch.setattr(heu, "_simulate", sim)
    solvers.solve(prof, "heu", limit, None, partition)
    return calls


@pytest.mark.parametrize("path,limit,partition,saves", [
    ("profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json", "16.1875GiB", "auto", True),  # no rank's re-solve pays
    ("profiles/gpt-20b-a100-80g-nvlink-tp4-pp8-mb2-m64.json", "19.8125GiB", "auto", False),  # the first three pay
])
def test_on_demand_re_solve_stops_after_idle_ranks(path, limit, partition, saves, monkeypatch):
    """Each trial re-solves one rank's chunks, ranks in order; ON_DEMAND_IDLE ranks in a row whose plan fits without
    being faster end the walk; without that rule the walk goes on, and (on these cases) ends at the same plan."""
    prof = Profile.model_validate_json((ROOT / path).read_text())
    lim = parse_size(limit)
    calls, idle_cap = _trace_on_demand(monkeypatch, prof, lim, partition), heu.ON_DEMAND_IDLE
    monkeypatch.setattr(heu, "ON_DEMAND_IDLE", prof.parallel.pp + 1)
    unbounded = _trace_on_demand(monkeypatch, prof, lim, partition)
    assert calls and len(calls) == len(unbounded)
    for call, full in zip(calls, unbounded):
        ranks = [r for r, _ in call["trials"]]
        assert all(len(r) == 1 for r in ranks), "a trial re-solves one rank"
        assert [r[0] for r in ranks] == sorted(r[0] for r in ranks), "ranks first to last"
        idle = 0
        for _, outcome in call["trials"]:
            assert idle < idle_cap, call["trials"]
            idle = 0 if outcome == "faster" else idle + (outcome == "not")
        assert call["trials"] == full["trials"][:len(call["trials"])]
        assert call["end"].predicted.iteration_time_s == full["end"].predicted.iteration_time_s
        assert call["end"].predicted.iteration_time_s <= call["start"].predicted.iteration_time_s
    assert (sum(len(c["trials"]) for c in calls) < sum(len(c["trials"]) for c in unbounded)) == saves
