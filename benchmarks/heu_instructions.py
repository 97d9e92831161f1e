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

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from sim_instructions import cli, counted  # noqa: E402  (callgrind around a child that toggles its own counting)


def child(name: str) -> None:
    """Inside valgrind: warm up, then count one search."""
    import heu_scaling as hs

    from lynx_planner import solvers
    from lynx_planner.solvers import candidates

    prof, limit = hs.named_case(name)
    solvers.solve(prof, "heu", limit)
    candidates.reset_caches()
    with counted():
        solvers.solve(prof, "heu", limit)


if __name__ == "__main__":
    cli(child, "instructions (Ir) of one HEU search", "13b,llama3-405b,qwen3-32b", __file__)
