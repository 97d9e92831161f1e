"""HEU at depth: CPU seconds of one HEU search on deep, long pipelines, with the deep-pipeline shortcuts (screening on
p + SHORT_STEADY micro-batches, contenders ranked by projection and only the winner simulated at full length) and
without them (the behaviour for p * M <= FULL_JUDGE_ACTIONS everywhere). Prints medians of REPEATS runs, spread and
the iteration times (which should agree or favour the shortcut only slightly either way).

    python benchmarks/heu_depth.py [REPEATS]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from lynx_planner.analytic import gpt_profile
from lynx_planner.models.catalog import MODELS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import ParallelConfig
from lynx_planner.solvers import heu, solve

CASES = [("gpt-175b", 8, 48, 384), ("gpt-175b", 8, 64, 768), ("gpt-175b", 8, 32, 96)]


def run(profile, limit: int, shortcuts: bool) -> tuple[float, float]:
    saved = heu.SHORT_STEADY, heu.FULL_JUDGE_ACTIONS
    if not shortcuts:
        heu.SHORT_STEADY, heu.FULL_JUDGE_ACTIONS = 10**9, 10**12
    try:
        t0 = time.process_time()
        _, _, evaluation = heu.heu_strategy(profile, limit, "auto")
        return time.process_time() - t0, evaluation.predicted.iteration_time_s
    finally:
        heu.SHORT_STEADY, heu.FULL_JUDGE_ACTIONS = saved


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"load average {os.getloadavg()[0]:.2f}; CPU seconds, median of {repeats} (min-max)")
    for name, tp, pp, m in CASES:
        par = ParallelConfig(tp=tp, pp=pp, num_microbatches=m, sequence_parallel=True)
        profile = gpt_profile(MODELS[name], par, HARDWARE["a100-80g-nvlink"], "flash", 0.0)
        full, none = (solve(profile, a, 2**62).evaluation.peak_bytes for a in ("full", "none"))
        limit = int(full + 0.3 * (none - full))
        for shortcuts in (False, True):
            got = [run(profile, limit, shortcuts) for _ in range(repeats)]
            cpu = [c for c, _ in got]
            print(f"{name} tp{tp} pp{pp} M{m} {'with' if shortcuts else 'without'} shortcuts: "
                  f"{statistics.median(cpu):.2f} s ({min(cpu):.2f}-{max(cpu):.2f}), iteration {got[0][1]:.4f} s")


if __name__ == "__main__":
    main()
