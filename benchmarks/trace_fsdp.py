"""Where an FSDP2 job's training-thread CPU goes on this machine: the job `lynx validate` runs for an FSDP plan
(benchmarks/validate_gpt.py, 2 gloo ranks, one thread each, fully_shard per layer as validate_fsdp.py wraps it),
with FSDP2's own functions wrapped by a CPU timer (time.thread_time, exclusive of the wrapped calls inside them), and
the same model without FSDP run in the same processes, both ranks at once, alternated micro-batch by micro-batch.

    python benchmarks/trace_fsdp.py [--repeats 3] [--microbatches 4]

Prints per micro-batch, rank 0 (the ranks are alike): the plain model's forward and backward CPU, the FSDP job's,
its communication threads' CPU (comm), the wall time the training thread waited in the synchronous all-gathers and
reduce-scatters, then the FSDP job's split: each wrapped FSDP2 function per unit (exclusive CPU) and the layers' own
forward calls. Indicative on a loaded machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

MODEL = Path(__file__).with_name("validate_gpt.py")


class Timer:
    """Exclusive thread CPU per (name, unit): a wrapped call's time less the wrapped calls inside it."""

    def __init__(self) -> None:
        self.stack: list[list] = []  # [name, unit, start, child time]
        self.excl: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.unit = "-"

    def wrap(self, name: str, fn, unit_of=None):
        timer = self

        def wrapped(*args, **kwargs):
            unit = unit_of(args) if unit_of else (timer.stack[-1][1] if timer.stack else timer.unit)
            t0 = time.thread_time()
            timer.stack.append([name, unit, t0, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                _, _, start, child = timer.stack.pop()
                total = time.thread_time() - start
                timer.excl[(name, unit)] += total - child
                timer.calls[(name, unit)] += 1
                if timer.stack:
                    timer.stack[-1][3] += total
        return wrapped

    def reset(self) -> None:
        self.excl.clear()
        self.calls.clear()


def _worker(rank: int, world: int, port: int, repeats: int, m: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
    from torch.distributed.fsdp._fully_shard import _fsdp_state as st

    from lynx_planner.profiler import load_model_file
    from lynx_planner.validate import _squares

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    timer = Timer()
    clock = time.thread_time
    torch.manual_seed(0)
    model, example = load_model_file(str(MODEL), batch_size=2, seq_len=256)
    model.train()
    plain = copy.deepcopy(model)
    # each layer's own forward, timed inside the module call (FSDP2's hooks run outside it)
    units = [("embedding", model.embedding, True)] + [(f"layers.{i}", model.layers[i], True) for i in range(6)] \
        + [("lm_head", model.lm_head, False)]
    for name, mod, _ in units:
        mod.forward = timer.wrap("layer forward", mod.forward, unit_of=lambda a, n=name: n)
    mesh = init_device_mesh("cpu", (world,))
    for name, mod, resharded in units:
        fully_shard(mod, mesh=mesh, reshard_after_forward=resharded)
    fully_shard(model, mesh=mesh)

    def group_unit(args):
        return args[0]._module_fqn or "root"

    for meth in ("pre_forward", "post_forward", "pre_backward", "post_backward", "unshard", "wait_for_unshard",
                 "reshard"):
        setattr(pg.FSDPParamGroup, meth, timer.wrap(f"ParamGroup.{meth}", getattr(pg.FSDPParamGroup, meth),
                                                    unit_of=group_unit))
    # a static method: its first argument is the group prefetched
    pg.FSDPParamGroup._prefetch_unshard = staticmethod(timer.wrap(
        "ParamGroup._prefetch_unshard", pg.FSDPParamGroup._prefetch_unshard, unit_of=group_unit))
    for fn in ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce"):
        setattr(pg, fn, timer.wrap(fn, getattr(pg, fn)))
    coll.foreach_reduce_scatter_copy_in = timer.wrap("reduce_scatter_copy_in (chunk_cat)",
                                                     coll.foreach_reduce_scatter_copy_in)
    coll._div_if_needed = timer.wrap("_div_if_needed", coll._div_if_needed)
    for meth in ("_pre_forward", "_post_forward", "_root_pre_forward", "_pre_backward",
                 "_root_post_backward_final_callback"):
        if hasattr(st.FSDPState, meth):
            setattr(st.FSDPState, meth, timer.wrap(f"State.{meth}", getattr(st.FSDPState, meth)))
    walls = defaultdict(float)  # wall seconds of the synchronous collectives (the training thread waiting)

    def walled(name, fn):
        def inner(*args, **kwargs):
            w0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                walls[name] += time.perf_counter() - w0
        return inner

    dist.all_gather_single = timer.wrap("gloo all_gather (calling thread)",
                                        walled("all_gather", dist.all_gather_single))
    dist.reduce_scatter_single = timer.wrap("gloo reduce_scatter (calling thread)",
                                            walled("reduce_scatter", dist.reduce_scatter_single))
    # the all-gather's copy-in (the local shard into the flat output: _foreach_copy_) and the copy-out
    # (split_with_sizes_copy) run inside foreach_all_gather / _copy_out; time the two torch calls themselves
    torch._foreach_copy_ = timer.wrap("copy-in _foreach_copy_", torch._foreach_copy_)
    torch.split_with_sizes_copy = timer.wrap("copy-out split_with_sizes_copy", torch.split_with_sizes_copy)

    batch = example
    rows = []
    for k in range(2 + repeats):
        timer.reset()
        walls.clear()
        plain_f = plain_b = fsdp_f = fsdp_b = 0.0
        model.zero_grad(set_to_none=False)
        comm = 0.0
        for _ in range(m):
            dist.barrier()
            c0 = clock()
            loss = _squares(plain(*batch), None)
            c1 = clock()
            loss.backward()
            c2 = clock()
            plain_f += c1 - c0
            plain_b += c2 - c1
            plain.zero_grad(set_to_none=True)
            dist.barrier()
            q0, c0 = time.process_time(), clock()
            loss = _squares(model(*batch), None)
            c1 = clock()
            timer.unit = "backward"
            loss.backward()
            timer.unit = "-"
            c2 = clock()
            fsdp_f += c1 - c0
            fsdp_b += c2 - c1
            comm += (time.process_time() - q0) - (c2 - c0)
        if k >= 2:
            rows.append({"plain_f": plain_f, "plain_b": plain_b, "fsdp_f": fsdp_f, "fsdp_b": fsdp_b, "comm": comm,
                         "wall_ag": walls["all_gather"], "wall_rs": walls["reduce_scatter"],
                         "excl": {f"{n}|{u}": v for (n, u), v in timer.excl.items()},
                         "calls": {f"{n}|{u}": v for (n, u), v in timer.calls.items()}})
    Path(out_dir, f"trace{rank}.json").write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    from lynx_planner.calibrate import _free_port

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(2, _free_port(), args.repeats, args.microbatches, out_dir), nprocs=2, join=True)
        rows = json.loads(Path(out_dir, "trace0.json").read_text())
    m = args.microbatches

    def med(key):
        return statistics.median(r[key] for r in rows) / m

    print(f"per micro-batch, rank 0, median of {len(rows)} iterations (CPU s of the training thread)")
    for key in ("plain_f", "plain_b", "fsdp_f", "fsdp_b", "comm", "wall_ag", "wall_rs"):
        print(f"  {key:8s} {med(key):.4f}")
    keys = sorted({k for r in rows for k in r["excl"]})
    print(f"  {'exclusive CPU per micro-batch':62s} {'s':>8s} {'calls':>6s}")
    for key in keys:
        v = statistics.median(r["excl"].get(key, 0.0) for r in rows) / m
        c = statistics.median(r["calls"].get(key, 0) for r in rows) / m
        print(f"  {key:62s} {v:8.5f} {c:6.1f}")
    by_name = defaultdict(list)
    for r in rows:
        sums = defaultdict(float)
        for key, v in r["excl"].items():
            sums[key.split("|")[0]] += v
        for n, v in sums.items():
            by_name[n].append(v)
    print("  by function, all units:")
    for n, vs in sorted(by_name.items()):
        print(f"  {n:62s} {statistics.median(vs) / m:8.5f}")


if __name__ == "__main__":
    main()
