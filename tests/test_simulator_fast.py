"""The simulator's fast paths (straight-line forward and backward, waking only the ranks an item's end can unblock,
per-schedule tables cached) against the straightforward timeline they replaced (tests/sim_reference.py): on random
small pipelines, schedules, splits and policies, every result must be identical, bit for bit."""

from __future__ import annotations

from functools import lru_cache

from conftest import small_profile
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_reference import simulate as reference

from lynx_planner import evaluate as ev
from lynx_planner import policy, schedules, simulator
from lynx_planner.schema import Profile

PLACEMENTS = ("on_demand", "layer_above", "grad_wait", "prev_forward")


@lru_cache(maxsize=None)
def base(tp: int, sp: bool) -> Profile:
    return small_profile(tp=tp, pp=1, m=1, layers=10, seq=256, sp=sp)  # 12 layers with the end ones


@st.composite
def cases(draw, placements=PLACEMENTS, trace=None):
    schedule = draw(st.sampled_from(schedules.NAMES))
    p = draw(st.integers(1, 4))
    v = draw(st.integers(*{"interleaved-1f1b": (2, 3), "zero-bubble": (1, 2)}.get(schedule, (1, 1))))
    m = draw(st.integers(1, 3)) * (p if schedules.get(schedule).rounds else 1) + \
        (0 if schedules.get(schedule).rounds else draw(st.integers(0, 3)))
    tp = draw(st.sampled_from((1, 2)))
    prof = base(tp, tp > 1 and draw(st.booleans()))
    par = prof.parallel.model_copy(update={
        "pp": p, "virtual_stages": v, "num_microbatches": m, "schedule": schedule,
        "tp_comm_overlap": draw(st.booleans()), "dp": draw(st.sampled_from((1, 2)))})
    hw = prof.hardware.model_copy(update={"interference": draw(st.sampled_from((1.0, 1.5)))})
    prof = prof.model_copy(update={"parallel": par, "hardware": hw})
    n, chunks = len(prof.layers), p * v
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=chunks - 1, max_size=chunks - 1)))
    bounds = [0, *cuts, n]
    pols = []
    for i, layer in enumerate(prof.layers):
        info = policy.analyse(prof.blocks[layer.block])
        units = sorted(info.units)
        keep = frozenset(u for u in units if draw(st.booleans())) if units else frozenset()
        pols.append(ev.layer_policy(prof, i, keep, None, draw(st.sampled_from(placements))))
    # now and then a uniform chunk (Megatron's): two neighbouring layers of one block in one stage, the upper one
    # recomputing both
    s = draw(st.integers(0, chunks - 1))
    first, end = bounds[s], bounds[s + 1]
    if draw(st.booleans()) and end - first >= 2 and prof.layers[end - 2].block == prof.layers[end - 1].block:
        for i in (end - 2, end - 1):
            info = policy.analyse(prof.blocks[prof.layers[i].block])
            pols[i] = ev.layer_policy(prof, i, frozenset(), policy.full_recompute(info), recompute_with=end - 1)
    return prof, bounds, pols, draw(st.booleans()) if trace is None else trace


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(cases())
def test_fast_simulator_matches_the_reference(case):
    prof, bounds, pols, trace = case
    runs = ev.runs_of(prof, ev.stage_plans(prof, bounds, pols))
    fast, slow = simulator.simulate(prof, runs, trace=trace), reference(prof, runs, trace=trace)
    assert fast.iteration_time_s == slow.iteration_time_s
    assert [vars(x) for x in fast.stages] == [vars(x) for x in slow.stages]
    assert fast.chunk_grad_waits_s == slow.chunk_grad_waits_s
    assert fast.trace == slow.trace
    assert fast.releases == slow.releases
    assert fast.memory == slow.memory


import sim_reference  # noqa: E402


def memory_timelines(stage_class, events):
    """Patch `stage_class.activation_peak` to also record each rank's memory events (fast: without a trace too)."""
    seen: list[list[tuple[float, int]]] = []
    peak = stage_class.activation_peak

    def record(self):
        seen.append(events(self))
        return peak(self)

    return seen, record


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(cases(("on_demand", "layer_above", "grad_wait"), trace=False))
def test_backwards_on_a_local_queue_match_the_reference(case):
    """Chunks whose recomputation is released in their own backward (gradient wait, layer_above) take the local-queue
    path when nothing else is queued: every result and the whole memory timeline (which only the peak shows without a
    trace) as the reference's."""
    prof, bounds, pols, _ = case
    runs = ev.runs_of(prof, ev.stage_plans(prof, bounds, pols))
    fast_seen, fast_record = memory_timelines(simulator._Stage, lambda st: list(zip(st.mem.times, st.mem.deltas)))
    slow_seen, slow_record = memory_timelines(sim_reference._Stage, lambda st: list(st.mem))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simulator._Stage, "activation_peak", fast_record)
        mp.setattr(sim_reference._Stage, "activation_peak", slow_record)
        fast, slow = simulator.simulate(prof, runs), reference(prof, runs)
    assert fast.iteration_time_s == slow.iteration_time_s
    assert [vars(x) for x in fast.stages] == [vars(x) for x in slow.stages]
    assert fast.chunk_grad_waits_s == slow.chunk_grad_waits_s
    assert fast_seen == slow_seen


def test_a_deep_pipeline_matches_the_reference():
    """Many ranks and micro-batches, some stages straight (on demand) and some not: where the wake-ups matter."""
    prof = base(2, True)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"pp": 4, "num_microbatches": 12})})
    bounds = [0, 2, 4, 6, len(prof.layers)]
    pols = [ev.none_policy(prof, i) if i % 3 == 0 else
            ev.layer_policy(prof, i, frozenset(), None, "layer_above" if i % 3 == 1 else "on_demand")
            for i in range(len(prof.layers))]
    runs = ev.runs_of(prof, ev.stage_plans(prof, bounds, pols))
    fast, slow = simulator.simulate(prof, runs), reference(prof, runs)
    assert [vars(x) for x in fast.stages] == [vars(x) for x in slow.stages]
    assert fast.iteration_time_s == slow.iteration_time_s


def test_shared_simulations_are_what_fresh_ones_give():
    """solve() reuses HEU's own simulation of its plan, and keeping everything on a split is that split's ideal: both
    must be what simulating from scratch gives."""
    from conftest import between

    from lynx_planner import solvers
    from lynx_planner.solvers.partition import even_bounds

    prof = small_profile(tp=2, pp=3, m=6, layers=7, seq=512)
    got = solvers.solve(prof, "heu", between(prof, 0.4))
    bounds = [st.layers[0] for st in got.stages] + [got.stages[-1].layers[1]]
    assert bounds != even_bounds(prof, 3)  # HEU's own split: its ideal is not the one keeping everything computed
    fresh = ev.evaluate(prof, got.stages)
    assert got.evaluation.predicted == fresh.predicted
    nones = [ev.none_policy(prof, i) for i in range(len(prof.layers))]
    runs = [simulator.stage_runs(prof, bounds[s], bounds[s + 1], nones) for s in range(len(bounds) - 1)]
    assert fresh.predicted.ideal_iteration_time_s == reference(prof, runs).iteration_time_s
    assert ev.keep_all(prof, bounds).predicted.iteration_time_s == reference(prof, runs).iteration_time_s


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(cases(trace=False), st.data())
def test_a_capped_simulation_stops_only_for_a_rank_that_peaks_above_its_cap(case, data):
    """simulate(caps=...) gives None exactly when a rank's full simulation peaks above its cap (it may stop early,
    on a lower bound of the peak), else the full simulation's figures: caps at the peaks never stop it, a cap a byte
    below a rank's peak always does."""
    prof, bounds, pols, _ = case
    runs = ev.runs_of(prof, ev.stage_plans(prof, bounds, pols))
    full = simulator.simulate(prof, runs)
    peaks = [r.activation_peak_bytes for r in full.stages]
    rank = data.draw(st.integers(0, len(peaks) - 1))
    below = [p - 1 if r == rank else p + data.draw(st.integers(0, 2)) for r, p in enumerate(peaks)]
    with pytest.MonkeyPatch.context() as mp:  # scanned after every visit to a rank: the bound checked all along
        mp.setattr(simulator, "CAP_SCAN_EVENTS", data.draw(st.sampled_from((1, 3))))
        at = simulator.simulate(prof, runs, caps=peaks)
        assert at is not None and [vars(x) for x in at.stages] == [vars(x) for x in full.stages]
        assert at.iteration_time_s == full.iteration_time_s and at.chunk_grad_waits_s == full.chunk_grad_waits_s
        assert simulator.simulate(prof, runs, caps=below) is None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from((0.0, 0.5, 1.0, 2.0, 3.0)), st.integers(-50, 50)), max_size=14),
       st.lists(st.sampled_from((0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 4.0)), min_size=1, max_size=4))
def test_the_settled_peak_is_the_most_held_at_the_end_of_a_time_before_the_clock(events, clocks):
    """_settled_peak, scanned on at rising clocks over events in time order: the highest of 0 and the sums of all
    events up to each time before the clock (later events come at or after it), not a sum inside a time's run."""
    events = sorted(events, key=lambda e: e[0])
    mem = simulator._Memory()
    for t, d in events:
        mem.note(t, d)
    scan = [0, 0, 0, float("-inf")]
    for now in sorted(clocks):
        times = sorted({t for t, _ in events if t < now})
        want = max([0] + [sum(d for t, d in events if t <= at) for at in times])
        assert simulator._settled_peak(mem, scan, now) == want
    late = simulator._Memory()  # out of time order: no bound
    late.note(1.0, 1)
    late.note(0.5, 1)
    assert simulator._settled_peak(late, [0, 0, 0, float("-inf")], 2.0) is None


def test_run_lists_simulated_again_are_what_fresh_ones_give():
    """The simulator derives a chunk's tables once per run list (simulator._chunk): the same lists simulated again,
    and a list changed in place to another policy's runs, give what fresh lists give (the reference), gradient waits
    included (each simulation's own, not added to the last's)."""
    prof = small_profile(tp=2, pp=2, m=4, layers=6, seq=512)
    bounds = [0, 4, len(prof.layers)]
    n = len(prof.layers)
    hidden = [ev.layer_policy(prof, i, frozenset(), at="grad_wait") for i in range(n)]
    full = [ev.layer_policy(prof, i, frozenset()) for i in range(n)]
    runs = ev.runs_of(prof, ev.stage_plans(prof, bounds, hidden))
    first = simulator.simulate(prof, runs)
    again = simulator.simulate(prof, runs)
    assert first.chunk_grad_waits_s == again.chunk_grad_waits_s == reference(prof, runs).chunk_grad_waits_s
    assert [vars(x) for x in again.stages] == [vars(x) for x in first.stages]
    runs[0][:] = ev.runs_of(prof, ev.stage_plans(prof, bounds, full))[0]  # the same list, other runs
    changed = simulator.simulate(prof, runs)
    slow = reference(prof, [list(r) for r in runs])
    assert [vars(x) for x in changed.stages] == [vars(x) for x in slow.stages]
    assert changed.iteration_time_s == slow.iteration_time_s != first.iteration_time_s


def sorted_peak(events: list[tuple[float, int]]) -> int:
    """The peak as defined: events in time order, frees before allocations at equal times."""
    run = peak = 0
    for _, delta in sorted(events):
        run += delta
        peak = max(peak, run)
    return peak


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from((0.0, 0.5, 1.0, 1.0 + 2 ** -52, 2.0)), st.integers(-50, 50)), max_size=12),
       st.booleans())
def test_memory_peak_is_the_peak_in_time_order(events, in_order):
    """_Memory.peak scans events appended in time order (ties in any order) without sorting them, and sorts those
    that are not (a side-stream start an ulp past the clock)."""
    if in_order:
        events = sorted(events, key=lambda e: e[0])  # times in order, equal times in the order they came
    mem = simulator._Memory()
    for t, delta in events:
        mem.note(t, delta)
    assert mem.peak() == sorted_peak(events)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(cases(("on_demand", "layer_above", "grad_wait"), trace=False))
def test_backwards_replayed_within_a_search_match_the_reference(case):
    """Within simulator.reused_backwards() (a search's simulations), a local backward from a state met before is
    replayed, not walked: a plan, another differing in its last chunk (the same timeline until that chunk's first
    backward) and the first again, each give every result and the whole memory timeline of the reference (run outside
    the search); the plan simulated again replays every local backward and end of iteration it has (no new entry)."""
    prof, bounds, pols, _ = case
    # the chunk tables from a clean start: a cache that earlier tests (any order, any xdist worker) left nearly full
    # would be cleared between the first plan and its second simulation, whose backwards would then be new chunks
    simulator._CHUNKS.clear()
    lo = bounds[-2]
    other = pols[:lo] + [ev.layer_policy(prof, i, frozenset(), None, "on_demand") for i in range(lo, len(pols))]
    runs = ev.runs_of(prof, ev.stage_plans(prof, bounds, pols))
    # as a search passes them: the chunks the plans share as the same run lists
    changed = runs[:-1] + ev.runs_of(prof, ev.stage_plans(prof, bounds, other))[-1:]
    fast_seen, fast_record = memory_timelines(simulator._Stage, lambda st: list(zip(st.mem.times, st.mem.deltas)))
    slow_seen, slow_record = memory_timelines(sim_reference._Stage, lambda st: list(st.mem))
    plans, slow = (runs, changed, runs), []
    with pytest.MonkeyPatch.context() as mp:  # the reference outside the search (it shares the end of iteration)
        mp.setattr(sim_reference._Stage, "activation_peak", slow_record)
        for plan in plans:
            slow_seen.clear()
            slow.append((reference(prof, [list(r) for r in plan]), list(slow_seen)))
    with pytest.MonkeyPatch.context() as mp, simulator.reused_backwards():
        mp.setattr(simulator._Stage, "activation_peak", fast_record)
        for plan, (want, want_seen) in zip(plans, slow):
            entries = len(simulator._REUSED[-1])
            fast_seen.clear()
            fast = simulator.simulate(prof, plan)
            assert fast.iteration_time_s == want.iteration_time_s
            assert [vars(x) for x in fast.stages] == [vars(x) for x in want.stages]
            assert fast.chunk_grad_waits_s == want.chunk_grad_waits_s
            assert fast_seen == want_seen
        assert len(simulator._REUSED[-1]) == entries  # the first plan again: all replayed


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from((0.0, 1.0, 2.0, 3.0)), st.integers(-50, 50)), min_size=1, max_size=12),
       st.integers(0, 3))
def test_the_highest_run_end_is_the_highest_sum_at_the_end_of_a_time(events, more):
    """_run_end_top's shortcut (the highest running sum, where first met at the end of its time's run) against the
    plain definition: the highest running sum whose next event (if any, in `times` beyond the sums too) has another
    time."""
    events = sorted(events, key=lambda e: e[0])
    times = [t for t, _ in events] + [4.0 + i for i in range(more)]  # times may go on past the sums
    sums, run = [], 0
    for _, d in events:
        run += d
        sums.append(run)
    want = max(s for i, s in enumerate(sums) if i + 1 == len(times) or times[i] != times[i + 1])
    assert simulator._run_end_top(times, sums) == want


def passes_over_every_rank(kind: str, p: int, v: int, m: int, blocking: bool
                           ) -> tuple[list[tuple[int, int, int]], bool]:
    """The visits the plain way: pass after pass over every rank in order, each running its items as far as their
    inputs have ended, until a pass runs nothing; the visits that ran something, as (rank, first item, end)."""
    orders = [list(schedules.order(kind, p, v, r, m)) for r in range(p)]
    paired = [schedules.get(kind).paired_sends(p, v, r, m) if blocking and schedules.get(kind).paired_sends
              else frozenset() for r in range(p)]
    done, ptr, visits, last = set(), [0] * p, [], p * v - 1

    def ran(item) -> bool:
        return item in done

    progress = True
    while progress:
        progress = False
        for s in range(p):
            i = ptr[s]
            while i < len(orders[s]):
                kind_, c, k = orders[s][i]
                if kind_ == "F" and c > 0 and not ran(("F", c - 1, k)):
                    break
                if kind_ == "B" and c < last and not ran(("B", c + 1, k)):
                    break
                if kind_ == "F" and c < last and i in paired[s]:  # blocking p2p: runs with the backward after it
                    _, cb, kb = orders[s][i + 1]
                    if cb < last and not ran(("B", cb + 1, kb)):
                        break
                    done.add(orders[s][i])
                    i += 1
                done.add(orders[s][i])
                i += 1
            if i > ptr[s]:
                visits.append((s, ptr[s], i))
                ptr[s], progress = i, True
    return visits, all(i == len(o) for i, o in zip(ptr, orders))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.sampled_from(schedules.NAMES), st.integers(1, 5), st.integers(1, 3), st.integers(1, 9), st.booleans())
def test_the_visits_found_once_per_schedule_are_the_passes_over_every_rank(kind, p, v, m, blocking):
    """simulate() runs the visits _visits finds once per schedule (waking only the ranks an item's end may unblock):
    those that run something, in order, are those of passes over every rank (the trace's order rests on it)."""
    lo, hi = schedules.get(kind).virtual
    v = max(v, lo) if hi is None else min(max(v, lo), hi)
    if schedules.get(kind).rounds:
        m = p * max(1, m // p)
    assert schedules.problem(kind, p, v, m) is None
    visits, complete = simulator._visits(kind, p, v, m, blocking)
    assert (list(visits), complete) == passes_over_every_rank(kind, p, v, m, blocking)
    assert complete


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(cases(trace=False))
def test_layer_runs_made_within_a_search_are_the_runs_made_alone(case):
    """Within a search a layer's run is made once per block, policy and what it reads of its place (its chunk's first
    layer or not, the first chunk or not, its trigger in the chunk), then given each layer's index: every chunk's runs
    (a layer's run asked again too) are field for field the ones made without the search's tables."""
    prof, bounds, pols, _ = case
    chunks = list(zip(bounds, bounds[1:]))
    alone = [simulator.stage_runs(prof, lo, hi, pols[lo:hi]) for lo, hi in chunks]
    with simulator.reused_backwards():
        shared = [simulator.stage_runs(prof, lo, hi, pols[lo:hi]) for lo, hi in chunks + chunks]
    assert shared == alone + alone


def test_layer_runs_shared_within_a_search_keep_their_placement_and_trigger():
    """Layers alike but for their placement, or for where their uniform chunk's top is within their chunk, get runs
    of their own within a search."""
    prof = base(2, False)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"pp": 3, "num_microbatches": 3})})
    bounds = [0, 4, 8, 12]
    pols = []
    for i, layer in enumerate(prof.layers):
        full = policy.full_recompute(policy.analyse(prof.blocks[layer.block]))
        pols.append(ev.layer_policy(prof, i, frozenset(), full, PLACEMENTS[i % len(PLACEMENTS)]))
    for lo, hi in ((5, 6), (9, 11)):  # uniform chunks topped 1 and 2 layers above their chunk's second layer
        for i in range(lo, hi + 1):
            full = policy.full_recompute(policy.analyse(prof.blocks[prof.layers[i].block]))
            pols[i] = ev.layer_policy(prof, i, frozenset(), full, recompute_with=hi)
    chunks = list(zip(bounds, bounds[1:]))
    alone = [simulator.stage_runs(prof, lo, hi, pols[lo:hi]) for lo, hi in chunks]
    with simulator.reused_backwards():
        shared = [simulator.stage_runs(prof, lo, hi, pols[lo:hi]) for lo, hi in chunks]
    assert shared == alone
    assert len({r.at for runs in alone for r in runs}) > 1 and {alone[1][2].trigger, alone[2][3].trigger} == {2, 3}
