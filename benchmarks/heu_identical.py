"""HEU's plans, byte for byte, over a wide set of cases: to show that a change meant to make HEU faster returns the
same plans (issue 29). Writes one line per case: its name and the sha256 of HEU's plan JSON with the search time
zeroed (the only field that may differ), and of every block's candidate set (solvers/candidates.py, which OPT, the
audit and the baselines read too).

    python benchmarks/heu_identical.py -o before.txt          # on the old code (e.g. a checkout of main)
    python benchmarks/heu_identical.py -o after.txt --compare before.txt   # exit 1 and list the cases that differ

Cases: every catalog layout of benchmarks/heu_scaling.py (CATALOG) at 0.3 and 0.5 of the way from full recomputation's
peak to none's; every case and limit of bench/suite.json and bench/ci/suite.json, even and auto split; the audit's
generated profiles (lynx_planner/audit.py, `--audit-cases full`) at its limits and splits; synthetic MoE layers. `--quick`:
the catalog and the CI suite only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lynx_planner import solvers  # noqa: E402
from lynx_planner.evaluate import make_plan  # noqa: E402
from lynx_planner.io import dumps, parse_size  # noqa: E402
from lynx_planner.schema import Profile  # noqa: E402
from lynx_planner.solvers import candidates  # noqa: E402


def plan_digest(prof: Profile, limit: int, partition: str = "auto") -> str:
    """sha256 of HEU's plan with search_time_s zeroed; 'infeasible' where HEU finds none."""
    try:
        got = solvers.solve(prof, "heu", limit, None, partition)
    except solvers.Infeasible:
        return "infeasible"
    solver = got.solver.model_copy(update={"search_time_s": 0.0})
    plan = make_plan(prof, "profile.json", "0" * 64, "heu", limit, got.stages, solver, got.evaluation)
    return hashlib.sha256(dumps(plan).encode()).hexdigest()[:16]


def frontier_digest(prof: Profile) -> str:
    parts = []
    for name in sorted(prof.blocks):
        fr = candidates.frontier(prof.blocks[name])
        parts.append(json.dumps([name, fr.eps, fr.groups, [[sorted(c.keep), list(c.recompute), c.kept_bytes,
                                                            c.rec_bytes, repr(c.rec_s), c.replays_collective]
                                                           for c in fr.candidates]]))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _between(prof: Profile, frac: float) -> int:
    full, none = (solvers.solve(prof, a, 1 << 62).evaluation.peak_bytes for a in ("full", "none"))
    return int(full + frac * (none - full))


def cases(quick: bool):
    """(name, profile, [(limit label, limit bytes)], splits)."""
    import heu_scaling as hs
    from lynx_planner.analytic import profile as analytic_profile
    from lynx_planner.models.catalog import MODELS
    from lynx_planner.models.hardware import HARDWARE
    from lynx_planner.schema import ParallelConfig

    for name, (tp, pp, dp, ep, v, m) in hs.CATALOG.items():
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, seq_len=4096, num_microbatches=m,
                             sequence_parallel=tp > 1, distributed_optimizer=True,
                             schedule="interleaved-1f1b" if v > 1 else "1f1b", virtual_stages=v)
        prof = analytic_profile(MODELS[name], par, HARDWARE["h100-80g-nvlink"])
        yield f"catalog {name}", prof, [(f, _between(prof, f)) for f in (0.3, 0.5)], ("auto",)
    suites = ["bench/ci"] + ([] if quick else ["bench"])
    for suite in suites:
        for item in json.loads((ROOT / suite / "suite.json").read_text()):
            path = (ROOT / suite / item["profile"]).resolve()
            prof = Profile.model_validate_json(path.read_text())
            yield (f"{suite} {path.stem}", prof, [(x, parse_size(x)) for x in item["memory_limits"]],
                   ("even", "auto"))
    if quick:
        return
    from lynx_planner import audit

    seen = set()
    for c in audit.suite("full"):
        key = (c.model, c.schedule, c.virtual_stages, c.ep)
        if key in seen:
            continue
        seen.add(key)
        prof = audit.case_profile(*key)
        yield (f"audit {c.model} {c.schedule} v{c.virtual_stages} ep{c.ep}", prof,
               [(b, audit.limit_of(prof, b)) for b in audit.BETWEEN], ("even", "auto"))
    from moe_models import synthetic_moe_profile

    for e in (8, 64):
        prof = synthetic_moe_profile(e)
        yield f"synthetic moe {e}", prof, [(f, _between(prof, f)) for f in (0.3, 0.5)], ("auto",)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--compare", help="an earlier output: exit 1 if any case differs")
    ap.add_argument("--quick", action="store_true", help="the catalog and the CI suite only")
    args = ap.parse_args()
    lines = []
    with open(args.out, "w") as out:
        for name, prof, limits, splits in cases(args.quick):
            candidates.reset_caches()
            line = f"{name} | frontier {frontier_digest(prof)}"
            for label, limit in limits:
                for part in splits:
                    line += f" | {label} {part} {plan_digest(prof, limit, part)}"
            lines.append(line)
            out.write(line + "\n")
            out.flush()
            print(line, flush=True)
    return compare(lines, args.compare) if args.compare else 0


def compare(lines: list[str], earlier: str) -> int:
    """Print the cases (a line each, named before its first ' | ') that differ from an earlier output's; 1 if any."""
    old = {ln.split(" | ")[0]: ln for ln in Path(earlier).read_text().splitlines()}
    differ = [ln for ln in lines if ln.split(" | ")[0] in old and old[ln.split(" | ")[0]] != ln]
    missing = [n for n in old if n not in {ln.split(" | ")[0] for ln in lines}]
    for ln in differ:
        print(f"DIFFERS: {ln}\n   was: {old[ln.split(' | ')[0]]}")
    print(f"{len(lines)} cases, {len(differ)} differ, {len(missing)} not run")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
