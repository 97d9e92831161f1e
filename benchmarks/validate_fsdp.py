"""Predicted vs measured for FSDP on this machine: calibrate, profile an FSDP data-parallel job, plan none/full/heu,
run them in a real 2-rank FSDP2 job (gloo).

    python benchmarks/validate_fsdp.py [--repeats 5] [--out DIR] [--hardware HW.json] [--no-reshard-after-forward]

1. `lynx hardware calibrate` (unless --hardware is given): this CPU's GEMM/memory throughput and gloo links.
2. Profile benchmarks/validate_gpt.py (GPT, hidden 512, 6 layers) with --method measure, one thread, as dp 2 with
   --fsdp (pp 1), 4 micro-batches of 2 sequences.
3. Plans none, full and heu (HEU's limit 30% of the way from full recomputation's peak to none's).
4. `lynx validate` of the three plans in one 2-process FSDP2 job (fully_shard per layer), iterations interleaved;
   prints the table: per rank forward, backward, recomputation and memory, and the iteration, predicted/measured.
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
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/validate-fsdp"))
    parser.add_argument("--hardware", type=Path, help="a Hardware file (default: calibrate this machine)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--fraction", type=float, default=0.3, help="HEU's limit between full's and none's peaks")
    parser.add_argument("--no-reshard-after-forward", action="store_true")
    parser.add_argument("--algos", default="none,full,heu", help="plans to run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    hw_path = args.hardware or args.out / "hardware.json"
    if args.hardware is None:
        write_atomic(hw_path, dumps(calibrate(threads=1)))
    hw = load_model(hw_path, Hardware)
    torch.set_num_threads(1)  # as each rank runs
    par = ParallelConfig(dp=2, fsdp=True, reshard_after_forward=not args.no_reshard_after_forward,
                         micro_batch_size=args.micro_batch_size, seq_len=args.seq_len, num_microbatches=4)
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
        modes = [(p.mode, p.at) for st in plan.stages for p in st.policies]
        print(f"{algo}: predicted {plan.predicted.iteration_time_s:.4f} s, static "
              f"{plan.predicted.stages[0].static_bytes / 2**20:.1f} MiB, layer modes {modes}")
    runs = validate.run(paths, str(MODEL), repeats=args.repeats)
    print(validate.table([validate.summary(r) for r in runs]))


if __name__ == "__main__":
    main()
