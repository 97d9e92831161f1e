"""`lynx simulate`: re-simulate a plan on its profile and print per-stage memory and time; optionally write a
Chrome trace or draw the timeline."""

from __future__ import annotations

from pathlib import Path

import typer

from ..io import InputError, dumps_json, file_sha256, format_bytes, write_atomic
from .options import check_output, load_plan, load_profile, plan_profile_path
from .tables import in_unit, ms, percent, table, unit
from .terminal import err, out

from ..streams import STREAMS  # the rank's streams (streams.py)

_STREAMS = ("compute", "tp collective", "recompute (side)")  # listed first in every trace, used or not


def chrome_trace(events: list[dict], stages: int) -> dict:
    """Chrome trace-event JSON: one process per stage, one thread per stream, with name metadata for Perfetto."""
    used = {e["tid"] for e in events}
    streams = list(_STREAMS) + [s for s in STREAMS if s in used and s not in _STREAMS] + sorted(used - set(STREAMS))
    tid = {name: i for i, name in enumerate(streams)}
    meta: list[dict] = []
    for s in range(stages):
        meta.append({"name": "process_name", "ph": "M", "pid": s, "tid": 0, "args": {"name": f"stage {s}"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": s, "tid": 0, "args": {"sort_index": s}})
        for name in streams:
            meta.append({"name": "thread_name", "ph": "M", "pid": s, "tid": tid[name], "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": s, "tid": tid[name],
                         "args": {"sort_index": tid[name]}})
    body = [{**e, "cat": e["tid"], "tid": tid[e["tid"]]} for e in events]
    body.sort(key=lambda e: (e["pid"], e["tid"], e["ts"]))
    return {"traceEvents": meta + body, "displayTimeUnit": "ms"}


def run(plan_path: Path, profile: Path | None, trace: Path | None, as_json: bool, plot: Path | None) -> None:
    from ..evaluate import evaluate

    if trace is not None:
        check_output(trace, "--trace", (plan_path, profile))
    if plot is not None:
        check_output(plot, "--plot", (plan_path, profile))
    plan = load_plan(plan_path)
    prof_path = plan_profile_path(plan, plan_path, profile)
    if trace is not None:
        check_output(trace, "--trace", (plan_path, prof_path))
    prof = load_profile(prof_path)
    if file_sha256(prof_path) != plan.profile_sha256:
        err.print(f"warning: {prof_path} is not the profile the plan was made for (sha256 differs)")
    if len(plan.stages) != prof.parallel.pp * prof.parallel.virtual_stages:
        raise InputError(f"{plan_path}: field stages: {len(plan.stages)} stages, the profile {prof_path} has "
                         f"pp {prof.parallel.pp} x {prof.parallel.virtual_stages} virtual stages")
    from ..evaluate import structure_problems

    broken = structure_problems(plan, prof)  # cheap, and bounds every layer range before the simulator expands it
    if broken:
        raise InputError(f"{plan_path}: field stages: {broken[0]}; run `lynx check {plan_path}`")
    try:
        ev = evaluate(prof, plan.stages, trace=trace is not None or plot is not None)
    except (KeyError, IndexError, ValueError) as e:
        raise InputError(f"{plan_path}: the plan does not fit the profile {prof_path} ({type(e).__name__}: {e}); "
                         "run `lynx check`") from None
    if trace is not None:
        write_atomic(trace, dumps_json(chrome_trace(ev.sim.trace, prof.parallel.pp), str(trace)))
    if plot is not None:
        from ..plot import timeline

        timeline(ev.sim.trace, ev.sim.memory, [s.static_bytes for s in ev.predicted.stages], plan.memory_limit_bytes,
                 f"{plan_path.name} ({plan.algo}): {prof.model.name} on {prof.hardware.name}, tp {prof.parallel.tp} "
                 f"pp {prof.parallel.pp} dp {prof.parallel.dp}, {prof.parallel.num_microbatches} micro-batches, "
                 f"{ev.predicted.iteration_time_s:.4f} s", plot)
    pred = ev.predicted
    if as_json:
        typer.echo(dumps_json(pred.model_dump(mode="json"), "--json", indent=1), nl=False)
        return
    unit_name, unit_size = unit([s.peak_memory_bytes for s in pred.stages])
    shown = table(f"{plan_path} ({plan.algo}) on {prof_path}",
                  [(col, "right") for col in ("stage", f"peak\n{unit_name}", f"static\n{unit_name}",
                                              f"activations\n{unit_name}", "busy s", "recompute\nexposed",
                                              "recompute\nhidden")])
    for s in pred.stages:
        shown.add_row(str(s.stage), in_unit(s.peak_memory_bytes, unit_size), in_unit(s.static_bytes, unit_size),
                      in_unit(s.activation_bytes, unit_size), f"{s.busy_time_s:.4f}", ms(s.exposed_recompute_s),
                      ms(s.hidden_recompute_s))
    out.print(shown)
    t, ideal = pred.iteration_time_s, pred.ideal_iteration_time_s
    out.print(f"iteration time {t:.4f} s, ideal (this split, no recomputation) {ideal:.4f} s ({percent(t / ideal - 1)}); "
              f"memory limit "
              f"{format_bytes(plan.memory_limit_bytes)}, peak {format_bytes(ev.peak_bytes)}")
    if any(s.offloaded_bytes for s in pred.stages):
        from ..offload import summary_line

        out.print(summary_line(pred.stages, t))
    if trace is not None:
        out.print(f"wrote {trace} ({len(ev.sim.trace)} events)")
    if plot is not None:
        out.print(f"wrote {plot}")
