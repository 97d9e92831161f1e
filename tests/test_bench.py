"""`lynx bench`: suites, reports, the baseline regression check, and the shipped profiles and suites."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lynx_planner import bench, solvers
from lynx_planner.cli import app
from lynx_planner.io import load_model, parse_size
from lynx_planner.schema import Profile

ROOT = Path(__file__).resolve().parent.parent
BASE = ["none", "full", "selective", "uniform", "block"]
runner = CliRunner()


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("suite")
    (d / "profiles").mkdir()
    prof = d / "profiles" / "small.json"
    r = runner.invoke(app, ["profile", "gpt-1.3b", "--tp", "2", "--pp", "2", "--micro-batch-size", "2",
                            "--num-microbatches", "4", "-o", str(prof)])
    assert r.exit_code == 0, r.output
    profile = load_model(prof, Profile)
    none = solvers.solve(profile, "none", 2**62).evaluation.peak_bytes
    full = solvers.solve(profile, "full", 2**62).evaluation.peak_bytes
    limits = [str(full + (none - full) * 3 // 4), str((none + full) // 2)]
    (d / "suite.json").write_text(json.dumps([{"profile": "profiles/small.json", "memory_limits": limits}]))
    return d


def invoke(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    return r


def test_bench_runs_and_writes_reports(suite, tmp_path):
    out = tmp_path / "out"
    r = invoke("bench", "--suite", suite, "--algos", ",".join(BASE), "--out", out)
    assert r.exit_code == 0, r.output
    md = (out / "bench.md").read_text()
    data = json.loads((out / "bench.json").read_text())
    assert "| case | limit |" in md and "small" in md
    assert len(data["cases"]) == 2
    for row in data["cases"]:
        assert set(row["results"]) == set(BASE)
        assert row["results"]["none"]["status"] == "infeasible"
        assert row["results"]["full"]["status"] == "ok" and row["results"]["full"]["fits"]
        assert row["results"]["full"]["check"] == []
        assert row["derived"]["best_baseline"] in BASE
    assert "HEU median search time" in r.stdout


@pytest.fixture
def fast_opt(monkeypatch):
    """OPT's MILP takes seconds per case: these tests are about the baseline's bookkeeping, so `opt` is HEU's plan
    under OPT's name (the plan still passes `check`)."""
    real = bench.solve

    def solve(profile, algo, *a, **kw):
        if algo != "opt":
            return real(profile, algo, *a, **kw)
        got = real(profile, "heu", *a, **kw)
        return dataclasses.replace(got, solver=got.solver.model_copy(update={"name": "opt"}))

    monkeypatch.setattr(bench, "solve", solve)


LYNX_AND_BASE = "heu,opt,full,block"


def test_update_then_check(suite, tmp_path, fast_opt):
    base = tmp_path / "baseline.json"
    r = invoke("bench", "--suite", suite, "--algos", LYNX_AND_BASE, "--out", tmp_path / "o1", "--update",
               "--baseline", base)
    assert r.exit_code == 0, r.output
    first = base.read_bytes()
    data = json.loads(first)
    assert data["format"] == bench.BASELINE_FORMAT
    assert "search_time_s" not in json.dumps(data)  # deterministic: quality numbers only
    assert "tolerance" not in data  # the suite's rule, not the baseline's
    r = invoke("bench", "--suite", suite, "--algos", LYNX_AND_BASE, "--out", tmp_path / "o2", "--update",
               "--baseline", base)
    assert base.read_bytes() == first
    r = invoke("bench", "--suite", suite, "--algos", LYNX_AND_BASE, "--out", tmp_path / "o3", "--check",
               "--baseline", base)
    assert r.exit_code == 0, r.output
    assert "ok" in r.stdout


def _baseline(suite: Path, tmp_path: Path) -> tuple[Path, dict]:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(bench.quality(_result_with_lynx(suite))))
    return path, json.loads(path.read_text())


def _check_refused(suite: Path, tmp_path: Path, baseline: Path, algos: str, needle: str) -> None:
    out = tmp_path / "o"
    r = invoke("bench", "--suite", suite, "--algos", algos, "--out", out, "--check", "--baseline", baseline)
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert needle in r.stderr, r.stderr
    assert not out.exists(), "refused before the run"


def test_check_refuses_an_empty_baseline(suite, tmp_path):
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"format": bench.BASELINE_FORMAT, "cases": {}}))
    _check_refused(suite, tmp_path, path, "heu,opt", "the baseline is empty")


def test_check_refuses_a_baseline_lacking_a_case(suite, tmp_path):
    path, data = _baseline(suite, tmp_path)
    del data["cases"][sorted(data["cases"])[0]]
    path.write_text(json.dumps(data))
    _check_refused(suite, tmp_path, path, "heu,opt,full", "no entry for suite case")


def test_check_refuses_a_baseline_lacking_an_algorithm_that_runs(suite, tmp_path):
    path, data = _baseline(suite, tmp_path)
    _check_refused(suite, tmp_path, path, "heu,opt,full,uniform", "no result for uniform")  # never in it
    del data["cases"][sorted(data["cases"])[1]]["opt"]
    path.write_text(json.dumps(data))
    _check_refused(suite, tmp_path, path, "heu,opt,full", "no result for opt")


@pytest.mark.parametrize("algos", ["none,full", "heu,full", "opt,block"])
def test_check_refuses_subsets_that_skip_heu_or_opt(suite, tmp_path, algos):
    path, _ = _baseline(suite, tmp_path)
    _check_refused(suite, tmp_path, path, algos, "must run both")


def test_check_tolerance_is_the_suites_not_the_baselines(suite):
    result = _result_with_lynx(suite)
    baseline = {**bench.quality(result), "tolerance": 1.0}  # a baseline file cannot loosen the check
    slower = copy.deepcopy(result)
    slower["cases"][0]["results"]["heu"]["iteration_time_s"] *= 1 + 2 * bench.TOLERANCE
    assert any("heu" in v and "slower" in v for v in bench.violations(slower, baseline))


def test_check_reports_lynx_results_absent_from_either_side(suite):
    result = _result_with_lynx(suite)
    baseline = bench.quality(result)
    for entry in baseline["cases"].values():
        del entry["opt"]
    assert any("no opt result" in v for v in bench.violations(result, baseline))
    unrun = copy.deepcopy(result)
    del unrun["cases"][0]["results"]["heu"]
    assert any("heu was not run" in v for v in bench.violations(unrun, bench.quality(result)))


def test_bench_outputs_never_replace_inputs(suite, tmp_path):
    r = invoke("bench", "--suite", suite, "--algos", "full", "--out", suite)
    assert r.exit_code == 0, r.output  # bench.md/bench.json beside suite.json are fine
    (suite / "bench.md").unlink()
    (suite / "bench.json").unlink()
    r = invoke("bench", "--suite", suite, "--algos", "full", "--out", tmp_path / "o", "--update", "--baseline",
               suite / "suite.json")
    assert r.exit_code == 2 and "input" in r.stderr, r.output
    assert json.loads((suite / "suite.json").read_text())[0]["profile"] == "profiles/small.json"


def test_default_baseline_is_in_the_suite(suite, tmp_path):
    r = invoke("bench", "--suite", suite, "--algos", "full", "--out", tmp_path / "o", "--update")
    assert r.exit_code == 0, r.output
    assert (suite / "baseline.json").is_file()
    (suite / "baseline.json").unlink()


def test_check_without_baseline_is_bad_input(suite, tmp_path):
    r = invoke("bench", "--suite", suite, "--algos", "full", "--out", tmp_path / "o", "--check", "--baseline",
               tmp_path / "none.json")
    assert r.exit_code == 2
    assert "none.json" in r.stderr


def _result_with_lynx(suite: Path) -> dict:
    """A real run of the baselines, with `block`'s results standing in for heu and opt."""
    result = bench.run_suite(suite, ["full", "block"])
    for row in result["cases"]:
        row["results"]["heu"] = copy.deepcopy(row["results"]["block"])
        row["results"]["opt"] = copy.deepcopy(row["results"]["block"])
        row["derived"] = bench.derive(row["results"])
    result["summary"] = bench.summarize(result["cases"])
    return result


def test_regressions_are_detected(suite):
    result = _result_with_lynx(suite)
    baseline = bench.quality(result)
    assert bench.violations(result, baseline) == []

    slower = copy.deepcopy(result)
    slower["cases"][0]["results"]["heu"]["iteration_time_s"] *= 1.006
    found = bench.violations(slower, baseline)
    assert len(found) == 1 and "heu" in found[0] and "slower" in found[0]

    within = copy.deepcopy(result)
    within["cases"][0]["results"]["opt"]["iteration_time_s"] *= 1.004
    assert bench.violations(within, baseline) == []

    oom = copy.deepcopy(result)
    oom["cases"][1]["results"]["opt"] = {"status": "infeasible", "fits": False, "needed_bytes": 1,
                                         "search_time_s": 0.1}
    assert any("no longer fits" in v for v in bench.violations(oom, baseline))

    bad = copy.deepcopy(result)
    bad["cases"][0]["results"]["full"]["check"] = ["stage 0: something"]
    assert any("fails check" in v for v in bench.violations(bad, baseline))

    gone = copy.deepcopy(result)
    gone["cases"][0]["results"]["heu"] = {"status": "missing", "reason": "no module"}
    assert any("not available" in v for v in bench.violations(gone, baseline))

    faster = copy.deepcopy(result)
    faster["cases"][0]["results"]["heu"]["iteration_time_s"] *= 0.9
    assert bench.violations(faster, baseline) == []


def test_derived_speedups(suite):
    result = _result_with_lynx(suite)
    for row in result["cases"]:
        d = row["derived"]
        assert d["heu_speedup_full"] == pytest.approx(row["results"]["full"]["iteration_time_s"]
                                                      / row["results"]["heu"]["iteration_time_s"])
        assert d["heu_speedup_block"] == pytest.approx(1.0)
        assert d["heu_opt_gap"] == pytest.approx(0.0)
        assert d["heu_speedup_checkmate"] is None  # not run
    md = bench.markdown(result)
    assert "HEU/full" in md and "HEU-OPT gap %" in md


def test_missing_algorithms_are_reported(suite, tmp_path, monkeypatch):
    real = bench.solve

    def solve(profile, algo, *a, **kw):
        if algo in ("heu", "opt"):
            raise ModuleNotFoundError(f"No module named 'lynx_planner.solvers.{algo}'", name=algo)
        return real(profile, algo, *a, **kw)

    monkeypatch.setattr(bench, "solve", solve)
    out = tmp_path / "out"
    r = invoke("bench", "--suite", suite, "--algos", "heu,opt,full", "--out", out)
    assert r.exit_code == 0, r.output
    data = json.loads((out / "bench.json").read_text())
    assert data["summary"]["missing"] == ["heu", "opt"]
    assert "missing: heu, opt" in r.stdout


def test_solver_crash_is_reported_not_raised(suite, tmp_path, monkeypatch):
    real = bench.solve

    def solve(profile, algo, *a, **kw):
        if algo == "block":
            raise ZeroDivisionError("oops")
        return real(profile, algo, *a, **kw)

    monkeypatch.setattr(bench, "solve", solve)
    result = bench.run_suite(suite, ["full", "block"])
    assert result["cases"][0]["results"]["block"]["status"] == "error"
    assert any("oops" in v for v in bench.violations(result, {"cases": {}}))


# --- the shipped profiles and suites ---------------------------------------------------------------------------

NAME = re.compile(r"^(gpt-[0-9.]+b)-(.+)-tp(\d+)-pp(\d+)-mb(\d+)-m(\d+)$")


def shipped_profiles() -> list[Path]:
    return sorted((ROOT / "profiles").glob("*.json"))


# the 2026 cases (scripts/regenerate.py MODERN_PROFILES): MODEL-HARDWARE-tpT[-sp]-ppP[-zb][-vV][-dpD][-epE]-mbB[-sS]-mM
MODERN = re.compile(r"^(.+?)-([a-z0-9]+-\d+g-[a-z]+)-tp(\d+)(-sp)?-pp(\d+)(-zb)?(?:-v(\d+))?(?:-dp(\d+))?"
                    r"(?:-ep(\d+))?-mb(\d+)(?:-s(\d+))?-m(\d+)$")


def test_shipped_modern_profiles_match_their_names():
    paths = [p for p in shipped_profiles() if not p.stem.startswith("gpt-")]
    assert len(paths) >= 4
    for path in paths:
        m = MODERN.match(path.stem)
        assert m, path.name
        p = load_model(path, Profile)
        par = p.parallel
        v = int(m.group(7) or 1)
        schedule = "zero-bubble" if m.group(6) else "interleaved-1f1b" if v > 1 else "1f1b"
        assert (p.model.name, p.hardware.name) == (m.group(1), m.group(2))
        assert (par.tp, par.sequence_parallel, par.pp, par.schedule, par.virtual_stages) == (
            int(m.group(3)), bool(m.group(4)), int(m.group(5)), schedule, v)
        assert (par.dp, par.ep, par.micro_batch_size, par.seq_len, par.num_microbatches) == (
            int(m.group(8) or 1), int(m.group(9) or 1), int(m.group(10)), int(m.group(11) or 2048), int(m.group(12)))


def test_shipped_profiles_match_their_names():
    paths = [p for p in shipped_profiles() if p.stem.startswith("gpt-")]
    assert 20 <= len(paths) <= 40
    for path in paths:
        m = NAME.match(path.stem)
        assert m, path.name
        p = load_model(path, Profile)
        par = p.parallel
        assert (p.model.name, p.hardware.name) == (m.group(1), m.group(2))
        assert (par.tp, par.pp, par.micro_batch_size, par.num_microbatches) == tuple(map(int, m.group(3, 4, 5, 6)))
        assert par.seq_len == 2048 and p.attention == "flash" and p.dropout == 0.1
        assert par.pp <= par.num_microbatches <= 8 * par.pp


@pytest.mark.parametrize("suite_dir", ["bench", "bench/ci"])
def test_shipped_suite_limits_are_between_full_and_none(suite_dir):
    cases = bench.load_suite(ROOT / suite_dir)
    if suite_dir == "bench":
        assert {c.path.resolve() for c in cases} == {p.resolve() for p in shipped_profiles()}
    else:
        assert 3 <= len(cases) <= 10
    for case in cases:
        profile = load_model(case.path, Profile)
        none = solvers.solve(profile, "none", 2**62).evaluation.peak_bytes
        full = solvers.solve(profile, "full", 2**62).evaluation.peak_bytes
        for lim in case.limits:
            assert full <= parse_size(lim) < none, (case.name, lim)
