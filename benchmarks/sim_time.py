"""CPU seconds of the pipeline simulator within HEU's search (issue 29's search time): per case, HEU's whole search
from cold caches, the share of it in simulator.simulate and simulator.stage_runs, and the simulations alone replayed
(the search's simulate calls, recorded once and run again in order inside one reused_backwards() block, as the search
runs them). Medians of --repeats, CPU seconds (time.process_time).

    python benchmarks/sim_time.py [--repeats 5] [--cases readme,llama3-405b,qwen3-32b]

To compare two versions, run it on each in turn (e.g. PYTHONPATH=<a checkout of the old code>, then this one),
interleaved, on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from lynx_planner import simulator, solvers  # noqa: E402
from lynx_planner.schema import Profile  # noqa: E402
from lynx_planner.solvers import candidates  # noqa: E402

CASES = ("readme", "llama3-405b", "qwen3-32b", "deepseek-v3", "mixtral-8x7b")


def case(name: str) -> tuple[Profile, int]:
    import heu_scaling as hs

    if name == "readme":
        path = ROOT / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json"
        return Profile.model_validate_json(path.read_text()), hs.README_LIMIT
    prof, _ = hs.catalog_profile(name)
    return prof, hs._limit(prof, 0.5)


def search(prof: Profile, limit: int, calls: list | None = None) -> tuple[float, float, float]:
    """(search, simulate, stage_runs) CPU seconds of one HEU search from cold caches; `calls` gets simulate's
    arguments."""
    spent = {"simulate": 0.0, "stage_runs": 0.0}
    real = {name: getattr(simulator, name) for name in spent}

    def timed(name):
        def call(*args, **kwargs):
            t0 = time.process_time()
            try:
                return real[name](*args, **kwargs)
            finally:
                spent[name] += time.process_time() - t0
                if calls is not None and name == "simulate":
                    calls.append((args, kwargs))
        return call

    candidates.reset_caches()
    for name in spent:
        setattr(simulator, name, timed(name))
    try:
        t0 = time.process_time()
        solvers.solve(prof, "heu", limit)
        total = time.process_time() - t0
    finally:
        for name, fn in real.items():
            setattr(simulator, name, fn)
    return total, spent["simulate"], spent["stage_runs"]


def replay(calls: list) -> float:
    """CPU seconds of the recorded simulations run again, in one reused_backwards() block as in the search."""
    simulator._CHUNKS.clear()
    t0 = time.process_time()
    with simulator.reused_backwards():
        for args, kwargs in calls:
            simulator.simulate(*args, **kwargs)
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    print("| case | HEU search CPU s | in simulate | in stage_runs | simulate calls | replayed simulations CPU s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.cases.split(","):
        prof, limit = case(name)
        calls: list = []
        search(prof, limit, calls)  # warm (imports, per-object caches of the profile's blocks) and record
        rows = [search(prof, limit) for _ in range(args.repeats)]
        replays = [replay(calls) for _ in range(args.repeats)]
        med = [statistics.median(r[i] for r in rows) for i in range(3)]
        print(f"| {name} | {med[0]:.4f} | {med[1]:.4f} | {med[2]:.4f} | {len(calls)} | "
              f"{statistics.median(replays):.4f} |", flush=True)


if __name__ == "__main__":
    main()
