"""The pipeline simulator's CPU time, this tree against another (e.g. main before a change), in one process: both
trees' `lynx_planner` packages are loaded side by side (as benchmarks/heu_ab.py does), each records the simulate calls
of one HEU search of a case, and the two replay their recorded simulations in alternation (each replay in one
reused_backwards() block, as the search runs them), so a loaded machine slows both alike. Also checks that both
trees' replays return the same results (repr of every field: bit for bit).

CPU seconds (time.process_time) of a case's replayed simulations, min and median of REPEATS per tree. Cases as
benchmarks/heu_ab.py names them: the README's 13B case at its 16.1875 GiB (`13b`), `13b-half`, and the catalog
layouts of benchmarks/heu_scaling.py halfway between full recomputation and none.

    python benchmarks/sim_ab.py --base ../lynx-planner-before [--cases 13b,llama3-405b,qwen3-32b] [--repeats 9]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import heu_ab  # noqa: E402


def record(pkg: str, which: str) -> list:
    """The simulate calls (arguments) of one HEU search of `which` in package `pkg`."""
    simulator = importlib.import_module(f"{pkg}.simulator")
    prof, limit = heu_ab._case(pkg, which)
    calls, real = [], simulator.simulate

    def recording(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)
    importlib.import_module(f"{pkg}.solvers.candidates").reset_caches()
    simulator.simulate = recording
    try:
        importlib.import_module(f"{pkg}.solvers").solve(prof, "heu", limit)
    finally:
        simulator.simulate = real
    return calls


def replay(pkg: str, calls: list) -> tuple[float, list]:
    """(CPU seconds, results) of the recorded simulations run again in one reused_backwards() block."""
    simulator = importlib.import_module(f"{pkg}.simulator")
    simulator._CHUNKS.clear()
    out = []
    t0 = time.process_time()
    with simulator.reused_backwards():
        for args, kwargs in calls:
            out.append(simulator.simulate(*args, **kwargs))
    return time.process_time() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the other tree (a checkout holding lynx_planner/)")
    ap.add_argument("--cases", default="13b,llama3-405b,qwen3-32b")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        pkgs = (heu_ab._load(Path(args.base), "lynx_base", Path(tmp)), heu_ab._load(ROOT, "lynx_this", Path(tmp)))
        print(f"load average {os.getloadavg()[0]:.2f}; CPU s of one HEU search's simulations replayed, "
              f"{args.repeats} alternating repeats: min / median")
        print("| case | simulations | base | this tree | median change | same results |\n|---|---:|---:|---:|---:|---|")
        for which in args.cases.split(","):
            calls = {p: record(p, which) for p in pkgs}
            cpu: dict[str, list[float]] = {p: [] for p in pkgs}
            texts = {}
            for r in range(args.repeats + 1):  # the first round warms both up, untimed
                for p in pkgs if r % 2 else pkgs[::-1]:
                    spent, got = replay(p, calls[p])
                    if r:
                        cpu[p].append(spent)
                    else:
                        texts[p] = [None if g is None else repr(asdict(g)) for g in got]
            a, b = cpu[pkgs[0]], cpu[pkgs[1]]
            print(f"| {which} | {len(calls[pkgs[1]])} | {min(a):.4f} / {statistics.median(a):.4f} | "
                  f"{min(b):.4f} / {statistics.median(b):.4f} | "
                  f"{100 * (statistics.median(b) / statistics.median(a) - 1):+.1f}% | "
                  f"{'yes' if texts[pkgs[0]] == texts[pkgs[1]] else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
