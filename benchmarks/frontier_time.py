"""CPU seconds (time.process_time) of building the keep/recompute frontiers (solvers/candidates.py) of a catalog
model at its heu_scaling.py layout (CATALOG): its largest block's alone, and all its blocks', caches cleared before
each build (block facts derived first: policy.analyse is not the search), median (min-max) of --repeats.

    python benchmarks/frontier_time.py [--repeats 7] [--models qwen3-32b,llama3-70b]
    git show main:lynx_planner/solvers/candidates.py > /tmp/old_candidates.py
    python benchmarks/frontier_time.py --against /tmp/old_candidates.py   # that file's builds, interleaved with ours

`--against`: another version of candidates.py, loaded beside this tree's (same package, same blocks) and timed
alternately with it in the same process, so that a loaded machine slows both alike; the table gains its times and
the ratio of the medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import heu_scaling as hs  # noqa: E402
from lynx_planner import policy  # noqa: E402
from lynx_planner.solvers import candidates  # noqa: E402


def load(path: str):
    """Another candidates.py as a module of the same package (its relative imports resolve to this tree's)."""
    spec = importlib.util.spec_from_file_location("lynx_planner.solvers._candidates_against", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def build_s(mod, blocks: list) -> float:
    mod.reset_caches()
    for b in blocks:
        policy.analyse(b)
    t0 = time.process_time()
    with mod.collector_paused():
        for b in blocks:
            mod.frontier(b)
    return time.process_time() - t0


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.4f} ({min(xs):.4f}-{max(xs):.4f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--models", default="qwen3-32b,llama3-70b,mixtral-8x7b,qwen3-235b-a22b,deepseek-v3")
    ap.add_argument("--against", help="another candidates.py to time alternately with this tree's")
    args = ap.parse_args()
    mods = [candidates] + ([load(args.against)] if args.against else [])
    cols = ["largest block's CPU s", "all blocks' CPU s"]
    head = ["model", "largest block"] + cols + ([f"{c} (--against)" for c in cols] + ["ratio (against / this)"]
                                               if args.against else [])
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name in args.models.split(","):
        prof = hs.catalog_profile(name)[0]
        blocks = list(prof.blocks.values())
        big = max(blocks, key=lambda b: len(b.ops))
        one: list[list[float]] = [[] for _ in mods]
        every: list[list[float]] = [[] for _ in mods]
        for _ in range(args.repeats):
            for i, mod in enumerate(mods):
                one[i].append(build_s(mod, [big]))
                every[i].append(build_s(mod, blocks))
        row = [name, f"{big.name} ({len(big.ops)} ops)", _fmt(one[0]), _fmt(every[0])]
        if args.against:
            row += [_fmt(one[1]), _fmt(every[1]),
                    f"{statistics.median(one[1]) / statistics.median(one[0]):.2f} / "
                    f"{statistics.median(every[1]) / statistics.median(every[0]):.2f}"]
        print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
