#!/usr/bin/env python
"""Propose bench memory limits for profiles and write the suite files.

For each profile the limits lie between the peak of Megatron's full recomputation (which must fit) and the peak of no
recomputation (which must not): at fractions 0.15 (tight: most layers must recompute something) and 0.5 of the way up
from full's peak, rounded down to 1/16 GiB (and never above the device's memory). Those are the budgets where the
choice of what to recompute, and where, matters. The CI subset takes the tight one.

Usage:
  scripts/propose_limits.py                       # print the proposals for profiles/*.json
  scripts/propose_limits.py --write               # (re)write bench/suite.json and bench/ci/suite.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from lynx_planner.io import load_model
from lynx_planner.schema import Profile
from lynx_planner.solvers import solve

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30
STEP = GiB // 16
FRACTIONS = (0.15, 0.5)

# The CI subset: small, quick cases covering every hardware kind, TP and PP in 2..8, one limit each.
CI = [
    "gpt-1.3b-a100-80g-pcie-tp2-pp2-mb2-m8",
    "gpt-2.7b-a100-40g-nvlink-tp2-pp2-mb2-m8",
    "gpt-2.7b-h100-80g-nvlink-tp2-pp4-mb4-m16",
    "gpt-6.7b-a100-40g-nvlink-tp4-pp4-mb1-m16",
    "gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16",
    "gpt-22b-a100-80g-nvlink-tp8-pp4-mb1-m16",
    "llama3-8b-h100-80g-nvlink-tp2-pp4-v2-mb1-m16",  # 2026: modern dense, interleaved
    "mixtral-8x7b-h100-80g-nvlink-tp2-pp4-dp8-ep8-mb1-m16",  # 2026: MoE with EP
]


def peaks(profile: Profile) -> tuple[int, int]:
    none = solve(profile, "none", 2**62).evaluation.peak_bytes
    full = solve(profile, "full", 2**62).evaluation.peak_bytes
    return none, full


def gib(n: float) -> str:
    text = f"{n / GiB:.4f}".rstrip("0").rstrip(".")
    return f"{text}GiB"


def propose(profile: Profile) -> list[str]:
    none, full = peaks(profile)
    cap = profile.hardware.memory_bytes
    limits = []
    for f in FRACTIONS:
        lim = min(full + f * (none - full), cap)
        lim = math.floor(lim / STEP) * STEP
        if full <= lim < none and gib(lim) not in limits:
            limits.append(gib(lim))
    return limits


def _order(path: Path) -> tuple:
    """gpt-1.3b before gpt-13b: by model size, then name."""
    size = path.stem.split("-")[1].rstrip("b")
    try:
        return (float(size), path.stem)
    except ValueError:
        return (math.inf, path.stem)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", type=Path, default=ROOT / "profiles")
    ap.add_argument("--write", action="store_true", help="write bench/suite.json and bench/ci/suite.json")
    args = ap.parse_args()
    suite, ci = [], []
    for path in sorted(args.profiles.glob("*.json"), key=_order):
        profile = load_model(path, Profile)
        none, full = peaks(profile)
        limits = propose(profile)
        print(f"{path.name}: no recomputation {none / GiB:.2f} GiB > limits {', '.join(limits) or '(none)'} "
              f">= full recomputation {full / GiB:.2f} GiB")
        if not limits:
            continue
        suite.append({"profile": f"../profiles/{path.name}", "memory_limits": limits})
        if path.stem in CI:
            ci.append({"profile": f"../../profiles/{path.name}", "memory_limits": limits[:1]})
    if args.write:
        (ROOT / "bench" / "ci").mkdir(parents=True, exist_ok=True)
        (ROOT / "bench" / "suite.json").write_text(json.dumps(suite, indent=1) + "\n")
        (ROOT / "bench" / "ci" / "suite.json").write_text(json.dumps(ci, indent=1) + "\n")
        print(f"wrote bench/suite.json ({len(suite)} profiles) and bench/ci/suite.json ({len(ci)} profiles)")


if __name__ == "__main__":
    main()
