"""Regenerate the pictures in docs/: the worked example's HEU and full-recomputation timelines on one time axis,
its compare plot, and the tune plots (`python scripts/make_pictures.py`, from the repository root; about a minute)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from lynx_planner.evaluate import evaluate
from lynx_planner.io import load_model
from lynx_planner.plot import timeline
from lynx_planner.schema import Plan, Profile

DOCS = Path("docs")
LIMIT = "16.1875GiB"


def lynx(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "lynx_planner.cli", *args], check=True)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        p = f"{tmp}/p.json"
        lynx("profile", "gpt-13b", "--hardware", "a100-80g-pcie", "--tp", "4", "--pp", "4", "--num-microbatches",
             "16", "--dropout", "0.1", "-o", p)
        lynx("compare", p, "--memory-limit", LIMIT, "--plot", str(DOCS / "compare.png"))
        runs = {}
        for algo in ("heu", "full"):
            lynx("plan", p, "--algo", algo, "--memory-limit", LIMIT, "-o", f"{tmp}/{algo}.json")
            plan = load_model(f"{tmp}/{algo}.json", Plan)
            profile = load_model(p, Profile)
            runs[algo] = (plan, profile, evaluate(profile, plan.stages, trace=True))
        end = 1.02 * max(ev.predicted.iteration_time_s for _, _, ev in runs.values())  # one time axis for both
        for algo, (plan, profile, ev) in runs.items():
            timeline(ev.sim.trace, ev.sim.memory, [s.static_bytes for s in ev.predicted.stages],
                     plan.memory_limit_bytes, f"{algo}: gpt-13b on a100-80g-pcie, tp 4 pp 4, 16 micro-batches, "
                     f"{ev.predicted.iteration_time_s:.4f} s", DOCS / f"timeline-{algo}.png", xmax=end)
        lynx("tune", "gpt-13b", "--gpus", "32", "--hardware", "a100-80g-pcie", "--global-batch", "256",
             "--memory-limit", "20GiB", "--top", "6", "--plot", str(DOCS / "tune.png"))
        lynx("tune", "gpt-175b", "--gpus", "1024", "--hardware", "h100-80g-nvlink", "--global-batch", "1536",
             "--plot", str(DOCS / "tune-gpt-175b.png"))


if __name__ == "__main__":
    main()
