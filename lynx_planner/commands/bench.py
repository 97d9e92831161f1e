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
        time_limit: float | None) -> None:
    from .. import bench

    # CI logs: no squashing (a width the user sets with COLUMNS is kept)
    wide = out if out.is_terminal or os.environ.get("COLUMNS") else Console(highlight=False, soft_wrap=True, width=200)
    code = bench.main(suite, baseline=baseline, check=check, update=update, algos=algo_names(algos), out_dir=out_dir,
                      time_limit=seconds(time_limit), console=wide)
    raise typer.Exit(code)
