"""Regenerate every shipped file from the current code, in order: the analytic profiles in profiles/, the example
plans in plans/ (from those profiles, --reproducible: byte-identical on every run), and the pictures in docs/ (the
worked example's timelines and compare plot, the tune plots). Deterministic: the same code writes the same bytes
(the pictures: the same drawing).

    python scripts/regenerate.py                      # everything (a few minutes on 2 busy cores)
    python scripts/regenerate.py profiles plans       # some parts
    python scripts/regenerate.py --out /tmp/fresh     # into another directory (tests compare it with the shipped)

Run it after a change to the cost model, the simulator or a solver, then look at the README's and docs' quoted
figures (tests/test_shipped_files.py says which no longer match).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The shipped profiles: sequence length 2048, flash attention, dropout 0.1, 1F1B.
#          model       hardware           tp pp mb  M
PROFILES = [("gpt-1.3b", "a100-40g-nvlink", 1, 2, 4, 8),
            ("gpt-1.3b", "a100-80g-nvlink", 1, 2, 4, 8),
            ("gpt-1.3b", "a100-80g-pcie", 2, 2, 2, 8),
            ("gpt-2.7b", "a100-40g-nvlink", 2, 2, 2, 8),
            ("gpt-2.7b", "a100-80g-nvlink", 1, 4, 2, 8),
            ("gpt-2.7b", "h100-80g-nvlink", 2, 4, 4, 16),
            ("gpt-6.7b", "a100-40g-nvlink", 4, 4, 1, 16),
            ("gpt-6.7b", "a100-80g-nvlink", 2, 4, 2, 8),
            ("gpt-6.7b", "a100-80g-pcie", 4, 2, 2, 8),
            ("gpt-6.7b", "h100-80g-nvlink", 2, 4, 4, 16),
            ("gpt-13b", "a100-40g-nvlink", 8, 4, 1, 16),
            ("gpt-13b", "a100-80g-nvlink", 4, 4, 1, 16),
            ("gpt-13b", "a100-80g-nvlink", 8, 2, 2, 8),
            ("gpt-13b", "a100-80g-pcie", 4, 4, 1, 16),
            ("gpt-13b", "a100-80g-pcie", 2, 8, 1, 32),
            ("gpt-13b", "h100-80g-nvlink", 4, 4, 2, 16),
            ("gpt-20b", "a100-80g-nvlink", 8, 4, 1, 16),
            ("gpt-20b", "a100-80g-nvlink", 4, 8, 2, 64),
            ("gpt-20b", "a100-80g-pcie", 4, 8, 1, 32),
            ("gpt-20b", "h100-80g-nvlink", 8, 4, 2, 32),
            ("gpt-22b", "a100-80g-nvlink", 8, 4, 1, 16),
            ("gpt-22b", "a100-80g-nvlink", 4, 8, 2, 32),
            ("gpt-22b", "a100-80g-pcie", 8, 4, 1, 32),
            ("gpt-22b", "h100-80g-nvlink", 8, 4, 4, 16),
            ("gpt-22b", "h100-80g-nvlink", 8, 8, 1, 64)]

# 2026 cases (bench suites, issue 29): modern dense, MoE with EP, interleaved and zero bubble, on h100-80g-nvlink, bf16,
# no dropout. bench/models/deepseek-v3-14l.json is the catalog's deepseek-v3 cut to 14 layers.
_H100 = ("--hardware", "h100-80g-nvlink")
MODERN_PROFILES = [
    ("llama3-8b-h100-80g-nvlink-tp2-pp4-v2-mb1-m16",
     ("llama3-8b", *_H100, "--tp", "2", "--pp", "4", "--micro-batch-size", "1", "--num-microbatches", "16",
      "--schedule", "interleaved-1f1b", "--virtual-stages", "2")),
    ("llama3-8b-h100-80g-nvlink-tp2-pp4-zb-v2-mb1-m16",
     ("llama3-8b", *_H100, "--tp", "2", "--pp", "4", "--micro-batch-size", "1", "--num-microbatches", "16",
      "--schedule", "zero-bubble", "--virtual-stages", "2")),
    ("qwen3-32b-h100-80g-nvlink-tp4-sp-pp4-mb1-s4096-m16",
     ("qwen3-32b", *_H100, "--tp", "4", "--pp", "4", "--sequence-parallel", "--micro-batch-size", "1", "--seq-len",
      "4096", "--num-microbatches", "16")),
    ("mixtral-8x7b-h100-80g-nvlink-tp2-pp4-dp8-ep8-mb1-m16",
     ("mixtral-8x7b", *_H100, "--tp", "2", "--pp", "4", "--dp", "8", "--ep", "8", "--distributed-optimizer",
      "--micro-batch-size", "1", "--num-microbatches", "16")),
    ("deepseek-v3-14l-h100-80g-nvlink-tp1-pp4-v2-dp16-ep16-mb1-m16",
     ("bench/models/deepseek-v3-14l.json", *_H100, "--tp", "1", "--pp", "4", "--dp", "16", "--ep", "16",
      "--distributed-optimizer", "--micro-batch-size", "1", "--num-microbatches", "16", "--schedule",
      "interleaved-1f1b", "--virtual-stages", "2")),
]

# The example plans: (profile name in profiles/, memory limit, algorithms).
PLANS = [("gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16", "16.1875GiB", ("heu", "opt", "full", "block", "adapipe")),
         ("gpt-22b-h100-80g-nvlink-tp8-pp8-mb1-m64", "8.8125GiB", ("heu", "full")),
         ("gpt-1.3b-a100-80g-pcie-tp2-pp2-mb2-m8", "7.8125GiB", ("heu", "full"))]

# The worked example (README, docs/guide.md): its limit, and the pictures drawn from it.
EXAMPLE = ("gpt-13b", "--hardware", "a100-80g-pcie", "--tp", "4", "--pp", "4", "--num-microbatches", "16",
           "--dropout", "0.1")
EXAMPLE_LIMIT = "16.1875GiB"
PARTS = ("profiles", "plans", "pictures")


def lynx(root: Path, *args: str) -> None:
    """`lynx ARGS` in `root` (so the paths a plan records are relative: profiles/NAME.json), output discarded."""
    subprocess.run([sys.executable, "-m", "lynx_planner.cli", *map(str, args)], cwd=root, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})


def profile_name(model: str, hw: str, tp: int, pp: int, mb: int, m: int) -> str:
    return f"{model}-{hw}-tp{tp}-pp{pp}-mb{mb}-m{m}"


def profile_args(model: str, hw: str, tp: int, pp: int, mb: int, m: int) -> list[str]:
    return [model, "--hardware", hw, "--tp", str(tp), "--pp", str(pp), "--micro-batch-size", str(mb),
            "--num-microbatches", str(m), "--seq-len", "2048", "--attention", "flash", "--dropout", "0.1"]


def make_profile(root: Path, row: tuple) -> Path:
    path = Path("profiles") / f"{profile_name(*row)}.json"
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    lynx(root, "profile", *profile_args(*row), "-o", path)
    return root / path


def make_plan(root: Path, name: str, limit: str, algo: str) -> Path:
    path = Path("plans") / f"{name}-{algo}.json"
    (root / "plans").mkdir(parents=True, exist_ok=True)
    lynx(root, "plan", Path("profiles") / f"{name}.json", "--algo", algo, "--memory-limit", limit, "--reproducible",
         "-o", path)
    return root / path


def make_pictures(root: Path) -> None:
    """The worked example's compare plot and its HEU and full-recomputation timelines on one time axis, and the
    tune plots."""
    import tempfile

    sys.path.insert(0, str(ROOT))
    from lynx_planner.evaluate import evaluate
    from lynx_planner.io import load_model
    from lynx_planner.plot import timeline
    from lynx_planner.schema import Plan, Profile

    docs = root / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        p = f"{tmp}/p.json"
        lynx(root, "profile", *EXAMPLE, "-o", p)
        lynx(root, "compare", p, "--memory-limit", EXAMPLE_LIMIT, "--plot", docs / "compare.png")
        runs = {}
        for algo in ("heu", "full"):
            lynx(root, "plan", p, "--algo", algo, "--memory-limit", EXAMPLE_LIMIT, "-o", f"{tmp}/{algo}.json")
            plan, profile = load_model(f"{tmp}/{algo}.json", Plan), load_model(p, Profile)
            runs[algo] = (plan, evaluate(profile, plan.stages, trace=True))
        end = 1.02 * max(ev.predicted.iteration_time_s for _, ev in runs.values())  # one time axis for both
        for algo, (plan, ev) in runs.items():
            timeline(ev.sim.trace, ev.sim.memory, [s.static_bytes for s in ev.predicted.stages],
                     plan.memory_limit_bytes, f"{algo}: gpt-13b on a100-80g-pcie, tp 4 pp 4, 16 micro-batches, "
                     f"{ev.predicted.iteration_time_s:.4f} s", docs / f"timeline-{algo}.png", xmax=end)
    lynx(root, "tune", "gpt-13b", "--gpus", "32", "--hardware", "a100-80g-pcie", "--global-batch", "256",
         "--memory-limit", "20GiB", "--top", "6", "--plot", docs / "tune.png")
    lynx(root, "tune", "gpt-175b", "--gpus", "1024", "--hardware", "h100-80g-nvlink", "--global-batch", "1536",
         "--plot", docs / "tune-gpt-175b.png")


def regenerate(root: Path, parts: tuple[str, ...] = PARTS, log=print) -> None:
    """Write the chosen parts under `root` (plans read root/profiles: regenerate profiles first, or copy them)."""
    for part in parts:
        t0 = time.perf_counter()
        if part == "profiles":
            for row in PROFILES:
                make_profile(root, row)
            for name, args in MODERN_PROFILES:
                (root / "profiles").mkdir(parents=True, exist_ok=True)
                if args[0].endswith(".json") and root != ROOT:  # a model file of the repository
                    (root / args[0]).parent.mkdir(parents=True, exist_ok=True)
                    (root / args[0]).write_bytes((ROOT / args[0]).read_bytes())
                lynx(root, "profile", *args, "-o", Path("profiles") / f"{name}.json")
        elif part == "plans":
            for name, limit, algos in PLANS:
                for algo in algos:
                    make_plan(root, name, limit, algo)
        elif part == "pictures":
            make_pictures(root)
        log(f"{part}: {time.perf_counter() - t0:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="*", help=f"what to regenerate: {', '.join(PARTS)} (default: all, in order)")
    ap.add_argument("--out", type=Path, default=ROOT, help="the directory to write into (default: this checkout)")
    args = ap.parse_args()
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        ap.error(f"unknown part {unknown[0]!r} (expected some of {', '.join(PARTS)})")
    parts = tuple(p for p in PARTS if p in args.parts) if args.parts else PARTS
    if "plans" in parts and "profiles" not in parts and args.out.resolve() != ROOT:
        import shutil

        shutil.copytree(ROOT / "profiles", args.out / "profiles", dirs_exist_ok=True)
    regenerate(args.out, parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
