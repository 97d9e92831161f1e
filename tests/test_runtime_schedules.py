"""Interleaved 1F1B and zero bubble in torch.distributed.pipelining (2 gloo ranks x 2 chunks) under HEU and
hand-made plans: gradients bit-identical to the run without a plan, releases where the simulator puts them; and the
refusal of a schedule that is not the plan's (issue 21.7)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from runtime_utils import HIDDEN, SEQ, Spec, Stage, StageModule, free_port, plan_from_policies, tiny_profile
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleInterleavedZeroBubble
from torch.distributed.pipelining import schedules as torch_schedules

import lynx_planner
from lynx_planner import evaluate, schedules, simulator
from lynx_planner.runtime import PlanMismatchError, attach
from lynx_planner.solvers import solve

P, V, N_MB, BATCH, PER_CHUNK = 2, 2, 4, 4, 2
SCHEDULES = ("interleaved-1f1b", "zero-bubble")  # both with V chunks per rank
LAYERS = P * V * PER_CHUNK


def layers_profile(schedule: str = "interleaved-1f1b", v: int = V, dropout: float = 0.1):
    """The tiny GPT's transformer layers alone (the modules the test's chunks hold), pp 2 x v chunks."""
    prof = tiny_profile(LAYERS, dropout=dropout)
    par = prof.parallel.model_copy(update={"pp": P, "virtual_stages": v, "num_microbatches": N_MB,
                                           "schedule": schedule})
    return prof.model_copy(update={"layers": prof.layers[1:-1], "parallel": par,
                                   "blocks": {"gpt_layer": prof.blocks["gpt_layer"]}})


def heu_plan(prof):
    """HEU at half-way between full recomputation's peak and no recomputation's: a mix of modes and placements."""
    none, full = (solve(prof, a, 2**62).evaluation.peak_bytes for a in ("none", "full"))
    limit = (none + full) // 2
    solved = solve(prof, "heu", limit)
    return evaluate.make_plan(prof, "p.json", "0" * 64, "heu", limit, solved.stages, solved.solver,
                              solved.evaluation)


# Every placement on every chunk (chunk c holds layers 2c, 2c + 1): prev_forward fires across chunks here.
HAND = [[Spec("selective", "prev_forward"), Spec("full", "grad_wait")],
        [Spec("full", "layer_above"), Spec("selective", "prev_forward")],
        [Spec("selective", "prev_forward"), Spec("full", "on_demand")],
        [Spec("full", "prev_forward"), Spec("full", "layer_above")]]


def hand_plan(prof):
    par = prof.parallel
    plan = plan_from_policies(prof, HAND, first_layer=0, num_microbatches=N_MB, schedule=par.schedule)
    return plan.model_copy(update={"parallel": plan.parallel.model_copy(update={"pp": P, "virtual_stages": V})})


def simulated_releases(prof, plan) -> list[dict]:
    return simulator.simulate(prof, evaluate.runs_of(prof, plan.stages), trace=True).releases


def _run(model: Stage, rank: int, plan, x, y, kind):
    chunks = schedules.chunks_of(P, V, rank)
    modules = [StageModule(model, range(PER_CHUNK * c, PER_CHUNK * (c + 1))) for c in chunks]
    stages = [PipelineStage(m, c, P * V, torch.device("cpu")) for m, c in zip(modules, chunks)]
    runtimes = []
    if plan is not None:
        for m, c, st in zip(modules, chunks, stages):
            lynx_planner.apply_plan(m, plan, stage=c)
            runtimes.append(attach(st))
    schedule = kind(stages, n_microbatches=N_MB, loss_fn=nn.MSELoss())
    torch.manual_seed(100 + rank)
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=[])
    log = [(mb, layer, at, action) for r in runtimes for mb, layer, at, action in r.log if mb is not None]
    triggers = {(mb, layer): (at, action) for mb, layer, at, action in log}
    assert len(triggers) == len(log), log  # each region recomputed once
    return [p.grad for m in modules for p in m.parameters()], triggers


def _worker(rank: int, port: int, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = Stage(LAYERS, dtype=torch.float32)
        x, y = torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)
        out = {}
        for schedule in SCHEDULES:
            prof = layers_profile(schedule)
            kind = getattr(torch_schedules, schedules.get(schedule).torch_class)
            plain, _ = _run(model, rank, None, x, y, kind)
            for name, plan in (("heu", heu_plan(prof)), ("hand", hand_plan(prof))):
                grads, triggers = _run(model, rank, plan, x, y, kind)
                out[schedule, name] = {"exact": all(torch.equal(a, b) for a, b in zip(plain, grads)),
                                       "triggers": triggers}
        try:  # issue 21.7: a plan made for interleaved 1F1B stepped by the zero-bubble schedule
            _run(model, rank, hand_plan(layers_profile()), x, y, ScheduleInterleavedZeroBubble)
            out["refused"] = None
        except PlanMismatchError as e:
            out["refused"] = str(e)
        results[rank] = out
    finally:
        dist.barrier()
        dist.destroy_process_group()


# Rank 0 runs F0,0 F0,1 F2,0 F2,1 F0,2 B2,0 F0,3 B2,1 F2,2 B0,0 F2,3 B0,1 B2,2 B2,3 B0,2 B0,3 (chunk, micro-batch):
# chunk 2's micro-batches 0 and 1 are released by chunk 0's forwards of 2 and 3, chunk 0's by chunk 2's forwards.
EXPECTED_RANK0_PREV_FORWARD = {(0, 0): ("prev_forward", ("F", 2)), (1, 0): ("prev_forward", ("F", 3)),
                               (2, 0): ("on_demand", ("B", 2)), (3, 0): ("on_demand", ("B", 3)),
                               (0, 4): ("prev_forward", ("F", 2)), (1, 4): ("prev_forward", ("F", 3)),
                               (2, 4): ("on_demand", ("B", 2)), (3, 4): ("on_demand", ("B", 3))}


def test_two_ranks_two_chunks_bit_identical_and_releases_as_simulated():
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(free_port(), results), nprocs=2, join=True)
    for schedule in SCHEDULES:
        prof = layers_profile(schedule)
        for name, plan in (("heu", heu_plan(prof)), ("hand", hand_plan(prof))):
            simulated = simulated_releases(prof, plan)
            assert any(p.mode != "none" for st in plan.stages for p in st.policies), name
            for rank in (0, 1):
                r = results[rank][schedule, name]
                assert r["exact"], f"{schedule} {name}, rank {rank}: gradients differ from the run without a plan"
                assert r["triggers"] == simulated[rank], f"{schedule} {name}, rank {rank}: released elsewhere than " \
                    "simulated"
    hand0 = results[0]["interleaved-1f1b", "hand"]["triggers"]
    assert {k: hand0[k] for k in EXPECTED_RANK0_PREV_FORWARD} == EXPECTED_RANK0_PREV_FORWARD
    for rank in (0, 1):
        refused = results[rank]["refused"]
        assert refused is not None and "ScheduleInterleavedZeroBubble" in refused and "'interleaved-1f1b'" in \
            refused, refused


def test_attach_refuses_a_stage_numbered_for_another_pipeline():
    prof = layers_profile()
    model = Stage(LAYERS, dtype=torch.float32)
    chunk = StageModule(model, range(4, 6))
    lynx_planner.apply_plan(chunk, hand_plan(prof), stage=2)
    stage = type("S", (), {"num_stages": 2, "stage_index": 0, "submod": chunk})()  # built as if pp 2 without chunks
    with pytest.raises(PlanMismatchError, match="stage 0 of 2.*stage 2 of 4"):
        attach(stage)
