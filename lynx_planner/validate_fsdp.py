"""`lynx validate` of FSDP plans: run a plan of an `--fsdp` profile (pp = 1) in a real data-parallel FSDP2 job on this
machine (one gloo process per DP rank) and measure what validate.py measures for a pipeline stage.

Every rank builds the model file's model alike (same seed), applies the plan, shards the planned layers in the memory
model's FSDP units (parallel/fsdp.py `units`: one `fully_shard` per layer with the profile's reshard_after_forward, the
final norm and output layer together and kept gathered, as torchtitan 0.3) and the whole model once more, and runs
iterations of `num_microbatches` forward and backward passes (gradient accumulation; FSDP2 reduce-scatters on each).
Measured per rank: forward and backward CPU time of the training thread (the collectives' waits are not CPU time
there: gloo runs them on its own threads), the recomputation inside backward and the one released early, the peak of
live bytes created in one untimed iteration; the iteration is wall time between barriers (its slowest rank). Results
come back as validate.PlanRun, one "stage" per plan (the ranks are alike: rank 0's figures)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from .io import InputError, load_model
from .parallel import fsdp
from .schema import Plan
from .validate import PlanRun, StageTimes, _failure, _free_port, _profile_of, _squares, _stage_module, measure_jobs


def check(plans: list[Plan]) -> int:
    """The DP world size of FSDP plans that can be validated together (InputError otherwise)."""
    par = plans[0].parallel
    if any(not p.parallel.fsdp for p in plans):
        raise InputError("validate: FSDP plans and others cannot be validated in one job")
    if any((p.parallel.tp, p.parallel.pp, p.parallel.cp, p.parallel.dp) != (1, 1, 1, par.dp) for p in plans):
        raise InputError("validate runs FSDP plans with tp = pp = cp = 1 and one dp (a data-parallel FSDP2 job)")
    if any(p.parallel.hsdp_shard_size for p in plans):
        raise InputError("validate runs plain FSDP (no --hsdp-shard-size) on this machine")
    return par.dp


def _worker(rank: int, world: int, port: int, plan_paths: list[str], model_path: str, repeats: int, warmup: int,
            threads: int, dtype: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from .profiler import load_model_file
    from .profiler.memory import LiveBytes
    from .runtime import apply_plan
    from .runtime import region as region_module

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    clock = time.thread_time
    rec = {"bwd": 0.0, "early": 0.0}
    in_backward = [False]
    original = region_module.Region.recompute

    def timed_recompute(self, trigger="on_demand"):
        if self.recomputed:
            return original(self, trigger)
        t0 = clock()
        original(self, trigger)
        rec["bwd" if in_backward[0] else "early"] += clock() - t0

    region_module.Region.recompute = timed_recompute
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        jobs = []
        for path in plan_paths:
            plan = load_model(path, Plan)
            prof = _profile_of(plan, path)
            prof_par = prof.parallel
            torch.manual_seed(0)  # the same model on every rank
            model, example = load_model_file(model_path, batch_size=prof_par.micro_batch_size,
                                             seq_len=prof_par.seq_len)
            model = model.to(torch_dtype).train()
            names = plan.stages[0].layer_names
            module = _stage_module(model, names)
            apply_plan(module, plan, stage=0)
            def layer(name: str):
                try:
                    return module.get_submodule(name)
                except AttributeError:
                    return module.get_submodule(f"model.{name}")

            first = plan.stages[0].layers[0]
            # the planned layers in FSDP units as the memory model wraps them (torchtitan's wrapping: fsdp.units),
            # then the rest
            for members, resharded in fsdp.units(prof, list(range(*plan.stages[0].layers))):
                mods = [layer(names[i - first]) for i in members]
                fully_shard(mods if len(mods) > 1 else mods[0], mesh=mesh, reshard_after_forward=resharded)
            fully_shard(module, mesh=mesh, reshard_after_forward=prof_par.reshard_after_forward)
            batch = tuple(x.to(torch_dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                          for x in example)
            jobs.append((module, batch, plan.parallel.num_microbatches))
        tracker: list[LiveBytes | None] = [None]
        held = [0]  # the most live bytes when a backward starts (with the tracker on)

        def iteration(job) -> tuple[float, StageTimes]:
            module, batch, m = job
            module.zero_grad(set_to_none=False)
            fwd = bwd = wall = 0.0
            rec["bwd"] = rec["early"] = 0.0
            dist.barrier()
            t0, c00, p0 = time.perf_counter(), clock(), time.process_time()
            for _ in range(m):
                c0, w0 = clock(), time.perf_counter()
                loss = _squares(module(*batch), None)
                fwd += clock() - c0
                if tracker[0] is not None:
                    held[0] = max(held[0], tracker[0].live)
                in_backward[0] = True
                c1 = clock()
                loss.backward()
                in_backward[0] = False
                bwd += clock() - c1
                wall += time.perf_counter() - w0
            cpu, proc = clock() - c00, time.process_time() - p0
            dist.barrier()
            return time.perf_counter() - t0, StageTimes(fwd, bwd, rec["bwd"], rec["early"], wall,
                                                        outside_compute_s=cpu - fwd - bwd, comm_threads_s=proc - cpu)

        results = measure_jobs(jobs, iteration, warmup, repeats, tracker, held)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    except BaseException as e:  # reported by the parent in one line
        Path(out_dir, f"rank{rank}.error").write_text(_failure(e, model_path))
        os._exit(1)
    region_module.Region.recompute = original
    dist.barrier()
    dist.destroy_process_group()


def run(plan_paths: list[str], plans: list[Plan], model_path: str, repeats: int, warmup: int, threads: int,
        dtype: str) -> list[PlanRun]:
    import logging

    import torch.multiprocessing as mp

    world = check(plans)
    with tempfile.TemporaryDirectory() as out_dir:
        logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
        try:
            mp.spawn(_worker, args=(world, _free_port(), plan_paths, str(Path(model_path).resolve()), repeats,
                                    warmup, threads, dtype, out_dir), nprocs=world, join=True)
        except (mp.ProcessRaisedException, mp.ProcessExitedException):
            errors = [f"rank {r}: {Path(out_dir, f'rank{r}.error').read_text()}" for r in range(world)
                      if Path(out_dir, f"rank{r}.error").exists()]
            raise InputError(f"{model_path}: the FSDP job failed: {'; '.join(errors) or 'a rank process died'}") \
                from None
        per_rank = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
    runs = []
    for i, (path, plan) in enumerate(zip(plan_paths, plans)):
        pr = PlanRun(Path(path).stem, plan, _profile_of(plan, path))
        pr.iterations_s = [max(per_rank[r][i]["iterations"][k] for r in range(world)) for k in range(repeats)]
        pr.stages = [[StageTimes(**per_rank[0][i]["stages"][k])] for k in range(repeats)]
        for st in pr.stages:
            st[0].activation_bytes = per_rank[0][i]["activation_bytes"]
            st[0].held_at_backward_bytes = per_rank[0][i]["held_at_backward_bytes"]
        runs.append(pr)
    return runs
