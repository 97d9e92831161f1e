"""Offload against recomputation: the two cases of issue 27's note, every plan judged by the simulator.

    python benchmarks/offload_cases.py [--out DIR] [--microbatches 4]

A. llama3-8b on one H100 (h100-80g-nvlink: PCIe 5.0 x16, 55.6 GB/s measured), seq 8192, micro-batch 1, dp 8 with the
   distributed optimizer (ZeRO-1: the per-GPU view of an 8-GPU data-parallel job), 75.8 GiB usable: memory forces
   recomputation and the host link has spare bandwidth.
B. The same model on A100s (a100-80g-nvlink: PCIe 4.0 x16, half the link): the link is the bottleneck, so HEU with
   offload sends what the forward window carries and recomputes the rest.
For each: HEU with offload (heu-offload), HEU without, Megatron full and selective recomputation, Megatron's
fine-grained offloading as its docs advise (offload) and torch save_on_cpu (full-offload): iteration time, peak memory,
offloaded GiB per micro-batch, host-link utilisation (the busier direction's copy seconds over the iteration), the
backward's stalls on late prefetches and the exposed recomputation. Each plan is written under --out and passes
`lynx check`. Deterministic: the figures are simulated, not timed (only the search times, not shown, are).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from lynx_planner import solvers
from lynx_planner.evaluate import check
from lynx_planner.io import dumps, file_sha256, load_model, write_atomic
from lynx_planner.schema import Profile

ALGOS = ("heu-offload", "heu", "full", "selective", "offload", "full-offload")
CASES = {
    "A: llama3-8b, H100 PCIe 5.0, seq 8192": ["llama3-8b", "--hardware", "h100-80g-nvlink", "--seq-len", "8192",
                                              "--dp", "8"],
    "B: llama3-8b, A100 PCIe 4.0, seq 8192": ["llama3-8b", "--hardware", "a100-80g-nvlink", "--seq-len", "8192",
                                              "--dp", "8"],
}


def rows(profile: Profile, path: Path, out: Path, tag: str) -> list[str]:
    from lynx_planner.models.hardware import default_memory_limit

    sha, limit = file_sha256(path), default_memory_limit(profile.hardware)
    got = {}
    for algo in ALGOS:
        try:
            plan = solvers.plan(profile, str(path), sha, algo, limit)
        except solvers.Infeasible as e:
            got[algo] = e.needed
            continue
        plan = plan.model_copy(update={"solver": plan.solver.model_copy(update={"search_time_s": 0.0})})
        write_atomic(out / f"{tag}-{algo}.json", dumps(plan))
        assert check(plan, profile) == [], algo
        got[algo] = plan.predicted
    full = got["full"].iteration_time_s if not isinstance(got["full"], int) else None
    lines = []
    for algo, pred in got.items():
        if isinstance(pred, int):
            lines.append(f"| {algo} | - | - | needs {pred / 2**30:.2f} | no | - | - | - | - |")
            continue
        st = max(pred.stages, key=lambda s: s.peak_memory_bytes)
        t = pred.iteration_time_s
        util = max(s.link_busy_s for s in pred.stages) / t
        lines.append(f"| {algo} | {t:.4f} | {full / t:.3f}x | {st.peak_memory_bytes / 2**30:.2f} | yes | "
                     f"{st.offloaded_bytes / 2**30:.2f} | {util:.0%} | {st.offload_stall_s * 1e3:.1f} | "
                     f"{st.exposed_recompute_s * 1e3:.0f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/offload"))
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for i, (name, cli) in enumerate(CASES.items()):
        path = args.out / f"case{'AB'[i]}-profile.json"
        subprocess.run([sys.executable, "-c", "from lynx_planner.cli import app; app()", "profile", *cli,
                        "--num-microbatches", str(args.microbatches), "-o", str(path)], check=True,
                       stdout=subprocess.DEVNULL)
        profile = load_model(path, Profile)
        print(f"\n{name}, {args.microbatches} micro-batches, limit 75.80 GiB")
        print("| plan | iteration s | vs full | peak GiB | fits | offloaded GiB/mb | link busy | stall ms | "
              "exposed recompute ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        for line in rows(profile, path, args.out, f"case{'AB'[i]}"):
            print(line)


if __name__ == "__main__":
    main()
