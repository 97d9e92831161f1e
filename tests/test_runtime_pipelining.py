"""apply_plan inside torch.distributed.pipelining (two gloo processes) and the one private hook it relies on."""

from __future__ import annotations

import copy
import dis
import inspect
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp
from runtime_utils import (
    HIDDEN,
    SEQ,
    Spec,
    Stage,
    StageModule,
    free_port,
    plan_from_policies,
    tiny_profile,
)
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    schedules,
)
from torch.utils._python_dispatch import TorchDispatchMode

import lynx_planner
from lynx_planner.models.gpt_block import Dropout
from lynx_planner.runtime import attach, pipelining
from lynx_planner.schema import LayerPolicy, StagePlan
from lynx_planner.validate import pipeline_step

N_MB, BATCH, PER_STAGE = 4, 4, 4
KEPT_OUTPUTS: list[int] = []  # per step of a worker: the micro-batch outputs its stage kept after the step
# Every placement on every stage where it can fire: prev_forward never fires on 1F1B's last stage (F(k) B(k)), and a
# stage's top layer_above is its grad_wait.
STAGES = [
    [Spec("full", "layer_above"), Spec("selective", "prev_forward"), Spec("full", "grad_wait"),
     Spec("selective", "on_demand")],
    [Spec("full", "layer_above"), Spec("selective", "on_demand"), Spec("full", "grad_wait"),
     Spec("full", "layer_above")],
]
# Stage 0 (1F1B order F0 F1 B0 F2 B1 F3 B2 B3): mb k's prev_forward fires in F(k + 1); B3 follows a backward, so mb 3
# recomputes on demand. (micro-batch, global layer) -> (trigger, action)
EXPECTED = {
    0: {(mb, layer): at for mb in range(N_MB) for layer, at in {
        1: ("layer_above", ("B", mb)),
        2: ("prev_forward", ("F", mb + 1)) if mb < N_MB - 1 else ("on_demand", ("B", mb)),
        3: ("grad_wait", ("B", mb)), 4: ("on_demand", ("B", mb))}.items()},
    1: {(mb, layer): at for mb in range(N_MB) for layer, at in {
        5: ("layer_above", ("B", mb)), 6: ("on_demand", ("B", mb)), 7: ("grad_wait", ("B", mb)),
        8: ("grad_wait", ("B", mb))}.items()},
}


def simulated_releases(plan) -> list[dict]:
    """What the simulator says released each (micro-batch, layer) of the plan, per stage."""
    from lynx_planner import evaluate, simulator

    prof = tiny_profile(2 * PER_STAGE)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"pp": 2, "num_microbatches": N_MB})})
    return simulator.simulate(prof, evaluate.runs_of(prof, plan.stages), trace=True).releases


def _set_dropout(model: nn.Module, p: float) -> None:
    for m in model.modules():
        if isinstance(m, Dropout):
            m.p = p


def _pipeline_grads(model: Stage, rank: int, plan, x, y) -> tuple[list[torch.Tensor], dict]:
    stage_module = StageModule(model, range(PER_STAGE * rank, PER_STAGE * (rank + 1)))
    stage = PipelineStage(stage_module, rank, 2, torch.device("cpu"))
    runtime = None
    if plan is not None:
        lynx_planner.apply_plan(stage_module, plan, stage=rank)
        runtime = attach(stage)
    schedule = Schedule1F1B(stage, n_microbatches=N_MB, loss_fn=nn.MSELoss())
    torch.manual_seed(100 + rank)
    pipeline_step(schedule, rank, 2, (x,), y)  # as lynx validate steps it
    KEPT_OUTPUTS.append(len(stage.output_chunks))
    triggers = {}
    if runtime is not None:  # (micro-batch, layer) -> (trigger, action), each region recomputed once
        log = [(mb, layer, at, action) for mb, layer, at, action in runtime.log if mb is not None]
        triggers = {(mb, layer): (at, action) for mb, layer, at, action in log}
        assert len(triggers) == len(log), log
    return [p.grad for p in stage_module.parameters()], triggers


def _reference_grads(model: Stage, rank: int, x, y) -> list[torch.Tensor]:
    model = copy.deepcopy(model)
    nn.MSELoss()(model(x.transpose(0, 1)).transpose(0, 1), y).backward()
    return [p.grad for i in range(PER_STAGE * rank, PER_STAGE * (rank + 1)) for p in model.layers[i].parameters()]


class _CountAllReduce(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.ops._c10d_functional.all_reduce.default
        return func(*args, **(kwargs or {}))


class _RowParallelMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        y = funcol.all_reduce(self.fc2(torch.relu(self.fc1(x))), "sum", dist.group.WORLD)
        return torch.sin(y)  # saves the all-reduced tensor


def _tp_all_reduces(plan) -> tuple[int, int, torch.Tensor]:
    model = nn.Sequential(_RowParallelMLP())
    torch.manual_seed(dist.get_rank())
    model[0].load_state_dict(_RowParallelMLP().state_dict())
    if plan is not None:
        lynx_planner.apply_plan(model, plan)
    x = torch.randn(4, 16, requires_grad=True)
    with _CountAllReduce() as count:
        out = model(x)
        forward = count.calls
        out.pow(2).sum().backward()
    return forward, count.calls - forward, model[0].fc1.weight.grad


def _worker(rank: int, port: int, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = Stage(2 * PER_STAGE, dtype=torch.float32)
        x, y = torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)
        plan = plan_from_policies(tiny_profile(2 * PER_STAGE), STAGES, num_microbatches=N_MB)
        plain, _ = _pipeline_grads(model, rank, None, x, y)
        planned, triggers = _pipeline_grads(model, rank, plan, x, y)
        no_dropout = copy.deepcopy(model)
        _set_dropout(no_dropout, 0.0)
        plan_no_dropout = plan_from_policies(tiny_profile(2 * PER_STAGE, dropout=0.0), STAGES, num_microbatches=N_MB)
        planned_no_dropout, _ = _pipeline_grads(no_dropout, rank, plan_no_dropout, x, y)
        reference = _reference_grads(no_dropout, rank, x, y)
        tp_plan = plan.model_copy(update={"stages": [StagePlan(stage=0, layers=(0, 1), layer_names=["0"], policies=[
            LayerPolicy(layers=(0, 1), block="tp_mlp", mode="full")])]})
        tp = [_tp_all_reduces(None), _tp_all_reduces(tp_plan)]
        results[rank] = {
            "kept_outputs": list(KEPT_OUTPUTS),
            "exact": all(torch.equal(a, b) for a, b in zip(plain, planned)), "triggers": triggers,
            "max_err": max((a - b).abs().max().item() for a, b in zip(planned_no_dropout, reference)),
            "tp": [(f, b) for f, b, _ in tp], "tp_exact": torch.equal(tp[0][2], tp[1][2])}
    finally:
        dist.barrier()
        dist.destroy_process_group()


def test_two_stage_1f1b_matches_reference_and_releases_as_the_simulator_says():
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(free_port(), results), nprocs=2, join=True)
    simulated = simulated_releases(plan_from_policies(tiny_profile(2 * PER_STAGE), STAGES, num_microbatches=N_MB))
    for rank in (0, 1):
        r = results[rank]
        assert r["exact"], f"rank {rank}: gradients with the plan differ from the run without it"
        assert r["max_err"] <= 1e-6, f"rank {rank}: max |grad - single-process reference| = {r['max_err']:.2e}"
        assert r["triggers"] == simulated[rank], f"rank {rank}: the runtime released recomputations elsewhere than " \
            "the simulator"
        assert r["triggers"] == EXPECTED[rank]
        assert r["tp"][1] == r["tp"][0] == (1, 1), "the recomputation repeated the TP all-reduce"
        assert r["tp_exact"]
        # the last stage keeps no micro-batch's output after the step (torch's return_outputs=False): the simulator
        # counts none, and torch would keep all N_MB
        if "return_outputs" in inspect.signature(Schedule1F1B.step).parameters:
            assert r["kept_outputs"] == [0, 0, 0], r["kept_outputs"]


def test_private_wait_hook_is_where_pipelining_expects_it():
    """Fails when PyTorch renames `schedules._wait_batch_p2p` or stops posting the gradient receive through it
    between get_bwd_recv_ops and backward_one_chunk: then update lynx_planner/runtime/pipelining.py."""
    assert list(inspect.signature(pipelining._ORIGINAL_WAIT).parameters) == ["work"]
    for schedule in (Schedule1F1B, ScheduleGPipe):
        names = [i.argval for i in dis.get_instructions(schedule._step_microbatches)
                 if i.argval in ("get_bwd_recv_ops", "_wait_batch_p2p", "backward_one_chunk")]
        after_recv = names[names.index("get_bwd_recv_ops") + 1:]
        assert after_recv[:2] == ["_wait_batch_p2p", "backward_one_chunk"], (schedule.__name__, names)

    class Runtime:
        def trigger(self, mb, at):
            order.append(("trigger", mb, at))

    class Work:
        def wait(self):
            order.append("wait")

    order: list = []
    pipelining._install_wait_hook()
    assert schedules._wait_batch_p2p is pipelining._wait_batch_p2p
    pipelining._pending.append((Runtime(), 3))
    schedules._wait_batch_p2p([Work()])
    assert order == [("trigger", 3, "grad_wait"), "wait"]


def test_hooks_release_prev_forward_where_the_table_says():
    """The hooks fire prev_forward in the forward right before another micro-batch's backward, also where the stage
    never holds its full 1F1B in-flight count (4 stages, 2 micro-batches: stage 0 runs F0 F1 B0 B1)."""
    from types import SimpleNamespace

    from lynx_planner import placements
    from lynx_planner.schema import PlanParallel

    def fired(kind: str, p: int, s: int, m: int) -> set:
        out = set()
        runtime = SimpleNamespace(parallel=PlanParallel(tp=1, pp=p, dp=1, num_microbatches=m, schedule=kind),
                                  action=None, micro_batch=None,
                                  trigger=lambda mb, at: out.add((mb, at, runtime.action)) if at != "grad_wait" else 0)
        stage = SimpleNamespace(num_stages=p, stage_index=s, forward_one_chunk=lambda *a, **k: None,
                                get_bwd_recv_ops=lambda *a: [], backward_one_chunk=lambda *a, **k: None)
        hooks = pipelining._StageHooks(runtime, stage)
        for action, mb in placements.schedule(kind, p, s, m):
            if action == "F":
                hooks.forward_one_chunk(mb)
            else:
                hooks.get_bwd_recv_ops(mb)
                hooks.backward_one_chunk(mb)
        return out

    assert fired("1f1b", 4, 0, 2) == {(0, "prev_forward", ("F", 1))}
    assert fired("1f1b", 4, 1, 6) == {(0, "prev_forward", ("F", 2)), (1, "prev_forward", ("F", 3)),
                                      (2, "prev_forward", ("F", 4)), (3, "prev_forward", ("F", 5))}
    assert fired("1f1b", 4, 3, 6) == set()
    assert fired("gpipe", 2, 0, 3) == {(0, "prev_forward", ("F", 2))}
