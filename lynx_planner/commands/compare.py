"""`lynx compare`: run several algorithms on one profile under one memory limit; print time, speedup over full
recomputation, memory and search time as a table or JSON, optionally a picture."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from ..io import InputError, dumps_json, format_bytes, raise_if_interrupted
from ..schema import Profile
from .options import algos as algo_names
from .options import check_output, device_limit, load_profile, seconds, size
from .tables import in_unit, ms, table, unit
from .terminal import err, out
from .terminal import progress as progress_bar


def compare_rows(profile: Profile, algos: list[str], limit: int, time_limit: float | None,
                 progress: bool = True) -> list[dict]:
    """One row per algorithm: the contract's keys plus `available`, `peak_per_stage` and `note`."""
    from ..solvers import Infeasible, solve

    rows: list[dict] = []
    with progress_bar(disable=not progress) as bar:
        task = bar.add_task("solving", total=len(algos))
        for algo in algos:
            bar.update(task, description=f"solving {algo}")
            row: dict[str, Any] = {"algo": algo, "iteration_time_s": None, "speedup_vs_full": None,
                                   "peak_memory_bytes": None, "fits": False, "search_time_s": None,
                                   "available": True, "peak_per_stage": None, "note": ""}
            t0 = time.perf_counter()
            try:
                solved = solve(profile, algo, limit, time_limit)
                raise_if_interrupted()
            except ModuleNotFoundError as e:
                row.update(available=False, note=f"not available ({e.name or e})")
            except Infeasible as e:
                row.update(peak_memory_bytes=e.needed, search_time_s=round(time.perf_counter() - t0, 6),
                           note=str(e))
            else:
                ev = solved.evaluation
                row.update(iteration_time_s=ev.predicted.iteration_time_s, peak_memory_bytes=ev.peak_bytes,
                           fits=ev.fits(limit), search_time_s=solved.solver.search_time_s,
                           peak_per_stage=[s.peak_memory_bytes for s in ev.predicted.stages])
            rows.append(row)
            bar.advance(task)
    full = next((r["iteration_time_s"] for r in rows if r["algo"] == "full"), None)
    if full is None and "full" not in algos:
        try:
            full = solve(profile, "full", limit).evaluation.predicted.iteration_time_s
        except Exception:
            full = None
    for r in rows:
        if full is not None and r["iteration_time_s"]:
            r["speedup_vs_full"] = full / r["iteration_time_s"]
    return rows


def run(profile_path: Path, memory_limit: str | None, algos: str | None, time_limit: float | None, as_json: bool,
        verbose: bool, plot: Path | None) -> None:
    if plot is not None:
        check_output(plot, "--plot")
    names = algo_names(algos)
    time_limit = seconds(time_limit)
    profile = load_profile(profile_path)
    limit = device_limit(size(memory_limit, "--memory-limit"), profile.hardware, f" in {profile_path}")
    rows = compare_rows(profile, names, limit, time_limit, progress=True)
    for r in rows:
        if not r["available"]:
            err.print(f"note: {r['algo']}: {r['note']}")
    if as_json:
        keys = ("algo", "iteration_time_s", "speedup_vs_full", "peak_memory_bytes", "fits", "search_time_s")
        typer.echo(dumps_json([{k: r[k] for k in keys} for r in rows], "--json", indent=1), nl=False)
    else:
        print_table(profile_path, profile, limit, rows, verbose)
    if plot is not None:
        from ..plot import time_memory

        par = profile.parallel
        time_memory([{**r, "label": r["algo"], "iteration_time_s": r["iteration_time_s"] if r["fits"] else None}
                     for r in rows if r.get("available", True)], limit,
                    f"{profile.model.name} on {profile.hardware.name}, tp {par.tp} pp {par.pp}, "
                    f"{par.num_microbatches} micro-batches: limit {format_bytes(limit)}", plot)
        if not as_json:
            out.print(f"wrote {plot}")
    fail_if_nothing_fits(rows, limit)


def fail_if_nothing_fits(rows: list[dict], limit: int) -> None:
    """A memory limit that no strategy meets is bad input (exit 2), after the results are shown."""
    ran = [r for r in rows if r["available"]]
    if ran and not any(r["fits"] for r in ran):
        least = min((r for r in ran if r["peak_memory_bytes"]), key=lambda r: r["peak_memory_bytes"], default=None)
        need = f"; the least needed is {format_bytes(least['peak_memory_bytes'])} ({least['algo']})" if least else ""
        raise InputError(f"--memory-limit: no algorithm fits in {format_bytes(limit)}{need}")


def print_table(profile_path: Path, profile: Profile, limit: int, rows: list[dict], verbose: bool = False) -> None:
    """Time, speedup, memory and fit columns always; each stage's peak only with --verbose, as a folding column."""
    unit_name, unit_size = unit([r.get("peak_memory_bytes") for r in rows])
    shown = table(f"{profile_path}: memory limit {format_bytes(limit)}, pp {profile.parallel.pp}",
                  (("algo", "left"), ("iteration s", "right"), ("vs full", "right"), (f"peak {unit_name}", "right"),
                   ("fits", "left"), ("search", "right")))
    if verbose:
        shown.add_column(f"peak {unit_name} per stage", justify="left", overflow="fold", ratio=1)
    for r in rows:
        if not r["available"]:
            shown.add_row(r["algo"], "-", "-", "-", "n/a", "-", *([""] if verbose else []))
            continue
        if r["peak_per_stage"]:
            peak = in_unit(r["peak_memory_bytes"], unit_size)
            stages = " ".join(in_unit(p, unit_size) for p in r["peak_per_stage"])
        else:
            peak = f"needs {in_unit(r['peak_memory_bytes'], unit_size)}" if r["peak_memory_bytes"] else "-"
            stages = ""
        shown.add_row(r["algo"], f"{r['iteration_time_s']:.4f}" if r["iteration_time_s"] else "-",
                      f"{r['speedup_vs_full']:.3f}x" if r["speedup_vs_full"] else "-", peak,
                      "yes" if r["fits"] else "[red]no[/red]",
                      ms(r["search_time_s"]) if r["search_time_s"] is not None else "-",
                      *([stages] if verbose else []))
    out.print(shown)
