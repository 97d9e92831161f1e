"""The schedules package: each order against torch's own, and the simulator on hand-computed small cases."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch.distributed.pipelining.schedules as torch_schedules
from test_simulator import synthetic

from lynx_planner import evaluate as ev
from lynx_planner import placements, schedules
from lynx_planner.schema import ParallelConfig

_KIND = {torch_schedules._ComputationType.FORWARD: "F", torch_schedules._ComputationType.FULL_BACKWARD: "B",
         torch_schedules._ComputationType.BACKWARD_INPUT: "B", torch_schedules._ComputationType.BACKWARD_WEIGHT: "W"}


def torch_order(cls, p: int, v: int, m: int, rank: int) -> tuple:
    """The rank's actions in torch's pipeline_order (the bubbles dropped), computed as its __init__ does."""
    rounds = max(1, m // p)
    me = SimpleNamespace(n_local_stages=v, pp_group_size=p, _n_microbatches=m, number_of_rounds=rounds,
                         microbatches_per_round=m // rounds)
    ops = cls._calculate_single_rank_operations(me, rank)
    return tuple((_KIND[a.computation_type], a.stage_index, a.microbatch_index) for a in ops if a is not None)


@pytest.mark.parametrize("name", ["interleaved-1f1b", "zero-bubble"])
def test_orders_are_torchs(name):
    cls = getattr(torch_schedules, schedules.get(name).torch_class)
    checked = 0
    for p in (1, 2, 3, 4):
        for v in (1, 2, 3):
            for m in (1, 2, 3, 4, 6, 8, 12):
                if schedules.problem(name, p, v, m):
                    continue
                for rank in range(p):
                    assert schedules.order(name, p, v, rank, m) == torch_order(cls, p, v, m, rank), (p, v, m, rank)
                    checked += 1
    assert checked > 100


def test_interleaved_order_is_megatrons_by_hand():
    # p 2, v 2, m 4, rank 0: warm-up (v - 1) p + 2 (p - 1 - r) = 4 forwards (chunk 0 for mb 0-1, chunk 2 for 0-1)
    assert schedules.order("interleaved-1f1b", 2, 2, 0, 4) == (
        ("F", 0, 0), ("F", 0, 1), ("F", 2, 0), ("F", 2, 1), ("F", 0, 2), ("B", 2, 0), ("F", 0, 3), ("B", 2, 1),
        ("F", 2, 2), ("B", 0, 0), ("F", 2, 3), ("B", 0, 1), ("B", 2, 2), ("B", 2, 3), ("B", 0, 2), ("B", 0, 3))
    assert schedules.in_flight("interleaved-1f1b", 2, 2, 0, 4) == 4
    assert schedules.in_flight("interleaved-1f1b", 2, 2, 2, 4) == 2
    # zero bubble, p 2: rank 1 defers one W into the bubble, rank 0 none
    assert schedules.order("zero-bubble", 2, 1, 1, 4) == (
        ("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1), ("W", 1, 0), ("F", 1, 2), ("B", 1, 2), ("W", 1, 1),
        ("F", 1, 3), ("B", 1, 3), ("W", 1, 2), ("W", 1, 3))


def test_one_f_one_b_and_gpipe_orders_unchanged():
    for p, m in ((4, 6), (4, 2), (3, 3), (1, 2)):
        for s in range(p):
            warm = min(p - s - 1, m)
            old = [("F", k) for k in range(warm)]
            for i in range(m - warm):
                old += [("F", warm + i), ("B", i)]
            old += [("B", k) for k in range(m - warm, m)]
            assert list(placements.schedule("1f1b", p, s, m)) == old
            assert list(placements.schedule("gpipe", p, s, m)) == [("F", k) for k in range(m)] + \
                [("B", k) for k in range(m)]


def profile(schedule: str, v: int, p: int = 2, m: int = 4, per_chunk: int = 1):
    """synthetic()'s layers (forward 1.5 s, backward 2.5 s of which the mm's weight gradient is 1 s; keeps 1100 B)
    cut into p x v chunks of `per_chunk` layers."""
    prof = synthetic(p, m, layers=v * per_chunk)
    par = ParallelConfig(pp=p, num_microbatches=m, schedule=schedule, virtual_stages=v)
    return prof.model_copy(update={"parallel": par})


def simulate(prof, pols=None):
    n = len(prof.layers)
    chunks = prof.parallel.pp * prof.parallel.virtual_stages
    bounds = [c * n // chunks for c in range(chunks + 1)]
    pols = pols or [ev.none_policy(prof, i) for i in range(n)]
    return ev.evaluate(prof, ev.stage_plans(prof, bounds, pols)).predicted


def test_interleaved_bubble_and_memory_by_hand():
    # per rank: forward 2 x 1.5 s, backward 2 x 2.5 s per micro-batch; bubble (p - 1) / v of that (Narayanan et al.)
    one = simulate(profile("1f1b", 1, per_chunk=2))
    inter = simulate(profile("interleaved-1f1b", 2))
    assert one.iteration_time_s == (4 + 1) * 8.0
    assert inter.iteration_time_s == (4 + 1 / 2) * 8.0
    # rank 0 holds chunk 0's 4 micro-batches and chunk 2's 2 at once: 5 layers' 1100 B at its peak (F2,1 .. B2,0),
    # 1 + (p - 1) / (p v) = 1.25 times 1F1B's 2 micro-batches x 2 layers (Korthikanti et al.)
    assert [s.activation_bytes for s in one.stages] == [2 * 2 * 1100, 1 * 2 * 1100]
    assert inter.stages[0].activation_bytes == 5 * 1100


def test_zero_bubble_timeline_and_deferred_weight_memory_by_hand():
    # F 1.5, B 1.5, W 1 per stage; rank 1: F0 1.5-3 B0 -4.5 F1 -6 B1 -7.5 W0 -8.5 F2 -10 B2 -11.5 W1 -12.5
    # F3 -14 B3 -15.5 W2 -16.5 W3 -17.5; rank 0 waits for each B: ... B3 15.5-17 W3 -18
    zb = simulate(profile("zero-bubble", 1))
    assert zb.iteration_time_s == 18.0
    assert simulate(profile("1f1b", 1)).iteration_time_s == (4 + 1) * 4.0
    # B frees nothing and adds the mm's output gradient (1000 B) and the chunk's input gradient (100 B) until W:
    # rank 1 holds F0 B0 F1 B1 (2 x (1100 + 1000 + 100)) before W0; on rank 0 torch's B does nothing (chunk 0's
    # input needs no gradient, W runs the whole backward): at most F(k + 1), F(k + 2), 2 x 1100
    assert [s.activation_bytes for s in zb.stages] == [2 * 1100, 2 * (1100 + 1000 + 100)]
    assert simulate(profile("1f1b", 1)).stages[1].activation_bytes == 1100


def test_interleaved_sends_cross_the_wrap_around_hop_but_not_within_a_rank():
    prof = profile("interleaved-1f1b", 2, m=2)
    slow = prof.model_copy(update={"blocks": {"layer": prof.blocks["layer"].model_copy(
        update={"output_bytes": 10**9})}})
    hop = 1e9 / prof.hardware.intra_node_bus_bytes_per_s
    # one pass of micro-batch 0 through chunks 0 -> 1 -> 2 -> 3 crosses 3 hops forward and 3 back
    one = profile("interleaved-1f1b", 2, p=1, m=1)  # p 1: both chunks on one rank, no hop at all
    slow_one = one.model_copy(update={"blocks": {"layer": one.blocks["layer"].model_copy(
        update={"output_bytes": 10**9})}})
    assert simulate(slow_one).iteration_time_s == simulate(one).iteration_time_s
    assert simulate(slow).iteration_time_s > simulate(prof).iteration_time_s + 2 * hop


def test_prev_forward_fires_across_chunks():
    fires = placements.prev_forward_fires("interleaved-1f1b", 2, 2, 0, 4)
    assert fires == {(0, 2): (2, 0), (0, 3): (2, 1), (2, 2): (0, 0), (2, 3): (0, 1)}
    assert placements.legal_placements("interleaved-1f1b", 2, 0, 4, 2)[-1] == "prev_forward"
    # zero bubble, p 2: rank 0 runs F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3; rank 1 F(k) B(k) of one micro-batch only
    assert placements.prev_forward_releases("zero-bubble", 2, 0, 4) == {1: 0, 2: 1, 3: 2}
    assert placements.prev_forward_releases("zero-bubble", 2, 1, 4) == {}


@pytest.mark.parametrize("schedule,v,m,message", [
    ("interleaved-1f1b", 1, 4, "at least 2 virtual stages"),
    ("1f1b", 2, 4, "exactly 1"),
    ("interleaved-1f1b", 2, 5, "equal rounds"),
])
def test_bad_schedule_settings(schedule, v, m, message):
    with pytest.raises(ValueError, match=message):
        ParallelConfig(pp=2, num_microbatches=m, schedule=schedule, virtual_stages=v)


def test_default_virtual_stages_leave_the_json_unchanged():
    assert "virtual_stages" not in ParallelConfig(pp=2).model_dump_json()
    assert '"virtual_stages":2' in ParallelConfig(pp=2, schedule="interleaved-1f1b", virtual_stages=2,
                                                  num_microbatches=4).model_dump_json()


def test_awaiting_weight_pass_counts_deferred_ws():
    # zero bubble, p 2, m 4: rank 1 runs B0 B1 before W0; rank 0 each B's W right after it
    assert schedules.awaiting_weight_pass("zero-bubble", 2, 1, 1, 4) == 2
    assert schedules.awaiting_weight_pass("zero-bubble", 2, 1, 0, 4) == 1
    assert schedules.awaiting_weight_pass("interleaved-1f1b", 2, 2, 0, 4) == 0


def test_chunk_limits_share_each_ranks_memory():
    from lynx_planner.solvers.stage_model import chunk_limits

    prof = profile("interleaved-1f1b", 2, per_chunk=2)
    prof = prof.model_copy(update={"layers": [l.model_copy(update={"static_bytes": 10 * (i + 1)})
                                              for i, l in enumerate(prof.layers)], "extra_static_bytes": 7})
    bounds = [0, 2, 4, 6, 8]
    limits = chunk_limits(prof, bounds, 10_000)
    static = [ev.static_bytes(prof, bounds[c], bounds[c + 1]) for c in range(4)]
    for rank in (0, 1):
        mine = [rank, rank + 2]
        free = 10_000 - 7 - sum(static[c] - 7 for c in mine)
        budgets = [limits[c] - static[c] for c in mine]  # what each chunk's stage model may spend
        assert free - 2 <= sum(budgets) <= free
    # rank 0's chunk 0 holds 4 micro-batches, chunk 2 two: twice the share
    assert abs((limits[0] - static[0]) - 2 * (limits[2] - static[2])) <= 2
    assert chunk_limits(profile("1f1b", 1, per_chunk=2), [0, 2, 4], 123) == [123, 123]


def test_megatron_export_names_the_virtual_stages():
    from lynx_planner import export
    from lynx_planner.solvers.partition import even_bounds

    prof = profile("interleaved-1f1b", 2, per_chunk=3)
    assert export.virtual_flags(prof, even_bounds(prof, 4)) == ["--num-layers-per-virtual-pipeline-stage 3"]
    uneven = export.virtual_flags(prof, [0, 2, 5, 8, 12])
    assert uneven == ['--pipeline-model-parallel-layout "t*2|t*3|t*3|t*4"']


def test_tune_tries_virtual_stages_where_layers_split_evenly():
    from lynx_planner.tune import pipeline_schedules

    got = pipeline_schedules(("1f1b", "interleaved-1f1b", "zero-bubble"), 2, 8, 24)
    assert ("1f1b", 1) in got and ("zero-bubble", 1) in got
    assert {v for s, v in got if s == "interleaved-1f1b"} == {2, 3, 4, 6}  # 2 x 8 does not divide 24
    assert pipeline_schedules(("interleaved-1f1b",), 1, 8, 24) == []  # one rank: nothing to interleave
    assert pipeline_schedules(("interleaved-1f1b",), 2, 8, 24, virtual=3) == [("interleaved-1f1b", 3)]


def test_zero_bubble_holds_recomputed_tensors_until_w():
    from test_simulator import recompute_mm

    prof = profile("zero-bubble", 1)
    got = simulate(prof, recompute_mm(prof, "on_demand"))
    # keeps the input (100 B); mm's output (1000 B) is regenerated at B and, with mm's output gradient (1000 B) and
    # the chunk's input gradient (100 B), held until W: rank 1 peaks at F0 B0 F1 B1 = 2 x (100 + 1000 + 1000 + 100),
    # as without recomputation; rank 0 (whose B holds no gradient: W runs its whole backward) at F(k + 1) F(k + 2)'s
    # inputs and one B's recomputed 1000 B
    assert [s.activation_bytes for s in got.stages] == [2 * 100 + 1000, 2 * (100 + 1000 + 1000 + 100)]


def test_recomputations_are_served_earliest_backward_first():
    from lynx_planner.simulator import LayerRun, _Stage, backward_deadlines

    run = LayerRun(0, (1.0,), (1.0,), 0, 10, 1.0, "grad_wait")
    # rank 0 of interleaved p 2, v 2: B(2, 0) comes before B(0, 0) in its order
    st = _Stage(0, {0: [run], 2: [run]}, 1.0, None, backward_deadlines(schedules.order("interleaved-1f1b", 2, 2, 0, 4)),
                False)
    st.release(0, 0, 0, "grad_wait", ("B", 0))
    st.release(2, 0, 0, "grad_wait", ("B", 0))
    st.release(2, 1, 0, "grad_wait", ("B", 1))
    assert [(t.chunk, t.mb) for t in st.queue] == [(2, 0), (2, 1), (0, 0)]


def test_check_reports_another_virtual_stage_count():
    prof = profile("interleaved-1f1b", 2)
    n = len(prof.layers)
    stages = ev.stage_plans(prof, [c * n // 4 for c in range(5)], [ev.none_policy(prof, i) for i in range(n)])
    from lynx_planner.schema import SolverInfo

    plan = ev.make_plan(prof, "p.json", "0" * 64, "none", prof.hardware.memory_bytes, stages,
                        SolverInfo(name="none", status="heuristic", search_time_s=0.0))
    assert ev.check(plan, prof) == []
    assert any("virtual_stages" in p for p in ev.check(plan.model_copy(update={"parallel": plan.parallel.model_copy(
        update={"virtual_stages": 1})}), prof))


def test_measured_split_backward_prices_b_and_w_except_on_chunk_0():
    """A block whose split backward measured 2x the whole: B and W cost twice on chunk 1; torch runs chunk 0's
    backward whole (its input needs no gradient), so chunk 0 keeps the whole backward's price; validate predicts
    what the simulator prices."""
    from lynx_planner import simulator, solvers, validate

    prof = profile("zero-bubble", 1)
    blocks = {name: b.model_copy(update={"split_backward": 2.0}) for name, b in prof.blocks.items()}
    doubled = prof.model_copy(update={"blocks": blocks})
    pol = ev.none_policy(doubled, 0)
    assert simulator.layer_run(doubled, 0, pol, first=0).bwd_input == (1.5,)
    assert simulator.layer_run(doubled, 0, pol, first=0).wgrad_s == 1.0
    assert simulator.layer_run(doubled, 1, pol, first=1).bwd_input == (3.0,)
    assert simulator.layer_run(doubled, 1, pol, first=1).wgrad_s == 2.0
    assert simulate(doubled).iteration_time_s > simulate(prof).iteration_time_s
    plan = solvers.plan(doubled, "profile.json", "", "none", 1 << 60)
    assert [validate.predicted_stage(doubled, plan, s).backward_s for s in (0, 1)] == [4 * 2.5, 4 * 5.0]
