"""CPU seconds (time.process_time) of building every block's keep/recompute frontier (solvers/candidates.py) of a
catalog model at its heu_scaling.py layout (CATALOG), caches cleared first (block facts pre-derived: policy.analyse is
not the search), median of --repeats; the largest block's alone, and all blocks'.

    python benchmarks/frontier_time.py [--repeats 7] [--models qwen3-32b,llama3-70b,deepseek-v3]

To compare two trees (e.g. main and a branch), run it alternately under each one's PYTHONPATH on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import heu_scaling as hs  # noqa: E402
from lynx_planner import policy  # noqa: E402
from lynx_planner.solvers import candidates  # noqa: E402


def build_s(blocks: list) -> float:
    candidates.reset_caches()
    for b in blocks:
        policy.analyse(b)
    t0 = time.process_time()
    with candidates.collector_paused():
        for b in blocks:
            candidates.frontier(b)
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--models", default="qwen3-32b,llama3-70b,mixtral-8x7b,deepseek-v3")
    args = ap.parse_args()
    print("| model | largest block | its frontier CPU s, median (min-max) | all blocks' CPU s, median |")
    print("|---|---|---:|---:|")
    for name in args.models.split(","):
        prof = hs.catalog_profile(name)[0]
        blocks = list(prof.blocks.values())
        big = max(blocks, key=lambda b: len(b.ops))
        one = [build_s([big]) for _ in range(args.repeats)]
        every = [build_s(blocks) for _ in range(args.repeats)]
        print(f"| {name} | {big.name} ({len(big.ops)} ops) | {statistics.median(one):.4f} ({min(one):.4f}-{max(one):.4f}) "
              f"| {statistics.median(every):.4f} |", flush=True)


if __name__ == "__main__":
    main()
