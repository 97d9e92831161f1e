"""`lynx check` re-derives everything a plan claims: each hand-edit of a real plan below is one the runtime would act
on or a user would read, and each must make `check` exit 1 naming it (or, for a file that is not strict JSON, make
loading it exit 2). A plan is a contract between the planner and the training job."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Callable

import pytest
from conftest import lynx

from lynx_planner import evaluate
from lynx_planner.io import load_model
from lynx_planner.schema import Plan, Profile

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "profiles" / "gpt-1.3b-a100-80g-pcie-tp2-pp2-mb2-m8.json"  # bench/ci's first case
# between full (7.34 GiB, the loss's backward gradients on stage 1 included) and none (10.16 GiB); bench/ci's limit
# was 7.0625GiB before the loss's gradients were counted (0.78 GiB here)
LIMIT = "7.8125GiB"


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("check")
    shutil.copy(SHIPPED, d / "p.json")
    out = {"dir": d, "profile": d / "p.json"}
    for algo in ("heu", "full"):
        out[algo] = d / f"{algo}.json"
        r = lynx("plan", d / "p.json", "--algo", algo, "--memory-limit", LIMIT, "-o", out[algo])
        assert r.exit_code == 0, r.output
        assert lynx("check", out[algo]).exit_code == 0
    return out


def _policies(plan: dict, mode: str) -> list[dict]:
    return [p for st in plan["stages"] for p in st["policies"] if p["mode"] == mode]


def _swap(items: list, i: int, j: int) -> None:
    items[i], items[j] = items[j], items[i]


# (name, which plan, edit, what `check` must say)
EDITS: list[tuple[str, str, Callable[[dict], None], str]] = [
    # what the runtime acts on
    ("full relabelled none", "full", lambda d: _policies(d, "full")[0].update(mode="none"), "mode 'none'"),
    ("selective relabelled none", "heu", lambda d: _policies(d, "selective")[0].update(mode="none"), "mode 'none'"),
    ("none relabelled full", "heu", lambda d: _policies(d, "none")[0].update(mode="full"), "mode 'full'"),
    ("stage indices swapped", "heu", lambda d: [x[i].update(stage=1 - i) for x in (d["stages"], d["predicted"][
        "stages"]) for i in (0, 1)], "stages[0]: stage index 1, expected 0"),
    ("layer_names swapped", "heu", lambda d: _swap(d["stages"][0]["layer_names"], 1, 2), "layer_names"),
    ("layer_names duplicated", "heu", lambda d: d["stages"][0]["layer_names"].__setitem__(2, "layers.0"),
     "layer_names"),
    ("layer_names nonexistent", "heu", lambda d: d["stages"][1]["layer_names"].__setitem__(0, "layers.99"),
     "layer_names"),
    ("layer_names missing", "heu", lambda d: d["stages"][1]["layer_names"].pop(), "layer_names"),
    ("parallel.tp", "heu", lambda d: d["parallel"].update(tp=4), "parallel.tp"),
    ("parallel.pp", "heu", lambda d: d["parallel"].update(pp=4), "parallel.pp"),
    ("parallel.dp", "heu", lambda d: d["parallel"].update(dp=2), "parallel.dp"),
    ("parallel.num_microbatches", "heu", lambda d: d["parallel"].update(num_microbatches=16),
     "parallel.num_microbatches"),
    ("parallel.schedule", "heu", lambda d: d["parallel"].update(schedule="gpipe"), "parallel.schedule"),
    ("precision", "heu", lambda d: d.update(dtype="fp16"), "dtype 'fp16' differs"),
    ("recompute order reversed", "heu", lambda d: _policies(d, "selective")[0]["recompute"].reverse(),
     "not a legal order"),
    ("recompute lists an op twice", "heu", lambda d: _policies(d, "selective")[0]["recompute"].append(
        _policies(d, "selective")[0]["recompute"][-1]), "twice"),
    ("recompute drops a needed op", "heu", lambda d: _policies(d, "selective")[0]["recompute"].pop(),
     "neither kept nor recomputed"),
    ("keep names an unknown op", "heu", lambda d: _policies(d, "selective")[0]["keep"].append(
        "attn.proj:tp_all_reduce#0x"), "does not have"),
    ("a placement with nothing to recompute", "heu", lambda d: _policies(d, "none")[0].update(at="grad_wait"),
     "nothing is recomputed"),
    # what a user reads
    ("algo bogus", "heu", lambda d: d.update(algo="bogus"), "not a known algorithm"),
    ("solver.name differs from algo", "heu", lambda d: d["solver"].update(name="opt"), "solver.name"),
    ("optimal with gap -5", "heu", lambda d: d.update(algo="opt") or d["solver"].update(
        name="opt", status="optimal", gap=-5.0), "gap -5.0 is negative"),
    ("optimal beyond the solver's tolerance", "heu", lambda d: d.update(algo="opt") or d["solver"].update(
        name="opt", status="optimal", gap=0.05), "optimal"),
    ("optimal with no gap", "heu", lambda d: d.update(algo="opt") or d["solver"].update(
        name="opt", status="optimal", gap=None), "optimal"),
    ("a heuristic claims optimal", "heu", lambda d: d["solver"].update(status="optimal", gap=0.0), "heuristic"),
    ("negative search time", "heu", lambda d: d["solver"].update(search_time_s=-1.0), "search_time_s"),
    ("iteration time", "heu", lambda d: d["predicted"].update(iteration_time_s=0.5), "iteration_time_s"),
    ("ideal time", "heu", lambda d: d["predicted"].update(ideal_iteration_time_s=0.7), "ideal_iteration_time_s"),
    ("stage peak", "heu", lambda d: d["predicted"]["stages"][1].update(peak_memory_bytes=7 << 30),
     "stage 1 peak_memory_bytes"),
    ("stage peak by one byte", "heu", lambda d: d["predicted"]["stages"][0].update(
        peak_memory_bytes=d["predicted"]["stages"][0]["peak_memory_bytes"] - 1), "stage 0 peak_memory_bytes"),
    ("stage static", "heu", lambda d: d["predicted"]["stages"][0].update(static_bytes=0), "static_bytes"),
    ("stage activation", "heu", lambda d: d["predicted"]["stages"][0].update(activation_bytes=1), "activation_bytes"),
    ("stage busy", "heu", lambda d: d["predicted"]["stages"][0].update(busy_time_s=0.1), "busy_time_s"),
    ("stage exposed", "heu", lambda d: d["predicted"]["stages"][0].update(exposed_recompute_s=0.0),
     "exposed_recompute_s"),
    ("stage hidden", "heu", lambda d: d["predicted"]["stages"][1].update(hidden_recompute_s=0.5),
     "hidden_recompute_s"),
    ("predicted stage index", "heu", lambda d: d["predicted"]["stages"][1].update(stage=5), "stage index"),
    ("predicted stage dropped", "heu", lambda d: d["predicted"]["stages"].pop(), "predicted has 1 stages"),
]


@pytest.mark.parametrize("name,which,edit,needle", EDITS, ids=[e[0] for e in EDITS])
def test_check_catches_each_edit(plans, tmp_path, name, which, edit, needle):
    data = json.loads(plans[which].read_text())
    edit(data)
    bad = plans["dir"] / f"edited-{tmp_path.name}.json"  # beside its profile, as a user's plan would be
    bad.write_text(json.dumps(data, allow_nan=False))
    r = lynx("check", bad)
    assert r.exit_code == 1, (name, r.output)
    assert needle in r.stdout, (name, r.stdout)
    assert "ok:" not in r.stdout


def test_check_api_reports_non_finite_numbers(plans):
    """A plan built in Python (not read from a file) with a NaN figure is not valid either."""
    plan = load_model(plans["heu"], Plan)
    profile = load_model(plans["profile"], Profile)
    assert evaluate.check(plan, profile) == []
    for field in ("iteration_time_s", "ideal_iteration_time_s"):
        for bad in (math.nan, math.inf):
            edited = plan.model_copy(update={"predicted": plan.predicted.model_copy(update={field: bad})})
            problems = evaluate.check(edited, profile)
            assert any(f"predicted.{field}" in p and "finite" in p for p in problems), problems


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_plan_files_are_strict_json(plans, tmp_path, literal):
    text = plans["heu"].read_text()
    old = json.dumps(json.loads(text)["predicted"]["iteration_time_s"])
    bad = tmp_path / "nan.json"
    bad.write_text(text.replace(old, literal, 1))
    for cmd in ("check", "simulate"):
        r = lynx(cmd, bad, "--profile", plans["profile"])
        assert r.exit_code == 2, r.output
        assert str(bad) in r.stderr and "predicted.iteration_time_s" in r.stderr, r.stderr


def test_profile_with_infinite_time_is_refused(plans, tmp_path):
    data = json.loads(plans["profile"].read_text())
    op = data["blocks"]["gpt_layer"]["ops"][3]
    prof = tmp_path / "inf.json"
    prof.write_text(json.dumps(data).replace(json.dumps(op["fwd_s"]), "Infinity", 1))
    out = tmp_path / "plan.json"
    r = lynx("plan", prof, "--algo", "full", "-o", out)
    assert r.exit_code == 2, r.output
    assert str(prof) in r.stderr and "fwd_s" in r.stderr and "Infinity" in r.stderr, r.stderr
    assert not out.exists()


def test_non_finite_numbers_are_never_written(plans, tmp_path, monkeypatch):
    """A NaN that reaches the writer (here: an evaluation made without the ideal) is refused, not written."""
    from lynx_planner import solvers

    real = solvers.evaluate
    monkeypatch.setattr(solvers, "evaluate", lambda profile, stages: real(profile, stages, ideal=False))
    out = tmp_path / "plan.json"
    r = lynx("plan", plans["profile"], "--algo", "full", "-o", out)
    assert r.exit_code == 2, r.output
    assert "ideal_iteration_time_s" in r.stderr
    assert not out.exists()


def test_check_prints_simulated_figures_not_claimed_ones(plans, tmp_path, monkeypatch):
    """Even if the comparison of predicted figures were lost, what `check` prints comes from its own simulation."""
    data = json.loads(plans["heu"].read_text())
    data["predicted"]["iteration_time_s"] = 9.8765
    for st in data["predicted"]["stages"]:
        st["peak_memory_bytes"] = 1
    bad = plans["dir"] / "claims.json"
    bad.write_text(json.dumps(data))
    monkeypatch.setattr(evaluate, "_check_predicted", lambda *a: [])
    r = lynx("check", bad)
    assert r.exit_code == 0, r.output
    sim = json.loads(plans["heu"].read_text())["predicted"]
    peak = max(s["peak_memory_bytes"] for s in sim["stages"])
    assert "9.8765" not in r.stdout and "0.00 GiB" not in r.stdout, r.stdout
    assert f"{sim['iteration_time_s']:.4f} s" in r.stdout and f"{peak / 2**30:.2f} GiB" in r.stdout, r.stdout


def test_optimal_means_the_milps_tolerance():
    from lynx_planner.solvers.milp import REL_GAP

    assert evaluate.SOLVER_REL_GAP == REL_GAP


def test_check_finds_the_profile_beside_the_plan_first(plans, tmp_path, monkeypatch):
    """A same-named profile in the working directory must not shadow the one beside the plan."""
    data = json.loads(plans["heu"].read_text())
    data["profile_path"] = "p.json"
    (plans["dir"] / "rel.json").write_text(json.dumps(data))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    (cwd / "p.json").write_text(plans["profile"].read_text() + "\n")  # another profile, same name
    monkeypatch.chdir(cwd)
    r = lynx("check", plans["dir"] / "rel.json")
    assert r.exit_code == 0, r.output
    assert str(plans["dir"] / "p.json") in r.stdout
