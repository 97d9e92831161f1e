"""Where one HEU search's time goes (issue 29, item 5): CPU seconds spent in each of its parts, each part's own time
(the parts it calls counted in theirs), median over REPEATS searches in one process (block caches cleared before
each, as a fresh `lynx plan` pays them), with each part's number of calls.

Parts: the block's candidate frontier (candidates.frontier), HEU's option frontiers (_frontier_of) and hulls, the
greedy and knapsack stage solutions, stage models, the split DP (auto_bounds), rank budgets (rank_limits), repair and
fill, the plans' layer policies and layer runs (policies_of, simulator.stage_runs), the simulations (simulator.simulate)
and their evaluations; `other` is the rest of the search. Timing wrappers add a little to every part.

    python benchmarks/heu_phases.py [--case 13b|llama3-405b|qwen3-32b|...] [--repeats 5]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import heu_scaling as hs  # noqa: E402

from lynx_planner import evaluate, simulator, solvers  # noqa: E402
from lynx_planner.solvers import candidates, heu  # noqa: E402

PARTS = [(candidates, "frontier"), (heu, "_frontier_of"), (heu, "_hull"), (heu, "_greedy"), (heu, "_solve_knapsack"),
         (heu, "_model"), (heu, "auto_bounds"), (heu, "rank_limits"), (heu, "repair"), (heu, "fill"),
         (heu, "policies_of"), (simulator, "stage_runs"), (simulator, "simulate"), (evaluate, "evaluation_of")]


def instrument() -> dict[str, list]:
    """Wrap each part: its own CPU seconds (less its wrapped callees') and calls, per search, in the returned dict."""
    own: dict[str, list] = {}
    inner: list[float] = []

    def wrap(mod, name: str) -> None:
        fn = getattr(mod, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t = time.process_time()
            inner.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.process_time() - t
                mine = own.setdefault(name, [0, 0.0])
                mine[0] += 1
                mine[1] += spent - inner.pop()
                if inner:
                    inner[-1] += spent
        setattr(mod, name, timed)

    for mod, name in PARTS:
        wrap(mod, name)
    return own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="13b", help="13b (the README's, at 16.1875 GiB) or a heu_scaling catalog layout")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    prof, limit = hs.named_case(args.case)
    solvers.solve(prof, "heu", limit)  # the process's one-off work
    own = instrument()
    runs: list[dict[str, list]] = []
    totals = []
    for _ in range(args.repeats):
        own.clear()
        candidates.reset_caches()
        t = time.process_time()
        solvers.solve(prof, "heu", limit)
        totals.append(time.process_time() - t)
        runs.append({k: list(v) for k, v in own.items()})
    total = statistics.median(totals)
    print(f"case {args.case}; CPU s of one search, median of {args.repeats}: {total:.4f}")
    print("| part | calls | own CPU ms (median) | share |")
    print("|---|---:|---:|---:|")
    names = [name for _, name in PARTS]
    rows = []
    for name in names:
        ms = statistics.median(r.get(name, [0, 0.0])[1] for r in runs) * 1e3
        rows.append((ms, name, runs[-1].get(name, [0, 0.0])[0]))
    rest = total * 1e3 - sum(ms for ms, _, _ in rows)
    for ms, name, calls in sorted(rows, reverse=True) + [(rest, "other", "")]:
        print(f"| {name} | {calls} | {ms:.1f} | {ms / (total * 1e3):.0%} |")


if __name__ == "__main__":
    main()
