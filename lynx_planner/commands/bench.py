"""`lynx bench`: run the quality and search-time suite (logic in lynx_planner/bench.py) and exit with its verdict."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console

from .options import algos as algo_names
from .options import seconds
from .terminal import out


def run(suite: Path, baseline: Path | None, check: bool, update: bool, algos: str | None, out_dir: Path,
        time_limit: float | None, audit_suite: bool = False, audit_cases: str = "full") -> None:
    from .. import bench

    if audit_suite:
        audit(check, update, algos, out_dir, time_limit, audit_cases)

    # CI logs: no squashing (a width the user sets with COLUMNS is kept)
    wide = out if out.is_terminal or os.environ.get("COLUMNS") else Console(highlight=False, soft_wrap=True, width=200)
    code = bench.main(suite, baseline=baseline, check=check, update=update, algos=algo_names(algos), out_dir=out_dir,
                      time_limit=seconds(time_limit), console=wide)
    raise typer.Exit(code)


def audit(check: bool, update: bool, algos: str | None, out_dir: Path, time_limit: float | None, cases: str) -> None:
    """`lynx bench --audit`: the independent search against HEU and OPT (lynx_planner/audit.py); exit 1 if it beats
    one by more than its tolerance."""
    from .. import audit as auditing
    from ..io import InputError

    if check or update:
        raise InputError("--audit: runs its own generated suite; it does not combine with --check or --update")
    if cases not in ("full", "ci"):
        raise InputError(f"--audit-cases: {cases!r} is not 'full' or 'ci'")
    names = auditing.ALGOS if algos is None else tuple(algo_names(algos))
    if not names or any(a not in auditing.ALGOS for a in names):
        raise InputError(f"--algos: --audit runs {' and '.join(auditing.ALGOS)} only, not {', '.join(names)}")
    limit = seconds(time_limit)
    code = auditing.main(cases, names, str(out_dir / "audit.json"), out,
                         auditing.OPT_TIME_LIMIT_S if limit is None else limit)
    raise typer.Exit(code)
