"""Every block's keep/recompute frontier (solvers/candidates.py), hashed: to show that a change meant to make building
frontiers faster returns the same frontiers (issue 29), candidate for candidate: keep sets, recompute tuples, costs,
order, and the frontier's eps and groups.

    python benchmarks/frontier_identical.py -o before.txt          # on the old code (e.g. a checkout of main)
    python benchmarks/frontier_identical.py -o after.txt --compare before.txt   # exit 1 and list the blocks that differ

One line per block: case, block name, sha256 of the frontier's canonical text (keep sets sorted: a frozenset's repr
depends on the process's string hashing) and the number of candidates. Blocks: every shipped profile
(profiles/*.json), every catalog layout of benchmarks/heu_scaling.py (CATALOG), the audit's generated profiles
(lynx_planner/audit.py), synthetic MoE layers of 8, 64 and 256 experts, and the MoE zoo (tests/moe_models.py, profiled
on this CPU once and cached in --cache, as heu_scaling.py does; `--zoo dense,moe` adds the dense zoo). `--time`: also
each block's build CPU seconds (caches cleared first).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lynx_planner.schema import Profile  # noqa: E402
from lynx_planner.solvers import candidates  # noqa: E402


def canonical(fr: candidates.Frontier) -> str:
    """The frontier as text, the same in every process."""
    lines = [f"eps {fr.eps!r} groups {fr.groups}"]
    for c in fr.candidates:
        lines.append(f"{sorted(c.keep)!r} {c.recompute!r} {c.kept_bytes} {c.rec_bytes} {c.rec_s!r} "
                     f"{c.replays_collective}")
    return "\n".join(lines)


def profiles(zoo: list[str], cache: Path):
    """(case, profile) of every case (see the module docstring)."""
    import heu_scaling as hs

    for path in sorted((ROOT / "profiles").glob("*.json")):
        yield path.stem, Profile.model_validate_json(path.read_text())
    for name in hs.CATALOG:
        yield f"catalog {name}", hs.catalog_profile(name)[0]
    from lynx_planner import audit

    seen = set()
    for c in audit.suite("full"):
        key = (c.model, c.schedule, c.virtual_stages, c.ep)
        if key not in seen:
            seen.add(key)
            yield f"audit {c.model} {c.schedule} v{c.virtual_stages} ep{c.ep}", audit.case_profile(*key)
    from moe_models import synthetic_moe_profile

    for e in (8, 64, 256):
        yield f"synthetic moe {e}", synthetic_moe_profile(e)
    cache.mkdir(parents=True, exist_ok=True)
    for part in zoo:
        if part == "moe":
            from moe_models import NAMES
        elif part == "dense":
            from zoo_models import NAMES
        else:
            raise SystemExit(f"--zoo: unknown zoo {part!r} (expected dense, moe)")
        file = str(ROOT / f"tests/{'moe' if part == 'moe' else 'zoo'}_models.py")
        for name in NAMES:
            for prec in hs.PRECISIONS:
                yield f"{part} {name} {prec}", hs._profile(file, name, prec, cache)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--compare", help="an earlier output: exit 1 if any block's frontier differs")
    ap.add_argument("--zoo", default="moe", help="profiled zoos to include: moe, dense (comma-separated; '' for none)")
    ap.add_argument("--cache", default="/tmp/heu-scaling-profiles")
    ap.add_argument("--time", action="store_true", help="also each block's frontier build CPU seconds")
    args = ap.parse_args()
    lines = []
    for case, prof in profiles([z for z in args.zoo.split(",") if z], Path(args.cache)):
        candidates.reset_caches()
        for name, block in prof.blocks.items():
            t0 = time.process_time()
            fr = candidates.frontier(block)
            dt = time.process_time() - t0
            digest = hashlib.sha256(canonical(fr).encode()).hexdigest()[:16]
            line = f"{case} | {name} | {digest} {len(fr.candidates)}"
            lines.append(line)
            print(line + (f" | {dt:.3f} s" if args.time else ""), flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    if args.compare:
        old = Path(args.compare).read_text().splitlines()
        differ = [f"- {a}\n+ {b}" for a, b in zip(old, lines) if a != b]
        if len(old) != len(lines):
            differ.append(f"{len(old)} blocks before, {len(lines)} now")
        print(f"{len(lines)} blocks, {len(differ)} differ")
        for d in differ:
            print(d)
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
