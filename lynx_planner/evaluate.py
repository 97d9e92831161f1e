"""Judging strategies: every plan's `predicted` block comes from the simulator, and `check` re-derives it.

A strategy is a stage split (`bounds`: stage s holds layers bounds[s]..bounds[s+1]-1) and one policy per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import offload, placements, policy, schedules, simulator, streams
from .parallel import fsdp
from .memo import per_object
from .schema import (PLAN_OFFLOAD_VERSION, LayerPolicy, Plan, PlanParallel, Predicted, Profile, SolverInfo, StagePlan,
                     StagePrediction)


def static_bytes(profile: Profile, first: int, end: int) -> int:
    """Static bytes of a stage holding layers [first, end): their weights, gradients and optimizer state, the per-rank
    buffers, and FSDP's gathered parameters and unsharded gradients at their peak (parallel/fsdp.py)."""
    return profile.extra_static_bytes + sum(l.static_bytes for l in profile.layers[first:end]) \
        + fsdp.transient_bytes(profile, list(range(first, end)))


def rank_static_bytes(profile: Profile, stages: list[StagePlan], rank: int) -> int:
    """Static bytes of one rank: its chunks' layers, the per-rank buffers once, and FSDP's transient buffers."""
    p = profile.parallel.pp
    mine = [i for st in stages if schedules.rank_of(p, st.stage) == rank for i in range(*st.layers)]
    return profile.extra_static_bytes + sum(profile.layers[i].static_bytes for i in mine) \
        + fsdp.transient_bytes(profile, mine)


def rank_offloaded_bytes(profile: Profile, stages: list[StagePlan], rank: int) -> int:
    """Bytes one micro-batch sends to the host from one rank (its chunks' offloaded tensors)."""
    p = profile.parallel.pp
    return sum(offload.offloaded_bytes(profile.blocks[pol.block], pol.offload) * (pol.layers[1] - pol.layers[0])
               for st in stages if schedules.rank_of(p, st.stage) == rank for pol in st.policies if pol.offload)


def none_policy(profile: Profile, i: int) -> LayerPolicy:
    """Layer i keeps everything its backward needs."""
    return layer_policy(profile, i, policy.none_keep(policy.analyse(profile.blocks[profile.layers[i].block])), ())


def layer_policy(profile: Profile, i: int, keep: frozenset[str], recompute: tuple[str, ...] | None = None,
                 at: str = "on_demand", recompute_with: int | None = None) -> LayerPolicy:
    """The policy of layer i that keeps `keep` (recompute defaults to the closure)."""
    block = profile.layers[i].block
    info = policy.analyse(profile.blocks[block])
    rec = policy.closure(info, keep) if recompute is None else recompute
    if not rec:
        at = "on_demand"
    return LayerPolicy(layers=(i, i + 1), block=block, mode=policy.mode_of(info, keep, rec),
                       keep=sorted(keep, key=info.order.__getitem__), recompute=list(rec), at=at,
                       recompute_with=recompute_with)


def group(policies: list[LayerPolicy]) -> list[LayerPolicy]:
    """Merge runs of consecutive layers with the same policy (the plan lists runs, not single layers)."""
    out: list[LayerPolicy] = []
    for p in policies:
        prev = out[-1] if out else None
        same = prev is not None and prev.layers[1] == p.layers[0] and p.recompute_with is None and all(
            getattr(prev, f) == getattr(p, f) for f in LayerPolicy.model_fields if f != "layers")  # (no model_dump: hot)
        if same:
            out[-1] = prev.model_copy(update={"layers": (prev.layers[0], p.layers[1])})
        else:
            out.append(p)
    return out


def stage_plans(profile: Profile, bounds: list[int], per_layer: list[LayerPolicy]) -> list[StagePlan]:
    return [
        StagePlan(stage=s, layers=(bounds[s], bounds[s + 1]),
                  layer_names=[l.name for l in profile.layers[bounds[s]:bounds[s + 1]]],
                  policies=group(per_layer[bounds[s]:bounds[s + 1]]))
        for s in range(len(bounds) - 1)
    ]


def runs_of(profile: Profile, stages: list[StagePlan]) -> list[list[simulator.LayerRun]]:
    return [simulator.stage_runs(profile, st.layers[0], st.layers[1], st.policies) for st in stages]


@dataclass
class Evaluation:
    predicted: Predicted
    sim: simulator.SimResult

    @property
    def peak_bytes(self) -> int:
        return max(s.peak_memory_bytes for s in self.predicted.stages)

    def fits(self, limit: int) -> bool:
        return self.peak_bytes <= limit

    def better_than(self, other: Evaluation, limit: int) -> bool:
        """Fitting beats not fitting; then the faster iteration wins."""
        if self.fits(limit) != other.fits(limit):
            return self.fits(limit)
        return self.predicted.iteration_time_s < other.predicted.iteration_time_s - 1e-12


def evaluate(profile: Profile, stages: list[StagePlan], trace: bool = False, ideal: bool = True) -> Evaluation:
    """Simulate the plan. `ideal=False` (the searches' own comparisons) skips simulating the ideal and reports NaN."""
    sim = simulator.simulate(profile, runs_of(profile, stages), trace=trace)
    bounds = [st.layers[0] for st in stages] + [stages[-1].layers[1]]
    return _evaluation(profile, stages, sim, ideal_time(profile, bounds) if ideal else float("nan"))


def evaluation_of(profile: Profile, stages: list[StagePlan], sim: simulator.SimResult) -> Evaluation:
    """A search's own evaluation of its simulation of these stages (evaluate(..., ideal=False) without simulating)."""
    return _evaluation(profile, stages, sim, float("nan"))


def _evaluation(profile: Profile, stages: list[StagePlan], sim: simulator.SimResult, ideal_s: float) -> Evaluation:
    preds = []
    for rank, r in enumerate(sim.stages):  # per rank: the device its chunks share
        static = rank_static_bytes(profile, stages, rank)
        preds.append(StagePrediction(stage=rank, peak_memory_bytes=static + r.activation_peak_bytes,
                                     static_bytes=static, activation_bytes=r.activation_peak_bytes,
                                     busy_time_s=r.busy_s, exposed_recompute_s=r.exposed_s,
                                     hidden_recompute_s=r.hidden_s,
                                     offloaded_bytes=rank_offloaded_bytes(profile, stages, rank),
                                     offload_stall_s=r.offload_stall_s, link_busy_s=r.link_busy_s,
                                     host_peak_bytes=r.host_peak_bytes))
    predicted = Predicted(iteration_time_s=sim.iteration_time_s, ideal_iteration_time_s=ideal_s, stages=preds)
    return Evaluation(predicted, sim)


def with_ideal(profile: Profile, evaluation: Evaluation, bounds: list[int]) -> Evaluation:
    """A search's own simulation of its plan (`ideal=False`) completed with the split's ideal: what evaluate() would
    give, without simulating the plan again."""
    predicted = evaluation.predicted.model_copy(update={"ideal_iteration_time_s": ideal_time(profile, bounds)})
    return Evaluation(predicted, evaluation.sim)


@per_object
def _ideal_times(profile: Profile) -> dict[tuple[int, ...], Evaluation]:
    return {}


def keep_all(profile: Profile, bounds: list[int]) -> Evaluation:
    """Every layer keeping all it saves on this split, simulated (memoised per split): the split's ideal, and one of
    the plans a search may weigh."""
    known = _ideal_times(profile)
    key = tuple(bounds)
    if key not in known:
        stages = stage_plans(profile, bounds, [none_policy(profile, i) for i in range(len(profile.layers))])
        sim = simulator.simulate(profile, runs_of(profile, stages))
        known[key] = _evaluation(profile, stages, sim, sim.iteration_time_s)
    return known[key]


def ideal_time(profile: Profile, bounds: list[int]) -> float:
    """The same split with no recomputation and unlimited memory (memoised per split)."""
    return keep_all(profile, bounds).predicted.iteration_time_s


def make_plan(profile: Profile, profile_path: str, profile_sha256: str, algo: str, memory_limit: int,
              stages: list[StagePlan], solver: SolverInfo, evaluation: Evaluation | None = None) -> Plan:
    ev = evaluation or evaluate(profile, stages)
    par = profile.parallel
    offloads = any(pol.offload for st in stages for pol in st.policies)
    return Plan(schema_version=PLAN_OFFLOAD_VERSION if offloads else 1, algo=algo, profile_sha256=profile_sha256,
                profile_path=profile_path, memory_limit_bytes=memory_limit,
                parallel=PlanParallel(tp=par.tp, pp=par.pp, dp=par.dp, num_microbatches=par.num_microbatches,
                                      schedule=par.schedule, virtual_stages=par.virtual_stages, ep=par.ep,
                                      fsdp=par.fsdp, reshard_after_forward=par.reshard_after_forward,
                                      hsdp_shard_size=par.hsdp_shard_size, cp=par.cp),
                stages=stages, predicted=ev.predicted, solver=solver, dtype=profile.dtype, autocast=profile.autocast,
                kernels=profile.kernels, fp8=profile.fp8)


# `check`'s tolerances. A plan's predicted times must equal a fresh simulation within 1e-6 relative (or 1 ns: the
# simulator is deterministic, so only float formatting and summation order can differ); byte counts exactly, since
# the simulator counts whole bytes.
TIME_RTOL = 1e-6
TIME_ATOL_S = 1e-9
# HiGHS's relative MIP gap (solvers/milp.py REL_GAP; a test keeps the two equal): what `optimal` may claim at most.
SOLVER_REL_GAP = 1e-4
MILP_ALGOS = ("opt", "checkmate", "adapipe", "opt-offload")  # those that can claim a status other than `heuristic`


@dataclass
class Verdict:
    problems: list[str]  # empty: the plan is valid for the profile
    evaluation: Evaluation | None  # the fresh simulation; None when the plan is too broken to simulate


def check(plan: Plan, profile: Profile, tolerance: float = TIME_RTOL) -> list[str]:
    """Reasons the plan is not valid for this profile (empty: valid). Re-simulates from scratch."""
    return verify(plan, profile, tolerance).problems


def verify(plan: Plan, profile: Profile, tolerance: float = TIME_RTOL) -> Verdict:
    """Re-derive everything the plan claims from the profile and a fresh simulation: what the runtime acts on
    (stage numbering, layer names, parallel setup, modes, keep/recompute sets and their order, placements), what a
    user reads (every predicted figure, the solver's status and gap), and that every number is finite."""
    problems = _check_header(plan, profile)
    structure = _check_structure(plan, profile)
    if structure:
        return Verdict(problems + structure, None)
    try:
        ev = evaluate(profile, plan.stages)
    except (KeyError, IndexError, ValueError) as e:
        return Verdict(problems + [f"the plan does not fit the profile ({type(e).__name__}: {e})"], None)
    for pred in ev.predicted.stages:
        if pred.peak_memory_bytes > plan.memory_limit_bytes:
            problems.append(f"stage {pred.stage}: peak memory {pred.peak_memory_bytes} B exceeds the limit "
                            f"{plan.memory_limit_bytes} B")
    problems += _check_offload(plan, profile, ev)
    problems += _check_predicted(plan.predicted, ev.predicted, tolerance)
    return Verdict(problems, ev)


def _check_header(plan: Plan, profile: Profile) -> list[str]:
    """Finiteness, algorithm, solver fields, memory limit and parallel setup."""
    from .io import nonfinite_field
    from .solvers import ALL_ALGOS as ALGOS

    out = []
    found = nonfinite_field(plan.model_dump(mode="python"))
    if found:
        out.append(f"field {found[0]} is {found[1]}: every number of a plan must be finite")
    if plan.algo not in ALGOS:
        out.append(f"algo {plan.algo!r} is not a known algorithm ({', '.join(ALGOS)})")
    sv = plan.solver
    if sv.name != plan.algo:
        out.append(f"solver.name {sv.name!r} is not the plan's algo {plan.algo!r}")
    if plan.algo not in MILP_ALGOS and sv.status != "heuristic":
        out.append(f"solver.status {sv.status!r}: {plan.algo!r} is a heuristic and proves nothing")
    if plan.algo == "opt-offload" and sv.status == "optimal":  # solvers/opt.py: its model restricts the offload
        out.append("solver.status 'optimal': opt-offload's MILP restricts what a layer may offload and proves no optimum")
    if sv.status == "heuristic" and (sv.gap is not None or sv.bound_s is not None):
        out.append("solver.status 'heuristic' with a gap or bound: a heuristic has neither")
    if sv.gap is not None and not sv.gap >= 0:
        out.append(f"solver.gap {sv.gap} is negative")
    if sv.status == "optimal" and not (sv.gap is not None and sv.gap <= SOLVER_REL_GAP * (1 + 1e-9)):
        out.append(f"solver.status 'optimal' with gap {sv.gap}: optimal means proven within the solver's relative "
                   f"tolerance {SOLVER_REL_GAP}")
    if sv.bound_s is not None and not sv.bound_s >= 0:
        out.append(f"solver.bound_s {sv.bound_s} is negative")
    if not sv.search_time_s >= 0:
        out.append(f"solver.search_time_s {sv.search_time_s} is negative")
    if plan.memory_limit_bytes <= 0:
        out.append(f"memory_limit_bytes {plan.memory_limit_bytes} is not positive")
    if plan.memory_limit_bytes > profile.hardware.memory_bytes:
        out.append(f"memory_limit_bytes {plan.memory_limit_bytes} exceeds the device's memory "
                   f"{profile.hardware.memory_bytes} B ({profile.hardware.name})")
    par = profile.parallel
    for field in ("tp", "pp", "dp", "num_microbatches", "schedule", "virtual_stages", "ep", "fsdp",
                  "reshard_after_forward", "hsdp_shard_size", "cp"):
        mine, theirs = getattr(plan.parallel, field), getattr(par, field)
        if mine != theirs:
            out.append(f"parallel.{field} {mine!r} differs from the profile's {theirs!r}")
    for field in ("dtype", "autocast"):  # apply_plan refuses a model in another precision than the plan's
        mine, theirs = getattr(plan, field), getattr(profile, field)
        if mine != theirs:
            out.append(f"{field} {mine!r} differs from the profile's {theirs!r} (the training precision)")
    early = sorted({p.at if p.at != "on_demand" else "recompute_with (uniform chunks)"
                    for st in plan.stages for p in st.policies if p.at != "on_demand" or p.recompute_with is not None})
    if plan.compiled and early:  # compiled, a layer recomputes inside its own fused backward (runtime/compiled.py)
        out.append(f"compiled: true, but placements {', '.join(early)} are not on_demand: under torch.compile every "
                   "recomputation runs on demand (re-plan with lynx plan --compile)")
    return out


def structure_problems(plan: Plan, profile: Profile) -> list[str]:
    """The checks that must pass before a plan can be simulated at all (cheap: no simulation)."""
    return _check_structure(plan, profile)


def _check_structure(plan: Plan, profile: Profile) -> list[str]:
    """Stages numbered 0..pp-1 in order, covering every layer once, with the profile's layer names and legal
    policies."""
    problems: list[str] = []
    chunks = profile.parallel.pp * profile.parallel.virtual_stages
    if len(plan.stages) != chunks:
        problems.append(f"plan has {len(plan.stages)} stages, the profile's pipeline has {chunks}"
                        + (f" (pp {profile.parallel.pp} x {profile.parallel.virtual_stages} virtual stages)"
                           if chunks != profile.parallel.pp else ""))
    expected = 0
    for s, st in enumerate(plan.stages):
        if st.stage != s:
            problems.append(f"stages[{s}]: stage index {st.stage}, expected {s} (stages are listed in order)")
        if st.layers[0] != expected or st.layers[1] <= st.layers[0] or st.layers[1] > len(profile.layers):
            problems.append(f"stage {st.stage}: layers {list(st.layers)} do not continue from layer {expected}")
            expected = max(expected, st.layers[1])
            continue
        expected = st.layers[1]
        names = [profile.layers[i].name for i in range(*st.layers)]
        if st.layer_names != names:
            problems.append(f"stage {st.stage}: layer_names {_short(st.layer_names)} are not the profile's "
                            f"{_short(names)}")
        outside = [p for p in st.policies if not st.layers[0] <= p.layers[0] <= p.layers[1] <= st.layers[1]]
        if outside:  # before any list of layer indices is built: [0, 10^9] must not cost 10^9 entries
            problems.append(f"stage {st.stage}: a policy's layers {list(outside[0].layers)} are outside the stage's "
                            f"{list(st.layers)}")
            continue
        covered = [i for p in st.policies for i in range(*p.layers)]
        if covered != list(range(*st.layers)):
            problems.append(f"stage {st.stage}: policies cover layers {covered[:3]}..., not {list(st.layers)}")
            continue
        for p in st.policies:
            problems += _check_policy(profile, st, p)
    if expected != len(profile.layers):
        problems.append(f"plan covers {expected} layers, the profile has {len(profile.layers)}")
    problems += _check_placements(plan, profile)
    return problems


def _short(items: list[str]) -> str:
    return str(items) if len(items) <= 4 else f"[{', '.join(map(repr, items[:3]))}, ... ({len(items)})]"


def _check_predicted(claimed: Predicted, sim: Predicted, rtol: float) -> list[str]:
    """Every predicted figure against the fresh simulation: times within rtol (or 1 ns), bytes exactly."""
    out = []

    def time(field: str, a: float, b: float) -> None:
        if not abs(a - b) <= max(rtol * abs(b), TIME_ATOL_S):  # `not <=`: NaN fails
            out.append(f"predicted {field} {a!r} s disagrees with the simulation ({b:.9g} s)")

    time("iteration_time_s", claimed.iteration_time_s, sim.iteration_time_s)
    time("ideal_iteration_time_s", claimed.ideal_iteration_time_s, sim.ideal_iteration_time_s)
    if len(claimed.stages) != len(sim.stages):
        return out + [f"predicted has {len(claimed.stages)} stages, the plan {len(sim.stages)}"]
    for s, (c, r) in enumerate(zip(claimed.stages, sim.stages)):
        if c.stage != r.stage:
            out.append(f"predicted.stages[{s}]: stage index {c.stage}, expected {r.stage}")
        for f in ("peak_memory_bytes", "static_bytes", "activation_bytes", "offloaded_bytes", "host_peak_bytes"):
            if getattr(c, f) != getattr(r, f):
                out.append(f"predicted stage {r.stage} {f} {getattr(c, f)} disagrees with the simulation "
                           f"({getattr(r, f)})")
        if c.offload_stall_s != r.offload_stall_s and r.offload_stall_s > c.offload_stall_s + TIME_ATOL_S:
            out.append(f"stage {r.stage}: the copy engine does not carry the offloaded tensors in time: the backward "
                       f"stalls {r.offload_stall_s:.6g} s for late prefetches, the plan claims "
                       f"{c.offload_stall_s:.6g} s (offloads more than the host link returns before it is needed)")
        for f in ("busy_time_s", "exposed_recompute_s", "hidden_recompute_s", "offload_stall_s", "link_busy_s"):
            time(f"stage {r.stage} {f}", getattr(c, f), getattr(r, f))
    return out


def _check_offload(plan: Plan, profile: Profile, ev: Evaluation) -> list[str]:
    """The host holds what the plan offloads (pinned host memory per GPU), and the version says it offloads."""
    out = []
    offloads = any(p.offload for st in plan.stages for p in st.policies)
    if offloads and plan.schema_version < PLAN_OFFLOAD_VERSION:
        out.append(f"schema_version {plan.schema_version}: a plan that offloads is version {PLAN_OFFLOAD_VERSION}")
    link = offload.rank_link(profile) if offloads else None
    if link is None:
        return out
    for pred in ev.predicted.stages:
        if pred.host_peak_bytes > link.pinned_bytes:
            out.append(f"stage {pred.stage}: offloaded tensors fill {pred.host_peak_bytes} B of host memory, more "
                       f"than the {link.pinned_bytes} B of pinned host memory per GPU ({profile.hardware.name})")
    return out


def _check_policy(profile: Profile, st: StagePlan, p: LayerPolicy) -> list[str]:
    where = f"stage {st.stage} layers {list(p.layers)}"
    out = []
    for i in range(*p.layers):
        if profile.layers[i].block != p.block:
            return [f"{where}: layer {i} is a {profile.layers[i].block!r}, the policy is for {p.block!r}"]
    if p.block not in profile.blocks:
        return [f"{where}: unknown block {p.block!r}"]
    info = policy.analyse(profile.blocks[p.block])
    keep, rec = list(p.keep), list(p.recompute)
    if p.recompute_with is not None:
        top = p.recompute_with
        if not (p.layers[1] - 1 <= top < st.layers[1]) or p.layers[0] < st.layers[0]:
            out.append(f"{where}: recompute_with {top} is not a later layer of the stage")
        if keep:
            out.append(f"{where}: a uniform chunk layer keeps nothing but recomputes from the chunk input")
    why = policy.validate(info, keep, rec) or _order_problem(info, keep, rec) or \
        offload.policy_problem(profile, info, p)
    if why:
        return out + [f"{where}: {why}"]
    mode = policy.mode_of(info, frozenset(keep), tuple(rec))
    if p.mode != mode:
        out.append(f"{where}: mode {p.mode!r}, but its keep and recompute sets make it {mode!r} (the runtime "
                   "acts on mode)")
    if not rec and p.at != "on_demand":
        out.append(f"{where}: at={p.at} but nothing is recomputed (a plan writes on_demand there)")
    if rec and p.at != "on_demand" and policy.cost(info, frozenset(keep), tuple(rec)).replays_collective:
        out.append(f"{where}: recomputation repeats a TP collective, so it can only run on demand (at={p.at})")
    return out


def _check_placements(plan: Plan, profile: Profile) -> list[str]:
    """Placements that never fire on their stage (placements.py): the simulator and the runtime run them on demand."""
    par, out = profile.parallel, []
    for st in plan.stages:
        fires = placements.legal_placements(par.schedule, par.pp, st.stage, par.num_microbatches, par.virtual_stages)
        legal = streams.legal_placements(profile, st.stage)
        for p in st.policies:
            if p.recompute and p.at in fires and p.at not in legal:
                out.append(f"stage {st.stage} layers {list(p.layers)}: placement {p.at} under FSDP resharding after "
                           "forward: the layer's parameters are not gathered when it fires; use layer_above or "
                           "on_demand, or profile with --no-reshard-after-forward")
            elif p.recompute and p.at not in legal:
                out.append(f"stage {st.stage} layers {list(p.layers)}: placement {p.at} never fires on this stage "
                           f"({par.schedule}, {len(plan.stages)} stages, {par.num_microbatches} micro-batches: no "
                           "forward of another micro-batch right before a backward); use on_demand")
    return out


def _order_problem(info: policy.BlockInfo, keep: list[str], rec: list[str]) -> str | None:
    """The runtime runs `recompute` in the listed order: each op once, after the recomputed ops it reads."""
    if len(set(rec)) != len(rec):
        dup = next(o for i, o in enumerate(rec) if o in rec[:i])
        return f"recompute lists {dup!r} twice"
    done: set[str] = set()
    for op in rec:
        late = [i for i in info.inputs.get(op, ()) if i in rec and i not in done]
        if late:
            return f"recompute runs {op!r} before {late[0]!r}, which it reads (not a legal order)"
        done.add(op)
    return None
