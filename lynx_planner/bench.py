"""`lynx bench`: every algorithm on a suite of (profile, memory limit) cases, plan quality and search time, and a
regression check against a stored baseline.

A suite is a directory with `suite.json`:

    [{"profile": "../profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json", "memory_limits": ["18GiB", "16.5GiB"]}]

(profile paths relative to the suite directory). For each case and limit every algorithm is solved, its plan
re-checked with `evaluate.check`, and the iteration time, overhead over the ideal, peak memory and search time are
collected. Results go to OUT/bench.md (markdown tables) and OUT/bench.json (everything, search times included).

The baseline (`--update`) holds only the quality numbers (iteration time, peak, fits) so that it is deterministic;
`--check` fails (exit 1) when a heu or opt plan got more than TOLERANCE (0.5 %) slower than the baseline, stopped
fitting memory, or any plan failed `lynx check`. A check that could pass without checking is refused (exit 2) before
the run: it must run heu and opt, and the baseline must hold every case of the suite and every algorithm run. The
tolerance is this module's, never the baseline file's. Algorithms whose solver module does not exist yet are reported
as missing.
"""

from __future__ import annotations

import textwrap

import statistics
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .evaluate import check as check_plan
from .evaluate import make_plan
from .io import (
    InputError,
    file_sha256,
    load_json,
    load_model,
    output_target,
    parse_size,
    raise_if_interrupted,
    same_file,
    write_atomic,
)
from .io import dumps_json as _strict_json
from .schema import Profile
from .solvers import ALGOS, Infeasible, solve
from .solvers.candidates import reset_caches

TOLERANCE = 0.005  # a heu/opt plan may get this much slower than the baseline before --check fails (the suite's
# rule, in code: a baseline file cannot loosen it)
LYNX = ("heu", "opt")
BASELINES = tuple(a for a in ALGOS if a not in LYNX)  # none, full, selective, uniform, block, checkmate, adapipe
SPEEDUP_OVER = ("full", "selective", "uniform", "block", "checkmate", "adapipe")
BASELINE_FORMAT = "lynx-bench-baseline/1"


@dataclass
class Case:
    name: str  # the profile file's stem
    profile: str  # as written in suite.json
    path: Path  # resolved against the suite directory
    limits: list[str]


def suite_file(suite: Path) -> Path:
    return suite if suite.suffix == ".json" else suite / "suite.json"


def load_suite(suite: Path) -> list[Case]:
    path = suite_file(suite)
    if not path.is_file():
        raise InputError(f"{path}: no such suite file (--suite takes a directory holding suite.json)")
    data = load_json(path)
    if not isinstance(data, list) or not data:
        raise InputError(f"{path}: expected a non-empty JSON list of {{\"profile\", \"memory_limits\"}} objects")
    cases = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("profile"), str):
            raise InputError(f"{path}: field [{i}].profile: expected a profile path (string)")
        limits = item.get("memory_limits")
        if not isinstance(limits, list) or not limits:
            raise InputError(f"{path}: field [{i}].memory_limits: expected a non-empty list of sizes")
        for j, lim in enumerate(limits):
            parse_size(str(lim), f"{path}: field [{i}].memory_limits[{j}]")
        prof = path.parent / item["profile"]
        if not prof.is_file():
            raise InputError(f"{path}: field [{i}].profile: {prof} does not exist")
        cases.append(Case(Path(item["profile"]).stem, item["profile"], prof, [str(x) for x in limits]))
    return cases


def run_algo(profile: Profile, profile_path: Path, sha: str, algo: str, limit: int,
             time_limit: float | None) -> dict:
    """Solve, judge and re-check one algorithm; never raises for solver trouble (it is reported)."""
    reset_caches()  # each search pays for its derived block facts, as a fresh `lynx plan` would
    t0 = time.perf_counter()
    try:
        solved = solve(profile, algo, limit, time_limit)
        raise_if_interrupted()  # HiGHS may have swallowed a Ctrl-C and returned its incumbent
    except ModuleNotFoundError as e:
        return {"status": "missing", "reason": f"no module {e.name or e}"}
    except Infeasible as e:
        return {"status": "infeasible", "fits": False, "needed_bytes": e.needed,
                "search_time_s": time.perf_counter() - t0}
    except Exception as e:  # a solver bug must not hide the rest of the bench
        return {"status": "error", "reason": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=-3)}
    plan = make_plan(profile, str(profile_path), sha, algo, limit, solved.stages, solved.solver, solved.evaluation)
    problems = check_plan(plan, profile)
    pred = plan.predicted
    peaks = [s.peak_memory_bytes for s in pred.stages]
    return {
        "status": "ok",
        "iteration_time_s": pred.iteration_time_s,
        "ideal_iteration_time_s": pred.ideal_iteration_time_s,
        "overhead_vs_ideal": pred.iteration_time_s / pred.ideal_iteration_time_s - 1,
        "peak_memory_bytes": max(peaks),
        "peak_per_stage_bytes": peaks,
        "fits": max(peaks) <= limit,
        "check": problems,
        "solver_status": solved.solver.status,
        "solver_source": solved.solver.source,
        "gap": solved.solver.gap,
        "search_time_s": solved.solver.search_time_s,
    }


def _time(r: dict | None) -> float | None:
    return r["iteration_time_s"] if r and r.get("status") == "ok" and r.get("fits") else None


def derive(results: dict[str, dict]) -> dict:
    """Per case: best baseline, heu/opt speedups over each baseline, heu-to-opt gap."""
    d: dict = {}
    fitting = {a: _time(results.get(a)) for a in BASELINES}
    fitting = {a: t for a, t in fitting.items() if t is not None}
    best = min(fitting, key=fitting.get) if fitting else None
    d["best_baseline"] = best
    d["best_baseline_time_s"] = fitting.get(best) if best else None
    for lynx in LYNX:
        t = _time(results.get(lynx))
        d[f"{lynx}_time_s"] = t
        for b in SPEEDUP_OVER + ("best",):
            tb = d["best_baseline_time_s"] if b == "best" else _time(results.get(b))
            rb = results.get(b) if b != "best" else None
            if t is None or (rb is not None and rb.get("status") in ("missing", "error", None)):
                d[f"{lynx}_speedup_{b}"] = None
            elif tb is None:
                d[f"{lynx}_speedup_{b}"] = "oom" if b != "best" and rb is not None else None
            else:
                d[f"{lynx}_speedup_{b}"] = tb / t
    h, o = d["heu_time_s"], d["opt_time_s"]
    d["heu_opt_gap"] = (h - o) / o if h is not None and o is not None else None
    return d


def run_suite(suite: Path, algos: list[str], time_limit: float | None = None, console: Console | None = None) -> dict:
    cases = load_suite(suite)
    rows = []
    from rich.progress import Progress

    total = sum(len(c.limits) for c in cases) * len(algos)
    err = Console(stderr=True)
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("bench", total=total)
        for case in cases:
            profile = load_model(case.path, Profile)
            sha = file_sha256(case.path)
            for lim in case.limits:
                limit = parse_size(lim, "memory limit")
                results = {}
                for algo in algos:
                    bar.update(task, description=f"{case.name} @ {lim}: {algo}")
                    results[algo] = run_algo(profile, case.path, sha, algo, limit, time_limit)
                    bar.advance(task)
                rows.append({"case": case.name, "profile": case.profile, "limit": lim, "limit_bytes": limit,
                             "results": results, "derived": derive(results)})
    return {"suite": str(suite), "algos": algos, "tolerance": TOLERANCE, "cases": rows, "summary": summarize(rows)}


def summarize(rows: list[dict]) -> dict:
    heu_ms = [r["results"]["heu"]["search_time_s"] * 1e3 for r in rows
              if r["results"].get("heu", {}).get("status") == "ok"]
    opt_s = [r["results"]["opt"]["search_time_s"] for r in rows if r["results"].get("opt", {}).get("status") == "ok"]
    gaps = [r["derived"]["heu_opt_gap"] for r in rows if r["derived"]["heu_opt_gap"] is not None]
    s: dict = {"cases": len(rows),
               "heu_median_search_ms": statistics.median(heu_ms) if heu_ms else None,
               "opt_median_search_s": statistics.median(opt_s) if opt_s else None,
               "max_heu_opt_gap": max(gaps) if gaps else None,
               "check_failures": sum(1 for r in rows for x in r["results"].values() if x.get("check")),
               "errors": sum(1 for r in rows for x in r["results"].values() if x.get("status") == "error"),
               "missing": sorted({a for r in rows for a, x in r["results"].items() if x.get("status") == "missing"})}
    for lynx in LYNX:
        for b in SPEEDUP_OVER + ("best",):
            vals = [r["derived"][f"{lynx}_speedup_{b}"] for r in rows]
            nums = [v for v in vals if isinstance(v, float)]
            s[f"{lynx}_min_speedup_{b}"] = min(nums) if nums else None
    return s


# ----------------------------------------------------------------------------------------------------------------
# baseline


def _key(row: dict) -> str:
    return f"{row['case']} @ {row['limit']}"


def quality(result: dict) -> dict:
    """The deterministic part of a run: what --update stores."""
    cases: dict = {}
    for row in result["cases"]:
        entry = {}
        for algo, r in row["results"].items():
            if r["status"] == "ok":
                entry[algo] = {"fits": r["fits"], "iteration_time_s": r["iteration_time_s"],
                               "peak_memory_bytes": r["peak_memory_bytes"]}
            elif r["status"] == "infeasible":
                entry[algo] = {"fits": False, "iteration_time_s": None, "peak_memory_bytes": r["needed_bytes"]}
        cases[_key(row)] = entry
    return {"format": BASELINE_FORMAT, "cases": cases}


def load_baseline(path: Path) -> dict:
    data = load_json(path)
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT or not isinstance(data.get("cases"), dict):
        raise InputError(f"{path}: field format: not a lynx bench baseline (expected format {BASELINE_FORMAT!r}; "
                         "write one with `lynx bench --update`)")
    if not data["cases"]:
        raise InputError(f"{path}: field cases: the baseline is empty, so a check against it would check nothing")
    return data


def check_coverage(path: Path, baseline: dict, cases: list[Case], algos: list[str]) -> None:
    """Refuse a check that could pass without checking: it must run heu and opt, and the baseline must hold every
    case of the suite with every algorithm that is run."""
    skipped = [a for a in LYNX if a not in algos]
    if skipped:
        raise InputError(f"--check: --algos skips {', '.join(skipped)}; the regression check is about heu and opt, "
                         "so it must run both")
    for case in cases:
        for lim in case.limits:
            key = f"{case.name} @ {lim}"
            entry = baseline["cases"].get(key)
            if not isinstance(entry, dict):
                raise InputError(f"{path}: field cases: no entry for suite case {key!r} (re-run `lynx bench "
                                 "--update`)")
            lacking = [a for a in algos if not isinstance(entry.get(a), dict)]
            if lacking:
                raise InputError(f"{path}: field cases.{key}: no result for {', '.join(lacking)}, which this run "
                                 "runs (re-run `lynx bench --update`)")


def violations(result: dict, baseline: dict) -> list[str]:
    """Reasons the run regressed from the baseline (empty: it did not). The tolerance is TOLERANCE, whatever the
    baseline file says."""
    tol = TOLERANCE
    found = []
    for row in result["cases"]:
        where = f"{row['case']} @ {row['limit']}"
        base = baseline["cases"].get(_key(row), {})
        for algo, r in row["results"].items():
            if r.get("status") == "error":
                found.append(f"{where}: {algo} failed: {r['reason']}")
            if r.get("check"):
                found.append(f"{where}: {algo} plan fails check: {'; '.join(r['check'][:3])}")
            if r.get("status") == "ok" and not r["fits"]:
                found.append(f"{where}: {algo} plan exceeds the memory limit")
        for algo in LYNX:
            b, r = base.get(algo), row["results"].get(algo)
            if r is None:
                found.append(f"{where}: {algo} was not run")
                continue
            if b is None:
                found.append(f"{where}: the baseline has no {algo} result")
                continue
            if r["status"] == "missing":
                found.append(f"{where}: {algo} is not available, the baseline has it")
            elif b["fits"] and r["status"] != "ok":
                found.append(f"{where}: {algo} no longer fits the memory limit (baseline "
                             f"{b['iteration_time_s']:.6f} s)")
            elif b["fits"] and r["status"] == "ok" and r["iteration_time_s"] > b["iteration_time_s"] * (1 + tol):
                found.append(f"{where}: {algo} iteration time {r['iteration_time_s']:.6f} s is "
                             f"{(r['iteration_time_s'] / b['iteration_time_s'] - 1) * 100:.2f}% slower than the "
                             f"baseline {b['iteration_time_s']:.6f} s (tolerance {tol * 100:.1f}%)")
    return found


# ----------------------------------------------------------------------------------------------------------------
# reports


def _fmt_time(r: dict | None) -> str:
    if r is None:
        return ""
    st = r.get("status")
    if st == "ok":
        return f"{r['iteration_time_s']:.4f}" + ("" if r["fits"] else " (over)")
    if st == "infeasible":
        need = r.get("needed_bytes")
        return f"OOM ({need / 2**30:.1f}G)" if need else "OOM"
    return "n/a" if st == "missing" else "ERROR"


def _fmt_x(v) -> str:
    if v is None:
        return "n/a"
    if v == "oom":
        return "OOM"
    return f"{v:.3f}x"


def _fmt_opt(v, fmt: str) -> str:
    return "n/a" if v is None else fmt.format(v)


def _speedup_columns() -> list[str]:
    return [f"HEU/{b}" for b in SPEEDUP_OVER] + [f"OPT/{b}" for b in SPEEDUP_OVER]


def summary_rows(result: dict) -> list[list[str]]:
    rows = []
    for row in result["cases"]:
        d, res = row["derived"], row["results"]
        best = f"{d['best_baseline']} {d['best_baseline_time_s']:.4f}" if d["best_baseline"] else "none fits"
        heu, opt = res.get("heu"), res.get("opt")
        cells = [row["case"], row["limit"], _fmt_time(heu) or "n/a", _fmt_time(opt) or "n/a", best]
        cells += [_fmt_x(d[f"heu_speedup_{b}"]) for b in SPEEDUP_OVER]
        cells += [_fmt_x(d[f"opt_speedup_{b}"]) for b in SPEEDUP_OVER]
        cells.append(_fmt_opt(d["heu_opt_gap"] * 100 if d["heu_opt_gap"] is not None else None, "{:.2f}"))
        cells.append(_fmt_opt(heu["search_time_s"] * 1e3 if heu and heu.get("status") == "ok" else None, "{:.1f}"))
        cells.append(_fmt_opt(opt["search_time_s"] if opt and opt.get("status") == "ok" else None, "{:.2f}"))
        rows.append(cells)
    return rows


SUMMARY_HEADER = (["case", "limit", "HEU s", "OPT s", "best baseline s"] + _speedup_columns()
                  + ["HEU-OPT gap %", "HEU search ms", "OPT search s"])


def summary_lines(result: dict) -> list[str]:
    s = result["summary"]
    lines = [f"{s['cases']} cases; algorithms missing: {', '.join(s['missing']) or 'none'}; "
             f"plans failing check: {s['check_failures']}; solver errors: {s['errors']}"]
    lines.append(f"HEU median search time: {_fmt_opt(s['heu_median_search_ms'], '{:.1f} ms')}; "
                 f"OPT median search time: {_fmt_opt(s['opt_median_search_s'], '{:.2f} s')}; "
                 f"max HEU-to-OPT gap: {_fmt_opt(_percent(s['max_heu_opt_gap']), '{:.2f}%')}")
    for lynx in LYNX:
        parts = [f"{b} {_fmt_x(s[f'{lynx}_min_speedup_{b}'])}" for b in SPEEDUP_OVER + ("best",)]
        lines.append(f"{lynx.upper()} min speedup over (where the baseline fits): " + ", ".join(parts))
    return lines


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def time_rows(result: dict) -> list[list[str]]:
    rows = []
    for row in result["cases"]:
        res = row["results"]
        # the ideal depends on the stage split: show the one of Megatron's even split (as full uses)
        order = ["full"] + [a for a in res if a != "full"]
        ideal = next((res[a]["ideal_iteration_time_s"] for a in order if res.get(a, {}).get("status") == "ok"), None)
        rows.append([row["case"], row["limit"], f"{ideal:.4f}" if ideal else "n/a"]
                    + [_fmt_time(res.get(a)) for a in result["algos"]])
    return rows


def markdown(result: dict) -> str:
    parts = [f"# lynx bench: {result['suite']}", "",
             "Iteration times in seconds (simulated); OOM: the algorithm cannot meet the limit (least peak it "
             "reaches); n/a: not available. Speedups: the baseline's time over HEU's (OPT's).", "",
             "## Summary", ""] + [f"- {line}" for line in summary_lines(result)]
    parts += ["", "## Lynx against the baselines", "", _md_table(SUMMARY_HEADER, summary_rows(result)), "",
              "## Iteration time per algorithm", "",
              _md_table(["case", "limit", "ideal (even split)"] + result["algos"], time_rows(result)), ""]
    return "\n".join(parts)


def print_report(result: dict, console: Console) -> None:
    """Two tables where the terminal is wide enough for them, else one record per case (names and figures whole)."""
    time_cols = ["case", "limit", "ideal (even split)"] + result["algos"]
    cols = ["case", "limit", "HEU s", "OPT s", "best baseline", "HEU/best", "HEU/full", "OPT/best", "OPT/full",
            "gap %", "HEU ms", "OPT s"]
    summary = []
    for row, cells in zip(result["cases"], summary_rows(result)):
        d = row["derived"]
        summary.append([*cells[:5], _fmt_x(d["heu_speedup_best"]), _fmt_x(d["heu_speedup_full"]),
                        _fmt_x(d["opt_speedup_best"]), _fmt_x(d["opt_speedup_full"]), *cells[-3:]])
    for title, header, rows in (("iteration time per algorithm (s)", time_cols, time_rows(result)),
                                ("Lynx against the baselines (speedup = baseline time / Lynx time)", cols, summary)):
        widths = [max(len(str(c)) for c in [h, *(r[i] for r in rows)]) for i, h in enumerate(header)]
        if sum(widths) + 3 * len(widths) + 1 <= console.width:
            t = Table(title=title, title_justify="left")
            for col in header:
                t.add_column(col, justify="left" if col in ("case", "limit", "best baseline") else "right",
                             no_wrap=True)
            for r in rows:
                t.add_row(*r)
            console.print(t)
            continue
        console.print(title)
        for r in rows:
            console.print(f"  {r[0]} at {r[1]}", markup=False)
            pairs = [f"{h} {v}" for h, v in zip(header[2:], r[2:])]
            for line in textwrap.wrap(";  ".join(pairs), width=console.width - 4, break_long_words=False,
                                      break_on_hyphens=False):
                console.print(f"    {line}", markup=False)
    for line in summary_lines(result):
        console.print(line)


def dumps_json(data: dict) -> str:
    return _strict_json(data, "bench", indent=1, sort_keys=True)


def main(suite: Path, baseline: Path | None, check: bool, update: bool, algos: list[str] | None = None,
         out_dir: Path = Path("bench/out"), time_limit: float | None = None, console: Console | None = None) -> int:
    """Run the suite, write the reports, check and/or update the baseline. Returns the exit code."""
    console = console or Console()
    algos = algos or list(ALGOS)
    baseline = baseline or (suite_file(suite).parent / "baseline.json")
    cases = load_suite(suite)  # everything below fails before the long run
    base = load_baseline(baseline) if check else None
    if base is not None:
        check_coverage(baseline, base, cases, algos)
    inputs = [suite_file(suite)] + [c.path for c in cases] + ([baseline] if check else [])
    outputs = [out_dir / "bench.md", out_dir / "bench.json"] if out_dir.is_dir() else []
    if update:
        if not baseline.parent.is_dir():
            raise InputError(f"{baseline}: cannot write: directory {baseline.parent} does not exist")
        outputs.append(baseline)
        inputs = inputs[:-1] if check else inputs  # --check --update reads the baseline, then replaces it
    for target in outputs:
        output_target(target)
        clash = next((i for i in inputs if same_file(target, i)), None)
        if clash is not None:
            raise InputError(f"{target}: it is the input file {clash}; writing it would destroy the input")
    result = run_suite(suite, algos, time_limit, console)
    print_report(result, console)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{out_dir}: --out: cannot create directory: {e.strerror}") from None
    write_atomic(out_dir / "bench.md", markdown(result))
    write_atomic(out_dir / "bench.json", dumps_json(result))
    console.print(f"wrote {out_dir / 'bench.md'} and {out_dir / 'bench.json'}")
    code = 0
    if check:
        found = violations(result, base)
        for v in found:
            console.print(f"[red]regression[/red]: {v}")
        console.print(f"check against {baseline}: " + ("ok" if not found else f"{len(found)} violation(s)"))
        code = 1 if found else 0
    if update:
        write_atomic(baseline, dumps_json(quality(result)))
        console.print(f"wrote baseline {baseline}")
    return code


def _percent(x: float | None) -> float | None:
    return None if x is None else x * 100
