"""`lynx validate`: run plans in a real torch.distributed.pipelining job on this machine and compare, per stage and for
the iteration, what each plan predicts with what the run measures.

One process per pipeline stage (gloo; the model file is built in each, seeded alike), each applying the plan's stage
with `apply_plan` and the pipelining trigger (`runtime.attach`), then timing iterations of the plan's schedule. With
several plans, every process holds one stage module per plan and runs their iterations interleaved, each round starting
one plan later, so load on a shared machine hits them alike. Measured per stage: forward and backward (CPU time of the
process's compute thread, summed over micro-batches; with one thread per process this is compute only, waits excluded),
the recomputation run inside backward (on demand or triggered by the layer above, or in a split backward's W: on the
critical path) and the one released early, and, from a storage tracker in one extra untimed iteration, the peak of live
bytes created in the iteration (activations, recomputed tensors and backward's transient gradients) and the most held
when a backward starts (the kept activations of the micro-batches in flight; predicted: walking the rank's order, the
kept bytes of the micro-batches in flight plus, with a split backward, the graphs whose W has not run). The predicted
peak is the plan's activation peak (kept plus recomputed tensors, no transient gradients); on an FSDP rank, with
the tensors FSDP2 makes anew each iteration beside them (fsdp_peak). The iteration time is wall time between barriers. Predicted backward includes the exposed
recomputation, as the measured one does. Precision and threads follow the profile (fp32 on CPU; the profile's threads,
else 1). Besides the chunks, the training thread's CPU (schedule, sends and receives, the loss, gradient scaling)
and the communication threads' are measured, and predicted where the profile measured the job's runtime
(LocalRuntime, profiler/runtime.py: the simulator charges them to the compute stream).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable
from datetime import timedelta
from pathlib import Path

from . import schedules, simulator, streams
from .parallel import fsdp
from .io import InputError, find_beside, load_model
from .schema import Plan, Profile


@dataclass
class StageTimes:
    forward_s: float
    backward_s: float  # including the recomputation that ran inside it
    recompute_in_backward_s: float
    recompute_early_s: float
    compute_wall_s: float = 0.0  # wall time of the forward and backward chunks (vs their CPU time: the CPU share)
    activation_bytes: int = 0  # peak of the bytes of storages created during the iteration (gradients included)
    held_at_backward_bytes: int = 0  # the most held when a backward started (kept activations of in-flight batches)
    # CPU time of the training thread outside the forward and backward chunks (the schedule's bookkeeping, posting
    # and waiting on sends and receives, the loss, gradient scaling), and of the process's other threads (gloo's
    # communication); predicted from a profile's LocalRuntime (runtime_cpu), else measured only
    outside_compute_s: float = 0.0
    comm_threads_s: float = 0.0


@dataclass
class PlanRun:
    name: str
    plan: Plan
    profile: Profile
    iterations_s: list[float] = field(default_factory=list)
    stages: list[list[StageTimes]] = field(default_factory=list)  # per repeat, per stage


# predictions ------------------------------------------------------------------------------------------------------
def predicted_stage(profile: Profile, plan: Plan, stage: int) -> StageTimes:
    """What the plan's profile says one iteration of a pipeline stage (a rank: all its chunks) costs (sums over its
    layers and micro-batches)."""
    par = plan.parallel
    m = par.num_microbatches
    fwd = bwd = 0.0
    split = schedules.get(par.schedule).splits_backward  # B and W as the simulator prices them
    kept, after_b, peak = {}, {}, plan.predicted.stages[stage].activation_bytes
    for c in schedules.chunks_of(par.pp, par.virtual_stages, stage):
        st = plan.stages[c]
        runs = simulator.stage_runs(profile, st.layers[0], st.layers[1], st.policies)
        if par.fsdp:
            peak = max(peak, fsdp_peak(profile, runs, peak))
            # what the simulator charges to compute that is not the training thread's CPU: the communication
            # threads' CPU, or in line the collectives' wall
            stolen = streams.not_training_thread_s(profile, [profile.layers[r.index].params for r in runs])
            fwd -= sum(f for f, _ in stolen)
            bwd -= sum(b for _, b in stolen)
        fwd += sum(sum(r.fwd[0::2]) for r in runs)
        bwd += sum(sum(r.bwd_input[0::2]) + r.wgrad_s if split else sum(r.bwd[0::2]) for r in runs)
        kept[c] = sum(r.kept_bytes for r in runs)
        after_b[c] = sum(r.kept_bytes + r.rec_bytes + r.wgrad_bytes for r in runs) if split else 0
    pred = plan.predicted.stages[stage]
    held = held_at_backward(schedules.order(par.schedule, par.pp, par.virtual_stages, stage, m), kept, after_b)
    besides, comm = runtime_cpu(profile, plan, stage)
    return StageTimes(forward_s=m * fwd, backward_s=m * bwd + pred.exposed_recompute_s,
                      recompute_in_backward_s=pred.exposed_recompute_s, recompute_early_s=pred.hidden_recompute_s,
                      activation_bytes=peak, held_at_backward_bytes=held, outside_compute_s=besides,
                      comm_threads_s=comm)


def runtime_cpu(profile: Profile, plan: Plan, rank: int) -> tuple[float, float]:
    """What a measured CPU profile's LocalRuntime says a rank's training thread spends per iteration besides its
    chunks (pipeline: per forward and backward item, and the gradient scaling) and its communication threads (per
    item; FSDP: every all-gather and reduce-scatter at the measured CPU per byte). The simulator charges the first and
    comm_cpu_share of the second to the compute stream. (0, 0) without one."""
    from .profiler.runtime import items

    par = profile.parallel
    if profile.runtime is None:
        return 0.0, 0.0
    layers = [i for c in schedules.chunks_of(par.pp, par.virtual_stages, rank) for i in range(*plan.stages[c].layers)]
    params = [profile.layers[i].params for i in layers]
    rt = profile.runtime
    besides = comm = 0.0
    if par.pp > 1 and rank < len(rt.item_s):
        n = items(par, rank)
        besides = n * rt.item_s[rank] + streams.grad_scale_s(profile, sum(params))
        comm = n * rt.item_comm_s[rank] if rank < len(rt.item_comm_s) else 0.0
    if par.fsdp and rt.comm_cpu_share:
        ag, rs = streams.collective_cpu_s(profile, params)
        gathers = 2 if fsdp.gathers_in_backward(par) else 1  # the top layer's backward gather counts too
        comm = par.num_microbatches * (gathers * sum(ag) + sum(rs)) / profile.runtime.comm_cpu_share
    return besides, comm


def fsdp_peak(profile: Profile, runs, activation_peak: int) -> int:
    """The live bytes validate's probe sees on an FSDP rank: beside the activations, the tensors FSDP2 makes anew each
    iteration (all-gather outputs, unsharded gradients, reduce-scatter buffers: fsdp.backward_new_bytes), at each
    unit's (layer's) backward and reduction. The activations there (one micro-batch in flight): the kept bytes of
    the units up to it, in its backward also its recomputed tensors and the plan's backward transient (the
    activation peak less the largest such sum), at its reduction without its own (its backward freed them)."""
    new = fsdp.backward_new_bytes(profile, [r.index for r in runs])
    below, base = [], 0
    for r in runs:
        below.append(base)
        base += r.kept_bytes
    held = [b + r.kept_bytes + r.rec_bytes + r.bwd_transient for b, r in zip(below, runs)]  # the loss's at its layer
    transient = max(0, activation_peak - max(held))
    return max(max(h + transient + during, b + post) for h, b, (during, post) in zip(held, below, new))


def held_at_backward(order, kept: dict[int, int], after_b: dict[int, int]) -> int:
    """The most bytes a rank holds when one of its backwards (B) starts, walking its order of work: the kept bytes
    (per micro-batch, of chunk c: kept[c]) of each micro-batch whose forward ran and whose B has not, plus, where the
    backward is split, what each one whose B ran and whose W has not still holds (after_b[c]: its graph, kept and
    recomputed tensors and the output gradients W reads). One walk, not a sum of per-chunk or per-state maxima: those
    fall at different times (a sum of them overstated zero bubble's and interleaved's holdings)."""
    held = most = 0
    for kind, c, _ in order:
        if kind == "F":
            held += kept[c]
        elif kind == "B":
            most = held if held > most else most
            held += after_b[c] - kept[c] if after_b[c] else -kept[c]
        else:  # W: the graph is freed
            held -= after_b[c]
    return most


# the job ------------------------------------------------------------------------------------------------------------
_STAGE_HINT = (". A stage calls its layers in order, each on the previous one's output; a model whose layers do not "
               "chain so (e.g. position embeddings added beside the token embedding) needs a "
               "stage_module(layer_names) in its file (docs/integrations.md)")

def _stage_module(model, layer_names: list[str]):
    """The model's own `stage_module(layer_names)` if it has one, else the stage's layers called in order."""
    import torch

    if hasattr(model, "stage_module"):
        return model.stage_module(layer_names)

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model  # keeps the model's module paths (apply_plan resolves them under `model.`)

        def forward(self, *args):
            x = args
            for name in layer_names:
                out = self.model.get_submodule(name)(*x)
                x = out if isinstance(out, tuple) else (out,)
            return x[0] if len(x) == 1 else x

    return Chain()


def _squares(output, target):
    """The loss of the timing runs: any output works; its cost is negligible beside the model's."""
    return output.float().pow(2).mean()


def pipeline_step(schedule, rank: int, world: int, batch: tuple, target) -> None:
    """One step of torch's pipeline schedule as each rank calls it: the first feeds the batch, the last the target
    and, as torchtitan's trainer does, asks for no outputs (torch would otherwise keep every micro-batch's output
    until the step ends, memory a training job does not spend and a plan does not count)."""
    from .runtime.pipelining import no_outputs
    if world == 1:
        schedule.step(*batch, target=target, losses=[], **no_outputs(schedule))
    elif rank == 0:
        schedule.step(*batch)
    elif rank == world - 1:
        schedule.step(target=target, losses=[], **no_outputs(schedule))
    else:
        schedule.step()


def _worker(rank: int, world: int, port: int, plan_paths: list[str], model_path: str, repeats: int, warmup: int,
            threads: int, dtype: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, schedules as torch_schedules

    from .profiler import load_model_file
    from .profiler.memory import LiveBytes
    from .runtime import apply_plan, attach
    from .runtime import region as region_module

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    clock = time.thread_time
    rec_in_bwd = [0.0]
    rec_early = [0.0]
    in_backward = [False]
    original = region_module.Region.recompute

    def timed_recompute(self, trigger="on_demand"):
        if self.recomputed:
            return original(self, trigger)
        t0 = clock()
        original(self, trigger)
        (rec_in_bwd if in_backward[0] else rec_early)[0] += clock() - t0

    region_module.Region.recompute = timed_recompute
    try:
        plans = [load_model(p, Plan) for p in plan_paths]
        torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        jobs = []
        for plan in plans:
            par = plan.parallel
            profile_par = _profile_of(plan, plan_paths[plans.index(plan)]).parallel
            torch.manual_seed(0)  # the same model on every rank
            model, example = load_model_file(model_path, batch_size=profile_par.micro_batch_size,
                                             seq_len=profile_par.seq_len)
            model = model.to(torch_dtype).train()
            chunks = schedules.chunks_of(par.pp, par.virtual_stages, rank)
            modules, stages = [], []
            for c in chunks:  # one stage module per chunk the rank holds (interleaved: several)
                names = plan.stages[c].layer_names
                module = _stage_module(model, names)
                apply_plan(module, plan, stage=c)
                stage = PipelineStage(module, c, len(plan.stages), torch.device("cpu"))
                attach(stage, _first_layer(module, names[0]))
                modules.append(module)
                stages.append(stage)
            kind = getattr(torch_schedules, schedules.get(par.schedule).torch_class)
            several = issubclass(kind, torch_schedules.PipelineScheduleMulti)
            schedule = kind(stages if several else stages[0], n_microbatches=par.num_microbatches, loss_fn=_squares)
            batch = tuple(torch.cat([x] * par.num_microbatches) if isinstance(x, torch.Tensor) else x
                          for x in example)
            batch = tuple(x.to(torch_dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                          for x in batch)
            target = torch.zeros(par.num_microbatches * profile_par.micro_batch_size)
            times = {"fwd": 0.0, "bwd": 0.0, "wall": 0.0}

            def timed(fn, key: str, times=times, backward: bool = False, starts: bool = False):
                """fn, its CPU and wall time added to times[key]; a backward marks it (recomputation inside counts as
                in backward); one that `starts` a micro-batch's backward also samples the held bytes."""
                def run(*a, **k):
                    if starts and tracker[0] is not None:
                        held_at_backward[0] = max(held_at_backward[0], tracker[0].live)
                    in_backward[0] = backward
                    t0, w0 = clock(), time.perf_counter()
                    try:
                        return fn(*a, **k)
                    finally:
                        in_backward[0] = False
                        times[key] += clock() - t0
                        times["wall"] += time.perf_counter() - w0
                return run

            def wrap(stage):
                stage.forward_one_chunk = timed(stage.forward_one_chunk, "fwd")
                stage.backward_one_chunk = timed(stage.backward_one_chunk, "bwd", backward=True, starts=True)
                # zero bubble's W: part of the backward's time, and a recomputation it runs is on its critical path
                # (torch's first stage runs its whole backward in W: its input needs no gradient)
                stage.backward_weight_one_chunk = timed(stage.backward_weight_one_chunk, "bwd", backward=True)

            for stage in stages:
                wrap(stage)
            jobs.append((modules, schedule, batch, target, times))
        tracker: list[LiveBytes | None] = [None]
        held_at_backward = [0]

        def iteration(job) -> tuple[float, StageTimes]:
            modules, schedule, batch, target, times = job
            for p in {id(p): p for module in modules for p in module.parameters()}.values():
                if p.grad is not None:
                    p.grad.zero_()  # in place: gradients are not new storages for the tracker
            times["fwd"] = times["bwd"] = times["wall"] = 0.0
            rec_in_bwd[0] = rec_early[0] = 0.0
            dist.barrier()
            t0, c0, p0 = time.perf_counter(), clock(), time.process_time()
            pipeline_step(schedule, rank, world, batch, target)
            cpu, proc = clock() - c0, time.process_time() - p0
            dist.barrier()
            wall = time.perf_counter() - t0
            return wall, StageTimes(times["fwd"], times["bwd"], rec_in_bwd[0], rec_early[0], times["wall"],
                                    outside_compute_s=cpu - times["fwd"] - times["bwd"], comm_threads_s=proc - cpu)

        results = measure_jobs(jobs, iteration, warmup, repeats, tracker, held_at_backward)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    except BaseException as e:  # reported by the parent in one line, not as a child traceback
        Path(out_dir, f"rank{rank}.error").write_text(_failure(e, model_path))
        os._exit(1)  # at once: the other stages wait in collectives, and the parent ends them
    region_module.Region.recompute = original
    dist.barrier()
    dist.destroy_process_group()


def measure_jobs(jobs: list, iteration, warmup: int, repeats: int, tracker: list, held: list) -> list[dict]:
    """Warm-up, then `repeats` timed rounds over the jobs in rotated order (`iteration(job)` -> (wall, StageTimes)),
    then one more iteration of each under a LiveBytes tracker (`tracker[0]`; `held[0]`: the bytes held when its
    backward starts, set by the iteration)."""
    from .profiler.memory import LiveBytes

    for k in range(warmup):
        for i in _rotated(len(jobs), k):
            iteration(jobs[i])
    results: list[dict] = [{"iterations": [], "stages": []} for _ in jobs]
    for k in range(repeats):
        for i in _rotated(len(jobs), k):
            wall, st = iteration(jobs[i])
            results[i]["iterations"].append(wall)
            results[i]["stages"].append(st.__dict__)
    for i, job in enumerate(jobs):
        tracker[0], held[0] = LiveBytes(), 0
        with tracker[0]:
            iteration(job)
        results[i]["activation_bytes"] = tracker[0].peak
        results[i]["held_at_backward_bytes"] = held[0]
        tracker[0] = None
    return results


def _rotated(n: int, k: int) -> list[int]:
    """The plans' order in round k: each round starts one plan later, so that no plan always runs right after the
    same one or first in its round (whatever the previous iteration left behind, allocator and caches, falls on all
    plans alike)."""
    return [(k + i) % n for i in range(n)]


def _failure(e: BaseException, model_path: str) -> str:
    """One line: the exception and the innermost line of the model file it came from (else the innermost line)."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    inside = [f for f in frames if f.filename == model_path] or frames[-1:]
    where = f" (at {Path(inside[-1].filename).name}:{inside[-1].lineno})" if inside else ""
    return (f"{type(e).__name__}: {e}".splitlines() or [""])[0] + where


def _first_layer(module, layer_name: str):
    """A chunk's first layer inside its stage module (the chain keeps the model under `model.`): what `attach` finds
    the chunk's runtime by, where several chunks share the model."""
    try:
        return module.get_submodule(layer_name)
    except AttributeError:
        return module.get_submodule(f"model.{layer_name}")


def _profile_of(plan: Plan, plan_path: str) -> Profile:
    path = find_beside(plan.profile_path, plan_path)
    if path is None:
        raise InputError(f"{plan_path}: its profile {plan.profile_path!r} is neither beside it nor at that path; "
                         "validate needs the profile the plan was made from")
    return load_model(path, Profile)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(plan_paths: list[str], model_path: str, repeats: int = 5, warmup: int = 2,
        threads: int | None = None, progress: Callable[[str], None] | None = None) -> list[PlanRun]:
    """Validate plans of one model (same pipeline depth) in one job; returns per plan the measured repeats.
    `progress` hears what it is doing (the run takes tens of seconds)."""
    from .runtime import dry_run

    say = progress or (lambda message: None)

    plans = [load_model(p, Plan) for p in plan_paths]
    profiles = [_profile_of(plan, path) for plan, path in zip(plans, plan_paths)]
    if any(plan.parallel.fsdp for plan in plans):  # a data-parallel FSDP2 job (validate_fsdp.py)
        from . import validate_fsdp

        validate_fsdp.check(plans)
        for path in plan_paths:
            dry_run(path, model_path)
        if getattr(profiles[0], "autocast", None):
            raise InputError("validate does not run autocast profiles yet")
        threads = threads or int(profiles[0].model.config.get("threads", 0) or 0) or 1
        return validate_fsdp.run([str(p) for p in plan_paths], plans, model_path, repeats, warmup, threads,
                                 getattr(profiles[0], "dtype", None) or "fp32")
    pps = {plan.parallel.pp for plan in plans}
    if len(pps) != 1:
        raise InputError(f"plans with different pipeline depths ({sorted(pps)}) cannot be validated in one job")
    if any(plan.parallel.tp != 1 or plan.parallel.dp != 1 for plan in plans):
        raise InputError("validate runs pipeline parallelism (tp = dp = 1) or FSDP data parallelism (--fsdp, pp = 1)")
    for path in plan_paths:
        say(f"checking {path} against {model_path} (one training step with the plan applied)")
        dry_run(path, model_path)  # the plan fits the model file and its profile
    profile = profiles[0]
    threads = threads or int(profile.model.config.get("threads", 0) or 0) or 1
    dtype = getattr(profile, "dtype", None) or "fp32"
    if getattr(profile, "autocast", None):
        raise InputError("validate does not run autocast profiles yet")
    import torch.multiprocessing as mp

    world = pps.pop()
    with tempfile.TemporaryDirectory() as out_dir:
        import logging

        # its 'Terminating process ... via signal SIGTERM' when one stage failed: the failure is reported below
        logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
        say(f"running {len(plans)} plan(s) in a {world}-stage gloo pipeline: {warmup} warm-up and {repeats} "
            "measured iterations each")
        try:
            mp.spawn(_worker, args=(world, _free_port(), [str(p) for p in plan_paths],
                                    str(Path(model_path).resolve()), repeats, warmup, threads, dtype, out_dir),
                     nprocs=world, join=True)
        except (mp.ProcessRaisedException, mp.ProcessExitedException):
            errors = [f"stage {r}: {Path(out_dir, f'rank{r}.error').read_text()}" for r in range(world)
                      if Path(out_dir, f"rank{r}.error").exists()]
            raise InputError(f"{model_path}: the pipeline job failed: {'; '.join(errors) or 'a stage process died'}"
                             + _STAGE_HINT) from None
        per_rank = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
    runs = []
    for i, (path, plan, prof) in enumerate(zip(plan_paths, plans, profiles)):
        pr = PlanRun(Path(path).stem, plan, prof)
        pr.iterations_s = [max(per_rank[r][i]["iterations"][k] for r in range(world)) for k in range(repeats)]
        pr.stages = [[StageTimes(**per_rank[r][i]["stages"][k]) for r in range(world)] for k in range(repeats)]
        for r in range(world):
            for st in pr.stages:
                st[r].activation_bytes = per_rank[r][i]["activation_bytes"]
                st[r].held_at_backward_bytes = per_rank[r][i]["held_at_backward_bytes"]
        runs.append(pr)
    return runs


# report -------------------------------------------------------------------------------------------------------------
def _spread(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q[0], q[2]


def summary(run_: PlanRun) -> dict:
    """Predicted and measured figures of one plan (medians over repeats, spread as 25th-75th percentiles)."""
    stages = []
    for s in range(run_.plan.parallel.pp):  # per rank
        pred = predicted_stage(run_.profile, run_.plan, s)
        meas = {k: _spread([getattr(rep[s], k) for rep in run_.stages])
                for k in ("forward_s", "backward_s", "recompute_in_backward_s", "recompute_early_s",
                          "outside_compute_s", "comm_threads_s")}
        stages.append({"stage": s, "predicted": pred.__dict__,
                       "measured": {k: v[0] for k, v in meas.items()} | {
                           "activation_bytes": run_.stages[0][s].activation_bytes,
                           "held_at_backward_bytes": run_.stages[0][s].held_at_backward_bytes},
                       "spread": {k: [v[1], v[2]] for k, v in meas.items()}})
    med, lo, hi = _spread(run_.iterations_s)
    pred = run_.plan.predicted.iteration_time_s
    cpu = sum(st.forward_s + st.backward_s for rep in run_.stages for st in rep)
    wall = sum(st.compute_wall_s for rep in run_.stages for st in rep)
    return {"plan": run_.name, "algo": run_.plan.algo, "profile_method": run_.profile.method,
            "hardware": run_.profile.hardware.name, "runtime": run_.profile.runtime is not None, "stages": stages, "cpu_share": cpu / wall if wall else 1.0,
            "iteration": {"predicted_s": pred, "measured_s": med, "spread_s": [lo, hi],
                          "predicted_over_measured": pred / med, "repeats": run_.iterations_s}}


def table(summaries: list[dict]) -> str:
    """The plain-text report: per plan, per stage predicted / measured, then the iterations."""
    lines = []
    mib = 1 << 20
    for s in summaries:
        lines.append(f"plan {s['plan']} ({s['algo']})")
        if s["profile_method"] != "measure":
            lines.append(f"  note: its profile is {s['profile_method']} (times for {s['hardware']}), not measured here")
        rows = (("forward s", "forward_s", 1, 4), ("backward s", "backward_s", 1, 4),
                ("recompute in backward s (exposed)", "recompute_in_backward_s", 1, 4),
                ("recompute early s (hidden)", "recompute_early_s", 1, 4),
                ("kept MiB when a backward starts", "held_at_backward_bytes", mib, 1),
                ("peak MiB", "activation_bytes", mib, 1))
        # one line per figure (not a column per figure): it stays within 80 columns
        for st in s["stages"]:
            p, m = st["predicted"], st["measured"]
            lines.append(f"  stage {st['stage']:<37}{'predicted':>10}  {'measured':>10}")
            for label, key, scale, digits in rows:
                lines.append(f"    {label:<39}{p[key] / scale:>10.{digits}f}  {m[key] / scale:>10.{digits}f}")
            # what the CPU does besides the chunks: predicted where the profile measured the job's runtime
            # (LocalRuntime)
            modelled = s.get("runtime", False)
            for label, key in (("schedule, sends and loss, CPU s", "outside_compute_s"),
                               ("communication threads, CPU s", "comm_threads_s")):
                if key in m:  # (summaries written before these were measured have none)
                    pred = f"{p[key]:>10.4f}" if modelled and p.get(key) else f"{'-':>10}"
                    lines.append(f"    {label:<39}{pred}  {m[key]:>10.4f}")
        busy = [sum(st[k]["forward_s"] + st[k]["backward_s"] for st in s["stages"]) for k in ("predicted", "measured")]
        lines.append(f"  compute (forward + backward, all stages): predicted {busy[0]:.4f} s, measured CPU "
                     f"{busy[1]:.4f} s, predicted/measured {busy[0] / busy[1]:.3f}")
        it = s["iteration"]
        lines.append(f"  iteration: predicted {it['predicted_s']:.4f} s, measured median {it['measured_s']:.4f} s "
                     f"[{it['spread_s'][0]:.4f}-{it['spread_s'][1]:.4f}], predicted/measured "
                     f"{it['predicted_over_measured']:.3f}")
    share = min(s["cpu_share"] for s in summaries)
    lines.append(f"compute got {share:.0%} of a CPU (CPU time / wall time of the forward and backward chunks)"
                 + (": the machine was busy, wall-clock times include waiting for a CPU" if share < 0.9 else ""))
    by_algo = {s["algo"]: s["iteration"] for s in summaries}
    if "full" in by_algo and "none" in by_algo:
        full, none = by_algo["full"], by_algo["none"]
        lines.append(f"full/none: predicted {full['predicted_s'] / none['predicted_s']:.3f}, "
                     f"measured {full['measured_s'] / none['measured_s']:.3f}")
    load = os.getloadavg()
    lines.append(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    import shutil
    import textwrap

    width = max(60, shutil.get_terminal_size((100, 24)).columns)
    wrapped = []
    for line in lines:  # at spaces, so that no figure is cut by the terminal
        indent = " " * (len(line) - len(line.lstrip()))
        wrapped += textwrap.wrap(line, width=width, subsequent_indent=indent + "  ", break_long_words=False,
                                 break_on_hyphens=False) or [line]
    return "\n".join(wrapped)
