"""Instructions (valgrind's callgrind, Ir) of one whole HEU search: per case, a search warms the process up, the block
caches are cleared (as a fresh `lynx plan` pays them) and one more search runs with callgrind's instrumentation on
(toggled by callgrind_control from inside the process). Instruction counts do not depend on the machine's load: two
trees compare on a busy machine (callgrind is about 50x slower than the plain run).

    python benchmarks/heu_instructions.py [--tree <a checkout>] [--cases 13b,llama3-405b,qwen3-32b]

Cases: `13b`, the README's case at its 16.1875 GiB, or a catalog layout of benchmarks/heu_scaling.py (CATALOG) half
way between full recomputation's peak and none's. Each case runs in its own valgrind process with PYTHONPATH at the
tree (this one by default).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from sim_instructions import count  # noqa: E402  (callgrind around a child that toggles its own counting)


def child(name: str) -> None:
    """Inside valgrind: warm up, then count one search."""
    import heu_scaling as hs

    from lynx_planner import solvers
    from lynx_planner.schema import Profile
    from lynx_planner.solvers import candidates

    if name == "13b":
        prof = Profile.model_validate_json((ROOT / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json").read_text())
        limit = hs.README_LIMIT
    else:
        prof, _ = hs.catalog_profile(name)
        limit = hs._limit(prof, 0.5)
    solvers.solve(prof, "heu", limit)
    candidates.reset_caches()

    def toggle(state: str) -> None:
        subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True)
    toggle("on")
    solvers.solve(prof, "heu", limit)
    toggle("off")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose lynx_planner is counted")
    ap.add_argument("--cases", default="13b,llama3-405b,qwen3-32b")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    print(f"instructions (Ir) of one HEU search, lynx_planner of {args.tree}")
    print("| case | Ir |\n|---|---:|")
    for name in args.cases.split(","):
        print(f"| {name} | {count(args.tree.resolve(), name, __file__):,} |", flush=True)


if __name__ == "__main__":
    main()
