"""What a fresh process pays for HEU's search, against a warm one (issue 29, item 5).

`search_time_s` in a plan is the wall time of the search in a fresh `lynx plan` process, while
benchmarks/heu_scaling.py times searches in one long process. This runs PROCESSES fresh interpreters, one after
another; in each it times, on the README's 13B case at 16.1875 GiB (or --case, a catalog layout of heu_scaling):

  import    importing lynx_planner (CLI's modules aside) and HEU's module: outside search_time_s (solvers.solve
            imports the algorithm's module before its clock starts);
  first     the process's first search (CPU s, and search_time_s, wall);
  caches    a search after also clearing every process-wide cache a first search fills (schedule tables, placements,
            the simulator's rank tables and block waits, HEU's frontier costs) besides candidates.reset_caches(): what
            those caches are worth to the first search;
  warm      a search after candidates.reset_caches() only (as heu_scaling times);
  cli       search_time_s of a `lynx plan` process of the same case (--cli; the 13B case only).

first - caches is what the interpreter itself pays the first time it runs the search's code (its specialising
bytecode is not yet warm); caches - warm is what the process-wide caches save. Run it on a quiet machine:

    python benchmarks/heu_fresh.py [--processes 7] [--case 13b|llama3-405b|...] [--cli]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILE_13B = ROOT / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json"

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, ROOT + "/benchmarks")
from lynx_planner import placements, schedules, simulator, solvers
from lynx_planner.solvers import candidates, heu
imported = time.perf_counter() - t0
import heu_scaling as hs
from lynx_planner.schema import Profile

if CASE == "13b":
    prof, limit = Profile.model_validate_json(open(PROFILE).read()), hs.README_LIMIT
else:
    prof, _ = hs.catalog_profile(CASE)
    limit = hs._limit(prof, 0.5)  # (its own searches of full and none warm the process: the 13B case is cleaner)

def clear_process_caches():
    for mod in (schedules, placements, simulator):
        for name in dir(mod):
            fn = getattr(mod, name)
            if callable(fn) and hasattr(fn, "cache_clear"):
                fn.cache_clear()
    simulator._WAITED.clear()
    heu._COSTS.clear()

def timed():
    c0 = time.process_time()
    got = solvers.solve(prof, "heu", limit)
    return [time.process_time() - c0, got.solver.search_time_s]

candidates.reset_caches()
out = {"import": imported, "first": timed()}
candidates.reset_caches(); clear_process_caches()
out["caches"] = timed()
candidates.reset_caches()
out["warm"] = timed()
print(json.dumps(out))
"""


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.4f} ({min(xs):.4f}-{max(xs):.4f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=7)
    ap.add_argument("--case", default="13b")
    ap.add_argument("--cli", action="store_true", help="also time `lynx plan` processes (the 13B case)")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = (f"ROOT = {str(ROOT)!r}\nCASE = {args.case!r}\nPROFILE = {str(PROFILE_13B)!r}\n") + CHILD
    rows: dict[str, list] = {"import": [], "first": [], "caches": [], "warm": [], "cli": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.processes):
            got = json.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                            text=True).stdout.splitlines()[-1])
            for k in ("import", "first", "caches", "warm"):
                rows[k].append(got[k])
            if args.cli and args.case == "13b":
                plan = Path(tmp) / "plan.json"
                subprocess.run([sys.executable, "-m", "lynx_planner.cli", "plan", str(PROFILE_13B), "--algo", "heu",
                                "--memory-limit", "16.1875GiB", "-o", str(plan)], env=env, check=True,
                               capture_output=True)
                rows["cli"].append(json.loads(plan.read_text())["solver"]["search_time_s"])
    print(f"load average {os.getloadavg()[0]:.2f}; case {args.case}; {args.processes} fresh processes; "
          "median (min-max)")
    print(f"import lynx_planner and HEU (wall s, outside the search): {_med(rows['import'])}")
    print("| search | CPU s | search_time_s (wall) |\n|---|---:|---:|")
    for k, label in (("first", "first in the process"), ("caches", "again, every process cache cleared"),
                     ("warm", "again, candidates.reset_caches() only")):
        print(f"| {label} | {_med([r[0] for r in rows[k]])} | {_med([r[1] for r in rows[k]])} |")
    if rows["cli"]:
        print(f"| `lynx plan` (its own process) | - | {_med(rows['cli'])} |")


if __name__ == "__main__":
    main()
