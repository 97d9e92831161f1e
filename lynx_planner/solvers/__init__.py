"""Strategy search: one module per algorithm, one entry point (`solve`) that times the search and judges the result
with the simulator.

Each algorithm module exposes `search(problem, algo) -> Strategy`.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

from ..evaluate import Evaluation, evaluate, make_plan, stage_plans
from ..io import InputError, format_bytes
from ..schema import LayerPolicy, Plan, Profile, SolverInfo, StagePlan

ALGOS: tuple[str, ...] = ("heu", "opt", "none", "full", "selective", "uniform", "block", "checkmate", "adapipe")
_MODULES = {"none": "megatron", "full": "megatron", "selective": "megatron", "uniform": "megatron",
            "block": "megatron", "checkmate": "checkmate", "heu": "heu", "opt": "opt", "adapipe": "adapipe"}
DEFAULT_PARTITION = {"heu": "auto", "opt": "auto", "adapipe": "auto"}


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


@dataclass
class Strategy:
    bounds: list[int]  # stage s holds layers bounds[s] .. bounds[s+1]-1
    policies: list[LayerPolicy]  # one per layer
    status: str = "heuristic"
    gap: float | None = None
    bound_s: float | None = None
    source: str | None = None  # which search's plan this is ('milp', 'heu'), where an algorithm has several


@dataclass
class Solved:
    stages: list[StagePlan]
    solver: SolverInfo
    evaluation: Evaluation


def _module(algo: str):
    if algo not in ALGOS:
        raise InputError(f"--algo: unknown algorithm {algo!r} (expected one of {', '.join(ALGOS)})")
    return importlib.import_module(f".{_MODULES[algo]}", __name__)


def solve(profile: Profile, algo: str, memory_limit: int, time_limit: float | None = None,
          partition: str | None = None) -> Solved:
    """Search a strategy, then simulate it. Raises Infeasible when the algorithm cannot meet the limit."""
    part = partition or DEFAULT_PARTITION.get(algo, "even")
    if part not in ("even", "auto"):
        raise InputError(f"--partition: {part!r} is not 'even' or 'auto'")
    problem = Problem(profile, memory_limit, time_limit, part)
    module = _module(algo)  # imported before the clock starts: search time is the search alone
    t0 = time.perf_counter()
    strategy = module.search(problem, algo)
    search_s = time.perf_counter() - t0
    stages = stage_plans(profile, strategy.bounds, strategy.policies)
    ev = evaluate(profile, stages)
    if not ev.fits(memory_limit):
        worst = max(ev.predicted.stages, key=lambda s: s.peak_memory_bytes)
        raise Infeasible(
            f"algorithm {algo!r} needs {format_bytes(worst.peak_memory_bytes)} on stage {worst.stage}, more than the "
            f"memory limit of {format_bytes(memory_limit)}", needed=worst.peak_memory_bytes)
    info = SolverInfo(name=algo, status=strategy.status, search_time_s=round(search_s, 6), gap=strategy.gap,
                      bound_s=strategy.bound_s, source=strategy.source)
    return Solved(stages, info, ev)


def plan(profile: Profile, profile_path: str, profile_sha256: str, algo: str, memory_limit: int,
         time_limit: float | None = None, partition: str | None = None) -> Plan:
    solved = solve(profile, algo, memory_limit, time_limit, partition)
    return make_plan(profile, profile_path, profile_sha256, algo, memory_limit, solved.stages, solved.solver,
                     solved.evaluation)
