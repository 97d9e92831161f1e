"""Identities the simulator must satisfy, on synthetic profiles with exactly representable times."""

from __future__ import annotations

import pytest

from lynx_planner import evaluate as ev
from lynx_planner import simulator
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import Block, Layer, LayerPolicy, ModelInfo, Op, ParallelConfig, Profile, SolverInfo


def synthetic(pp: int, m: int, layers: int = 4, schedule: str = "1f1b", window: float = 0.0,
              transfer_bytes: int = 0, interference: float = 1.0, fwd_window: float = 0.0) -> Profile:
    """Layers of one compute op (fwd 1, bwd 2) around an optional backward-only collective of `window` seconds (and
    a forward-only one of `fwd_window` seconds)."""
    ops = [Op(id="a:mm#0", fwd_s=1.0, bwd_s=2.0, out_bytes=1000, inputs=["input"], saves=["input"])]
    if window:
        ops.insert(0, Op(id="a:tp_grad_all_reduce#0", kind="collective", fwd_s=0.0, bwd_s=window, out_bytes=0,
                         inputs=["input"]))
    if fwd_window:
        ops.insert(0, Op(id="a:tp_all_reduce#0", kind="collective", fwd_s=fwd_window, bwd_s=0.0, out_bytes=0,
                         inputs=["input"]))
    ops.append(Op(id="b:gelu#0", fwd_s=0.5, bwd_s=0.5, out_bytes=3000, inputs=["a:mm#0"], saves=["a:mm#0"]))
    hw = HARDWARE["a100-80g-nvlink"].model_copy(update={"inter_node_latency_s": 0.0, "intra_node_latency_s": 0.0,
                                                        "interference": interference})
    block = Block(name="layer", input_bytes=100, output_bytes=transfer_bytes, ops=ops)
    return Profile(model=ModelInfo(name="synthetic", source="test", params=0),
                   parallel=ParallelConfig(pp=pp, num_microbatches=m, schedule=schedule),
                   hardware=hw, blocks={"layer": block},
                   layers=[Layer(block="layer", name=f"layers.{i}", params=0, static_bytes=0)
                           for i in range(layers * pp)])


def even(profile: Profile) -> list[int]:
    n = len(profile.layers) // profile.parallel.pp
    return [s * n for s in range(profile.parallel.pp + 1)]


def run(profile: Profile, pols: list[LayerPolicy] | None = None) -> ev.Evaluation:
    pols = pols or [ev.none_policy(profile, i) for i in range(len(profile.layers))]
    return ev.evaluate(profile, ev.stage_plans(profile, even(profile), pols))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("pp,m", [(1, 1), (2, 4), (4, 4), (4, 16), (3, 2)])
def test_equal_stages_free_communication(schedule, pp, m):
    prof = synthetic(pp, m, schedule=schedule)
    t_f, t_b = 4 * 1.5, 4 * 2.5  # four layers per stage
    assert run(prof).predicted.iteration_time_s == (m + pp - 1) * (t_f + t_b)


@pytest.mark.parametrize("pp,m", [(4, 16), (4, 2), (2, 8)])
def test_peak_is_in_flight_times_layer_bytes(pp, m):
    prof = synthetic(pp, m)
    per_layer = 100 + 1000  # the input (saved by mm) and mm's output (saved by gelu)
    for s, st in enumerate(run(prof).predicted.stages):
        assert st.activation_bytes == min(m, pp - s) * 4 * per_layer


def test_transfers_delay_each_hop():
    slow = synthetic(2, 1, transfer_bytes=10**9)
    bus = slow.hardware.intra_node_bus_bytes_per_s
    # one micro-batch: F0, send, F1 B1, send, B0
    assert run(slow).predicted.iteration_time_s == pytest.approx(2 * 6.0 + 2 * 10.0 + 2 * 1e9 / bus)


def recompute_mm(profile: Profile, at: str, skip_top: bool = False) -> list[LayerPolicy]:
    """Drop mm's output (1000 B) and recompute it (1 s) in every layer; optionally keep all in each stage top."""
    n = len(profile.layers) // profile.parallel.pp
    return [ev.none_policy(profile, i) if skip_top and i % n == n - 1
            else ev.layer_policy(profile, i, frozenset(), ("a:mm#0",), at) for i in range(len(profile.layers))]


def test_recomputation_in_a_longer_window_is_free():
    prof = synthetic(2, 4, window=4.0)  # every layer's backward idles 4 s on its collective
    ideal = run(prof).predicted.iteration_time_s
    # below each stage's top layer, the layer above has a 4 s window for 1 s of work
    hidden = run(prof, recompute_mm(prof, "layer_above", skip_top=True)).predicted
    assert hidden.iteration_time_s == ideal
    assert sum(s.exposed_recompute_s for s in hidden.stages) == 0
    assert sum(s.hidden_recompute_s for s in hidden.stages) == 2 * 4 * 3 * 1.0
    on_demand = run(prof, recompute_mm(prof, "on_demand", skip_top=True)).predicted
    assert sum(s.exposed_recompute_s for s in on_demand.stages) == 2 * 4 * 3 * 1.0
    assert on_demand.iteration_time_s > ideal


def test_interference_shrinks_windows():
    tight = synthetic(1, 1, window=0.5, interference=2.0)  # 0.5 s window, 1 s of work at half speed
    got = run(tight, recompute_mm(tight, "layer_above")).predicted
    # the top layer has no window (one stage, no gradient wait); the three others hide 0.25 s each
    assert sum(s.exposed_recompute_s for s in got.stages) == 1.0 + 3 * 0.75
    assert sum(s.hidden_recompute_s for s in got.stages) == 3 * 0.25


def test_recomputed_tensors_live_until_their_backward():
    prof = synthetic(1, 1)
    kept = 4 * 100  # inputs only
    lazy = run(prof, recompute_mm(prof, "on_demand")).predicted.stages[0].activation_bytes
    assert lazy == kept + 1000  # one layer's regenerated output at a time
    wide = synthetic(2, 1, window=10.0)  # stage 0 waits for stage 1's backward: its layers recompute early
    pols = [ev.none_policy(wide, i) if i >= 4 else ev.layer_policy(wide, i, frozenset(), ("a:mm#0",), "grad_wait")
            for i in range(8)]
    early = run(wide, pols).predicted.stages[0].activation_bytes
    assert early == kept + 4 * 1000  # all four regenerated before stage 0's backward starts


def test_schedule_orders():
    assert simulator.schedule("1f1b", 4, 0, 6) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4),
                                                    ("B", 1), ("F", 5), ("B", 2), ("B", 3), ("B", 4), ("B", 5)]
    assert simulator.schedule("1f1b", 4, 3, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


def test_trace_has_a_track_per_stage_and_stream():
    prof = synthetic(2, 2, window=1.0)
    ev_ = ev.evaluate(prof, ev.stage_plans(prof, even(prof), recompute_mm(prof, "layer_above")), trace=True)
    tracks = {(e["pid"], e["tid"]) for e in ev_.sim.trace}
    assert {(0, "compute"), (1, "compute"), (0, "recompute (side)"), (0, "tp collective")} <= tracks


def test_prev_forward_fires_only_in_a_forward_of_another_micro_batch():
    """1F1B, 2 stages, 4 micro-batches, every layer's recomputation (1 s) placed prev_forward, 2 s of forward
    collectives per layer. Stage 0 (F0 F1 B0 F2 B1 F3 B2 B3): mb k < 3 is released at F(k + 1)'s start and hides in
    its collectives; B3 follows a backward, so mb 3 runs on demand. Stage 1 (F0 B0 F1 B1 ...): never fires."""
    prof = synthetic(2, 4, fwd_window=2.0)
    stages = ev.stage_plans(prof, even(prof), recompute_mm(prof, "prev_forward"))
    got = ev.evaluate(prof, stages, trace=True)
    s0, s1 = got.predicted.stages
    assert (s0.exposed_recompute_s, s0.hidden_recompute_s) == (4 * 1.0, 3 * 4 * 1.0)
    assert (s1.exposed_recompute_s, s1.hidden_recompute_s) == (4 * 4 * 1.0, 0.0)
    assert got.sim.releases[0][(0, 2)] == ("prev_forward", ("F", 1))
    assert got.sim.releases[0][(3, 2)] == ("on_demand", ("B", 3))
    assert set(got.sim.releases[1].values()) == {("on_demand", ("B", k)) for k in range(4)}
    # `check` says the placement is illegal on the last stage, and only there
    info = SolverInfo(name="heu", status="heuristic", search_time_s=0)
    limit = prof.hardware.memory_bytes
    problems = ev.check(ev.make_plan(prof, "p.json", "0" * 64, "heu", limit, stages, info, got), prof)
    assert problems and all("stage 1" in p and "prev_forward never fires" in p for p in problems), problems
    legal = [p if i < 4 else ev.layer_policy(prof, i, frozenset(), ("a:mm#0",), "on_demand")
             for i, p in enumerate(recompute_mm(prof, "prev_forward"))]
    stages = ev.stage_plans(prof, even(prof), legal)
    assert ev.check(ev.make_plan(prof, "p.json", "0" * 64, "heu", limit, stages, info), prof) == []


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
def test_placement_table(kind):
    from lynx_planner import placements

    for p in range(1, 6):
        for m in range(1, 9):
            for s in range(p):
                order = placements.schedule(kind, p, s, m)
                fires = placements.prev_forward_releases(kind, p, s, m)
                for j, k in fires.items():  # F(j) immediately precedes B(k), j != k
                    assert j != k and order[order.index(("F", j)) + 1] == ("B", k)
                assert len(fires) == sum(1 for a, b in zip(order, order[1:]) if a[0] == "F" and b[0] == "B"
                                         and a[1] != b[1])
                legal = "prev_forward" in placements.legal_placements(kind, p, s, m)
                assert legal == (simulator.in_flight(kind, p, s, m) >= 2)
    assert placements.prev_forward_releases("1f1b", 4, 0, 6) == {3: 0, 4: 1, 5: 2}
    assert placements.prev_forward_releases("gpipe", 2, 1, 3) == {2: 0}


def with_loss_head(prof: Profile, tokens: int, vocab: int) -> Profile:
    """`prof` plus an output layer as the last layer: its GEMM (bf16 logits, saves its input) and the training stack's
    cross-entropy on fp32 logits, which saves its fp32 log_softmax output (aux_bytes), as analytic/decoder.py."""
    from lynx_planner.policy import OUTSIDE

    head = Block(name="head", input_bytes=100, output_bytes=0, ops=[
        Op(id=":mm#0", fwd_s=1.0, bwd_s=2.0, out_bytes=2 * tokens * vocab, inputs=["input"], saves=["input"]),
        Op(id="loss:cross_entropy#0", fwd_s=0.5, bwd_s=0.5, out_bytes=4 * tokens, aux_bytes=4 * tokens * vocab,
           inputs=[":mm#0"], tags=[OUTSIDE])])
    return prof.model_copy(update={"blocks": {**prof.blocks, "head": head},
                                   "layers": prof.layers + [Layer(block="head", name="lm_head", params=0,
                                                                  static_bytes=0)]})


@pytest.mark.parametrize("m", [1, 4])
def test_loss_gradients_count_at_the_last_stage_backward_start(m):
    """The loss's backward holds, beside log_softmax's saved fp32 output, the fp32 gradient it receives and the one
    it makes: 2 x 4 bytes per token and vocabulary entry, from the head's backward start to its end. By hand, 6
    tokens, vocabulary 10: 480 bytes on the last stage (1F1B: one micro-batch in flight there), none on stage 0."""
    prof = with_loss_head(synthetic(2, m), tokens=6, vocab=10)
    assert simulator.loss_grad_bytes(prof.blocks["head"]) == 2 * 4 * 6 * 10
    pols = [ev.none_policy(prof, i) for i in range(len(prof.layers))]
    stages = ev.evaluate(prof, ev.stage_plans(prof, [0, 4, 9], pols)).predicted.stages
    layer = 100 + 1000  # as test_peak_is_in_flight_times_layer_bytes
    head = 100 + 4 * 6 * 10  # its input (saved by the GEMM) and the saved fp32 log_softmax output
    assert stages[0].activation_bytes == min(m, 2) * 4 * layer
    assert stages[1].activation_bytes == 4 * layer + head + 2 * 4 * 6 * 10
    # the searches' stage model leaves the same bytes out of the last stage's budget
    from lynx_planner.solvers.stage_model import stage_model
    budgets = [stage_model(prof, 1, 4, 9, 10**6, 0.0).budget, stage_model(prof, 0, 0, 4, 10**6, 0.0).budget]
    assert budgets == [10**6 - 480, 10**6]
