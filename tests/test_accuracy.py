"""The accuracy model (issue 17): compute efficiency by shape, backward GEMMs, the whole iteration (optimizer step),
the overlap options and rank order, the memory reserve, the new hardware kinds, and the published rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lynx_planner import costs, export
from lynx_planner import evaluate as ev
from lynx_planner.calibrate import fit_shape_model
from lynx_planner.models.hardware import HARDWARE, default_memory_limit, memory_reserve
from lynx_planner.schema import Block, Hardware, Layer, ModelInfo, Op, ParallelConfig, Profile
from lynx_planner.simulator import OPTIMIZER_BYTES_PER_PARAM, block_segments, block_segments_tp_overlap, simulate

from test_dp import P, iteration, synthetic

GiB = 1 << 30
A100 = HARDWARE["a100-80g-nvlink"]
FLAT = A100.model_copy(update={"gemm_half_dim": None, "gemm_backward_efficiency": None,
                               "attention_half_flops": None})


# ---------------------------------------------------------------------------------------------- compute by shape


def test_flat_hardware_keeps_the_old_meaning():
    """Hardware files without the shape fields: a GEMM is 2mkn / (peak x efficiency), backward twice that."""
    f = costs.gemm_fwd_s(1000, 2000, 3000, FLAT)
    assert f == 2.0 * 1000 * 2000 * 3000 / (FLAT.peak_flops * FLAT.gemm_efficiency)
    assert costs.gemm_bwd_s(1000, 2000, 3000, FLAT) == 2 * f
    assert costs.attention_s(1e12, FLAT, per_head_flops=1e6) == 1e12 / (FLAT.peak_flops * FLAT.attention_efficiency)


def test_efficiency_grows_with_each_output_dimension_towards_the_top():
    d = A100.gemm_half_dim
    assert costs.shape_efficiency(int(d), 10**9, 10**9, A100) == pytest.approx(A100.gemm_efficiency / 2, rel=1e-6)
    assert costs.shape_efficiency(10**9, 7, int(d), A100) == pytest.approx(A100.gemm_efficiency / 2, rel=1e-6)
    narrow, wide = costs.shape_efficiency(2048, 6144, 768, A100), costs.shape_efficiency(2048, 6144, 3200, A100)
    assert narrow < wide < A100.gemm_efficiency
    few, many = costs.shape_efficiency(512, 6144, 3200, A100), costs.shape_efficiency(8192, 6144, 3200, A100)
    assert few < many
    # per FLOP, the 1T model's MLP GEMM at tp 8 (12800 columns per rank) beats the 1.7B's at tp 1 (9216)
    t_small = costs.gemm_fwd_s(2048, 2304, 9216, A100) / (2048 * 2304 * 9216)
    t_large = costs.gemm_fwd_s(2048, 25600, 12800, A100) / (2048 * 25600 * 12800)
    assert t_large < t_small


def test_skinny_gemm_is_bound_by_moving_its_operands():
    hw = A100.model_copy(update={"gemm_half_dim": 1.0})  # shape losses aside
    m, k, n = 65536, 8, 65536  # 2mkn is small; the m x n output's bytes dominate
    moved = costs.memory_s(2 * (m * k + k * n + m * n), hw)
    assert costs.gemm_fwd_s(m, k, n, hw) == pytest.approx(moved + costs.KERNEL_S, rel=1e-12)


def test_backward_is_dgrad_plus_wgrad_each_on_its_shape():
    m, k, n = 8192, 768, 6144  # 22B's attention projection at tp 8: a short k makes dgrad and wgrad narrow
    be = A100.gemm_backward_efficiency
    fwd = costs.gemm_fwd_s(m, k, n, A100)
    dgrad, wgrad = costs.gemm_fwd_s(m, n, k, A100), costs.gemm_fwd_s(k, m, n, A100)
    assert costs.gemm_bwd_s(m, k, n, A100) == pytest.approx((dgrad + wgrad) / be, rel=1e-12)
    assert dgrad > fwd and wgrad > fwd  # their outputs have the short side
    assert costs.gemm_bwd_s(m, k, n, A100) > 2 * fwd / be


def test_a_batched_gemm_fills_the_waves_its_small_side_leaves_idle():
    s, d, heads = 2048, 96, 32  # p v of math attention: per (batch, head) [s, s] @ [s, d]
    one = costs.shape_efficiency(s, s, d, A100)
    assert costs.shape_efficiency(s, s, d, A100, batch=heads) == pytest.approx(
        costs.shape_efficiency(s, s, d * heads, A100), rel=1e-12)  # as if stacked along the small side
    assert costs.shape_efficiency(s, s, d, A100, batch=heads) > one
    # the roofline counts every product's operands: here the batch is memory-bound, 2 bytes x (sk + kd + sd) each
    moved = costs.memory_s(2 * heads * (s * s + s * d + s * d), A100)
    assert costs.gemm_fwd_s(s, s, d, A100, batch=heads) == pytest.approx(moved + costs.KERNEL_S, rel=1e-12)
    # backward: per product, dgrad [s, d] @ [d, s] and the second operand's gradient [s, s]ᵀ @ [s, d]
    be = A100.gemm_backward_efficiency
    assert costs.gemm_bwd_s(s, s, d, A100, batch=heads) == pytest.approx(
        (costs.gemm_fwd_s(s, d, s, A100, batch=heads) + costs.gemm_fwd_s(s, s, d, A100, batch=heads)) / be)


def test_math_attention_prices_its_gemms_per_head():
    from lynx_planner.analytic import gpt_layer_block
    from lynx_planner.models.catalog import GPTConfig

    par = ParallelConfig(tp=8, micro_batch_size=4)
    block = gpt_layer_block(GPTConfig("22b", 48, 6144, 64), par, A100, "math", 0.1)
    ops = {o.id: o for o in block.ops}
    b, heads, s, d = 4, 8, 2048, 96
    qk = ops["attn.core:baddbmm#0"]
    assert qk.flops == 2.0 * b * heads * s * d * s
    assert qk.fwd_s == costs.gemm_fwd_s(s, d, s, A100, batch=b * heads)
    assert ops["attn.core:bmm#0"].bwd_s == costs.gemm_bwd_s(s, s, d, A100, batch=b * heads)
    assert ops["attn.core:bmm#0"].out_bytes == 2 * b * heads * s * d


def test_cross_entropy_makes_megatrons_passes_over_the_logits():
    from lynx_planner.analytic import lm_head_block
    from lynx_planner.analytic.ops import CE_BWD_BYTES, CE_FWD_BYTES, cross_entropy_s
    from lynx_planner.models.catalog import GPTConfig

    n, v = 4096, 131072
    fwd, bwd = cross_entropy_s(n, v, A100, 1)
    assert (CE_FWD_BYTES, CE_BWD_BYTES) == (38, 14)  # six passes forward, two backward (ops.py)
    assert fwd == costs.memory_s(38 * n * v, A100) and bwd == costs.memory_s(14 * n * v, A100)
    assert cross_entropy_s(n, v // 8, A100, 8)[0] == pytest.approx(
        costs.memory_s(38 * n * v // 8, A100) + 3 * A100.intra_node_latency_s)  # three tiny all-reduces under TP
    par = ParallelConfig(tp=2, seq_len=2048, micro_batch_size=2)
    loss = lm_head_block(GPTConfig("x", 2, 1024, 16, vocab=v), par, A100).ops[-1]
    assert (loss.fwd_s, loss.bwd_s) == cross_entropy_s(4096, v // 2, A100, 2)
    # the decoder families (Llama, Qwen, Mixtral, ...) price their loss, outside lm_head, the same way
    from lynx_planner.analytic.decoder import _lm_head
    from lynx_planner.models.catalog import MODELS, as_spec

    llama = as_spec(MODELS["llama3-8b"])
    loss = _lm_head(llama, par, A100).ops[-1]
    assert loss.id == "loss:cross_entropy#0"
    assert (loss.fwd_s, loss.bwd_s) == cross_entropy_s(4096, llama.vocab // 2, A100, 2)


def test_the_hopper_die_sustains_less_of_its_datasheet_peak():
    from lynx_planner.models import hardware as H

    for name in ("h100-80g-nvlink", "h200-141g-nvlink"):
        hw = HARDWARE[name]
        assert hw.gemm_efficiency == pytest.approx(H.GEMM_EFFICIENCY * H.HOPPER_SUSTAINED)
        assert hw.attention_efficiency == pytest.approx(H.ATTENTION_EFFICIENCY * H.HOPPER_SUSTAINED)
    assert A100.gemm_efficiency == H.GEMM_EFFICIENCY and H.HOPPER_SUSTAINED < 1


def test_attention_efficiency_grows_with_the_work_of_a_head():
    per_flop_short = costs.attention_s(1e12, A100, per_head_flops=2 * 1024**2 * 64) / 1e12
    per_flop_long = costs.attention_s(1e12, A100, per_head_flops=2 * 8192**2 * 128) / 1e12
    assert per_flop_long < per_flop_short
    assert per_flop_long == pytest.approx(1 / (A100.peak_flops * A100.attention_efficiency), rel=0.01)


def test_calibrate_recovers_a_known_shape_model():
    top, d = 5e10, 64.0
    shapes = [(128, 128, 128), (512, 512, 512), (1024, 64, 1024), (64, 1024, 1024), (2048, 256, 1024)]
    times = {s: 2.0 * s[0] * s[1] * s[2] / (top * s[0] / (s[0] + d) * s[1] / (s[1] + d) * s[2] / (s[2] + d))
             for s in shapes}
    got_top, got_d = fit_shape_model(times)
    assert got_d == d
    assert got_top == pytest.approx(top, rel=1e-9)


# ---------------------------------------------------------------------------------------------- the whole iteration


def test_optimizer_step_ends_the_iteration():
    base = synthetic(1)
    with_step = base.model_copy(update={"parallel": base.parallel.model_copy(update={"optimizer_step": True})})
    step = OPTIMIZER_BYTES_PER_PARAM * 2 * P / (base.hardware.hbm_bytes_per_s * base.hardware.memory_efficiency)
    assert iteration(with_step) == pytest.approx(iteration(base) + step)  # one rank: the norm all-reduce is free


def test_distributed_optimizer_steps_on_its_shard_only():
    def step_s(dist: bool) -> float:
        prof = synthetic(2, distributed_optimizer=dist)
        on = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"optimizer_step": True})})
        return iteration(on) - iteration(prof)

    hw = synthetic(2).hardware
    full = OPTIMIZER_BYTES_PER_PARAM * 2 * P / (hw.hbm_bytes_per_s * hw.memory_efficiency)
    # the norm's one-number all-reduce over 2 ranks at zero latency costs ~nothing
    assert step_s(False) == pytest.approx(full, rel=1e-6)
    assert step_s(True) == pytest.approx(full / 2, rel=1e-6)


def test_without_grad_reduce_overlap_the_reduction_follows_the_backward():
    prof = synthetic(2)
    off = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"overlap_grad_reduce": False})})
    assert iteration(prof) == pytest.approx(19.5)  # test_dp: overlapped with the last backward
    assert iteration(off) == pytest.approx(16.0 + 2 * 3.0)  # both layers' 3 s all-reduces after compute ends


def test_overlap_param_gather_hides_the_weight_all_gather():
    prof = synthetic(2, distributed_optimizer=True)
    on = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"overlap_param_gather": True})})
    assert iteration(prof) == pytest.approx(19.0)  # test_dp: 17.5 + 1.5 s all-gather
    assert iteration(on) == pytest.approx(17.5)


def test_overlap_param_gather_needs_the_distributed_optimizer():
    with pytest.raises(ValueError, match="distributed_optimizer"):
        ParallelConfig(dp=2, overlap_param_gather=True)
    with pytest.raises(ValueError, match="sequence_parallel"):
        ParallelConfig(tp=2, tp_comm_overlap=True)


# ---------------------------------------------------------------------------------------------- overlaps and links


def _tp_block() -> Block:
    ops = [Op(id="a:tp_all_gather#0", kind="collective", fwd_s=3.0, bwd_s=3.0, out_bytes=0, inputs=["input"]),
           Op(id="a:mm#0", fwd_s=2.0, bwd_s=4.0, out_bytes=10, inputs=["a:tp_all_gather#0"]),
           Op(id="b:tp_reduce_scatter#0", kind="collective", fwd_s=1.0, bwd_s=1.0, out_bytes=10, inputs=["a:mm#0"])]
    return Block(name="b", input_bytes=1, output_bytes=1, ops=ops)


def test_tp_comm_overlap_hides_collectives_behind_their_gemm():
    block = _tp_block()
    assert block_segments(block) == ((0.0, 3.0, 2.0, 1.0), (0.0, 1.0, 4.0, 3.0))
    # forward: the all-gather outlasts its 2 s GEMM by 1 s; the reduce-scatter hides entirely. Backward: 4 s GEMM.
    assert block_segments_tp_overlap(block) == ((0.0, 1.0, 2.0, 0.0), (0.0, 0.0, 4.0, 0.0))


def test_without_the_async_all_reduce_the_input_gradients_collective_is_exposed():
    """Megatron before 2021-09 (the sc21 runs) all-reduced a column-parallel GEMM's input gradient after its whole
    backward; the async all-reduce runs it beside the weight-gradient GEMM. Analytic and traced profiles alike."""
    from lynx_planner.analytic import gpt_profile
    from lynx_planner.models.catalog import GPTConfig

    cfg = GPTConfig("g", 2, 1024, 16, vocab=8192)
    par = ParallelConfig(tp=2, seq_len=1024)
    on, off = (gpt_profile(cfg, par.model_copy(update={"async_tp_allreduce": a}), A100).blocks["gpt_layer"]
               for a in (True, False))
    grad = [op for op in off.ops if op.id.endswith("tp_grad_all_reduce#0")]
    assert len(grad) == 2 and all(op.bwd_s > 0 and op.bwd_overlap_s == 0 for op in grad)
    assert all(op.bwd_overlap_s > 0 for op in on.ops if op.id.endswith("tp_grad_all_reduce#0"))
    idle_on, idle_off = (sum(block_segments(b)[1][1::2]) for b in (on, off))
    assert idle_off == pytest.approx(idle_on + sum(min(op.bwd_s, o.bwd_overlap_s) for op, o in
                                                   zip(grad, [o for o in on.ops if o.id in {g.id for g in grad}])))
    assert "async_tp_allreduce" not in ParallelConfig().model_dump_json()  # the default keeps stored bytes
    old = ParallelConfig(async_tp_allreduce=False, overlap_p2p_comm=False, grad_reduce_in_fp32=False,
                         gradient_accumulation_fusion=False, contiguous_grad_buffers=False)
    assert ParallelConfig.model_validate_json(old.model_dump_json()) == old  # written and read back
    from lynx_planner.profiler import tp as tp_shard

    ops: list[Op] = []
    gemm = Op(id="a:mm#0", fwd_s=2.0, bwd_s=4.0, out_bytes=10)
    for a in (True, False):
        tp_shard._before_column(ops, gemm, "input", 100, 2, False, (1e9, 0.0), a)
    assert [op.bwd_overlap_s for op in ops] == [2.0, 0.0]


def _two_stage(par: ParallelConfig, hw: Hardware, layers: int = 2) -> Profile:
    ops = [Op(id="a:mm#0", fwd_s=1.0, bwd_s=2.0, out_bytes=10, inputs=["input"], saves=["input"])]
    return Profile(model=ModelInfo(name="s", source="test", params=0), parallel=par, hardware=hw,
                   blocks={"l": Block(name="l", input_bytes=10, output_bytes=8 * 10**9, ops=ops)},
                   layers=[Layer(block="l", name=f"layers.{i}", params=0, static_bytes=0) for i in range(layers)])


def test_megatron_rank_order_and_p2p_link_price_the_stage_transfers():
    hw = A100.model_copy(update={"intra_node_bus_bytes_per_s": 100e9, "inter_node_bus_bytes_per_s": 10e9,
                                 "intra_node_latency_s": 0.0, "inter_node_latency_s": 0.0,
                                 "p2p_bytes_per_s": 50e9, "p2p_latency_s": 0.0})
    old = _two_stage(ParallelConfig(tp=2, pp=2, dp=4, num_microbatches=1), hw)
    new = old.model_copy(update={"parallel": old.parallel.model_copy(update={"rank_order": "tp-dp-pp"})})
    near = old.model_copy(update={"parallel": ParallelConfig(tp=2, pp=2, dp=2, num_microbatches=1,
                                                             rank_order="tp-dp-pp")})
    # one forward and one backward transfer of 8 GB; 1 + 2 + 2 + 1 s of compute
    assert iteration(old) == pytest.approx(6 + 2 * 8e9 / 100e9)  # before: the link over tp x pp = 4 ranks
    # Megatron's order: each of the 2 TP ranks sends half (scatter-gather), then they all-gather it over NVLink
    gather = 8e9 / 2 / 100e9
    assert iteration(new) == pytest.approx(6 + 2 * (4e9 / 10e9 + gather))  # tp x dp = 8 ranks apart: another node
    assert iteration(near) == pytest.approx(6 + 2 * (4e9 / 50e9 + gather))  # 4 ranks apart, same node: p2p link
    # with sequence parallelism the boundary tensor is already split: each rank sends its own share, no gather
    sp = new.model_copy(update={"parallel": new.parallel.model_copy(update={"sequence_parallel": True})})
    assert iteration(sp) == pytest.approx(6 + 2 * 8e9 / 10e9)



def test_a_model_file_pipeline_sends_over_the_measured_p2p_link():
    """A model file's profile lays its ranks out as torch.distributed.pipelining does (neighbouring stages 1 rank apart
    at tp = dp = 1), so a calibrated hardware file's measured point-to-point send prices each activation and
    gradient transfer, not its all-reduce figures: the send of the example GPT's [2, 64, 128] fp32 boundary tensor
    (64 KiB) at 1 ms + 64 KiB / 0.5 GB/s."""
    from lynx_planner.profiler import profile_model_file
    from lynx_planner.simulator import send_s

    hw = A100.model_copy(update={"device": "cpu", "backend": "gloo", "gpus_per_node": 2,
                                 "intra_node_bus_bytes_per_s": 1e9, "intra_node_latency_s": 0.25e-3,
                                 "p2p_bytes_per_s": 0.5e9, "p2p_latency_s": 1e-3})
    path = str(Path(__file__).parents[1] / "examples" / "gpt_model.py")
    prof = profile_model_file(path, parallel=ParallelConfig(pp=2), hardware=hw, progress=False)
    assert prof.parallel.rank_order == "tp-dp-pp"
    boundary = 2 * 64 * 128 * 4
    assert send_s(prof, boundary) == pytest.approx(1e-3 + boundary / 0.5e9)
    # before (no rank order): the collective link spanning the 2 ranks, its all-reduce latency
    old = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"rank_order": None})})
    assert send_s(old, boundary) == pytest.approx(0.25e-3 + boundary / 1e9)
    assert iteration(prof) > iteration(old)

def _blocking(prof: Profile, **kw) -> Profile:
    return prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"overlap_p2p_comm": False, **kw})})


def test_blocking_p2p_sends_wait_for_both_ends_and_hold_the_sender():
    """Megatron's batched blocking p2p (before --overlap-p2p-communication, and its 1F1B): a rank posts its sends and
    its next receive when an item ends; a transfer starts once both ends have posted; the sender waits it out."""
    hw = A100.model_copy(update={"intra_node_bus_bytes_per_s": 100e9, "intra_node_latency_s": 0.0})
    prof = _two_stage(ParallelConfig(pp=2, num_microbatches=2), hw)  # F 1 s, B 2 s per stage; S = 8 GB / 100 GB/s
    S = 8e9 / 100e9
    assert iteration(prof) == pytest.approx(9 + 2 * S)  # sends beside compute: F0, F1 and both gradients in flight
    # rank 1 sends B0's gradient (S) before F1: one more S on the critical path
    assert iteration(_blocking(prof)) == pytest.approx(9 + 3 * S)
    # Megatron's order, tp 2: a rank sends half (H) and the receivers all-gather (G); the sender waits out H only,
    # but rank 1 posts F1's receive after B0, so that transfer (H + G) starts then: 9 + 3 (H + G), not 9 + 2S + H
    mega = _two_stage(ParallelConfig(tp=2, pp=2, num_microbatches=2, rank_order="tp-dp-pp"),
                      hw.model_copy(update={"p2p_bytes_per_s": 50e9, "p2p_latency_s": 0.0}))
    H, G = 4e9 / 50e9, 4e9 / 100e9
    assert iteration(mega) == pytest.approx(9 + 2 * (H + G))
    assert iteration(_blocking(mega)) == pytest.approx(9 + 3 * (H + G))
    runs = ev.runs_of(mega, ev.stage_plans(mega, [0, 1, 2], [ev.none_policy(mega, i) for i in range(2)]))
    starts = {e["name"]: e["ts"] for e in simulate(_blocking(mega), runs, trace=True).trace if e["pid"] == 0}
    assert starts["F mb1 L0"] == pytest.approx((1 + H) * 1e6)  # the sender waits out its half, not the gather
    runs = ev.runs_of(prof, ev.stage_plans(prof, [0, 1, 2], [ev.none_policy(prof, i) for i in range(2)]))
    starts = {e["name"]: e["ts"] for e in simulate(_blocking(prof), runs, trace=True).trace if e["pid"] == 0}
    assert starts["F mb1 L0"] == pytest.approx((1 + S) * 1e6)  # rank 0 sends F0's output before it starts F1
    light = prof.model_copy(update={"blocks": {"l": prof.blocks["l"].model_copy(update={"output_bytes": 0})}})
    assert iteration(_blocking(light)) == pytest.approx(iteration(light))  # nothing to send: nothing changes
    assert "overlap_p2p_comm" not in ParallelConfig().model_dump_json()


def test_blocking_interleaved_sends_a_forward_with_the_backward_after_it():
    """Interleaved 1F1B without p2p overlap (Megatron's send_forward_backward_recv_forward_backward): in the steady
    state a forward's output leaves only after the backward that follows it on its rank."""
    from lynx_planner import schedules

    hw = A100.model_copy(update={"intra_node_bus_bytes_per_s": 100e9, "intra_node_latency_s": 0.0})
    par = ParallelConfig(pp=2, num_microbatches=4, schedule="interleaved-1f1b", virtual_stages=2)
    prof = _blocking(_two_stage(par, hw, layers=4))  # one layer per chunk
    runs = ev.runs_of(prof, ev.stage_plans(prof, [0, 1, 2, 3, 4], [ev.none_policy(prof, i) for i in range(4)]))
    trace = simulate(prof, runs, trace=True).trace
    start = {(e["pid"], e["name"]): e["ts"] for e in trace if e["tid"] == "compute"}
    end = {(e["pid"], e["name"]): e["ts"] + e["dur"] for e in trace if e["tid"] == "compute"}
    paired = 0
    for r in range(2):
        order = schedules.order(par.schedule, 2, 2, r, 4)
        for i, ((a, c, k), (b, cb, kb)) in enumerate(zip(order, order[1:])):
            assert (i in schedules.interleaved.paired_sends(2, 2, r, 4)) == (a == "F" and b == "B")  # steady state
            if a == "F" and b == "B" and c < 3:
                paired += 1
                recv = ((c + 1) % 2, f"F mb{k} L{c + 1}")
                assert start[recv] >= end[(r, f"B mb{kb} L{cb}")] - 1e-6  # not before the paired backward ends
    assert paired > 0


@pytest.mark.parametrize("p, v", [(3, 2), (3, 3), (4, 2)])
def test_blocking_interleaved_with_every_forward_in_warm_up_sends_them_alone(p, v):
    """m = p: every forward of rank 0 is warm-up (Megatron's all_warmup_microbatches), so none waits for a backward;
    pairing its last forward with the first backward, whose gradient needs that very output, deadlocked."""
    from lynx_planner import schedules
    from lynx_planner.schedules import interleaved

    hw = A100.model_copy(update={"intra_node_bus_bytes_per_s": 100e9, "intra_node_latency_s": 0.0})
    par = ParallelConfig(pp=p, num_microbatches=p, schedule="interleaved-1f1b", virtual_stages=v)
    prof = _two_stage(par, hw, layers=p * v)
    assert interleaved.warmup(p, v, 0, p) == p * v and not interleaved.paired_sends(p, v, 0, p)
    order = schedules.order(par.schedule, p, v, 0, p)
    assert [a for a, _, _ in order[p * v - 1:p * v + 1]] == ["F", "B"]  # adjacent, yet not a steady-state pair

    def chunked(profile: Profile) -> float:  # one layer per chunk
        pols = [ev.none_policy(profile, i) for i in range(p * v)]
        plans = ev.stage_plans(profile, list(range(p * v + 1)), pols)
        return ev.evaluate(profile, plans).predicted.iteration_time_s

    assert chunked(_blocking(prof)) >= chunked(prof)


def test_sixteen_bit_gradients_halve_the_reduction_and_add_the_fp16_step_passes():
    from lynx_planner.simulator import FP16_GRAD_STEP_BYTES_PER_PARAM

    prof = synthetic(2)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"overlap_grad_reduce": False})})
    fp16 = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"grad_reduce_in_fp32": False})})
    assert iteration(prof) == pytest.approx(16.0 + 2 * 3.0)  # test_dp: 3 s per layer in fp32
    assert iteration(fp16) == pytest.approx(16.0 + 2 * 1.5)
    step = [p.model_copy(update={"parallel": p.parallel.model_copy(update={"optimizer_step": True, "dp": 1})})
            for p in (prof, fp16)]
    extra = FP16_GRAD_STEP_BYTES_PER_PARAM * 2 * P / (A100.hbm_bytes_per_s * A100.memory_efficiency)
    assert iteration(step[1]) == pytest.approx(iteration(step[0]) + extra)


def test_without_contiguous_buffers_the_gradients_are_copied_to_buckets_and_back():
    prof = synthetic(2)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"overlap_grad_reduce": False})})
    off = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"contiguous_grad_buffers": False})})
    copies = 3 * 2 * 4 * 2 * P / (A100.hbm_bytes_per_s * A100.memory_efficiency)  # copy in, divide, copy out
    assert iteration(off) == pytest.approx(iteration(prof) + copies)
    one = [p.model_copy(update={"parallel": p.parallel.model_copy(update={"dp": 1, "optimizer_step": True})})
           for p in (prof, off)]
    assert iteration(one[1]) == iteration(one[0])  # nothing to reduce: no buckets


def test_without_gradient_accumulation_fusion_each_weight_gemm_adds_its_gradient():
    from lynx_planner.analytic import gpt_profile
    from lynx_planner.analytic.ops import grad_accum_bytes
    from lynx_planner.models.catalog import GPTConfig

    cfg = GPTConfig("g", 2, 1024, 16, vocab=8192)
    par = ParallelConfig(seq_len=1024, num_microbatches=4)
    assert grad_accum_bytes(par) == 0.0
    off = par.model_copy(update={"gradient_accumulation_fusion": False})
    assert grad_accum_bytes(off) == pytest.approx((2 + 2 * 4) * 3 / 4)  # read 2, read and write fp32; not mb 0
    assert grad_accum_bytes(off.model_copy(update={"grad_reduce_in_fp32": False})) == pytest.approx(6 * 3 / 4)
    assert grad_accum_bytes(off.model_copy(update={"num_microbatches": 1})) == 0.0
    from lynx_planner.analytic.decoder import decoder_profile
    from lynx_planner.models.catalog import MODELS

    with pytest.raises(ValueError, match="gpt family only"):  # the decoder families' cached blocks ignore it
        decoder_profile(MODELS["llama3-8b"], off, A100)
    on_b, off_b = (gpt_profile(cfg, p, A100, "math").blocks["gpt_layer"] for p in (par, off))
    for a, b in zip(on_b.ops, off_b.ops):
        if a.id == "mlp.fc1:addmm#0":  # weight [1024, 4096]
            acc = grad_accum_bytes(off) * 1024 * 4096 / (A100.hbm_bytes_per_s * A100.memory_efficiency)
            assert b.bwd_s == pytest.approx(a.bwd_s + acc)
        elif a.id.startswith("attn.core:"):  # activations times activations: no weight
            assert b.bwd_s == a.bwd_s


def test_a_group_with_several_gpus_per_node_crosses_nodes_on_several_nics():
    hw = A100.model_copy(update={"intra_node_bus_bytes_per_s": 200e9, "inter_node_bus_bytes_per_s": 20e9,
                                 "gpus_per_node": 8, "nics_per_node": 8})
    assert costs.group_link(hw, 8, 1) == costs.link(hw, 8)  # within a node
    assert costs.group_link(hw, 32, 8)[0] == 20e9  # tp 8: one GPU per node in the DP group, one NIC
    assert costs.group_link(hw, 32, 2)[0] == 80e9  # tp 2: 4 per node, 4 rings
    assert costs.group_link(hw, 32, 1)[0] == 160e9  # tp 1: 8 per node, 8 NICs
    assert costs.group_link(hw.model_copy(update={"inter_node_bus_bytes_per_s": 40e9}), 32, 1)[0] == 200e9  # capped
    # one GPU per node: its ring never crosses the intra-node link, which does not bound it
    assert costs.group_link(hw.model_copy(update={"inter_node_bus_bytes_per_s": 300e9}), 32, 8)[0] == 300e9
    old = hw.model_copy(update={"nics_per_node": None})  # hardware files without the field: one NIC's worth
    assert costs.group_link(old, 32, 1) == costs.link(old, 32)
    # the simulator's DP reduction over 16 ranks on 2 nodes (test_dp's links: 4 GB/s in a node, 1 GB/s a NIC),
    # after the backward: each of the 2 layers all-reduces 4 P bytes, over 1 NIC's ring or min(8 x 1, 4) GB/s
    prof = synthetic(16)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"overlap_grad_reduce": False})})
    one, eight = (prof.model_copy(update={"hardware": prof.hardware.model_copy(update={"nics_per_node": n})})
                  for n in (None, 8))
    ring = 2 * 15 / 16 * 4 * P
    assert iteration(one) == pytest.approx(16.0 + 2 * ring / 1e9)
    assert iteration(eight) == pytest.approx(16.0 + 2 * ring / 4e9)


def test_defaults_leave_stored_profiles_bytes_unchanged():
    """A profile written before the newer fields existed (the shipped one with them taken out) loads and writes back
    without them: their defaults are left out of the JSON."""
    stored = json.loads(Path("profiles/gpt-13b-a100-80g-nvlink-tp4-pp4-mb1-m16.json").read_text())
    for key in ("optimizer_step", "rank_order"):
        stored["parallel"].pop(key)
    for key in ("gemm_half_dim", "gemm_backward_efficiency", "attention_half_flops", "nics_per_node"):
        stored["hardware"].pop(key)
    again = json.loads(Profile.model_validate(stored).model_dump_json())
    assert again["parallel"] == stored["parallel"] and again["hardware"] == stored["hardware"]


def test_megatron_export_names_the_overlaps():
    from conftest import small_profile

    prof = small_profile(tp=2, pp=2, sp=True)
    par = prof.parallel.model_copy(update={"dp": 2, "distributed_optimizer": True, "overlap_param_gather": True,
                                           "tp_comm_overlap": True, "overlap_grad_reduce": False})
    prof = prof.model_copy(update={"parallel": par})
    from lynx_planner import solvers

    res = solvers.solve(prof, "full", 1 << 50)
    plan = ev.make_plan(prof, "p.json", "", "full", 1 << 50, res.stages, res.solver)
    flags = export.megatron(plan, prof).flags
    assert "--overlap-param-gather" in flags and "--tp-comm-overlap" in flags
    assert "--overlap-grad-reduce" not in flags and "--use-distributed-optimizer" in flags
    assert not any("async_tp_allreduce" in n for n in export.megatron(plan, prof).not_expressible)
    old = prof.model_copy(update={"parallel": par.model_copy(update={"async_tp_allreduce": False})})
    assert any("async_tp_allreduce" in n for n in export.megatron(plan, old).not_expressible)
    assert "--no-gradient-accumulation-fusion" not in flags and "--no-overlap-p2p-communication" not in flags
    sc21 = prof.model_copy(update={"parallel": par.model_copy(update={
        "gradient_accumulation_fusion": False, "grad_reduce_in_fp32": False, "overlap_p2p_comm": False})})
    out = export.megatron(plan, sc21)
    assert "--no-gradient-accumulation-fusion" in out.flags
    assert "--no-overlap-p2p-communication" not in out.flags  # 1F1B: Megatron's sends block anyway
    assert any("grad_reduce_in_fp32" in n for n in out.not_expressible)
    assert not any("overlap_p2p_comm true" in n for n in out.not_expressible)  # priced blocking, as Megatron runs it
    assert any("overlap_p2p_comm true" in n for n in export.megatron(plan, prof).not_expressible)  # priced overlapped
    assert not any("contiguous" in n for n in out.not_expressible)
    lists = prof.model_copy(update={"parallel": par.model_copy(update={"contiguous_grad_buffers": False})})
    assert any("contiguous_grad_buffers" in n for n in export.megatron(plan, lists).not_expressible)
    inter = small_profile(tp=2, pp=2, m=4)
    inter = inter.model_copy(update={"parallel": inter.parallel.model_copy(update={
        "schedule": "interleaved-1f1b", "virtual_stages": 2, "overlap_p2p_comm": False})})
    res = solvers.solve(inter, "full", 1 << 50)
    iplan = ev.make_plan(inter, "p.json", "", "full", 1 << 50, res.stages, res.solver)
    assert "--no-overlap-p2p-communication" in export.megatron(iplan, inter).flags
    flags_known = set(Path("tests/data/megatron_flags.txt").read_text().split())
    assert {"--no-gradient-accumulation-fusion", "--no-overlap-p2p-communication"} <= flags_known


# ---------------------------------------------------------------------------------------------- memory reserve


def test_default_memory_limit_is_the_device_less_the_reserve():
    assert memory_reserve(A100) == GiB + int(0.04 * 80 * GiB)
    assert default_memory_limit(A100) == 80 * GiB - memory_reserve(A100)
    own = A100.model_copy(update={"memory_reserve_bytes": 3 * GiB})
    assert default_memory_limit(own) == 77 * GiB
    tiny = A100.model_copy(update={"memory_bytes": GiB})
    assert default_memory_limit(tiny) == GiB // 2  # never more than half the device


def test_tune_uses_the_default_limit():
    from lynx_planner import tune

    res = tune.tune("gpt-1.3b", 8, HARDWARE["a100-80g-nvlink"], 64, seq_len=1024, top=1)
    best = res.rows[0]
    assert best.peak_memory_bytes <= default_memory_limit(HARDWARE["a100-80g-nvlink"])


# ---------------------------------------------------------------------------------------------- hardware kinds


@pytest.mark.parametrize("name,tflops,mem_gib,hbm", [("h200-141g-nvlink", 989.5, 141, 4800),
                                                     ("b200-180g-nvlink", 2250.0, 180, 8000),
                                                     ("mi300x-192g", 1307.4, 192, 5300)])
def test_current_gpus_with_their_datasheet_peaks(name, tflops, mem_gib, hbm):
    hw = HARDWARE[name]
    assert hw.peak_flops == tflops * 1e12 and hw.memory_bytes == mem_gib * GiB and hw.hbm_bytes_per_s == hbm * 1e9
    assert "datasheet" in hw.notes


# ---------------------------------------------------------------------------------------------- published rows


def test_a100_rows_within_tolerance():
    """Korthikanti's tables (the shape model is fitted there) and Narayanan's Table 1 (checked, with the settings of
    the authors' Megatron: benchmarks/published_runs.py N1_SETTINGS)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import published_runs as pr

    rows = pr.korthikanti_4() + pr.korthikanti_5() + pr.narayanan_1()
    off = [(r.label, round(r.ratio, 3)) for r in rows
           if abs(r.ratio - 1) > (pr.RATIO_TOLERANCE if r.unit == "x" else pr.TOLERANCE)]
    assert not off


def test_h100_rows_within_tolerance_with_the_tune_rule():
    """Megatron-LM's H100 table: HOPPER_SUSTAINED is fitted on its pp 1 rows, its pp > 1 rows are the check; the
    micro-batch, schedule and recomputation are what the `tuned` rule picks, named in each row's note."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import published_runs as pr

    rows = pr.megatron_h100()
    assert len(rows) == 9 and all(r.note.startswith("mb") for r in rows)
    assert [(r.label, round(r.ratio, 3)) for r in rows if abs(r.ratio - 1) > pr.TOLERANCE] == []


def test_torchtitan_memory_terms_add_up_and_count_llama_3_8b():
    """The torchtitan-1 memory rows' term table: the hand count of torchtitan's tensors is of Llama 3.1 8B (its
    sharded fp32 parameters and Adam state: 12 bytes of 8,030,261,248 parameters over 8 ranks, the count transformers
    gives in test_fsdp_cp), lynx's terms add up to the simulator's peak, the final norm's and the loss's agree (the
    loss's: log_softmax's saved fp32 output and, in its backward, the two fp32 logits gradients the simulator holds
    over the output layer's backward), and every other term differs by what its note names."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import published_runs as pr

    assert pr.torchtitan_memory_by_hand(8)["shards"] == 12 * 8_030_261_248 // 8
    terms = pr.torchtitan_memory_terms(8)
    parts = {t: (tt, ly) for t, tt, ly, _ in terms}
    assert sum(ly for t, (tt, ly) in parts.items() if t in pr.TT_TERMS_WHY) == pytest.approx(
        parts["allocated peak"][1], rel=1e-3)
    assert parts["final norm"][0] == pytest.approx(parts["final norm"][1], rel=0.01)
    assert parts["loss"][0] == pytest.approx(parts["loss"][1], rel=0.01)
    assert all(why for t, _, _, why in terms if t not in ("final norm", "loss"))
    # hand-counted allocation below the printed (reserved) peak, as the allocator's cache makes it
    assert parts["allocated peak"][0] < parts["reserved peak (printed)"][0]


# ---------------------------------------------------------------------------------------------- traced model files


def test_traced_gemms_carry_their_shapes_forward_and_backward():
    import torch

    from lynx_planner.profiler.timing import analytic_times
    from lynx_planner.profiler.tracing import trace

    m, k, n = 48, 32, 80
    lin = torch.nn.Linear(k, n)
    traced = trace(lin, (torch.randn(m, k, requires_grad=True),), {})
    (op,) = [o for o in traced.ops if o.fwd.gemms]
    assert op.fwd.gemms == [(m, k, n)]
    assert sorted(op.bwd.gemms) == sorted([(m, n, k), (n, m, k)])  # dgrad [m, k] and wgrad [n, k] outputs
    fwd, bwd = analytic_times(traced, A100)[op.id]
    be = A100.gemm_backward_efficiency
    assert bwd >= (costs.gemm_fwd_s(m, n, k, A100) + costs.gemm_fwd_s(n, m, k, A100)) / be
    assert fwd >= costs.gemm_fwd_s(m, k, n, A100)
    flat_fwd, flat_bwd = analytic_times(traced, FLAT)[op.id]
    assert flat_fwd < fwd  # the flat model knows nothing of this GEMM's small shape


def test_profile_options_set_the_overlaps(tmp_path):
    from conftest import lynx

    out = tmp_path / "p.json"
    r = lynx("profile", "gpt-1.3b", "--tp", "2", "--dp", "2", "--sequence-parallel", "--distributed-optimizer",
             "--overlap-param-gather", "--tp-comm-overlap", "--no-overlap-grad-reduce", "-o", out)
    assert r.exit_code == 0, r.output
    par = json.loads(out.read_text())["parallel"]
    assert par["overlap_param_gather"] and par["tp_comm_overlap"] and par["overlap_grad_reduce"] is False
    assert par["optimizer_step"] and par["rank_order"] == "tp-dp-pp"  # a catalog model: the whole iteration
    bad = lynx("profile", "gpt-1.3b", "--dp", "2", "--no-distributed-optimizer", "--overlap-param-gather", "-o",
               tmp_path / "q.json")
    assert bad.exit_code == 2 and "distributed_optimizer" in bad.output and not (tmp_path / "q.json").exists()


def test_batched_gemm_folds_its_batch_into_m():
    import torch

    from lynx_planner.profiler.tracing import trace

    class Bmm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 16, 24))

        def forward(self, x):
            return torch.bmm(x, self.w)

    traced = trace(Bmm(), (torch.randn(3, 8, 16, requires_grad=True),), {})
    (op,) = [o for o in traced.ops if o.fwd.gemms]
    assert op.fwd.gemms == [(3 * 8, 16, 24)]


def test_both_end_stages_all_reduce_the_tied_embedding():
    from conftest import small_profile

    from lynx_planner.simulator import optimizer_step_s

    prof = small_profile(tp=1, pp=2, m=2)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"optimizer_step": True})})
    plans = ev.stage_plans(prof, [0, 5, 10], [ev.none_policy(prof, i) for i in range(10)])
    res = ev.evaluate(prof, plans).sim
    emb = prof.layers[0].params
    assert prof.layers[0].block == "embedding" and emb > 0
    for s, (first, end) in enumerate(((0, 5), (5, 10))):
        own = sum(l.params for l in prof.layers[first:end])
        assert res.stages[s].grad_reduce_exposed_s == pytest.approx(optimizer_step_s(prof, own, emb, 2))
        assert optimizer_step_s(prof, own, emb, 2) > optimizer_step_s(prof, own, 0, 2)
