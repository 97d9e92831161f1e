"""Instructions (valgrind's callgrind, Ir) of the pipeline simulator within HEU's search: per case, one HEU search
records its simulate calls, they are replayed once to warm up and then once more with callgrind's instrumentation on
(toggled by callgrind_control from inside the process), so the count is that of the replayed simulations alone.
Instruction counts do not depend on the machine's load: two trees compare on a busy machine (run them under
`flock` on a shared lock file or alone all the same: callgrind is about 50x slower than the plain run).

    python benchmarks/sim_instructions.py [--tree <a checkout>] [--cases readme,llama3-405b,qwen3-32b]

Cases as benchmarks/sim_time.py names them. Each case runs in its own valgrind process with PYTHONPATH at the tree
(this one by default); the cyclic garbage collector is left on, as in a search.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(name: str) -> None:
    """Inside valgrind: record, warm up, count one replay."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests"))
    import sim_time

    prof, limit = sim_time.case(name)
    calls: list = []
    sim_time.search(prof, limit, calls)
    sim_time.replay(calls)

    with counted():
        sim_time.replay(calls)


@contextmanager
def counted():
    """Callgrind counts this block only (the process, started with --instr-atstart=no, toggles its own counting)."""
    def toggle(state: str) -> None:
        subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True)
    toggle("on")
    try:
        yield
    finally:
        toggle("off")


def count(tree: Path, name: str, script: str = __file__) -> int:
    """Ir of `script --child name` under callgrind, PYTHONPATH at the tree (the child toggles the counting)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = dict(os.environ, PYTHONPATH=str(tree))
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                        sys.executable, script, "--child", name], env=env, check=True, capture_output=True)
        got = re.search(r"^totals: (\d+)", out.read_text(), re.M)
        return int(got.group(1))


def cli(child, title: str, cases: str, script: str) -> None:
    """A counting script's command line: --tree, --cases (default `cases`), and the --child it runs under valgrind."""
    ap = argparse.ArgumentParser(description=title)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose lynx_planner is counted")
    ap.add_argument("--cases", default=cases)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    print(f"{title}, lynx_planner of {args.tree}")
    print("| case | Ir |\n|---|---:|")
    for name in args.cases.split(","):
        print(f"| {name} | {count(args.tree.resolve(), name, script):,} |", flush=True)


if __name__ == "__main__":
    cli(child, "instructions (Ir) of one HEU search's simulations replayed", "readme,llama3-405b,qwen3-32b", __file__)
