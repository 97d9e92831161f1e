"""`lynx validate`: run plans for real (logic in lynx_planner/validate.py) and print predicted vs measured."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..io import InputError
from .options import load_plan
from .options import threads as check_threads
from .terminal import err, out
from .user_code import call_model_file


def run(plan_path: Path, model_path: Path, repeats: int, warmup: int, threads: int | None, also: list[Path] | None,
        as_json: bool) -> None:
    from .. import validate

    if not model_path.is_file():
        raise InputError(f"{model_path}: no such model file")
    check_threads(threads)
    paths = [plan_path, *(also or [])]
    for p in paths:
        load_plan(p)
    with err.status("validate: starting") as status:  # a spinner on a terminal, nothing in a pipe
        runs = call_model_file(model_path, "validation", validate.run, [str(p) for p in paths], str(model_path),
                               repeats=repeats, warmup=warmup, threads=threads,
                               progress=lambda message: status.update(f"validate: {message}"))
    summaries = [validate.summary(r) for r in runs]
    if as_json:
        typer.echo(json.dumps(summaries, indent=1))
    else:
        out.print(validate.table(summaries), markup=False)
