"""Shared fixtures: small analytic profiles that solve in well under a second."""

from __future__ import annotations

import pytest

from lynx_planner.analytic import gpt_profile
from lynx_planner.models.catalog import GPTConfig
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import ParallelConfig, Profile

TINY = GPTConfig("gpt-tiny", num_layers=8, hidden=1024, heads=16, vocab=8192)


def small_profile(tp: int = 2, pp: int = 2, mb: int = 1, m: int = 4, hardware: str = "a100-80g-pcie",
                  layers: int = 8, seq: int = 1024, attention: str = "flash", dropout: float = 0.1,
                  sp: bool = False) -> Profile:
    cfg = GPTConfig("gpt-tiny", num_layers=layers, hidden=1024, heads=16, vocab=8192)
    par = ParallelConfig(tp=tp, pp=pp, micro_batch_size=mb, seq_len=seq, num_microbatches=m, sequence_parallel=sp)
    return gpt_profile(cfg, par, HARDWARE[hardware], attention=attention, dropout=dropout)


def peak(profile: Profile, algo: str) -> int:
    """The peak memory of an algorithm's plan with no memory limit."""
    from lynx_planner import solvers

    return solvers.solve(profile, algo, 1 << 50).evaluation.peak_bytes


def between(profile: Profile, frac: float) -> int:
    """A limit `frac` of the way from full recomputation's peak to no recomputation's."""
    lo, hi = peak(profile, "full"), peak(profile, "none")
    return int(lo + frac * (hi - lo))


def solve_all(profile: Profile, limit: int, algos=None, time_limit: float = 30,
              gaps: dict | None = None) -> dict[str, float]:
    """Iteration time of every algorithm that fits (all of them by default); each plan must pass `lynx check`.
    `gaps`, if given, receives each algorithm's reported solver gap."""
    from lynx_planner import solvers
    from lynx_planner.evaluate import check, make_plan

    out = {}
    for algo in algos or solvers.ALGOS:
        try:
            s = solvers.solve(profile, algo, limit, time_limit=time_limit)
        except solvers.Infeasible:
            continue
        plan = make_plan(profile, "p.json", "0" * 64, algo, limit, s.stages, s.solver, s.evaluation)
        assert check(plan, profile) == [], algo
        out[algo] = s.evaluation.predicted.iteration_time_s
        if gaps is not None:
            gaps[algo] = s.solver.gap
    return out


def lynx(*args):
    """Run the `lynx` command in-process (typer's CliRunner); a traceback in its output is always a bug."""
    from typer.testing import CliRunner

    from lynx_planner.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture
def profile() -> Profile:
    return small_profile()
