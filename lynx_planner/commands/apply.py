"""`lynx apply --dry-run`: run a model file's forward and backward with a plan applied, and print which ops each
layer keeps and recomputes (op ids wrapped whole at the terminal's width), or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..io import InputError
from .options import load_plan
from .terminal import out, width
from .user_code import call_model_file


def run(plan_path: Path, model_path: Path, dry_run: bool, as_json: bool, compiled: bool = False,
        backend: str = "inductor") -> None:
    if not dry_run:
        raise InputError("lynx apply needs --dry-run: plans are applied inside the training script, with "
                         "`module = lynx_planner.apply_plan(module, 'plan.json', stage=STAGE)`")
    if not model_path.is_file():
        raise InputError(f"{model_path}: no such model file")
    load_plan(plan_path)  # a clear error for a bad plan before running user code
    compile = backend if compiled else None
    try:
        from ..runtime import dry_run as _dry_run
    except ImportError as e:
        raise InputError(f"the runtime (lynx_planner.runtime) is not available in this installation ({e})") from None
    extra = {"compile": compile} if compile else {}  # the eager call as before
    rows = call_model_file(model_path, "dry run", _dry_run, str(plan_path), str(model_path), **extra)
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    out.print(f"{plan_path} on {model_path}")
    for line in dry_run_lines(rows, width()):
        out.print(line, markup=False)
    plan = load_plan(plan_path)
    precision = (f"fp32 weights under {plan.autocast} autocast" if plan.autocast else
                 f"{plan.dtype} weights" if plan.dtype else "the weights as built")
    how = f", compiled ({compile}): planned layers as selective-checkpoint regions" if compile else ""
    out.print(f"ok: a training forward and backward of {model_path} ran with every stage of the plan applied "
              f"({precision}{how})")


def dry_run_lines(rows: list[dict], width: int) -> list[str]:
    """One heading per layer, then its kept and recomputed op ids wrapped at spaces so that no id is cut."""
    import textwrap

    lines = []
    for r in rows:
        when = r.get("when", r.get("at", ""))
        lines.append(f"stage {r['stage']}  layer {r['layer']}  {r['module']}  {r['mode']}  at {when}")
        for key in ("keep", "recompute", "offload"):
            if r.get(key):
                lines += textwrap.wrap(", ".join(r[key]), width=width, initial_indent=f"  {key}: ",
                                       subsequent_indent=" " * (len(key) + 4), break_long_words=False,
                                       break_on_hyphens=False)
    return lines
