"""Property tests over random op graphs and random small pipelines."""

from __future__ import annotations

from conftest import between, small_profile, solve_all
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lynx_planner import policy, solvers
from lynx_planner.schema import Block, Op
from lynx_planner.solvers.candidates import pareto


@st.composite
def blocks(draw) -> Block:
    n = draw(st.integers(2, 9))
    ops: list[Op] = []
    for i in range(n):
        earlier = ["input"] + [o.id for o in ops]
        inputs = draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=3, unique=True))
        saves = draw(st.lists(st.sampled_from(inputs + [f"m:op#{i}"]), max_size=2, unique=True))
        collective = i > 0 and draw(st.booleans()) and draw(st.booleans())
        ops.append(Op(id=f"m:op#{i}", kind="collective" if collective else "compute",
                      fwd_s=draw(st.floats(0.0, 2.0)), bwd_s=draw(st.floats(0.0, 3.0)),
                      out_bytes=draw(st.integers(0, 1000)), aux_bytes=draw(st.sampled_from([0, 0, 7])),
                      inputs=inputs, saves=saves))
    return Block(name="random", input_bytes=draw(st.integers(0, 100)), output_bytes=0, ops=ops)


@settings(max_examples=200, deadline=None)
@given(blocks())
def test_every_candidate_is_executable(block):
    info = policy.analyse(block)
    cands = pareto(block)
    assert cands, "at least keeping everything"
    for c in cands:
        assert policy.validate(info, sorted(c.keep), list(c.recompute)) is None
        assert set(policy.closure(info, c.keep)) <= set(c.recompute)
    nothing = policy.cost(info, policy.none_keep(info), ())
    assert min(c.rec_s for c in cands) == 0.0
    assert max(c.kept_bytes for c in cands) <= nothing.kept_bytes + sum(
        o.out_bytes for o in block.ops if o.kind == "collective")


@settings(max_examples=200, deadline=None)
@given(blocks(), st.data())
def test_closure_covers_every_dropped_tensor(block, data):
    info = policy.analyse(block)
    keep = frozenset(data.draw(st.lists(st.sampled_from(info.keepable), unique=True)) if info.keepable else [])
    rec = policy.closure(info, keep)
    assert policy.validate(info, sorted(keep), list(rec)) is None
    assert set(info.units) <= keep | set(rec)


pipelines = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2, 4]),
    "pp": st.sampled_from([1, 2, 3]),
    "mb": st.sampled_from([1, 2]),
    "m_factor": st.sampled_from([1, 2]),
    "hardware": st.sampled_from(["a100-80g-nvlink", "a100-80g-pcie", "h100-80g-nvlink"]),
    "attention": st.sampled_from(["flash", "math"]),
    "frac": st.floats(0.05, 0.95),
})


# Derandomized so CI cannot flake; the pinned examples are cases random runs found (set derandomize=False and run
# with --hypothesis-seed=N to explore further).
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(pipelines)
@example({"tp": 2, "pp": 1, "mb": 1, "m_factor": 1, "hardware": "a100-80g-nvlink", "attention": "math", "frac": 0.25})
@example({"tp": 1, "pp": 1, "mb": 1, "m_factor": 1, "hardware": "a100-80g-nvlink", "attention": "math", "frac": 0.0625})
def test_random_pipelines(cfg):
    prof = small_profile(tp=cfg["tp"], pp=cfg["pp"], mb=cfg["mb"], m=cfg["pp"] * cfg["m_factor"],
                         hardware=cfg["hardware"], layers=6, seq=512, attention=cfg["attention"])
    limit = between(prof, cfg["frac"])
    gaps: dict = {}
    times = solve_all(prof, limit, ("full", "selective", "block", "checkmate", "adapipe", "heu", "opt"), time_limit=20,
                      gaps=gaps)
    assert {"full", "heu", "opt"} <= set(times)
    best_baseline = min(t for a, t in times.items() if a not in ("heu", "opt"))
    # OPT's gap is honest: its bound is below every plan's time, so no baseline beats OPT by more than the gap OPT
    # reports. (OPT itself can lose to a baseline by its model's error: hypothesis found Checkmate 0.09% ahead on a
    # one-stage, one-micro-batch pipeline, where OPT reported a 2.5% gap.) HEU beats Megatron's strategies; its
    # knapsack rounds memory, so at a limit met within kilobytes the exact MILPs can beat it.
    # Where no MILP gave a bound (its model found the limit infeasible), OPT returns HEU's plan and claims nothing.
    if gaps["opt"] is not None:
        assert times["opt"] * (1 - gaps["opt"]) <= best_baseline * (1 + 1e-9)
    else:
        assert times["opt"] == times["heu"]
    assert times["heu"] <= min(t for a, t in times.items() if a in ("full", "selective", "block")) * (1 + 1e-9)
    again = solvers.solve(prof, "heu", limit)
    assert again.evaluation.predicted.iteration_time_s == times["heu"]
