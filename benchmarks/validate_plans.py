"""Predicted vs measured, end to end on this machine: calibrate, profile, plan none/full/heu, run them for real.

    python benchmarks/validate_plans.py [--schedule 1f1b|zero-bubble] [--repeats 5] [--out DIR] [--hardware HW.json]
    python benchmarks/validate_plans.py --schedule interleaved-1f1b --virtual-stages 2

1. `lynx hardware calibrate` (unless --hardware is given): this CPU's GEMM/memory throughput and gloo links.
2. Profile benchmarks/validate_gpt.py (GPT, hidden 512, 6 layers, activations dominating) with --method measure,
   one thread, as a 2-stage 1F1B pipeline of 4 micro-batches of 2 sequences.
3. Plans none, full and heu; HEU's memory limit lies 30% of the way from full recomputation's peak to none's, so it
   must choose selective policies (under zero bubble the last stage's peak is the same for every plan, the limit
   admits it, and HEU keeps everything: its plan is none's, run as a second copy).
   With a schedule that splits the backward (zero bubble) the profile also measures each block's B + W over its
   whole backward (Block.split_backward), which the simulator prices.
4. `lynx validate` of the three plans in one 2-process gloo job, iterations interleaved (each round starting one plan
   later); prints the table and full/none predicted vs measured. Everything is written under --out (default
   benchmarks/out/validate).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lynx_planner import solvers, validate
from lynx_planner.calibrate import calibrate
from lynx_planner.io import dumps, file_sha256, load_model, write_atomic
from lynx_planner.profiler import profile_model_file
from lynx_planner.schema import Hardware, ParallelConfig

MODEL = Path(__file__).with_name("validate_gpt.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/validate"))
    parser.add_argument("--hardware", type=Path, help="a Hardware file (default: calibrate this machine)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--fraction", type=float, default=0.3, help="HEU's limit between full's and none's peaks")
    parser.add_argument("--schedule", default="1f1b", help="pipeline schedule (docs/schedules.md)")
    parser.add_argument("--virtual-stages", type=int, default=1, help="chunks per rank (interleaved-1f1b: >= 2)")
    parser.add_argument("--algos", default="none,full,heu", help="plans to run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    hw_path = args.hardware or args.out / "hardware.json"
    if args.hardware is None:
        write_atomic(hw_path, dumps(calibrate(threads=1)))
    hw = load_model(hw_path, Hardware)
    torch.set_num_threads(1)  # as each pipeline process runs
    par = ParallelConfig(pp=2, micro_batch_size=args.micro_batch_size, seq_len=args.seq_len, num_microbatches=4,
                         schedule=args.schedule, virtual_stages=args.virtual_stages)
    profile = profile_model_file(str(MODEL), parallel=par, hardware=hw, method="measure", progress=False)
    profile_path = args.out / "profile.json"
    write_atomic(profile_path, dumps(profile))
    sha = file_sha256(profile_path)
    full = solvers.solve(profile, "full", 1 << 60).evaluation.peak_bytes
    none = solvers.solve(profile, "none", 1 << 60).evaluation.peak_bytes
    limit = int(full + args.fraction * (none - full))
    paths = []
    for algo in args.algos.split(","):
        plan = solvers.plan(profile, "profile.json", sha, algo, limit if algo == "heu" else 1 << 60)
        path = args.out / f"{algo}.json"
        write_atomic(path, dumps(plan))
        paths.append(str(path))
        modes = [p.mode for st in plan.stages for p in st.policies]
        print(f"{algo}: predicted {plan.predicted.iteration_time_s:.4f} s, layer modes {modes}")
    runs = validate.run(paths, str(MODEL), repeats=args.repeats)
    print(validate.table([validate.summary(r) for r in runs]))


if __name__ == "__main__":
    main()
