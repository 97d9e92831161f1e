"""`lynx bench --audit`: a second, independent search that tries to beat HEU and OPT, over a generated suite.

The suite crosses every schedule with dense and MoE catalog models at reduced depth (MoE with and without expert
parallelism), memory limits between full recomputation's peak and keeping everything, and Megatron's even split as
well as the recomputation-aware one (`--partition auto`). On each case HEU and OPT plan as a user's `lynx plan` would;
then the audit searches on its own: per layer a handful of coarse policies (keep all, Megatron's full and selective
recomputation, and the block's cheapest policies keeping at most a quarter, half, three quarters of what keeping all
keeps), all recomputation on demand, chosen per chunk as "the first k of the chunk's layers take one policy", by
coordinate descent from several starts (all full, all at half, keep all), with over-limit plans ranked by their
excess so that a start over the limit descends into it. It searches the even split and the split each algorithm
chose. Every plan is judged by the simulator, the same one that judges HEU and OPT; nothing of their models is used.

A case is beaten when the audit's best fitting plan simulates more than TOLERANCE faster than the algorithm's.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from functools import lru_cache

from rich.console import Console
from rich.table import Table

from . import evaluate as ev
from . import policy
from .schema import LayerPolicy, ParallelConfig, Profile
from .solvers import Infeasible, solve
from .solvers.candidates import pareto
from .solvers.partition import even_bounds
from .solvers.stage_model import n_chunks

TOLERANCE = 0.005  # beaten by more than this (relative to the algorithm's time) fails the audit
HARDWARE = "h100-80g-nvlink"
LAYERS = 8  # every model at this depth: the pipeline's structure matters here, not the depth
MICROBATCHES = 8
SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("zero-bubble", 1))
DENSE = ("llama3-8b", "qwen3-32b")
MOE = ("mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3")
BETWEEN = (0.2, 0.5)  # the limit: full's peak + this share of (keep-all's peak - full's peak), on the even split
MIN_CHOICES = 3  # layers whose block has fewer candidates (embedding, head, final norm) keep everything
MAX_SWEEPS = 4
ALGOS = ("heu", "opt")
OPT_TIME_LIMIT_S = 20.0  # OPT's search per case (--time-limit overrides)


@dataclass(frozen=True)
class AuditCase:
    model: str  # a catalog name, cut to LAYERS layers
    schedule: str
    virtual_stages: int
    ep: int
    between: float
    partition: str

    @property
    def name(self) -> str:
        sched = self.schedule + (f"-v{self.virtual_stages}" if self.virtual_stages > 1 else "")
        return f"{self.model} {sched} ep{self.ep} {self.between:g} {self.partition}"


def suite(size: str = "full") -> list[AuditCase]:
    """The generated cases: 'full' (128: every schedule x dense/MoE x EP/no EP x 2 limits x even/auto) or 'ci' (a
    handful that covers each schedule, MoE with EP and both splits)."""
    cases = []
    for model in DENSE + MOE:
        for sched, v in SCHEDULES:
            for ep in ((1, 8) if model in MOE else (1,)):
                for between in BETWEEN:
                    for part in ("even", "auto"):
                        cases.append(AuditCase(model, sched, v, ep, between, part))
    if size == "ci":
        keep = {("llama3-8b", "1f1b", 1, 0.2, "auto"), ("mixtral-8x7b", "interleaved-1f1b", 8, 0.2, "even"),
                ("deepseek-v3", "zero-bubble", 8, 0.5, "even"), ("qwen3-32b", "gpipe", 1, 0.5, "even")}
        cases = [c for c in cases if (c.model, c.schedule, c.ep, c.between, c.partition) in keep]
    return cases


@lru_cache(maxsize=64)
def case_profile(model: str, schedule: str, virtual_stages: int, ep: int) -> Profile:
    from .analytic import profile
    from .models.catalog import MODELS
    from .models.hardware import HARDWARE as HW

    spec = MODELS[model]
    spec = spec.model_copy(update={"num_layers": LAYERS})
    par = ParallelConfig(tp=1, pp=4, dp=8, ep=ep, seq_len=2048, micro_batch_size=1, num_microbatches=MICROBATCHES,
                         schedule=schedule, virtual_stages=virtual_stages, distributed_optimizer=True)
    return profile(spec, par, HW[HARDWARE])


def coarse_choices(profile: Profile, block: str) -> list[tuple[frozenset[str], tuple[str, ...]]]:
    """(keep, recompute) per coarse policy of a block, from keeping all to Megatron's full recomputation."""
    info = policy.analyse(profile.blocks[block])
    cands = pareto(profile.blocks[block])
    if len(cands) < MIN_CHOICES:
        return [(policy.none_keep(info), ())]
    most = max(c.kept_bytes for c in cands)
    out = [(policy.none_keep(info), ()), (frozenset(), policy.full_recompute(info))]
    sel = policy.selective_keep(info)
    out.append((sel, policy.closure(info, sel)))
    for q in (0.75, 0.5, 0.25):
        fit = [c for c in cands if c.kept_bytes <= q * most]
        if fit:
            c = min(fit, key=lambda c: (c.rec_s, c.kept_bytes))
            out.append((c.keep, c.recompute))
    seen, unique = set(), []
    for keep, rec in out:
        if (keep, rec) not in seen:
            seen.add((keep, rec))
            unique.append((keep, rec))
    return unique


class _Search:
    """Coordinate descent over per-chunk "first k layers take policy x" moves on one split."""

    def __init__(self, profile: Profile, bounds: list[int], limit: int):
        self.profile, self.bounds, self.limit = profile, bounds, limit
        self.choices = {b: coarse_choices(profile, b) for b in {l.block for l in profile.layers}}
        self.policies: dict[tuple[int, int], LayerPolicy] = {}
        self.seen: dict[tuple[int, ...], tuple] = {}
        # the layers with a choice, per chunk
        self.free = [[i for i in range(bounds[c], bounds[c + 1])
                      if len(self.choices[profile.layers[i].block]) > 1] for c in range(len(bounds) - 1)]
        self.sims = 0

    def _policy(self, i: int, x: int) -> LayerPolicy:
        if (i, x) not in self.policies:
            opts = self.choices[self.profile.layers[i].block]
            keep, rec = opts[min(x, len(opts) - 1)]
            self.policies[(i, x)] = ev.layer_policy(self.profile, i, keep, rec, "on_demand")
        return self.policies[(i, x)]

    def score(self, state: tuple[int, ...]) -> tuple:
        """(over the limit, excess or time, time, peak): lower is better; fitting plans rank by time."""
        if state not in self.seen:
            pols = [self._policy(i, x) for i, x in enumerate(state)]
            e = ev.evaluate(self.profile, ev.stage_plans(self.profile, self.bounds, pols), ideal=False)
            self.sims += 1
            t, peak = e.predicted.iteration_time_s, e.peak_bytes
            over = peak > self.limit
            self.seen[state] = (over, peak - self.limit if over else t, t, peak)
        return self.seen[state]

    def uniform(self, x: int) -> tuple[int, ...]:
        return tuple(x if len(self.choices[l.block]) > 1 else 0 for l in self.profile.layers)

    def descend(self, state: tuple[int, ...]) -> tuple[int, ...]:
        best = self.score(state)
        for _ in range(MAX_SWEEPS):
            improved = False
            for layers in self.free:
                n_opts = max(len(self.choices[self.profile.layers[i].block]) for i in layers) if layers else 0
                for x in range(n_opts):
                    for k in range(1, len(layers) + 1):
                        s = list(state)
                        for i in layers[:k]:
                            s[i] = x
                        cand = tuple(s)
                        if cand != state and self.score(cand) < best:
                            state, best, improved = cand, self.score(cand), True
            if not improved:
                break
        return state

    def run(self) -> tuple[float, int] | None:
        """The best fitting plan's (iteration time, peak), or None."""
        best = None
        for start in (self.uniform(1), self.uniform(3), self.uniform(0)):
            got = self.score(self.descend(start))
            if not got[0] and (best is None or got < best):
                best = got
        return None if best is None else (best[2], best[3])


def limit_of(profile: Profile, between: float) -> int:
    s = _Search(profile, even_bounds(profile, n_chunks(profile)), 0)
    full, none = s.score(s.uniform(1))[3], s.score(s.uniform(0))[3]
    return int(full + between * (none - full))


def audit_case(case: AuditCase, algos: tuple[str, ...] = ("heu", "opt"), opt_time_limit: float | None = 20.0
               ) -> dict:
    profile = case_profile(case.model, case.schedule, case.virtual_stages, case.ep)
    limit = limit_of(profile, case.between)
    row: dict = {"case": case.name, **asdict(case), "memory_limit_bytes": limit}
    splits = [even_bounds(profile, n_chunks(profile))]
    for algo in algos:
        t0 = time.perf_counter()
        try:
            got = solve(profile, algo, limit, opt_time_limit if algo == "opt" else None, case.partition)
        except Infeasible:
            row[algo] = None
            continue
        bounds = [st.layers[0] for st in got.stages] + [got.stages[-1].layers[1]]
        if bounds not in splits:
            splits.append(bounds)
        row[algo] = {"iteration_time_s": got.evaluation.predicted.iteration_time_s, "status": got.solver.status,
                     "search_time_s": round(time.perf_counter() - t0, 3), "bounds": bounds}
    t0 = time.perf_counter()
    best, sims = None, 0
    for bounds in splits:
        search = _Search(profile, bounds, limit)
        got = search.run()
        sims += search.sims
        if got is not None and (best is None or got[0] < best[0]):
            best = (got[0], got[1], bounds)
    row["audit"] = None if best is None else {"iteration_time_s": best[0], "peak_memory_bytes": best[1],
                                              "bounds": best[2], "simulations": sims,
                                              "search_time_s": round(time.perf_counter() - t0, 3)}
    for algo in algos:
        a = row.get(algo)
        if a is not None and best is not None:
            a["beaten_by"] = max(0.0, (a["iteration_time_s"] - best[0]) / a["iteration_time_s"])
    return row


def run(cases: list[AuditCase], algos: tuple[str, ...] = ("heu", "opt"), opt_time_limit: float | None = 20.0,
        console: Console | None = None, each=None) -> list[dict]:
    """Audit every case (a progress bar on stderr); `each(row)` is called as each case ends."""
    from rich.progress import Progress

    err = Console(stderr=True) if console is None else console
    rows = []
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("audit", total=len(cases))
        for case in cases:
            bar.update(task, description=case.name)
            rows.append(audit_case(case, algos, opt_time_limit))
            if each is not None:
                each(rows[-1])
            bar.advance(task)
    return rows


def beaten(rows: list[dict], algos: tuple[str, ...] = ("heu", "opt")) -> list[tuple[float, str, str]]:
    """(how much faster the audit's plan is, algorithm, case) for every case it beats, worst first."""
    out = [(r[a]["beaten_by"], a, r["case"]) for r in rows for a in algos
           if r.get(a) and r[a].get("beaten_by", 0) > 0]
    return sorted(out, key=lambda x: (-x[0], x[1], x[2]))


def worst(rows: list[dict], algo: str, n: int = 10) -> list[dict]:
    """The `n` cases where the audit's plan is furthest ahead of `algo`'s (beaten or not), worst first."""
    have = [r for r in rows if r.get(algo) and r.get("audit")]
    return sorted(have, key=lambda r: (-r[algo].get("beaten_by", 0.0), r["case"]))[:n]


def report(rows: list[dict], console: Console, algos: tuple[str, ...] = ("heu", "opt"), worst_n: int = 10) -> int:
    """Print, per algorithm, its worst `worst_n` cases against the audit; 1 if any is beaten by more than TOLERANCE
    (or has no plan where the audit has one), else 0."""
    beats = beaten(rows, algos)
    over = [b for b in beats if b[0] > TOLERANCE]
    for algo in algos:
        mine = [b for b in beats if b[1] == algo]
        top = worst(rows, algo, worst_n)
        t = Table(title=f"audit, {algo}: {len(rows)} cases; beaten in {len(mine)}, by more than {TOLERANCE:.1%} in "
                        f"{sum(b[0] > TOLERANCE for b in mine)} (worst {len(top)})")
        for col in ("case", f"{algo} s", "audit s", "beaten by", "status"):
            t.add_column(col)
        for r in top:
            a = r[algo]
            t.add_row(r["case"], f"{a['iteration_time_s']:.4f}", f"{r['audit']['iteration_time_s']:.4f}",
                      f"{a.get('beaten_by', 0.0):.2%}", str(a.get("status", "")))
        console.print(t)
    missing = [(a, r["case"]) for r in rows for a in algos if r.get(a) is None and r.get("audit")]
    for a, case in missing:
        console.print(f"{a} found no plan on {case}, the audit did", markup=False)
    return 1 if over or missing else 0


def main(size: str, algos: tuple[str, ...], out_json: str | None, console: Console,
         opt_time_limit: float | None = 20.0) -> int:
    rows = run(suite(size), algos, opt_time_limit, console)
    if out_json:
        from pathlib import Path

        from .io import write_atomic

        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out_json, json.dumps(rows, indent=1, sort_keys=True) + "\n")
    return report(rows, console, algos)
