"""The simulator's results, bit for bit, over a wide set of cases: to show that a change meant to make the simulator
faster gives the same floats in the same order (issue 29). Writes one line per case: its name and sha256 digests of

- HEU's search: its plan JSON (search time zeroed) and every simulation the search ran, in order (the runs passed in,
  the caps, and the whole result: repr of every float, every stage's figures, gradient waits);
- plain simulations of full recomputation, no recomputation and seeded random plans (every placement, uniform chunks,
  offload), with and without a trace (trace events, releases, the memory timelines), and capped at the peaks and a
  byte below them; on the profile as given and with blocking p2p (overlap_p2p_comm false) and, where sequence
  parallel, --tp-comm-overlap.

    python benchmarks/sim_identical.py -o before.txt          # on the old code (e.g. PYTHONPATH=<a checkout of it>)
    python benchmarks/sim_identical.py -o after.txt --compare before.txt   # exit 1 and list the cases that differ

Cases: the README's 13B case at its 16.1875 GiB; the catalog's llama3-405b, qwen3-32b, deepseek-v3 and mixtral-8x7b
layouts (benchmarks/heu_scaling.py) at half way between full recomputation's peak and none's; the deepest gpt-175b
depth case; the audit's generated profiles (lynx_planner/audit.py) for GPipe, interleaved 1F1B and zero bubble; every
shipped profile (plain simulations only). `--quick`: the README case, one catalog model and the audit's three.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import heu_identical  # noqa: E402
from lynx_planner import evaluate as ev  # noqa: E402
from lynx_planner import offload, policy, simulator, solvers  # noqa: E402
from lynx_planner.evaluate import make_plan  # noqa: E402
from lynx_planner.io import dumps  # noqa: E402
from lynx_planner.schema import Profile  # noqa: E402
from lynx_planner.solvers import candidates  # noqa: E402
from lynx_planner.solvers.partition import even_bounds  # noqa: E402

PLACEMENTS = ("on_demand", "layer_above", "grad_wait", "prev_forward")
RANDOM_PLANS = 3  # seeded random plans per profile


def result_text(sim: simulator.SimResult | None) -> str:
    """Everything a simulation returns, floats as repr (exact)."""
    return "None" if sim is None else repr(asdict(sim))


def _digest(parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def search_digests(prof: Profile, limit: int) -> tuple[str, str, int]:
    """(HEU's plan, every simulation of its search, how many) for a search from cold caches."""
    seen: list[str] = []
    real = simulator.simulate

    def recording(profile, stage_layers, trace=False, caps=None):
        got = real(profile, stage_layers, trace=trace, caps=caps)
        seen.append(repr(stage_layers) + repr(trace) + repr(caps) + result_text(got))
        return got

    candidates.reset_caches()
    simulator.simulate = recording
    try:
        got = solvers.solve(prof, "heu", limit)
    finally:
        simulator.simulate = real
    solver = got.solver.model_copy(update={"search_time_s": 0.0})
    plan = make_plan(prof, "profile.json", "0" * 64, "heu", limit, got.stages, solver, got.evaluation)
    return _digest([dumps(plan)]), _digest(seen), len(seen)


def random_policies(prof: Profile, bounds: list[int], rng: random.Random, offload: bool):
    """A seeded random plan: random kept units and placements, now and then a uniform chunk, and (offload) some kept
    units offloaded with either reload."""
    pols = []
    for i, layer in enumerate(prof.layers):
        info = policy.analyse(prof.blocks[layer.block])
        units = sorted(info.units)
        keep = frozenset(u for u in units if rng.random() < 0.5)
        p = ev.layer_policy(prof, i, keep, None, rng.choice(PLACEMENTS))
        if offload and keep and rng.random() < 0.5:
            off = [u for u in sorted(keep) if rng.random() < 0.5]  # sorted: a set's order varies by process
            if off:
                p = p.model_copy(update={"offload": off, "reload": rng.choice(("layer_above", "grad_wait"))})
        pols.append(p)
    for s in range(len(bounds) - 1):  # a uniform chunk: the top two layers of a stage, when of one block
        first, end = bounds[s], bounds[s + 1]
        if rng.random() < 0.3 and end - first >= 2 and prof.layers[end - 2].block == prof.layers[end - 1].block:
            for i in (end - 2, end - 1):
                info = policy.analyse(prof.blocks[prof.layers[i].block])
                pols[i] = ev.layer_policy(prof, i, frozenset(), policy.full_recompute(info), recompute_with=end - 1)
    return pols


def plain_digest(prof: Profile) -> str:
    """Simulations of full, none and random plans on the even split: traced, untraced and capped."""
    chunks = prof.parallel.pp * prof.parallel.virtual_stages
    bounds = even_bounds(prof, chunks)
    n = len(prof.layers)
    plans = [[ev.layer_policy(prof, i, frozenset()) for i in range(n)], [ev.none_policy(prof, i) for i in range(n)]]
    rng = random.Random(29)
    offload_ok = offload.rank_link(prof) is not None
    plans += [random_policies(prof, bounds, rng, offload_ok and k == RANDOM_PLANS - 1) for k in range(RANDOM_PLANS)]
    parts = []
    for pols in plans:
        stages = ev.stage_plans(prof, bounds, pols)
        runs = ev.runs_of(prof, stages)
        parts.append(repr(runs))
        try:
            full = simulator.simulate(prof, runs)
        except ValueError as e:  # e.g. an offload on hardware with no host link
            parts.append(f"error {e}")
            continue
        parts.append(result_text(full))
        parts.append(result_text(simulator.simulate(prof, runs, trace=True)))
        peaks = [r.activation_peak_bytes for r in full.stages]
        parts.append(result_text(simulator.simulate(prof, runs, caps=peaks)))
        parts.append(result_text(simulator.simulate(prof, runs, caps=[p - 1 for p in peaks])))
        parts.append(repr(ev.evaluate(prof, stages).predicted))
    return _digest(parts)


def variants(prof: Profile):
    """(label, profile): as given, with blocking p2p, and with --tp-comm-overlap where sequence parallel."""
    yield "", prof
    par = prof.parallel
    yield " blocking", prof.model_copy(update={"parallel": par.model_copy(update={"overlap_p2p_comm": False})})
    if par.sequence_parallel and par.tp > 1 and not par.tp_comm_overlap:
        yield " tp-overlap", prof.model_copy(update={"parallel": par.model_copy(update={"tp_comm_overlap": True})})


def cases(quick: bool):
    """(name, profile, HEU's limit or None: plain simulations only)."""
    import heu_scaling as hs
    from lynx_planner import audit
    from lynx_planner.analytic import gpt_profile
    from lynx_planner.models.catalog import MODELS
    from lynx_planner.models.hardware import HARDWARE
    from lynx_planner.schema import ParallelConfig

    readme = Profile.model_validate_json((ROOT / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json").read_text())
    yield "README 13B", readme, hs.README_LIMIT
    for name in ("llama3-405b",) if quick else ("llama3-405b", "qwen3-32b", "deepseek-v3", "mixtral-8x7b"):
        prof, _ = hs.catalog_profile(name)
        yield f"catalog {name}", prof, hs._limit(prof, 0.5)
    for model, schedule, v, ep in (("llama3-8b", "gpipe", 1, 1), ("mixtral-8x7b", "interleaved-1f1b", 2, 8),
                                   ("qwen3-32b", "zero-bubble", 1, 1)):
        prof = audit.case_profile(model, schedule, v, ep)
        yield f"audit {model} {schedule} v{v} ep{ep}", prof, audit.limit_of(prof, 0.2)
    if quick:
        return
    pp, m = hs.DEPTH[-1]
    prof = gpt_profile(MODELS["gpt-175b"], ParallelConfig(tp=8, pp=pp, num_microbatches=m, sequence_parallel=True),
                       HARDWARE["a100-80g-nvlink"], "flash", 0.0)
    yield f"depth gpt-175b pp{pp} M{m}", prof, hs._limit(prof, 0.3)
    for path in sorted((ROOT / "profiles").glob("*.json")):
        yield f"profile {path.stem}", Profile.model_validate_json(path.read_text()), None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--compare", help="an earlier output: exit 1 if any case differs")
    ap.add_argument("--quick", action="store_true", help="a few cases only")
    args = ap.parse_args()
    lines = []
    with open(args.out, "w") as out:
        for name, prof, limit in cases(args.quick):
            line = name
            if limit is not None:
                plan, sims, count = search_digests(prof, limit)
                line += f" | heu plan {plan} | {count} simulations {sims}"
            for label, variant in variants(prof):
                line += f" | plain{label} {plain_digest(variant)}"
            lines.append(line)
            out.write(line + "\n")
            out.flush()
            print(line, flush=True)
    return heu_identical.compare(lines, args.compare) if args.compare else 0


if __name__ == "__main__":
    sys.exit(main())
