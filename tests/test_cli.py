"""The `lynx` commands end to end (in-process with typer's CliRunner; one subprocess run for the console script)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import lynx

from lynx_planner import solvers
from lynx_planner.io import file_sha256, load_model
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import Plan, Profile

BASELINES = ["none", "full", "selective", "uniform", "block"]
COMPARE_KEYS = {"algo", "iteration_time_s", "speedup_vs_full", "peak_memory_bytes", "fits", "search_time_s"}



@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prof") / "gpt-1.3b.json"
    r = lynx("profile", "gpt-1.3b", "--tp", "2", "--pp", "2", "--micro-batch-size", "2", "--num-microbatches", "4",
             "--dropout", "0.1", "-o", path)
    assert r.exit_code == 0, r.output
    return path


@pytest.fixture(scope="module")
def limits(profile_path) -> dict[str, int]:
    """A limit between full's peak and none's peak (none does not fit, full does)."""
    profile = load_model(profile_path, Profile)
    none = solvers.solve(profile, "none", 2**62).evaluation.peak_bytes
    full = solvers.solve(profile, "full", 2**62).evaluation.peak_bytes
    return {"tight": (none + full) // 2, "none": none, "full": full}


@pytest.mark.parametrize("cmd", ["profile", "plan", "compare", "simulate", "check", "apply", "bench", "models",
                                 "hardware", "schema", "tune", "export", "validate"])
def test_help(cmd):
    r = lynx(cmd, "--help")
    assert r.exit_code == 0
    assert "Usage" in r.output
    # an option's value list folded across lines (`<1f1b|gpipe|interle` / `aved-1f1b|...>`) is unreadable: long
    # choice lists get a short metavar and are spelled out in the help text
    folded = re.findall(r"<[\w.-]+\|[\w.|-]*\s", r.output)
    assert not folded, folded


def test_top_level_help_lists_commands():
    r = lynx("--help")
    assert r.exit_code == 0
    for cmd in ("profile", "plan", "compare", "simulate", "check", "apply", "bench", "models", "hardware", "schema"):
        assert cmd in r.output


def test_console_script():
    exe = shutil.which("lynx")
    cmd = [exe] if exe else [sys.executable, "-m", "lynx_planner.cli"]
    r = subprocess.run(cmd + ["models"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "gpt-22b" in r.stdout


def test_models_and_hardware():
    r = lynx("models")
    assert r.exit_code == 0
    for name in ("gpt-1.3b", "gpt-2.7b", "gpt-6.7b", "gpt-13b", "gpt-20b", "gpt-22b", "gpt-175b"):
        assert name in r.stdout
    r = lynx("hardware")
    assert r.exit_code == 0
    for name in ("v100-32g-nvlink", "a100-40g-nvlink", "a100-80g-nvlink", "a100-80g-pcie", "h100-80g-nvlink"):
        assert name in r.stdout


@pytest.mark.parametrize("which", ["profile", "plan"])
def test_schema(which):
    r = lynx("schema", which)
    assert r.exit_code == 0
    schema = json.loads(r.stdout)
    assert "schema_version" in schema["properties"]


def test_profile_defaults(profile_path, tmp_path):
    out = tmp_path / "p.json"
    r = lynx("profile", "gpt-13b", "--tp", "4", "--pp", "4", "-o", out)
    assert r.exit_code == 0, r.output
    p = load_model(out, Profile)
    assert p.hardware.name == "a100-80g-nvlink"
    assert (p.parallel.tp, p.parallel.pp, p.parallel.dp) == (4, 4, 1)
    assert p.parallel.num_microbatches == 8  # 2·pp
    assert p.parallel.seq_len == 2048 and p.parallel.micro_batch_size == 1
    assert p.attention == "flash" and p.dropout == 0.0 and p.method == "analytic"
    assert "wrote" in r.stdout
    assert p.parallel.overlap_p2p_comm  # torch's schedules overlap their sends


def test_profile_blocking_sends_as_megatron_1f1b_runs_them(tmp_path):
    out = tmp_path / "p.json"
    assert lynx("profile", "gpt-1.3b", "--pp", "2", "--no-overlap-p2p-communication", "-o", out).exit_code == 0
    assert not load_model(out, Profile).parallel.overlap_p2p_comm


def test_profile_options(tmp_path):
    hw = tmp_path / "hw.json"
    hw.write_text(HARDWARE["h100-80g-nvlink"].model_copy(update={"name": "my-h100"}).model_dump_json())
    out = tmp_path / "p.json"
    r = lynx("profile", "gpt-2.7b", "--hardware", hw, "--tp", "2", "--pp", "2", "--dp", "4", "--sequence-parallel",
             "--attention", "math", "--dropout", "0.1", "--schedule", "gpipe", "--distributed-optimizer",
             "--seq-len", "1024", "--num-microbatches", "3", "-o", out)
    assert r.exit_code == 0, r.output
    p = load_model(out, Profile)
    assert p.hardware.name == "my-h100"
    assert p.parallel.sequence_parallel and p.parallel.schedule == "gpipe" and p.parallel.distributed_optimizer
    assert p.parallel.dp == 4 and p.parallel.seq_len == 1024 and p.parallel.num_microbatches == 3
    assert p.attention == "math" and p.dropout == 0.1


def test_profile_model_file_uses_profiler(tmp_path, monkeypatch):
    from lynx_planner.analytic import gpt_profile
    from lynx_planner.models.catalog import MODELS

    calls = {}

    def profile_model_file(path, **kw):
        calls.update(kw, path=path)
        return gpt_profile(MODELS["gpt-1.3b"], kw["parallel"], kw["hardware"], kw["attention"] or "flash")

    monkeypatch.setitem(sys.modules, "lynx_planner.profiler",
                        types.SimpleNamespace(profile_model_file=profile_model_file))
    model = tmp_path / "model.py"
    model.write_text("import torch\n")
    out = tmp_path / "p.json"
    r = lynx("profile", model, "--tp", "2", "--pp", "2", "--method", "measure", "--device", "cpu", "-o", out)
    assert r.exit_code == 0, r.output
    assert calls["path"] == str(model) and calls["method"] == "measure" and calls["device"] == "cpu"
    # a model file gets --attention (and --seq-len, --micro-batch-size) only when given: it may not take them
    assert calls["parallel"].tp == 2 and calls["attention"] is None and calls["progress"] is True
    assert out.is_file()


@pytest.mark.parametrize("algo", BASELINES)
def test_plan_and_check_every_baseline(algo, profile_path, limits, tmp_path):
    out = tmp_path / f"{algo}.json"
    limit = limits["none"] + 2**30 if algo in ("none", "selective") else limits["tight"]
    r = lynx("plan", profile_path, "--algo", algo, "-o", out, "--memory-limit", str(limit))
    assert r.exit_code == 0, r.output
    assert "iteration time" in r.stdout
    plan = load_model(out, Plan)
    assert plan.algo == algo and plan.memory_limit_bytes == limit
    assert plan.profile_path == str(profile_path)
    assert plan.profile_sha256 == file_sha256(profile_path)
    assert max(s.peak_memory_bytes for s in plan.predicted.stages) <= limit
    r = lynx("check", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("ok:")


def test_plan_default_limit_is_device_memory_less_the_reserve(profile_path, tmp_path):
    out = tmp_path / "plan.json"
    r = lynx("plan", profile_path, "--algo", "full", "-o", out)
    assert r.exit_code == 0, r.output
    device = load_model(profile_path, Profile).hardware.memory_bytes
    assert device == 80 * 2**30
    # docs/accuracy.md: 1 GiB (context, NCCL, cuBLAS workspaces) + 4 % (fragmentation) of the device
    assert load_model(out, Plan).memory_limit_bytes == device - 2**30 - int(0.04 * device) == 81389630260


def test_plan_partition_option(profile_path, tmp_path):
    out = tmp_path / "plan.json"
    r = lynx("plan", profile_path, "--algo", "block", "--partition", "even", "-o", out)
    assert r.exit_code == 0, r.output


def test_reproducible_plans_are_byte_identical(profile_path, limits, tmp_path):
    a, b, c, d = (tmp_path / f"{x}.json" for x in "abcd")
    for path in (a, b):
        r = lynx("plan", profile_path, "--algo", "block", "--memory-limit", str(limits["tight"]), "--reproducible",
                 "-o", path)
        assert r.exit_code == 0, r.output
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text())["solver"]["search_time_s"] == 0.0
    for path in (c, d):
        assert lynx("plan", profile_path, "--algo", "block", "--memory-limit", str(limits["tight"]),
                    "-o", path).exit_code == 0
    pc, pd = json.loads(c.read_text()), json.loads(d.read_text())
    pc["solver"].pop("search_time_s"), pd["solver"].pop("search_time_s")
    assert pc == pd


def test_compare_json(profile_path, limits):
    r = lynx("compare", profile_path, "--memory-limit", str(limits["tight"]), "--algos", ",".join(BASELINES),
             "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["algo"] for row in rows] == BASELINES
    for row in rows:
        assert set(row) == COMPARE_KEYS
        assert isinstance(row["fits"], bool)
        assert isinstance(row["peak_memory_bytes"], int)
    by = {row["algo"]: row for row in rows}
    assert by["full"]["speedup_vs_full"] == pytest.approx(1.0)
    assert by["full"]["fits"] and by["full"]["iteration_time_s"] > 0
    assert not by["none"]["fits"] and by["none"]["iteration_time_s"] is None
    assert by["none"]["peak_memory_bytes"] == limits["none"]  # the least peak it reaches
    assert by["block"]["speedup_vs_full"] >= 1.0


def test_compare_default_runs_every_algorithm(profile_path, monkeypatch):
    """Algorithms whose module does not exist yet are 'not available', not a crash."""
    real = solvers.solve

    def solve(profile, algo, *a, **kw):
        if algo not in BASELINES:
            raise ModuleNotFoundError(f"No module named 'lynx_planner.solvers.{algo}'", name=f"x.{algo}")
        return real(profile, algo, *a, **kw)

    monkeypatch.setattr(solvers, "solve", solve)
    r = lynx("compare", profile_path, "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["algo"] for row in rows] == list(solvers.ALGOS)
    heu = next(row for row in rows if row["algo"] == "heu")
    assert heu["fits"] is False and heu["iteration_time_s"] is None
    assert "not available" in r.stderr
    r = lynx("compare", profile_path)
    assert r.exit_code == 0, r.output
    assert "n/a" in r.stdout and "full" in r.stdout


def test_compare_table(profile_path, limits):
    r = lynx("compare", profile_path, "--memory-limit", str(limits["tight"]), "--algos", "none,full,block")
    assert r.exit_code == 0, r.output
    assert "needs" in r.stdout and "yes" in r.stdout


@pytest.fixture(scope="module")
def plan_path(profile_path, limits, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "block.json"
    r = lynx("plan", profile_path, "--algo", "block", "--memory-limit", str(limits["tight"]), "-o", out)
    assert r.exit_code == 0, r.output
    return out


def test_simulate(plan_path, profile_path, tmp_path):
    r = lynx("simulate", plan_path)
    assert r.exit_code == 0, r.output
    assert "iteration time" in r.stdout
    r = lynx("simulate", plan_path, "--profile", profile_path, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == json.loads(plan_path.read_text())["predicted"]


def test_simulate_trace(plan_path, tmp_path):
    trace = tmp_path / "trace.json"
    r = lynx("simulate", plan_path, "--trace", trace)
    assert r.exit_code == 0, r.output
    data = json.loads(trace.read_text())
    assert data["displayTimeUnit"] == "ms"
    events = data["traceEvents"]
    pp = load_model(plan_path, Plan).parallel.pp
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == set(range(pp))
    for e in spans:
        assert isinstance(e["tid"], int) and e["dur"] > 0 and e["ts"] >= 0 and e["name"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(s, f"stage {s}") for s in range(pp)}
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in spans} <= threads


def test_check_detects_tampering(plan_path, profile_path, tmp_path):
    plan = json.loads(plan_path.read_text())
    plan["predicted"]["iteration_time_s"] *= 0.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(plan))
    r = lynx("check", bad)
    assert r.exit_code == 1
    assert "disagrees" in r.stdout

    plan = json.loads(plan_path.read_text())
    plan["memory_limit_bytes"] = 1
    bad.write_text(json.dumps(plan))
    r = lynx("check", bad)
    assert r.exit_code == 1 and "exceeds" in r.stdout


def test_check_profile_hash_mismatch(plan_path, profile_path, tmp_path):
    other = tmp_path / "changed.json"
    other.write_text(profile_path.read_text() + "\n")
    r = lynx("check", plan_path, "--profile", other)
    assert r.exit_code == 1
    assert "profile_sha256" in r.stdout


def test_apply_dry_run(plan_path, tmp_path, monkeypatch):
    model = tmp_path / "model.py"
    model.write_text("")
    rows = [{"stage": 0, "layer": 1, "module": "layers.0", "mode": "full", "keep": [], "recompute": ["a", "b"],
             "at": "on_demand"}]
    monkeypatch.setitem(sys.modules, "lynx_planner.runtime", types.SimpleNamespace(dry_run=lambda p, m: rows))
    r = lynx("apply", plan_path, model, "--dry-run")
    assert r.exit_code == 0, r.output
    assert "layers.0" in r.stdout and "on_demand" in r.stdout


def test_apply_without_dry_run_explains(plan_path, tmp_path):
    model = tmp_path / "model.py"
    model.write_text("")
    r = lynx("apply", plan_path, model)
    assert r.exit_code == 2
    assert "apply_plan" in r.stderr


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gpt_model.py"


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="examples/gpt_model.py not present")
def test_model_file_end_to_end(tmp_path):
    """profile a model file, plan it, check the plan, and dry-run it on the model."""
    prof, plan = tmp_path / "p.json", tmp_path / "plan.json"
    r = lynx("profile", EXAMPLE, "--tp", "2", "--pp", "2", "--seq-len", "64", "-o", prof)
    assert r.exit_code == 0, r.output
    assert load_model(prof, Profile).model.source.endswith("gpt_model.py")
    r = lynx("plan", prof, "--algo", "full", "-o", plan)
    assert r.exit_code == 0, r.output
    assert lynx("check", plan).exit_code == 0
    r = lynx("apply", plan, EXAMPLE, "--dry-run")
    assert r.exit_code == 0, r.output
    assert "layers.0" in r.stdout and "on_demand" in r.stdout
