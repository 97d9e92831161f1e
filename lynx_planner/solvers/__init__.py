"""Strategy search: one module per algorithm, one entry point (`solve`) that times the search and judges the result
with the simulator.

Each algorithm module exposes `search(problem, algo) -> Strategy`.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

from ..evaluate import Evaluation, evaluate, make_plan, stage_plans, with_ideal
from ..io import InputError, format_bytes
from ..schema import CandidateBound, LayerPolicy, Plan, Profile, SolverInfo, StagePlan
from . import candidates

ALGOS: tuple[str, ...] = ("heu", "opt", "none", "full", "selective", "uniform", "block", "checkmate", "adapipe")
# Algorithms that offload (solvers/offload.py): named on request, not in the default lists of compare and bench.
OFFLOAD_ALGOS: tuple[str, ...] = ("heu-offload", "opt-offload", "offload", "full-offload")
ALL_ALGOS: tuple[str, ...] = ALGOS + OFFLOAD_ALGOS
_MODULES = {"heu-offload": "offload", "opt-offload": "opt", "offload": "offload", "full-offload": "offload",
            "none": "megatron", "full": "megatron", "selective": "megatron", "uniform": "megatron",
            "block": "megatron", "checkmate": "checkmate", "heu": "heu", "opt": "opt", "adapipe": "adapipe"}
DEFAULT_PARTITION = {"heu": "auto", "opt": "auto", "adapipe": "auto", "heu-offload": "auto", "opt-offload": "auto"}


class Infeasible(InputError):
    """No plan of this algorithm fits the memory limit; `needed` is the least peak it can reach, if known."""

    def __init__(self, message: str, needed: int | None = None):
        super().__init__(message)
        self.needed = needed


@dataclass(frozen=True)
class Problem:
    profile: Profile
    memory_limit: int
    time_limit: float | None = None  # seconds, for MILP solvers
    partition: str = "even"  # "even" (Megatron) or "auto" (recomputation-aware)
    compiled: bool = False  # for torch.compile: every recomputation on demand (HEU searches only those)
    offload_modules: tuple[str, ...] | None = None  # `offload`: Megatron's --offload-modules (None: its docs' advice)


@dataclass
class Strategy:
    bounds: list[int]  # stage s holds layers bounds[s] .. bounds[s+1]-1
    policies: list[LayerPolicy]  # one per layer
    status: str = "heuristic"
    gap: float | None = None
    bound_s: float | None = None
    source: str | None = None  # which search's plan this is ('milp', 'heu'), where an algorithm has several
    evaluation: Evaluation | None = None  # the search's own simulation of this plan (ideal=False), if it has one


@dataclass
class Solved:
    stages: list[StagePlan]
    solver: SolverInfo
    evaluation: Evaluation


def _module(algo: str):
    if algo not in ALL_ALGOS:
        raise InputError(f"--algo: unknown algorithm {algo!r} (expected one of {', '.join(ALL_ALGOS)})")
    return importlib.import_module(f".{_MODULES[algo]}", __name__)


def solve(profile: Profile, algo: str, memory_limit: int, time_limit: float | None = None,
          partition: str | None = None, compiled: bool = False, offload_modules: tuple[str, ...] | None = None
          ) -> Solved:
    """Search a strategy, then simulate it. Raises Infeasible when the algorithm cannot meet the limit. `compiled`:
    for torch.compile, whose selective-checkpoint regions recompute inside the layer's fused backward: every placement
    becomes on_demand and is simulated so (HEU searches on-demand placements only)."""
    part = partition or DEFAULT_PARTITION.get(algo, "even")
    if part not in ("even", "auto"):
        raise InputError(f"--partition: {part!r} is not 'even' or 'auto'")
    problem = Problem(profile, memory_limit, time_limit, part, compiled, offload_modules)
    module = _module(algo)  # imported before the clock starts: search time is the search alone
    t0 = time.perf_counter()
    limit_s = time_limit if time_limit is not None else getattr(module, "DEFAULT_TIME_LIMIT_S", None)
    # a MILP solver's time limit bounds its whole search, the block candidates it builds first included
    with candidates.served() as used, candidates.time_limit(None if limit_s is None else t0 + limit_s):
        strategy = module.search(problem, algo)
    search_s = time.perf_counter() - t0
    if compiled:
        strategy = _on_demand(strategy, algo)
    bound = _bound(used)
    if bound is not None:  # a MILP's bound and optimum over a subset of the policies prove nothing about the rest
        strategy.gap = strategy.bound_s = None
        strategy.status = "feasible" if strategy.status == "optimal" else strategy.status
    stages = stage_plans(profile, strategy.bounds, strategy.policies)
    # the simulator is deterministic: a search's own simulation of the same stages is what a fresh one would give
    ev = evaluate(profile, stages) if strategy.evaluation is None else \
        with_ideal(profile, strategy.evaluation, strategy.bounds)
    if not ev.fits(memory_limit):
        worst = max(ev.predicted.stages, key=lambda s: s.peak_memory_bytes)
        raise Infeasible(
            f"algorithm {algo!r} needs {format_bytes(worst.peak_memory_bytes)} on stage {worst.stage}, more than the "
            f"memory limit of {format_bytes(memory_limit)}", needed=worst.peak_memory_bytes)
    info = SolverInfo(name=algo, status=strategy.status, search_time_s=round(search_s, 6), gap=strategy.gap,
                      bound_s=strategy.bound_s, source=strategy.source, candidates=bound)
    return Solved(stages, info, ev)


def _on_demand(strategy: Strategy, algo: str) -> Strategy:
    """The strategy with every recomputation on demand, re-simulated (an early placement's regenerated tensors are
    held longer than on demand's: the plan still fits)."""
    if any(p.recompute_with is not None for p in strategy.policies):
        raise InputError(f"--compile: {algo!r} recomputes Megatron's uniform chunks, which do not run under "
                         "torch.compile; choose another algorithm")
    if all(p.at == "on_demand" for p in strategy.policies):
        return strategy
    strategy.policies = [p.model_copy(update={"at": "on_demand"}) for p in strategy.policies]
    strategy.evaluation = None
    return strategy


def _bound(used: dict) -> CandidateBound | None:
    """How the candidates a search used differ from the exact Pareto sets (None: they did not)."""
    inexact = {name: f for name, f in sorted(used.items()) if not f.exact}
    if not inexact:
        return None
    return CandidateBound(blocks=list(inexact), groups=sum(f.groups for f in inexact.values()),
                          eps=max(f.eps for f in inexact.values()))


def plan(profile: Profile, profile_path: str, profile_sha256: str, algo: str, memory_limit: int,
         time_limit: float | None = None, partition: str | None = None, compiled: bool = False,
         offload_modules: tuple[str, ...] | None = None) -> Plan:
    compiled = compiled or profile.compiled  # a profile of compiled blocks is planned for compiled training
    solved = solve(profile, algo, memory_limit, time_limit, partition, compiled, offload_modules)
    made = make_plan(profile, profile_path, profile_sha256, algo, memory_limit, solved.stages, solved.solver,
                     solved.evaluation)
    return made.model_copy(update={"compiled": True}) if compiled else made
