"""`lynx export`: print the launch settings that reproduce a checked plan's layout and (the nearest) recomputation
in Megatron-LM or torchtitan (logic in lynx_planner/export.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from ..io import InputError, file_sha256, format_bytes
from .choices import Framework
from .options import load_plan, load_profile, plan_profile_path
from .tables import gib


def run(plan_path: Path, to: Framework, profile: Path | None) -> None:
    from .. import export
    from ..evaluate import verify

    plan = load_plan(plan_path)
    prof_path = plan_profile_path(plan, plan_path, profile)
    prof = load_profile(prof_path)
    if file_sha256(prof_path) != plan.profile_sha256:
        raise InputError(f"{plan_path}: field profile_sha256: {prof_path} is not the profile the plan was made for "
                         "(it changed since); re-run `lynx plan`, or pass the right --profile")
    problems = verify(plan, prof).problems  # what `lynx check` rejects is not exported
    if problems:
        raise InputError(f"{plan_path}: `lynx check` rejects this plan, not exporting it: "
                         + "\n".join(problems[:5]) + ("\n..." if len(problems) > 5 else ""))
    if to is Framework.torchtitan:
        args, notes = export.torchtitan_args(plan, prof, str(prof_path))
        typer.echo(f"# {plan_path} ({plan.algo}) for {export.TORCHTITAN_VERSION}: arguments of torchtitan's train "
                   "(python -m torchtitan.train ...)")
        typer.echo(" \\\n".join(shlex.join(line) for line in args))
        for note in notes:
            typer.echo(f"# {note}")
        typer.echo(export.TORCHTITAN_HOOK.format(module=args[0][1], config=args[1][1], plan=plan_path.name))
        return
    if to is Framework("torchtitan-0.2"):
        typer.echo(f"# {plan_path} ({plan.algo}) for {export.TORCHTITAN_02_VERSION}: job config (TOML)")
        typer.echo(export.toml(export.torchtitan(plan, prof)))
        typer.echo(export.TORCHTITAN_APPLY)
        return
    got = export.megatron(plan, prof, str(prof_path))
    typer.echo(f"# {plan_path} ({plan.algo}, {plan.predicted.iteration_time_s:.4f} s) for {export.MEGATRON_VERSION}")
    typer.echo(" \\\n".join(got.flags + (got.recompute.flags if got.recompute else [])))
    typer.echo("")
    if got.recompute is None:
        typer.echo(f"# no Megatron recomputation fits the plan's limit of {format_bytes(plan.memory_limit_bytes)}")
    else:
        rc = got.recompute
        typer.echo(f"# nearest Megatron recomputation within {format_bytes(plan.memory_limit_bytes)}: {rc.name}, "
                   f"predicted {rc.iteration_time_s:.4f} s ({rc.iteration_time_s / got.plan_time_s:.3f}x the plan's "
                   f"{got.plan_time_s:.4f} s), peak {format_bytes(rc.peak_memory_bytes)}")
    for note in got.not_expressible:
        typer.echo(f"# not expressible in Megatron: {note}")
    typer.echo("# Megatron's choices on this split: " + "; ".join(
        f"{c.name} {c.iteration_time_s:.4f} s {gib(c.peak_memory_bytes)} GiB{'' if c.fits else ' (over)'}"
        for c in got.choices))
