"""What a multi-rank job costs on this CPU besides its layers' compute (schema.LocalRuntime), measured for the jobs
`lynx validate` runs here: a gloo pipeline (pp ranks, tp = dp = 1) or a data-parallel FSDP2 job (dp ranks, pp = 1).

The block times of a measured profile are one process's layers alone. A real job also runs, on the same cores:
torch's pipeline schedule and stage bookkeeping, the posting and waiting on every send and receive, the loss, the
gradient scaling at the iteration's end, and gloo's communication threads, which copy every byte sent, gathered or
reduced. Measured by CPU time (a busy machine's waits for a CPU stay out, as in the block times):

- pipeline: torch's own schedule (the profile's) run on `pp` processes whose chunks are null modules (one scalar
  weight; outputs of the real boundary and output shapes, so every send and the loss are the real sizes): per rank,
  its training thread's CPU besides the null chunks' forwards, and its communication threads' CPU (the process's
  less the training thread's), per forward or backward item of its order; a gloo ping-pong between ranks 0 and 1
  (as `lynx hardware calibrate`) for the send's bandwidth and latency; the gradient scaling's CPU per parameter on
  the profiled model's own gradients.
- FSDP: the communication threads' CPU per byte and the wall time of a gloo all-gather (output bytes) and
  reduce-scatter (input bytes) of the largest layer's fp32 parameters (up to 64 MiB; the wall also at a sixteenth of
  it, for its fixed part), the collectives FSDP2 runs per unit, each run as FSDP2 runs it on a CPU: synchronously,
  the training thread waiting (docs/timeline.md); and FSDP2's own work on the training thread per unit (copies,
  allocations, hooks, the calling thread's share of the collectives): stand-in units of the largest layer's tensors
  (and of a sixteenth of each) with and without fully_shard, the difference (fsdp_thread_cpu).
- both: the contention between the ranks' compute, compute_slowdown: the model file's whole forward and backward
  timed by CPU on one rank while the others wait, then on every rank at once; the ratio of the medians. The block
  times are one process alone; the job's ranks run beside each other on the shared caches and memory, and each
  rank's kernels take that much more CPU time (contention, not waiting: CPU time excludes the waits for a core).

Whether the communication threads' CPU delays the compute depends on the cores: where the job's threads, each rank's
compute threads and one communication thread, outnumber the cores (2 ranks of 1 thread on 2 cores), every second
they run is taken from a rank's compute (comm_cpu_share 1); with a core to spare for each, nothing (0)."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from .. import schedules
from ..schema import LocalRuntime, ParallelConfig

WARMUP = 2
LINK_BYTES = 16 << 20  # the large send of the ping-pong (as calibrate's): its time is mostly bandwidth
MAX_COLLECTIVE = 64 << 20  # bytes: the largest collective measured (FSDP: the largest layer's, up to this)


def applies(par: ParallelConfig, device: str) -> bool:
    """Whether a measured profile of this setup gets a LocalRuntime: a CPU job lynx validate runs."""
    if device != "cpu" or par.tp != 1 or par.cp != 1:
        return False
    pipeline = par.pp > 1 and par.dp == 1 and par.num_microbatches >= par.pp  # torch's schedules need m >= pp
    fsdp = par.fsdp and par.pp == 1 and par.dp > 1 and par.hsdp_shard_size is None
    return pipeline or fsdp


def comm_cpu_share(ranks: int, threads: int, cores: int) -> float:
    """1 where the job's threads (per rank its compute threads and a communication thread) outnumber the cores, so
    that the communication threads' CPU comes out of compute; else 0."""
    return 1.0 if ranks * (threads + 1) > cores else 0.0


def items(par: ParallelConfig, rank: int) -> int:
    """Forward and backward items in a pipeline rank's order (a split backward's W rides with its B)."""
    order = schedules.order(par.schedule, par.pp, par.virtual_stages, rank, par.num_microbatches)
    return sum(1 for kind, _, _ in order if kind in ("F", "B"))


class _Null(torch.nn.Module):
    """A chunk without compute: its output has the shape the real chunk's has, and carries the gradient to its
    input and its one weight (so torch's stage sends, receives and the loss run at their real sizes)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones((), dtype=dtype))
        self.register_buffer("base", torch.zeros(shape, dtype=dtype))

    def forward(self, *args):
        out = self.base * self.weight
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            out = out + x.mul(0).sum()  # the input's gradient flows (zeros, contiguous), as a real chunk's does
        return out


def _pipeline_worker(rank: int, world: int, port: int, par_json: str, boundary: list[int], output: list[int],
                     inputs, dtype: str, threads: int, repeats: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as torch_schedules

    from ..calibrate import ping_pong
    from ..validate import _squares, pipeline_step

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    try:
        par = ParallelConfig.model_validate_json(par_json)
        torch_dtype = getattr(torch, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype])
        n = par.pp * par.virtual_stages
        clock = time.thread_time
        fwd = [0.0]
        stages = []
        for c in schedules.chunks_of(par.pp, par.virtual_stages, rank):
            module = _Null(tuple(output if c == n - 1 else boundary), torch_dtype)
            start = {}
            module.register_forward_pre_hook(lambda m, a: start.__setitem__(0, clock()))
            module.register_forward_hook(lambda m, a, o: fwd.__setitem__(0, fwd[0] + clock() - start[0]))
            stages.append(PipelineStage(module, c, n, torch.device("cpu")))
        kind = getattr(torch_schedules, schedules.get(par.schedule).torch_class)
        several = issubclass(kind, torch_schedules.PipelineScheduleMulti)
        schedule = kind(stages if several else stages[0], n_microbatches=par.num_microbatches, loss_fn=_squares)
        batch = tuple(torch.cat([x] * par.num_microbatches) for x in inputs)
        target = torch.zeros(par.num_microbatches)
        outside, comm = [], []
        for k in range(WARMUP + repeats):
            dist.barrier()
            fwd[0] = 0.0
            c0, p0 = clock(), time.process_time()
            pipeline_step(schedule, rank, world, batch, target)
            cpu, proc = clock() - c0, time.process_time() - p0
            if k >= WARMUP:
                outside.append(cpu - fwd[0])
                comm.append(proc - cpu)
        link = None
        if rank < 2:
            lat = ping_pong(rank, 4, "cpu", 2 * repeats, peer=1 - rank)
            big = ping_pong(rank, LINK_BYTES, "cpu", repeats, peer=1 - rank)
            link = [LINK_BYTES / max(big - lat, 1e-9), lat]
        else:
            dist.barrier()  # the ping-pong's barriers
            dist.barrier()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
            {"outside": statistics.median(outside), "comm": statistics.median(comm), "link": link}))
    finally:
        dist.destroy_process_group()


def _model_step(model_path: str, overrides: dict, dtype: str):
    """One forward and backward of the model file's model on its example inputs, as one rank runs it."""
    from .loading import load_model_file
    from .recorder import tensors_in

    model, inputs = load_model_file(model_path, dtype=dtype, **overrides)
    model.train()

    def step() -> None:
        out = [t for t in tensors_in(model(*inputs)) if t.requires_grad]
        if out:  # (an output without a gradient: the forward alone)
            out[0].float().pow(2).mean().backward()  # validate's loss (validate._squares)
        model.zero_grad(set_to_none=True)

    return step


def _cpu_time(fn) -> float:
    """The calling thread's CPU seconds of one call of fn."""
    c0 = time.thread_time()
    fn()
    return time.thread_time() - c0


def slowdown(alone: list[float], together: list[float]) -> float:
    """compute_slowdown: the median CPU time of the same work with every rank running it at once over the median with
    one rank running it alone (4 significant digits)."""
    return float(f"{statistics.median(together) / statistics.median(alone):.4g}")


def _compute_worker(rank: int, world: int, port: int, model_path: str, overrides: dict, dtype: str, threads: int,
                    repeats: int, out_dir: str) -> None:
    """Rank 0's forward and backward CPU alone (the others waiting in a barrier: no CPU), then every rank's at once,
    alternated step by step (a drift of the machine's other load moves both alike)."""
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    try:
        step = _model_step(model_path, overrides, dtype)
        alone, together = [], []
        for k in range(WARMUP + repeats):
            if rank == 0:
                alone.append(_cpu_time(step))
            dist.barrier()
            together.append(_cpu_time(step))
            dist.barrier()
        alone, together = alone[WARMUP:], together[WARMUP:]
        Path(out_dir, f"compute{rank}.json").write_text(json.dumps({"alone": alone, "together": together}))
    finally:
        dist.destroy_process_group()


class _Unit(torch.nn.Module):
    """A stand-in for one FSDP unit: flat weights of the unit's tensors' sizes and almost no compute (one pass over
    each weight forward, its gradient backward), so that the same units run with and without FSDP2 differ by FSDP2's
    own work on the training thread (which has a part per tensor as well as per byte)."""

    def __init__(self, sizes: list[int], dtype: torch.dtype) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.full((n,), 1e-3, dtype=dtype)) for n in sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = x + w.sum()
        return x


FSDP_UNITS = 4  # stand-in units in a chain (and the root), per size measured


def fsdp_thread_cpu(world: int, sizes: list[int], dtype: torch.dtype, m: int, repeats: int
                    ) -> tuple[float, float]:
    """(forward, backward) CPU seconds of the training thread per unit and micro-batch that FSDP2 adds to a chain of
    stand-in units whose tensors have `sizes` parameters (each unit fully_shard-ed, resharded after forward, and the
    root, as validate_fsdp.py runs a job: m micro-batches per iteration, FSDP2 reducing on each) over the same units
    without FSDP: its hooks, the all-gather's copy-in and copy-out, the allocations, the reduce-scatter's copy-in
    (chunk_cat), the calling thread's part of each synchronous collective and the sharded gradient's accumulation.
    Medians over the iterations; the ranks run alike and at once (call in every rank of the process group)."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    plain = torch.nn.Sequential(*(_Unit(sizes, dtype) for _ in range(FSDP_UNITS)))
    sharded = copy.deepcopy(plain)
    mesh = init_device_mesh("cpu", (world,))
    for unit in sharded:
        fully_shard(unit, mesh=mesh, reshard_after_forward=True)
    fully_shard(sharded, mesh=mesh)
    x = torch.zeros(8, dtype=dtype, requires_grad=True)

    def iteration(model, fresh_grads: bool) -> tuple[float, float]:
        model.zero_grad(set_to_none=fresh_grads)
        dist.barrier()
        fwd = bwd = 0.0
        for _ in range(m):
            c0 = time.thread_time()
            out = model(x).float().pow(2).mean()
            c1 = time.thread_time()
            out.backward()
            fwd, bwd = fwd + c1 - c0, bwd + time.thread_time() - c1
            if fresh_grads:  # the profile's blocks: each backward makes its gradients afresh
                model.zero_grad(set_to_none=True)
        return fwd, bwd

    extra: list[tuple[float, float]] = []
    for k in range(WARMUP + repeats):
        pf, pb = iteration(plain, True)
        sf, sb = iteration(sharded, False)
        if k >= WARMUP:
            extra.append(((sf - pf) / (m * FSDP_UNITS), (sb - pb) / (m * FSDP_UNITS)))
    return statistics.median(f for f, _ in extra), statistics.median(b for _, b in extra)


def _four_digits(pair: tuple[float, float]) -> list[float]:
    """A measured line written with four significant digits (as the other terms): the profile's bytes stay stable."""
    return [float(f"{x:.4g}") for x in pair]


def line(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float]:
    """(intercept, slope) of the line through two measured points (x0 < x1), each clamped at zero (a negative one is
    noise: no part of a collective or a unit's work takes negative time)."""
    slope = max(0.0, (y1 - y0) / (x1 - x0))
    return max(0.0, y0 - slope * x0), slope


def _fsdp_worker(rank: int, world: int, port: int, nbytes: int, sizes: list[int], dtype: str, m: int, threads: int,
                 repeats: int, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    try:
        full = torch.ones(nbytes // 4)
        shard = torch.ones(nbytes // 4 // world)

        def timed(fn) -> tuple[float, float]:
            """The communication threads' CPU of one collective (the process's less this thread's) and its wall time,
            run as FSDP2 runs it on a CPU: synchronously, the training thread waiting (FSDP2's unshard_async_op is
            False and a CPU has no streams, so no compute runs beside it), both ranks starting together; medians."""
            cpu, wall = [], []
            for k in range(WARMUP + repeats):
                dist.barrier()
                c0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
                fn()
                if k >= WARMUP:
                    wall.append(time.perf_counter() - w0)
                    cpu.append((time.process_time() - p0) - (time.thread_time() - c0))
            return statistics.median(cpu), statistics.median(wall)

        small_bytes = max(4 * world, nbytes // 16 // (4 * world) * 4 * world)
        gather, ag_wall = timed(lambda: dist.all_gather_single(full, shard))
        scatter, rs_wall = timed(lambda: dist.reduce_scatter_single(shard, full))
        full_s, shard_s = full[:small_bytes // 4], shard[:small_bytes // 4 // world]
        _, ag_wall_small = timed(lambda: dist.all_gather_single(full_s, shard_s))
        _, rs_wall_small = timed(lambda: dist.reduce_scatter_single(shard_s, full_s))
        # FSDP2's training-thread work per unit, on units of the largest layer's tensors and of a sixteenth of each
        # (its fixed part: hooks and bookkeeping, per unit and per tensor; its part per parameter: copies and
        # allocations)
        torch_dtype = getattr(torch, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype])
        cap = MAX_COLLECTIVE // 4 / max(1, sum(sizes))  # (a unit beyond the collectives' cap: scaled down to it)
        sizes = [max(1, int(n * cap)) for n in sizes] if cap < 1 else sizes
        smaller = [max(1, n // 16) for n in sizes]
        small, large = sum(smaller), sum(sizes)
        (f0, b0), (f1, b1) = (fsdp_thread_cpu(world, u, torch_dtype, m, repeats) for u in (smaller, sizes))
        if rank == 0:
            Path(out_dir, "fsdp.json").write_text(json.dumps({
                "all_gather": gather / nbytes, "reduce_scatter": scatter / nbytes,
                "all_gather_wall": line(small_bytes, ag_wall_small, nbytes, ag_wall),
                "reduce_scatter_wall": line(small_bytes, rs_wall_small, nbytes, rs_wall),
                "forward": line(small, f0, large, f1), "backward": line(small, b0, large, b1)}))
    finally:
        dist.destroy_process_group()


def grad_scale_s_per_param(model: torch.nn.Module, m: int, repeats: int) -> float:
    """CPU seconds per parameter of the pipeline schedule's gradient scaling (torch's stage.scale_grads: each
    gradient divided in place by the micro-batches), on the model's own parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    if not numel:
        return 0.0
    grads = [torch.zeros_like(p) for p in params]
    times = []
    for _ in range(WARMUP + max(repeats, 10)):  # a fraction of a millisecond: more runs than the blocks get
        t0 = time.thread_time()
        for g in grads:
            g.div_(m)
        times.append(time.thread_time() - t0)
    return statistics.median(times[WARMUP:]) / numel


def compute_slowdown(world: int, model_path: str, overrides: dict, dtype: str, threads: int, repeats: int) -> float:
    """The model file's forward and backward on `world` processes at once over one alone (slowdown)."""
    import torch.multiprocessing as mp

    from ..calibrate import _free_port

    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_compute_worker, args=(world, _free_port(), model_path, overrides, dtype, threads, repeats, out_dir),
                 nprocs=world, join=True)
        ranks = [json.loads(Path(out_dir, f"compute{r}.json").read_text()) for r in range(world)]
    return slowdown(ranks[0]["alone"], ranks[0]["together"])


def measure(par: ParallelConfig, *, model: torch.nn.Module, inputs: tuple, boundary: tuple[int, ...],
            output: tuple[int, ...], dtype: str, threads: int, repeats: int, unit_params: int, model_path: str,
            overrides: dict, unit_tensors: list[int] | None = None) -> LocalRuntime:
    """The LocalRuntime of the job `par` describes (applies() must hold): `inputs` the first stage's example
    inputs (one micro-batch), `boundary` and `output` the shapes a chunk sends and the last one outputs,
    `unit_params` the largest layer's parameters (FSDP's collectives are measured at its size) and `unit_tensors` its
    tensors' sizes (FSDP2's own work, on stand-ins of them; default one tensor of unit_params); `model_path` and
    `overrides` load the model file in each rank's process (load_model_file) for the compute measured there."""
    import logging

    import torch.multiprocessing as mp

    from ..calibrate import _free_port

    cores = os.cpu_count() or 1
    world = par.pp if par.pp > 1 else par.dp
    share = comm_cpu_share(world, threads, cores)
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    slower = compute_slowdown(world, model_path, overrides, dtype, threads, repeats)
    with tempfile.TemporaryDirectory() as out_dir:
        if par.pp > 1:
            tensors = tuple(x for x in inputs if isinstance(x, torch.Tensor))
            mp.spawn(_pipeline_worker, args=(world, _free_port(), par.model_dump_json(), list(boundary), list(output),
                                             tensors, dtype, threads, repeats, out_dir), nprocs=world, join=True)
            ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
            bw, lat = ranks[0]["link"]
            return LocalRuntime(
                cores=cores, ranks=world, comm_cpu_share=share, p2p_bytes_per_s=float(f"{bw:.4g}"),
                p2p_latency_s=float(f"{lat:.4g}"),
                item_s=[float(f"{r['outside'] / items(par, i):.4g}") for i, r in enumerate(ranks)],
                item_comm_s=[float(f"{r['comm'] / items(par, i):.4g}") for i, r in enumerate(ranks)],
                grad_scale_s_per_param=float(f"{grad_scale_s_per_param(model, par.num_microbatches, repeats):.4g}"),
                compute_slowdown=slower)
        # the size of the job's largest unit's gather (fp32 on a CPU), in whole elements per rank
        nbytes = max(world * 4, min(MAX_COLLECTIVE, 4 * unit_params) // (4 * world) * 4 * world)
        mp.spawn(_fsdp_worker, args=(world, _free_port(), nbytes, list(unit_tensors or [unit_params]), dtype,
                                     par.num_microbatches, threads, repeats, out_dir), nprocs=world, join=True)
        rates = json.loads(Path(out_dir, "fsdp.json").read_text())
    return LocalRuntime(cores=cores, ranks=world, comm_cpu_share=share,
                        all_gather_cpu_s_per_byte=float(f"{rates['all_gather']:.4g}"),
                        reduce_scatter_cpu_s_per_byte=float(f"{rates['reduce_scatter']:.4g}"),
                        all_gather_wall=_four_digits(rates["all_gather_wall"]),
                        reduce_scatter_wall=_four_digits(rates["reduce_scatter_wall"]),
                        fsdp_forward=_four_digits(rates["forward"]), fsdp_backward=_four_digits(rates["backward"]),
                        compute_slowdown=slower)
