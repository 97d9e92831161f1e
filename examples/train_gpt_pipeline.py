"""Train a small GPT in a two-stage 1F1B pipeline on CPU with a lynx plan applied to each stage.

    torchrun --nproc-per-node 2 examples/train_gpt_pipeline.py [--plan plan.json | --demo-placements] [--steps 8]

A plan for it from the command line (the model trains in fp32, as `lynx profile` builds it):

    lynx profile examples/train_gpt_pipeline.py --pp 2 -o pipe.json
    lynx plan pipe.json --algo heu --memory-limit 2500000 -o plan.json
    lynx apply plan.json examples/train_gpt_pipeline.py --dry-run

By default it profiles this model analytically, plans it with HEU under a memory limit that forces recomputation
(30% of the way from full recomputation's peak to no recomputation's), applies the plan to each stage and trains.
--plan takes a plan file instead; --demo-placements a hand-made plan with one placement per layer, to see every
trigger fire: stage 0 = embedding, layers.0 (selective, prev_forward), layers.1 (full, grad_wait); stage 1 =
layers.2 (full, layer_above), layers.3 (selective, on_demand), lm_head. The file also defines `lynx_model()`, so
`lynx` can profile it or dry-run a plan against it.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

import lynx_planner
from lynx_planner import policy, solvers
from lynx_planner.analytic import gpt_profile
from lynx_planner.io import load_model
from lynx_planner.models.catalog import GPTConfig
from lynx_planner.models.gpt_block import GPTBlock
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.runtime import attach, runtime_of
from lynx_planner.runtime.pipelining import no_outputs  # return_outputs=False, as torchtitan steps the last stage
from lynx_planner.schema import (
    LayerPolicy,
    ParallelConfig,
    Plan,
    PlanParallel,
    Predicted,
    Profile,
    SolverInfo,
    StagePlan,
    StagePrediction,
)

CONFIG = GPTConfig("example-gpt", num_layers=4, hidden=64, heads=4, vocab=128)
SEQ, MICRO_BATCH, N_MICROBATCHES, DROPOUT = 32, 2, 4, 0.1


class Embedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(CONFIG.vocab, CONFIG.hidden)
        self.position = nn.Parameter(torch.randn(SEQ, 1, CONFIG.hidden) * 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [batch, seq] -> [seq, batch, hidden]
        return self.embed(tokens.t()) + self.position


class LMHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.final_norm = nn.LayerNorm(CONFIG.hidden)
        self.head = nn.Linear(CONFIG.hidden, CONFIG.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [seq, batch, hidden] -> logits [batch, seq, vocab]
        return self.head(self.final_norm(x)).transpose(0, 1)


class PipelineGPT(nn.Module):
    """Module paths match the analytic profile's layer names: 'embedding', 'layers.<i>', 'lm_head'."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding: nn.Module | None = Embedding()
        self.layers = nn.ModuleDict({str(i): GPTBlock(CONFIG.hidden, CONFIG.heads, SEQ, dropout=DROPOUT)
                                     for i in range(CONFIG.num_layers)})
        self.lm_head: nn.Module | None = LMHead()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for layer in self.layers.values():
            x = layer(x)
        return self.lm_head(x) if self.lm_head is not None else x

    @staticmethod
    def layer_names() -> list[str]:
        return ["embedding", *(f"layers.{i}" for i in range(CONFIG.num_layers)), "lm_head"]

    def stage_module(self, layer_names: list[str]) -> PipelineGPT:
        """A copy holding only these layers, under the same module paths (what apply_plan resolves)."""
        stage = copy.deepcopy(self)
        stage.embedding = stage.embedding if "embedding" in layer_names else None
        stage.lm_head = stage.lm_head if "lm_head" in layer_names else None
        for key in [k for k in stage.layers if f"layers.{k}" not in layer_names]:
            del stage.layers[key]
        return stage


def lynx_model() -> tuple[nn.Module, tuple]:
    return PipelineGPT(), (torch.zeros(MICRO_BATCH, SEQ, dtype=torch.long),)


def profile() -> Profile:
    par = ParallelConfig(pp=2, seq_len=SEQ, micro_batch_size=MICRO_BATCH, num_microbatches=N_MICROBATCHES)
    return gpt_profile(CONFIG, par, HARDWARE["a100-80g-nvlink"], dropout=DROPOUT)


def heu_plan(prof: Profile) -> Plan:
    """What `lynx plan --algo heu` writes, for a limit between full recomputation's peak and none's."""
    full = solvers.solve(prof, "full", 1 << 60).evaluation.peak_bytes
    none = solvers.solve(prof, "none", 1 << 60).evaluation.peak_bytes
    limit = int(full + 0.3 * (none - full))
    return solvers.plan(prof, "(in memory)", "", "heu", limit)


def demo_plan(prof: Profile) -> Plan:
    """One policy per layer from policy.py (no solver): mode and placement per layer index."""
    choices = {0: ("none", "on_demand"), 1: ("selective", "prev_forward"), 2: ("full", "grad_wait"),
               3: ("full", "layer_above"), 4: ("selective", "on_demand"), 5: ("none", "on_demand")}
    policies = []
    for index, (mode, at) in choices.items():
        info = policy.analyse(prof.blocks[prof.layers[index].block])
        keep = {"none": policy.none_keep(info), "full": frozenset(), "selective": policy.selective_keep(info)}[mode]
        recompute = policy.full_recompute(info) if mode == "full" else policy.closure(info, keep)
        policies.append(LayerPolicy(layers=(index, index + 1), block=info.block.name, mode=mode, at=at,
                                    keep=[o.id for o in info.block.ops if o.id in keep], recompute=list(recompute)))
    stages = [StagePlan(stage=s, layers=(3 * s, 3 * s + 3), policies=policies[3 * s:3 * s + 3],
                        layer_names=[layer.name for layer in prof.layers[3 * s:3 * s + 3]]) for s in range(2)]
    zero = [StagePrediction(stage=s, peak_memory_bytes=0, static_bytes=0, activation_bytes=0, busy_time_s=0,
                            exposed_recompute_s=0, hidden_recompute_s=0) for s in range(2)]
    return Plan(algo="demo", profile_sha256="", profile_path="", memory_limit_bytes=0,
                parallel=PlanParallel(tp=1, pp=2, dp=1, num_microbatches=N_MICROBATCHES, schedule="1f1b"),
                stages=stages, predicted=Predicted(iteration_time_s=0, ideal_iteration_time_s=0, stages=zero),
                solver=SolverInfo(name="demo", status="heuristic", search_time_s=0))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, CONFIG.vocab), targets.reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", help="a plan file for this model (default: a HEU plan made here)")
    parser.add_argument("--demo-placements", action="store_true", help="a hand-made plan using every placement")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    if args.plan:
        plan = load_model(args.plan, Plan)
    else:
        plan = demo_plan(profile()) if args.demo_placements else heu_plan(profile())
    named = [name for st in plan.stages for name in st.layer_names]
    if named != PipelineGPT.layer_names():  # stage modules keep only the layers their stage names
        raise SystemExit(f"{args.plan}: the plan's stages name the layers {named}, this model has "
                         f"{PipelineGPT.layer_names()}: a plan made for another model would train without some")

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    if rank == 0:
        for st in plan.stages:
            print(f"stage {st.stage}: " + ", ".join(f"{p.layers}: {p.mode} ({len(p.recompute)} ops, {p.at})"
                                                   for p in st.policies), flush=True)
    if world != len(plan.stages):
        raise SystemExit(f"the plan has {len(plan.stages)} stages: run with --nproc-per-node {len(plan.stages)}")

    torch.manual_seed(0)  # the same model and data on every rank
    model = PipelineGPT()
    batch = N_MICROBATCHES * MICRO_BATCH
    tokens = torch.randint(0, CONFIG.vocab, (batch, SEQ + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # one fixed batch: the loss must go down

    stage_module = model.stage_module(plan.stages[rank].layer_names)
    lynx_planner.apply_plan(stage_module, plan, stage=rank)
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    attach(stage)
    schedule = Schedule1F1B(stage, n_microbatches=N_MICROBATCHES, loss_fn=cross_entropy)
    optimizer = torch.optim.AdamW(stage_module.parameters(), lr=3e-3)

    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(inputs)
        else:
            schedule.step(target=targets, losses=losses, **no_outputs(schedule))
        optimizer.step()
        if losses:
            print(f"step {step}: loss {torch.stack(losses).mean().item():.4f}", flush=True)

    done = runtime_of(stage_module).recomputations(micro_batch=0)
    print(f"rank {rank}: recomputations of micro-batch 0 in the last step, by layer: "
          f"{ {layer: triggers[-1] for layer, triggers in sorted(done.items())} }", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
