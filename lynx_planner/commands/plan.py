"""`lynx plan`: search one algorithm's recomputation strategy for a profile within a memory limit, write the plan
and print its per-stage memory and time."""

from __future__ import annotations

from pathlib import Path

from ..io import InputError, dumps, file_sha256, format_bytes, raise_if_interrupted, write_atomic
from ..schema import Plan, Profile
from .options import check_output, device_limit, load_profile, seconds, size
from .tables import in_unit, ms, percent, table, unit
from .terminal import err, out


def run(profile_path: Path, algo: str, output: Path, memory_limit: str | None, time_limit: float | None,
        partition, reproducible: bool, compiled: bool = False, offload_modules: str | None = None) -> None:
    from .. import solvers

    if algo not in solvers.ALL_ALGOS:
        raise InputError(f"--algo: unknown algorithm {algo!r} (expected one of {', '.join(solvers.ALL_ALGOS)})")
    modules = None
    if offload_modules is not None:
        from ..offload import MODULES

        modules = tuple(m.strip() for m in offload_modules.split(",") if m.strip())
        if algo != "offload":
            raise InputError("--offload-modules: only with --algo offload")
        bad = [m for m in modules if m not in MODULES] or ([] if modules else ["(empty)"])
        if bad:
            raise InputError(f"--offload-modules: unknown module {bad[0]!r} (expected some of {', '.join(MODULES)})")
    check_output(output, "-o", (profile_path,))
    time_limit = seconds(time_limit)
    profile = load_profile(profile_path)
    sha = file_sha256(profile_path)
    limit = device_limit(size(memory_limit, "--memory-limit"), profile.hardware, f" in {profile_path}")
    try:
        with err.status(f"searching ({algo}) ..."):
            plan = solvers.plan(profile, str(profile_path), sha, algo, limit, time_limit,
                                partition.value if partition else None, compiled, modules)
        raise_if_interrupted()  # HiGHS may have swallowed a Ctrl-C and returned its incumbent
    except ModuleNotFoundError as e:
        raise InputError(f"--algo: {algo!r} is not available in this installation ({e})") from None
    except solvers.Infeasible as e:
        raise solvers.Infeasible(f"{profile_path}: {e}{least_memory_hint(profile, algo)}", e.needed) from None
    if reproducible:
        plan = plan.model_copy(update={"solver": plan.solver.model_copy(update={"search_time_s": 0.0})})
    write_atomic(output, dumps(plan))
    summary(plan, output)


def least_memory_hint(profile: Profile, algo: str) -> str:
    if algo == "full":
        return ""
    from ..solvers import solve

    try:
        full = solve(profile, "full", 2**62).evaluation.peak_bytes
    except Exception:
        return ""
    return f"; full recomputation needs {format_bytes(full)}"


def summary(plan: Plan, path: Path) -> None:
    pred = plan.predicted
    t, ideal = pred.iteration_time_s, pred.ideal_iteration_time_s
    unit_name, unit_size = unit([pr.peak_memory_bytes for pr in pred.stages])
    shown = table(f"{plan.algo}: {path}, memory limit {format_bytes(plan.memory_limit_bytes)}",
                  [(col, "right") for col in ("stage", "layers", f"peak\n{unit_name}", f"static\n{unit_name}",
                                              f"activations\n{unit_name}", "recompute\nexposed", "recompute\nhidden")])
    pp = plan.parallel.pp
    for pr in pred.stages:  # per rank; interleaved: its chunks' layers
        layers = ", ".join(f"{st.layers[0]}-{st.layers[1] - 1}" for st in plan.stages if st.stage % pp == pr.stage)
        shown.add_row(str(pr.stage), layers, in_unit(pr.peak_memory_bytes, unit_size),
                      in_unit(pr.static_bytes, unit_size), in_unit(pr.activation_bytes, unit_size),
                      ms(pr.exposed_recompute_s), ms(pr.hidden_recompute_s))
    out.print(shown)
    out.print(f"iteration time {t:.4f} s; ideal (this split, no recomputation, unlimited memory) {ideal:.4f} s: "
              f"{ideal / t:.3f}x of ideal speed ({percent(t / ideal - 1)})")
    if any(pr.offloaded_bytes for pr in pred.stages):
        from ..offload import summary_line

        out.print(summary_line(pred.stages, t))
    out.print(f"solver {plan.solver.name}: {plan.solver.status}, search time {ms(plan.solver.search_time_s)}"
              + (f", gap {plan.solver.gap:.2%}" if plan.solver.gap else ""))
