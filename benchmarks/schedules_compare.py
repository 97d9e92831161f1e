"""1F1B vs interleaved 1F1B vs zero bubble on one catalog case, each planned with HEU and with Megatron's best
built-in recomputation (the fastest of none, selective, full, uniform and block N that fits), all judged by the
simulator: iteration time and peak memory per pipeline rank.

    python benchmarks/schedules_compare.py [--model gpt-175b] [--hardware a100-80g-nvlink] [--tp 8] [--pp 8]
        [--micro-batch-size 2] [--num-microbatches 32] [--memory-limit 80GiB]
"""

from __future__ import annotations

import argparse
import resource
import time

from lynx_planner.build import build_profile
from lynx_planner.io import parse_size
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import ParallelConfig
from lynx_planner.solvers import Infeasible, solve

SCHEDULES = [("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3), ("zero-bubble", 1), ("zero-bubble", 2)]
MEGATRON = ("none", "selective", "full", "uniform", "block")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-175b")
    ap.add_argument("--hardware", default="a100-80g-nvlink")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=8)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--num-microbatches", type=int, default=32)
    ap.add_argument("--memory-limit", default=None)
    args = ap.parse_args()
    hw = HARDWARE[args.hardware]
    limit = parse_size(args.memory_limit) if args.memory_limit else hw.memory_bytes
    print(f"{args.model} on {hw.name}, tp {args.tp} pp {args.pp}, micro-batch {args.micro_batch_size} x "
          f"{args.num_microbatches}, limit {limit / 2**30:.1f} GiB; peak GiB per pipeline rank")
    print(f"{'schedule':<18}{'v':>2}  {'plan':<18}{'iter s':>8}  {'vs 1F1B HEU':>11}  {'search CPU s':>12}  peaks GiB")
    base = None
    for name, v in SCHEDULES:
        par = ParallelConfig(tp=args.tp, pp=args.pp, micro_batch_size=args.micro_batch_size,
                             num_microbatches=args.num_microbatches, schedule=name, virtual_stages=v)
        prof = build_profile(args.model, par, hw)
        rows = []
        t0 = time.process_time()
        try:
            heu = solve(prof, "heu", limit)
            rows.append(("heu", heu.evaluation, time.process_time() - t0))
        except Infeasible as e:
            rows.append(("heu", None, str(e)))
        megatron, least = [], None
        for algo in MEGATRON:
            try:
                megatron.append((algo, solve(prof, algo, limit).evaluation))
            except Infeasible as e:
                least = min(least or e.needed, e.needed)
        if megatron:
            algo, best = min(megatron, key=lambda x: x[1].predicted.iteration_time_s)
            rows.append((f"megatron {algo}", best, None))
        else:
            rows.append(("megatron", None, f"none of {', '.join(MEGATRON)} fits (the least needs "
                                          f"{least / 2**30:.2f} GiB)"))
        for label, e, cpu in rows:
            if e is None:
                print(f"{name:<18}{v:>2}  {label:<18}{'-':>8}  {cpu}")
                continue
            t = e.predicted.iteration_time_s
            base = base or t
            peaks = " ".join(f"{s.peak_memory_bytes / 2**30:.1f}" for s in e.predicted.stages)
            print(f"{name:<18}{v:>2}  {label:<18}{t:>8.3f}  {base / t:>10.3f}x  "
                  f"{'' if cpu is None else f'{cpu:.2f}':>12}  {peaks}")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"process CPU {usage.ru_utime + usage.ru_stime:.1f} s, max RSS {usage.ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
