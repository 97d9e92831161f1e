"""The local job's runtime costs (schema.LocalRuntime, profiler/runtime.py): what a measured CPU profile of a
multi-rank job adds to the timeline besides the layers, checked by hand against the simulator, FSDP's waits and
validate's predicted rows; absent (and the timeline unchanged) everywhere else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lynx_planner import evaluate as ev
from lynx_planner import simulator, solvers, streams
from lynx_planner.build import build_profile
from lynx_planner.io import dumps
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.parallel import fsdp
from lynx_planner.profiler import profile_model_file
from lynx_planner.profiler import runtime as local_runtime
from lynx_planner.schema import LocalRuntime, ParallelConfig, Profile

from test_simulator import run, synthetic

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "gpt_model.py")
H100 = HARDWARE["h100-80g-nvlink"]


def simulate(prof: Profile) -> ev.Evaluation:
    """The iteration of `none` on the even split (every layer kept)."""
    return run(prof)


def with_runtime(prof: Profile, **fields) -> Profile:
    rt = LocalRuntime(cores=2, ranks=prof.parallel.pp, comm_cpu_share=1.0, **fields)
    return prof.model_copy(update={"runtime": rt})


# the rule and the counts --------------------------------------------------------------------------------------------

def test_comm_threads_take_compute_only_without_a_core_to_spare():
    assert local_runtime.comm_cpu_share(ranks=2, threads=1, cores=2) == 1.0  # 4 threads on 2 cores
    assert local_runtime.comm_cpu_share(ranks=2, threads=1, cores=4) == 0.0  # a core each for the comm threads
    assert local_runtime.comm_cpu_share(ranks=2, threads=2, cores=4) == 1.0


def test_items_are_a_ranks_forwards_and_backwards():
    par = ParallelConfig(pp=2, num_microbatches=4)
    assert local_runtime.items(par, 0) == local_runtime.items(par, 1) == 8  # 4 F + 4 B
    inter = ParallelConfig(pp=2, num_microbatches=4, schedule="interleaved-1f1b", virtual_stages=2)
    assert local_runtime.items(inter, 0) == 16  # two chunks
    zb = ParallelConfig(pp=2, num_microbatches=4, schedule="zero-bubble")
    assert local_runtime.items(zb, 1) == 8  # W rides with its B


def test_which_setups_get_one():
    assert local_runtime.applies(ParallelConfig(pp=2, num_microbatches=4), "cpu")
    assert local_runtime.applies(ParallelConfig(dp=2, fsdp=True), "cpu")
    assert not local_runtime.applies(ParallelConfig(pp=2, num_microbatches=4), "cuda")  # a GPU profile is unchanged
    assert not local_runtime.applies(ParallelConfig(pp=2, num_microbatches=1), "cpu")  # torch's schedules: m >= pp
    assert not local_runtime.applies(ParallelConfig(pp=1), "cpu")  # one rank: no job
    assert not local_runtime.applies(ParallelConfig(tp=2, pp=2, num_microbatches=4), "cpu")  # validate: tp = 1
    assert not local_runtime.applies(ParallelConfig(dp=2), "cpu")  # plain DP: validate does not run it


# old and GPU profiles ---------------------------------------------------------------------------------------------

def test_profiles_without_it_write_and_simulate_as_before(tmp_path):
    prof = build_profile("gpt-1.3b", ParallelConfig(pp=2, num_microbatches=4, seq_len=2048), H100)
    assert prof.runtime is None and "runtime" not in json.loads(dumps(prof))
    assert streams.pp_link(prof) is None and streams.item_overhead_s(prof, 0) == 0.0
    assert streams.grad_scale_s(prof, 10**9) == 0.0
    zero = with_runtime(prof)  # present but all zero: the timeline is the same
    assert simulate(zero).predicted.iteration_time_s == pytest.approx(
        simulate(prof).predicted.iteration_time_s, rel=1e-12)


def test_it_round_trips_in_the_profile():
    prof = with_runtime(synthetic(2, 4), p2p_bytes_per_s=1e9, p2p_latency_s=1e-4, item_s=[1e-3, 2e-3],
                        item_comm_s=[1e-4, 1e-4], grad_scale_s_per_param=1e-9)
    again = Profile.model_validate_json(dumps(prof))
    assert again.runtime == prof.runtime


# the simulator, by hand ---------------------------------------------------------------------------------------------

def test_item_overhead_is_compute_on_every_item():
    """Each of a rank's 2m items (m forwards, m backwards) costs item_s + comm_cpu_share x item_comm_s more on its
    compute stream: its busy time grows by exactly 2m times that."""
    prof = synthetic(2, 4)
    base = simulate(prof).predicted.stages
    a, c = 1.5e-3, 0.25e-3
    got = simulate(with_runtime(prof, item_s=[a, 2 * a], item_comm_s=[c, c])).predicted.stages
    assert got[0].busy_time_s - base[0].busy_time_s == pytest.approx(8 * (a + c))
    assert got[1].busy_time_s - base[1].busy_time_s == pytest.approx(8 * (2 * a + c))
    spare = with_runtime(prof, item_s=[a, a], item_comm_s=[c, c]).model_copy()
    spare.runtime.comm_cpu_share = 0.0  # a core to spare: the communication threads cost compute nothing
    assert simulate(spare).predicted.stages[0].busy_time_s - base[0].busy_time_s == pytest.approx(8 * a)


def test_two_stage_path_by_hand():
    """Two stages of one layer, one micro-batch: F0, send, F1, B1, send, B0. With an overhead o on every item and a
    measured link (bandwidth w, latency l), the iteration is F0 + F1 + B1 + B0 + 4 o + 2 (bytes / w + l), then the
    gradient scaling of stage 0 (the last to finish), its per-parameter CPU times its parameters."""
    prof = synthetic(2, 1, layers=1, transfer_bytes=10**6)
    prof = prof.model_copy(update={"layers": [l.model_copy(update={"params": 1000 * (i + 1)})
                                              for i, l in enumerate(prof.layers)]})
    f, b = 1.0 + 0.5, 2.0 + 0.5  # the synthetic layer's forward and backward
    o, w, lat, g = 1e-3, 1e8, 2e-4, 1e-6
    timed = with_runtime(prof, item_s=[o, o], item_comm_s=[0.0, 0.0], p2p_bytes_per_s=w, p2p_latency_s=lat,
                         grad_scale_s_per_param=g)
    assert simulator.p2p_bus(timed) == (w, lat)
    path = 2 * f + 2 * b + 4 * o + 2 * (10**6 / w + lat)
    assert simulate(timed).predicted.iteration_time_s == pytest.approx(path + g * 1000)


def test_fsdp_collectives_cpu_comes_out_of_compute():
    """Under FSDP on a CPU without a core to spare, layer j's all-gather (beside layer j-1's forward) adds its
    communication threads' CPU, rate x gathered bytes, to layer j's forward compute and shortens its wait by as much;
    in backward, the next lower layer's all-gather and this layer's reduce-scatter (rate x fp32 gradient bytes)."""
    prof = build_profile("llama3-8b", ParallelConfig(dp=8, fsdp=True, micro_batch_size=1, seq_len=512), H100)
    rag, rrs = 1e-10, 2e-10
    rt = LocalRuntime(cores=2, ranks=8, comm_cpu_share=1.0, all_gather_cpu_s_per_byte=rag,
                      reduce_scatter_cpu_s_per_byte=rrs)
    stolen = prof.model_copy(update={"runtime": rt})
    layers = list(range(len(prof.layers)))
    fwd = [1e-3] * len(layers)
    bwd = [2e-3] * len(layers)
    base = streams.layer_waits(prof, layers, fwd, bwd)
    got = streams.layer_waits(stolen, layers, fwd, bwd)
    g = fsdp.gather_bytes(prof)
    p = [prof.layers[i].params for i in layers]
    j = 5  # a decoder layer in the middle
    assert got[j].fwd_copy - base[j].fwd_copy == pytest.approx(rag * g * p[j])
    assert got[j].bwd_copy - base[j].bwd_copy == pytest.approx(rag * g * p[j - 1] + rrs * 4 * p[j])
    assert got[j].fwd_before == pytest.approx(max(0.0, base[j].fwd_before - rag * g * p[j]))
    assert got[0].fwd_before == base[0].fwd_before  # the lowest layer's all-gather is waited for whole
    spare = stolen.model_copy(update={"runtime": rt.model_copy(update={"comm_cpu_share": 0.0})})
    assert streams.layer_waits(spare, layers, fwd, bwd) == base


def test_compute_slowdown_stretches_every_layers_compute_not_its_waits():
    """Two stages of one layer, one micro-batch: F0 + F1 + B1 + B0. A layer's forward is 1.5 s of compute, its
    backward 2.5 s of compute and a 0.7 s wait on its collective. With the other ranks' compute beside it (slowdown
    s), every compute second takes s: the iteration is s (2 x 1.5 + 2 x 2.5) + 2 x 0.7; the waits stay."""
    prof = synthetic(2, 1, layers=1, window=0.7)
    assert simulate(prof).predicted.iteration_time_s == pytest.approx(8.0 + 1.4)
    s = 1.25
    slowed = with_runtime(prof, compute_slowdown=s)
    assert streams.compute_slowdown(slowed) == s and streams.compute_slowdown(prof) == 1.0
    assert simulate(slowed).predicted.iteration_time_s == pytest.approx(s * 8.0 + 1.4)


def test_compute_slowdown_stretches_recomputation():
    """Recomputing the 1 s matmul of every layer on demand (2 stages x 4 micro-batches x 4 layers) exposes 32 s; on
    ranks that slow each other by s, 32 s times s. Hidden beside a 4 s window (below each stage's top layer, 3 of
    4), 24 s times s, still hidden."""
    from test_simulator import recompute_mm

    prof = synthetic(2, 4, window=4.0)
    s = 1.5
    slowed = with_runtime(prof, compute_slowdown=s)
    on_demand = run(slowed, recompute_mm(slowed, "on_demand")).predicted
    assert sum(st.exposed_recompute_s for st in on_demand.stages) == pytest.approx(32 * s)
    hidden = run(slowed, recompute_mm(slowed, "layer_above", skip_top=True)).predicted
    assert sum(st.hidden_recompute_s for st in hidden.stages) == pytest.approx(24 * s)
    assert sum(st.exposed_recompute_s for st in hidden.stages) == 0


def test_compute_slowdown_in_validates_fsdp_forward():
    """validate's predicted forward of an FSDP rank: m micro-batches of every layer's compute ops (tp = 1: all the
    block's ops but views) and FSDP2's copies; the slowdown multiplies the first alone, so the forward grows by
    (s - 1) m times the layers' summed compute-op forward seconds."""
    from lynx_planner import validate

    prof = build_profile("llama3-8b", ParallelConfig(dp=8, fsdp=True, micro_batch_size=1, seq_len=512,
                                                     num_microbatches=2), H100)
    plan = solvers.plan(prof, "p.json", "0" * 64, "none", 1 << 60)
    s = 1.2
    slowed = prof.model_copy(update={"runtime": LocalRuntime(cores=2, ranks=8, comm_cpu_share=1.0,
                                                             compute_slowdown=s)})
    compute = sum(op.fwd_s for layer in prof.layers for op in prof.blocks[layer.block].ops
                  if op.kind == "compute" and not op.view)
    base, got = validate.predicted_stage(prof, plan, 0), validate.predicted_stage(slowed, plan, 0)
    assert got.forward_s - base.forward_s == pytest.approx((s - 1) * 2 * compute)


def test_slowdown_is_the_ratio_of_medians():
    assert local_runtime.slowdown([1.0, 2.0, 3.0], [2.0, 2.5, 4.5]) == 1.25
    assert local_runtime.slowdown([0.3, 0.3], [0.3, 0.3]) == 1.0


def test_an_old_runtime_reads_as_no_slowdown():
    """A LocalRuntime written before compute_slowdown loads as 1 (no slowdown) and writes without it."""
    old = '{"cores": 2, "ranks": 2, "comm_cpu_share": 1.0, "item_s": [0.001, 0.002]}'
    rt = LocalRuntime.model_validate_json(old)
    assert rt.compute_slowdown == 1.0 and "compute_slowdown" not in json.loads(dumps(rt))
    assert json.loads(dumps(rt.model_copy(update={"compute_slowdown": 1.1})))["compute_slowdown"] == 1.1


# validate's predicted rows ----------------------------------------------------------------------------------------

def test_validate_predicts_the_cpu_besides_the_chunks():
    """validate's predicted rows: a rank's 2m items times its training thread's and its communication threads'
    per-item CPU, the former with the gradient scaling of its parameters."""
    from lynx_planner import validate

    prof = synthetic(2, 4)
    prof = prof.model_copy(update={"layers": [l.model_copy(update={"params": 500}) for l in prof.layers]})
    prof = with_runtime(prof, item_s=[1e-3, 3e-3], item_comm_s=[2e-4, 1e-4], grad_scale_s_per_param=1e-9)
    plan = solvers.plan(prof, "p.json", "0" * 64, "none", 1 << 60)
    besides, comm = validate.runtime_cpu(prof, plan, 1)
    assert besides == pytest.approx(8 * 3e-3 + 1e-9 * 500 * 4)  # 4 layers a stage
    assert comm == pytest.approx(8 * 1e-4)


# the measurement (real processes; figures not timed) ------------------------------------------------------------

def test_measured_pipeline_profile_carries_the_local_runtime():
    par = ParallelConfig(pp=2, seq_len=64, micro_batch_size=2, num_microbatches=4)
    prof = profile_model_file(EXAMPLE, parallel=par, hardware=H100, method="measure", threads=1, repeats=2,
                              progress=False)
    rt = prof.runtime
    assert rt is not None and rt.ranks == 2 and rt.backend == "gloo"
    assert len(rt.item_s) == len(rt.item_comm_s) == 2 and all(x > 0 for x in rt.item_s)
    assert rt.p2p_bytes_per_s > 0 and rt.p2p_latency_s > 0 and rt.grad_scale_s_per_param > 0
    assert rt.compute_slowdown > 0
    assert simulator.p2p_bus(prof) == (rt.p2p_bytes_per_s, rt.p2p_latency_s)
    one = profile_model_file(EXAMPLE, parallel=ParallelConfig(seq_len=64, micro_batch_size=2), hardware=H100,
                             method="measure", threads=1, repeats=1, progress=False)
    assert one.runtime is None  # one rank: nothing to measure
    analytic = profile_model_file(EXAMPLE, parallel=par, hardware=H100, progress=False)
    assert analytic.runtime is None and "runtime" not in json.loads(dumps(analytic))


def test_measured_fsdp_profile_carries_the_collectives_and_the_slowdown():
    par = ParallelConfig(dp=2, fsdp=True, seq_len=64, micro_batch_size=2, num_microbatches=2)
    prof = profile_model_file(EXAMPLE, parallel=par, hardware=H100, method="measure", threads=1, repeats=2,
                              progress=False)
    rt = prof.runtime
    assert rt is not None and rt.ranks == 2 and not rt.item_s
    assert rt.all_gather_cpu_s_per_byte > 0 and rt.reduce_scatter_cpu_s_per_byte > 0 and rt.compute_slowdown > 0
    assert streams.compute_slowdown(prof) == rt.compute_slowdown
    # FSDP in line: the collectives' wall and FSDP2's own work, each a line (fixed, per unit of size); a collective
    # takes some time, FSDP2's forward and backward some CPU (at the largest layer's size: the line at its params)
    assert streams.fsdp_in_line(prof)
    n = max(layer.params for layer in prof.layers)
    for cost, size in ((rt.all_gather_wall, 4 * n), (rt.reduce_scatter_wall, 4 * n), (rt.fsdp_forward, n),
                       (rt.fsdp_backward, n)):
        assert len(cost) == 2 and min(cost) >= 0 and cost[0] + cost[1] * size > 0
        assert all(float(f"{x:.4g}") == x for x in cost)  # four significant digits, as the other measured terms


def test_null_chunk_sends_the_real_shapes_and_passes_gradients():
    import torch

    null = local_runtime._Null((3, 2, 5), torch.float32)
    x = torch.randn(3, 2, 5, requires_grad=True)
    out = null(x)
    assert out.shape == (3, 2, 5)
    out.pow(2).mean().backward()
    assert x.grad is not None and x.grad.is_contiguous() and null.weight.grad is not None
    assert null(torch.zeros(2, 4, dtype=torch.long)).shape == (3, 2, 5)  # the first chunk's token input


def test_validate_table_prints_the_predicted_rows_beside_the_measured(monkeypatch):
    import os
    import shutil

    from lynx_planner.validate import table

    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((80, 24)))
    figures = {"forward_s": 0.1, "backward_s": 0.2, "recompute_in_backward_s": 0.0, "recompute_early_s": 0.0,
               "held_at_backward_bytes": 2**20, "activation_bytes": 2**21}
    summary = {"plan": "heu", "algo": "heu", "profile_method": "measure", "hardware": "a100-80g-nvlink",
               "runtime": True, "cpu_share": 1.0,
               "stages": [{"stage": 0, "predicted": figures | {"outside_compute_s": 0.0021, "comm_threads_s": 0.0003},
                           "measured": figures | {"outside_compute_s": 0.0025, "comm_threads_s": 0.0007}}],
               "iteration": {"predicted_s": 1.0, "measured_s": 1.0, "spread_s": [1.0, 1.0],
                             "predicted_over_measured": 1.0}}
    rows = [line for line in table([summary]).splitlines() if "CPU s" in line]
    assert rows[0].split()[-2:] == ["0.0021", "0.0025"] and rows[1].split()[-2:] == ["0.0003", "0.0007"]
    summary["runtime"] = False  # a profile without one: measured only
    rows = [line for line in table([summary]).splitlines() if "CPU s" in line]
    assert rows[0].split()[-2:] == ["-", "0.0025"]


# FSDP in line on this CPU (streams.fsdp_in_line) --------------------------------------------------------------------

def in_line(prof: Profile, **lines) -> Profile:
    """prof with a LocalRuntime measuring FSDP in line: every line (seconds, seconds per unit) given or zero."""
    got = {k: lines.get(k, (0.0, 0.0)) for k in ("all_gather_wall", "reduce_scatter_wall", "fsdp_forward",
                                                  "fsdp_backward")}
    return prof.model_copy(update={"runtime": LocalRuntime(cores=2, ranks=prof.parallel.dp, comm_cpu_share=1.0,
                                                           **got)})


def fsdp_profile(**par) -> Profile:
    return build_profile("llama3-8b", ParallelConfig(dp=2, fsdp=True, micro_batch_size=1, seq_len=256,
                                                     num_microbatches=2, **par), H100)


def test_a_line_through_two_points_by_hand():
    assert local_runtime.line(1.0, 3.0, 3.0, 7.0) == pytest.approx((1.0, 2.0))
    assert local_runtime.line(1.0, 3.0, 3.0, 2.0) == pytest.approx((3.0, 0.0))  # falling: noise, flat
    assert local_runtime.line(1.0, 1.0, 3.0, 7.0) == pytest.approx((0.0, 3.0))  # below zero at 0: clamped


def test_in_line_needs_every_term():
    """Only a profile that measured all four lines runs FSDP in line; one measured before them (or a GPU's) keeps
    the overlapped model, waits and all."""
    prof = fsdp_profile()
    assert streams.fsdp_in_line(in_line(prof))
    partial = in_line(prof)
    partial.runtime.fsdp_backward = None
    assert not streams.fsdp_in_line(partial) and not streams.fsdp_in_line(prof)
    layers = list(range(len(prof.layers)))
    assert streams.layer_waits(partial, layers, [1e-3] * len(layers), [2e-3] * len(layers)) == \
        streams.layer_waits(prof.model_copy(update={"runtime": LocalRuntime(cores=2, ranks=2, comm_cpu_share=1.0)}),
                            layers, [1e-3] * len(layers), [2e-3] * len(layers))


def test_in_line_waits_by_hand():
    """In line, a middle layer j (p parameters, bf16: 2 bytes each gathered and reduced as validate's job runs
    them) spends on the compute stream, forward: FSDP2's a_f + b_f p and its all-gather's wall l_ag + r_ag 2p;
    backward: a_b + b_b p, the all-gather of layer j-1 (prefetched in line) and its own reduce-scatter
    l_rs + r_rs 2p. No idle segment anywhere (nothing hides in a blocked thread); the top layer also gathers
    itself before its backward; the lowest layer's reduce-scatter ran in line, none is left for the iteration's end.
    Kept gathered after forward: no gather in backward, and FSDP2's backward work less its forward's (one gather)."""
    prof = fsdp_profile()
    af, bf, ab, bb = 1e-4, 2e-10, 3e-4, 5e-10
    lag, rag, lrs, rrs = 2e-4, 1e-9, 4e-4, 3e-9
    lined = in_line(prof, fsdp_forward=(af, bf), fsdp_backward=(ab, bb), all_gather_wall=(lag, rag),
                    reduce_scatter_wall=(lrs, rrs))
    layers = list(range(len(prof.layers)))
    p = [prof.layers[i].params for i in layers]
    waits = streams.layer_waits(lined, layers, [1e-3] * len(p), [2e-3] * len(p))
    j, top = 5, len(p) - 1
    assert waits[j].fwd_copy == pytest.approx(af + bf * p[j] + lag + rag * 2 * p[j])
    assert waits[j].bwd_copy == pytest.approx(ab + bb * p[j] + lag + rag * 2 * p[j - 1] + lrs + rrs * 2 * p[j])
    assert waits[top].bwd_copy == pytest.approx(ab + bb * p[top] + (lag + rag * 2 * p[top])
                                                + lag + rag * 2 * p[top - 1] + lrs + rrs * 2 * p[top])
    assert waits[0].bwd_copy == pytest.approx(ab + bb * p[0] + lrs + rrs * 2 * p[0])
    assert all(w.fwd_before == w.bwd_before == w.bwd_after == w.rec_beside == 0.0 for w in waits)
    assert streams.grad_sync_s(lined, p) == [0.0] * len(p)
    kept = in_line(fsdp_profile(reshard_after_forward=False), fsdp_forward=(af, bf), fsdp_backward=(ab, bb),
                   all_gather_wall=(lag, rag), reduce_scatter_wall=(lrs, rrs))
    wk = streams.layer_waits(kept, layers, [1e-3] * len(p), [2e-3] * len(p))
    assert wk[j].bwd_copy == pytest.approx((ab - af) + (bb - bf) * p[j] + lrs + rrs * 2 * p[j])


def test_in_line_iteration_counts_every_collective_by_hand():
    """One rank (pp 1), m micro-batches of L layers, everything in line: the iteration is the sum of its parts, so
    raising the all-gather's fixed wall by d adds 2 L m d (each layer gathered before its forward and again before
    its backward), the reduce-scatter's L m d (each layer reduced once, the lowest included), FSDP2's fixed forward or
    backward work L m d; validate's predicted forward (the training thread's CPU) takes the last, not the walls."""
    from lynx_planner import validate

    prof = fsdp_profile()
    m, n = prof.parallel.num_microbatches, len(prof.layers)
    base = dict(fsdp_forward=(1e-4, 1e-10), fsdp_backward=(2e-4, 2e-10), all_gather_wall=(3e-4, 1e-9),
                reduce_scatter_wall=(5e-4, 2e-9))
    d = 1e-3

    def iteration(**change):
        lines = base | {k: (base[k][0] + v, base[k][1]) for k, v in change.items()}
        return simulate(in_line(prof, **lines)).predicted.iteration_time_s

    t0 = iteration()
    assert iteration(all_gather_wall=d) - t0 == pytest.approx(2 * n * m * d)
    assert iteration(reduce_scatter_wall=d) - t0 == pytest.approx(n * m * d)
    assert iteration(fsdp_forward=d) - t0 == pytest.approx(n * m * d)
    assert iteration(fsdp_backward=d) - t0 == pytest.approx(n * m * d)
    plan = solvers.plan(prof, "p.json", "0" * 64, "none", 1 << 60)

    def forward(**change):
        lines = base | {k: (base[k][0] + v, base[k][1]) for k, v in change.items()}
        return validate.predicted_stage(in_line(prof, **lines), plan, 0).forward_s

    assert forward(all_gather_wall=d) == pytest.approx(forward())
    assert forward(fsdp_forward=d) - forward() == pytest.approx(n * m * d)


def test_an_old_runtime_has_no_in_line_terms():
    old = '{"backend": "gloo", "cores": 2, "ranks": 2, "comm_cpu_share": 1.0, "all_gather_cpu_s_per_byte": 1e-9}'
    rt = LocalRuntime.model_validate_json(old)
    assert rt.all_gather_wall is None and rt.fsdp_forward is None
    assert json.loads(dumps(rt)) == json.loads(old)
    lined = LocalRuntime(cores=2, ranks=2, comm_cpu_share=1.0, fsdp_forward=(1e-4, 2e-10))
    assert LocalRuntime.model_validate_json(dumps(lined)) == lined
