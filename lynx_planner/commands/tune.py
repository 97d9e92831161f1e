"""`lynx tune`: search parallel layouts and recomputation together (logic in lynx_planner/tune.py), print the best
configurations (or, without --gpus, the fewest GPUs that fit), and write the best one's profile and plan."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import typer

from ..io import InputError, format_bytes, make_directory
from ..models.hardware import default_memory_limit
from ..schema import Hardware
from .options import check_output, device_limit, size
from .options import hardware as find_hardware
from .tables import gib, table
from .terminal import err, out, progress_bar
from .user_code import call_model_file


def run(model: str, global_batch: int, hardware: str, gpus: str | None, seq_len: int, memory_limit: str | None,
        time_limit: float | None, top: int, ep: int | None, distributed_optimizer: bool, as_json: bool,
        out_dir: Path | None, plot: Path | None, schedule: str, virtual_stages: int | None,
        fsdp: bool = False, reshard_after_forward: bool = True, hsdp_shard_size: int | None = None,
        cp: int | None = None, kernels=None, fp8: bool = False) -> None:
    from .. import schedules as schedule_names
    from .. import tune
    from .profile import resolve_distributed_optimizer

    search = tune.ParallelSearch(fsdp, reshard_after_forward, hsdp_shard_size, cp)
    distributed_optimizer = resolve_distributed_optimizer(distributed_optimizer, search.fsdp)
    if not search.fsdp and (search.hsdp_shard_size is not None or not search.reshard_after_forward):
        raise InputError("--hsdp-shard-size and --no-reshard-after-forward need --fsdp")

    names = schedule_names.NAMES if schedule.strip() == "all" else tuple(s.strip() for s in schedule.split(",")
                                                                         if s.strip())
    unknown = [s for s in names if s not in schedule_names.NAMES]
    if unknown or not names:
        raise InputError(f"--schedule: unknown schedule {unknown[0] if unknown else schedule!r} (expected 'all' or "
                         f"some of {', '.join(schedule_names.NAMES)})")

    from ..build import is_model_file

    if (kernels is not None or fp8) and is_model_file(model):
        raise InputError(f"{'--kernels' if kernels is not None else '--fp8'}: a model file is profiled as it runs; "
                         "kernels are chosen for catalog models and config.json files")
    kinds = [find_hardware(h.strip()) for h in hardware.split(",") if h.strip()]
    if not kinds:
        raise InputError("--hardware: empty list")
    counts = tune.gpu_counts(gpus) if gpus is not None else None
    one = len(kinds) == 1 and counts is not None and len(counts) == 1
    if out_dir is not None and not one:
        raise InputError("--out: needs one --hardware and one --gpus count (it writes that configuration's files)")
    if out_dir is not None:
        check_out_dir(out_dir)
    if plot is not None:
        if not one:
            raise InputError("--plot: needs one --hardware and one --gpus count (it draws that search's "
                             "configurations)")
        check_output(plot, "--plot")
    limit = size(memory_limit, "--memory-limit")
    for hw in kinds:
        device_limit(limit, hw)
    if counts is None:
        if names != ("1f1b",) or virtual_stages is not None:
            raise InputError("--schedule/--virtual-stages: need --gpus (sizing up searches 1F1B layouts)")
        if kernels is not None or fp8:
            raise InputError("--kernels/--fp8: need --gpus (sizing up prices the default kernels)")
        return size_up(model, kinds, global_batch, seq_len, limit, time_limit, distributed_optimizer, as_json,
                       search)
    json_rows = []
    choices: list = []
    for hw, gpus_n in ((hw, n) for hw in kinds for n in counts):
        profiles = tune.Profiles(model, hw, seq_len, distributed_optimizer, search=search,
                                 call=lambda fn, *a, **k: call_model_file(Path(model), "profiling", fn, *a, **k),
                                 kernels=kernels.value if kernels else "hf", fp8=fp8)
        bar, report = progress_bar(f"{hw.name} x {gpus_n}:" if len(counts) > 1 else f"{hw.name}:")
        try:
            with bar:
                result = tune.tune(model, gpus_n, hw, global_batch, seq_len, limit, time_limit, top,
                                   distributed_optimizer, profiles, progress=report, make_plan=out_dir is not None
                                   or not as_json, names=names, virtual=virtual_stages, ep=ep)
        except InputError as e:
            if one:
                raise
            err.print(f"note: {gpus_n} x {hw.name}: {e}")  # another type or count may still do
            continue
        gpus = gpus_n
        if result.top:
            choices.append(tune.Choice(hw.name, gpus, result.top[0], limit or default_memory_limit(hw)))
        if as_json:
            json_rows += [{"hardware": hw.name, "gpus": gpus, **r.json()} for r in result.rows]
        else:
            print_tune(model, gpus, hw, global_batch, seq_len, limit or default_memory_limit(hw), result)
        if result.time_limit_hit:
            left = result.enumerated - result.planned - result.megatron_only - result.too_big - result.pruned
            what = (f"{left} of {result.enumerated} layouts were not planned" if left else
                    "HEU with offload was not tried on every layout that could enter the table")
            err.print(f"note: --time-limit {time_limit:g} s reached: {what}; the table covers those reached")
        if not result.top and result.time_limit_hit and one:
            raise InputError(f"--time-limit: {time_limit:g} s ran out before any layout of {model} on {gpus} x "
                             f"{hw.name} was planned")
        if not result.top and one:
            raise InputError(f"--memory-limit: no layout of {model} on {gpus} x {hw.name} fits in "
                             f"{format_bytes(limit or default_memory_limit(hw))}, even with full recomputation")
        if out_dir is not None:
            if result.best_plan is None:
                raise InputError(f"--out: HEU found no plan for the best layout {result.top[0].layout.label()}")
            make_directory(out_dir, "--out")
            check_out_dir(out_dir)
            written = tune.write_outputs(result, out_dir)
            if not as_json:
                out.print(f"wrote {written[0]} and {written[1]} ({result.top[0].layout.label()}; check with "
                          f"`lynx check {written[1]}`)")
        if plot is not None:
            from ..plot import time_memory

            labelled = {id(r) for r in result.top[:5]}
            points = [{"algo": r.algo, "peak_memory_bytes": r.peak_memory_bytes,
                       "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
                       "label": r.layout.label() if id(r) in labelled else ""} for r in result.rows if r.fits]
            time_memory(points, limit or default_memory_limit(hw), f"{model} on {gpus} x {hw.name}, global batch "
                        f"{global_batch}", plot, y="tokens_per_s_per_gpu")
            if not as_json:
                out.print(f"wrote {plot}")
    if as_json:
        typer.echo(json.dumps(json_rows, indent=1))
    if one:
        return
    answer = tune.verdicts(choices)
    if answer is None:
        raise InputError(f"--memory-limit: no layout of {model} fits on any of the GPU types and counts searched, "
                         "even with full recomputation")
    if not as_json:
        print_verdicts(*answer)


def print_verdicts(fastest, cheapest) -> None:
    """The answer across GPU types and counts: the fastest layout and the one with the fewest GPU-hours."""
    def line(c) -> str:
        r = c.row
        return (f"{c.gpus} x {c.hardware}, {r.layout.label()} {r.algo}: {r.iteration_time_s:.3f} s/iteration, "
                f"{c.gpu_hours:.4g} GPU-hours/iteration ({r.tokens_per_s_per_gpu * 3600:.4g} tokens/GPU-hour), "
                f"peak {format_bytes(r.peak_memory_bytes)}, headroom {format_bytes(c.headroom_bytes)}")
    out.print(f"fastest: {line(fastest)}")
    out.print(f"fewest GPU-hours: {line(cheapest)}")
    out.print("(GPU-hours, not prices: weigh each type's hourly price; headroom: the memory limit less the peak)")


def check_out_dir(out_dir: Path) -> None:
    """--out: a directory where profile.json and plan.json can both be written, or one that can be made; checked
    before the search, so a bad target costs nothing, and made only when the results are written (a failed or
    interrupted search leaves nothing behind)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: --out is a file, expected a directory")
    if not out_dir.is_dir():
        parent = next(p for p in out_dir.absolute().parents if p.exists())
        try:  # can it be made? (a directory made and removed at once)
            os.rmdir(tempfile.mkdtemp(prefix=".lynx-", dir=parent))
        except OSError as e:
            raise InputError(f"{out_dir}: --out: cannot create the directory in {parent}: {e.strerror}") from None
        return
    for name in ("profile.json", "plan.json"):
        check_output(out_dir / name, "--out")


def layout_cells(lay) -> list[str]:
    v = f" v{lay.virtual_stages}" if lay.virtual_stages > 1 else ""
    pp = f"{lay.pp}" if lay.schedule == "1f1b" else f"{lay.pp}({lay.schedule}{v})"
    cp = f" cp{lay.cp}" if getattr(lay, "cp", 1) > 1 else ""
    shard = (f" hsdp{lay.hsdp_shard_size}" if lay.hsdp_shard_size else " fsdp") if getattr(lay, "fsdp", False) else ""
    return [f"{lay.tp}x{pp}x{lay.dp}" + (f" ep{lay.ep}" if lay.ep > 1 else "") + cp + shard,
            f"{lay.micro_batch_size}x{lay.num_microbatches}",
            "y" if lay.sequence_parallel else "-"]


def tune_table(title: str, result, best_meg):
    shown = table(title, (("#", "right"), ("tp×pp×dp", "left"), ("mb×M", "left"), ("sp", "left"), ("algo", "left"),
                          ("tok/s/GPU", "right"), ("iter s", "right"), ("GiB", "right"), ("fits", "left"),
                          ("speedup", "right")), collapse_padding=True)
    shown.columns[0].min_width = 2
    base = best_meg.tokens_per_s_per_gpu if best_meg else None
    for i, r in enumerate(result.top, 1):
        rate = r.tokens_per_s_per_gpu
        shown.add_row(str(i), *layout_cells(r.layout), r.algo, f"{rate:.1f}" if rate < 1e6 else f"{rate:.3g}",
                      f"{r.iteration_time_s:.3f}" if r.iteration_time_s >= 0.01 else f"{r.iteration_time_s:.2e}",
                      gib(r.peak_memory_bytes), "yes" if r.fits else "[red]no[/red]",
                      f"{r.tokens_per_s_per_gpu / base:.3f}x" if base else "-")
    return shown


def print_tune(model: str, gpus: int, hw: Hardware, global_batch: int, seq_len: int, limit: int, result) -> None:
    title = (f"{model} on {gpus} x {hw.name}, global batch {global_batch} x {seq_len} tokens, "
             f"limit {format_bytes(limit)}")
    out.print(tune_table(title, result, result.best_megatron))
    meg = result.best_megatron
    if meg is not None:
        out.print(f"speedup: over the best Megatron-style configuration, {meg.layout.label()} {meg.algo} "
                  f"({meg.tokens_per_s_per_gpu:.1f} tok/s/GPU, {meg.iteration_time_s:.3f} s)")
    out.print(f"{result.enumerated} layouts: {result.planned} planned with HEU and Megatron, {result.megatron_only} "
              f"with Megatron only, {result.too_big} do not fit even with full recomputation, {result.pruned} skipped "
              f"(their balanced ideal cannot enter the table); {result.elapsed_s:.1f} s")


def size_up(model: str, kinds: list[Hardware], global_batch: int, seq_len: int, limit: int | None,
            time_limit: float | None, distributed_optimizer: bool, as_json: bool, search=None) -> None:
    from .. import tune

    rows = []
    for hw in kinds:
        bar, report = progress_bar(f"{hw.name}:")
        with bar:
            sizing = tune.size_up(model, hw, global_batch, seq_len, limit, time_limit=time_limit,
                                  distributed_optimizer=distributed_optimizer, progress=report,
                                  search=search or tune.ParallelSearch())
        if sizing.fewest_gpus is None:
            rows.append({"hardware": hw.name, "gpus": None, "fewest": True, "row": None})
        for n, result in sizing.results:
            best = result.top[0] if result.top else None
            rows.append({"hardware": hw.name, "gpus": n, "fewest": n == sizing.fewest_gpus, "row": best})
    if as_json:
        typer.echo(json.dumps([{"hardware": r["hardware"], "gpus": r["gpus"], "fewest_gpus": r["fewest"],
                                **(r["row"].json() if r["row"] else {})} for r in rows], indent=1))
        return
    title = (f"{model}: global batch {global_batch} x {seq_len} tokens; the fewest GPUs that fit, and twice and four "
             "times that")
    shown = table(title, (("hardware", "left"), ("GPUs", "right"), ("tp×pp×dp", "left"), ("mb×M", "left"),
                          ("sp", "left"), ("algo", "left"), ("tok/s/GPU", "right"), ("iter s", "right"),
                          ("GiB", "right")), collapse_padding=True)
    for r in rows:
        best = r["row"]
        if best is None:
            shown.add_row(r["hardware"], "-" if r["gpus"] is None else str(r["gpus"]), "does not fit", "", "", "",
                          "", "", "")
            continue
        shown.add_row(r["hardware"], f"{r['gpus']}{' *' if r['fewest'] else ''}", *layout_cells(best.layout),
                      best.algo, f"{best.tokens_per_s_per_gpu:.1f}", f"{best.iteration_time_s:.3f}",
                      gib(best.peak_memory_bytes))
    out.print(shown)
    out.print("* the fewest GPUs (powers of two) on which some layout fits in memory")
