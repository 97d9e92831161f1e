"""Judging strategies: every plan's `predicted` block comes from the simulator, and `check` re-derives it.

A strategy is a stage split (`bounds`: stage s holds layers bounds[s]..bounds[s+1]-1) and one policy per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import policy, simulator
from .memo import per_object
from .schema import LayerPolicy, Plan, PlanParallel, Predicted, Profile, SolverInfo, StagePlan, StagePrediction


def static_bytes(profile: Profile, first: int, end: int) -> int:
    return profile.extra_static_bytes + sum(l.static_bytes for l in profile.layers[first:end])


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
        same = prev is not None and prev.layers[1] == p.layers[0] and prev.model_dump(exclude={"layers"}) == \
            p.model_dump(exclude={"layers"}) and p.recompute_with is None
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
    ideal_s = ideal_time(profile, bounds) if ideal else float("nan")
    preds = []
    for st, r in zip(stages, sim.stages):
        static = static_bytes(profile, *st.layers)
        preds.append(StagePrediction(stage=st.stage, peak_memory_bytes=static + r.activation_peak_bytes,
                                     static_bytes=static, activation_bytes=r.activation_peak_bytes,
                                     busy_time_s=r.busy_s, exposed_recompute_s=r.exposed_s,
                                     hidden_recompute_s=r.hidden_s))
    predicted = Predicted(iteration_time_s=sim.iteration_time_s, ideal_iteration_time_s=ideal_s, stages=preds)
    return Evaluation(predicted, sim)


@per_object
def _ideal_times(profile: Profile) -> dict[tuple[int, ...], float]:
    return {}


def ideal_time(profile: Profile, bounds: list[int]) -> float:
    """The same split with no recomputation and unlimited memory (memoised per split)."""
    known = _ideal_times(profile)
    key = tuple(bounds)
    if key not in known:
        known[key] = _simulate_ideal(profile, bounds)
    return known[key]


def _simulate_ideal(profile: Profile, bounds: list[int]) -> float:
    nones = [none_policy(profile, i) for i in range(len(profile.layers))]
    runs = [simulator.stage_runs(profile, bounds[s], bounds[s + 1], nones[bounds[s]:bounds[s + 1]])
            for s in range(len(bounds) - 1)]
    return simulator.simulate(profile, runs).iteration_time_s


def make_plan(profile: Profile, profile_path: str, profile_sha256: str, algo: str, memory_limit: int,
              stages: list[StagePlan], solver: SolverInfo, evaluation: Evaluation | None = None) -> Plan:
    ev = evaluation or evaluate(profile, stages)
    par = profile.parallel
    return Plan(algo=algo, profile_sha256=profile_sha256, profile_path=profile_path, memory_limit_bytes=memory_limit,
                parallel=PlanParallel(tp=par.tp, pp=par.pp, dp=par.dp, num_microbatches=par.num_microbatches,
                                      schedule=par.schedule),
                stages=stages, predicted=ev.predicted, solver=solver, dtype=profile.dtype, autocast=profile.autocast)


def check(plan: Plan, profile: Profile, tolerance: float = 1e-6) -> list[str]:
    """Reasons the plan is not valid for this profile (empty: valid). Re-simulates from scratch."""
    problems: list[str] = []
    par = profile.parallel
    if len(plan.stages) != par.pp:
        problems.append(f"plan has {len(plan.stages)} stages, the profile's pipeline has {par.pp}")
    expected = 0
    for st in plan.stages:
        if st.layers[0] != expected or st.layers[1] <= st.layers[0]:
            problems.append(f"stage {st.stage}: layers {list(st.layers)} do not continue from layer {expected}")
        expected = st.layers[1]
        covered = [i for p in st.policies for i in range(*p.layers)]
        if covered != list(range(*st.layers)):
            problems.append(f"stage {st.stage}: policies cover layers {covered[:3]}..., not {list(st.layers)}")
            continue
        for p in st.policies:
            problems += _check_policy(profile, st, p)
    if expected != len(profile.layers):
        problems.append(f"plan covers {expected} layers, the profile has {len(profile.layers)}")
    if problems:
        return problems
    ev = evaluate(profile, plan.stages)
    for pred in ev.predicted.stages:
        if pred.peak_memory_bytes > plan.memory_limit_bytes:
            problems.append(f"stage {pred.stage}: peak memory {pred.peak_memory_bytes} B exceeds the limit "
                            f"{plan.memory_limit_bytes} B")
    t_plan, t_sim = plan.predicted.iteration_time_s, ev.predicted.iteration_time_s
    if abs(t_plan - t_sim) > tolerance * max(1.0, t_sim):
        problems.append(f"predicted iteration time {t_plan:.6f} s disagrees with the simulation ({t_sim:.6f} s)")
    return problems


def _check_policy(profile: Profile, st: StagePlan, p: LayerPolicy) -> list[str]:
    where = f"stage {st.stage} layers {list(p.layers)}"
    out = []
    for i in range(*p.layers):
        if profile.layers[i].block != p.block:
            return [f"{where}: layer {i} is a {profile.layers[i].block!r}, the policy is for {p.block!r}"]
    info = policy.analyse(profile.blocks[p.block])
    keep, rec = list(p.keep), list(p.recompute)
    if p.recompute_with is not None:
        top = p.recompute_with
        if not (p.layers[1] - 1 <= top < st.layers[1]) or p.layers[0] < st.layers[0]:
            out.append(f"{where}: recompute_with {top} is not a later layer of the stage")
        if keep:
            out.append(f"{where}: a uniform chunk layer keeps nothing but recomputes from the chunk input")
    why = policy.validate(info, keep, rec)
    if why:
        out.append(f"{where}: {why}")
    elif rec and p.at != "on_demand" and policy.cost(info, frozenset(keep), tuple(rec)).replays_collective:
        out.append(f"{where}: recomputation repeats a TP collective, so it can only run on demand (at={p.at})")
    return out
