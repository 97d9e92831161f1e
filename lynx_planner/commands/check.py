"""`lynx check`: verify a plan against its profile and a fresh simulation; exit 1 with the problems, else print the
simulated figures."""

from __future__ import annotations

from pathlib import Path

import typer

from ..io import file_sha256, format_bytes
from .options import load_plan, load_profile, plan_profile_path
from .terminal import out


def run(plan_path: Path, profile: Path | None) -> None:
    from ..evaluate import TIME_RTOL, Verdict, verify

    plan = load_plan(plan_path)
    prof_path = plan_profile_path(plan, plan_path, profile)
    prof = load_profile(prof_path)
    sha = file_sha256(prof_path)
    if sha != plan.profile_sha256:
        out.print(f"{plan_path}: profile_sha256 {plan.profile_sha256[:12]}... does not match {prof_path} "
                  f"({sha[:12]}...): the profile changed since the plan was made; re-run `lynx plan`")
        raise typer.Exit(1)
    try:
        verdict = verify(plan, prof)
    except (KeyError, IndexError, ValueError) as e:  # a plan too broken for the checks themselves
        verdict = Verdict([f"the plan does not fit the profile ({type(e).__name__}: {e})"], None)
    if verdict.problems:
        for p in verdict.problems:
            out.print(f"{plan_path}: {p}")
        raise typer.Exit(1)
    sim = verdict.evaluation.predicted  # what is printed is simulated here, never read from the plan
    out.print(f"ok: {plan_path} ({plan.algo}) is valid for {prof_path}: simulated peak "
              f"{format_bytes(verdict.evaluation.peak_bytes)} <= limit {format_bytes(plan.memory_limit_bytes)}, "
              f"iteration time {sim.iteration_time_s:.4f} s (ideal on this split {sim.ideal_iteration_time_s:.4f} s); every "
              f"predicted figure within {TIME_RTOL:g} (relative) of the simulation, bytes exact")
