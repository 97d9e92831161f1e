"""Every kind of bad input exits 2 with a short message on stderr naming the file and field, no traceback, and leaves
no output file behind (shared/CONTRACT.md)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lynx_planner.cli import app
from lynx_planner.io import load_model
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import Profile
from lynx_planner.solvers import solve

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    profile = d / "profile.json"
    r = runner.invoke(app, ["profile", "gpt-1.3b", "--tp", "2", "--pp", "2", "-o", str(profile)])
    assert r.exit_code == 0, r.output
    plan = d / "plan.json"
    r = runner.invoke(app, ["plan", str(profile), "--algo", "full", "-o", str(plan)])
    assert r.exit_code == 0, r.output
    data = json.loads(profile.read_text())

    def write(name: str, text: str) -> Path:
        (d / name).write_text(text)
        return d / name

    files = {"profile": profile, "plan": plan, "dir": d}
    files["malformed"] = write("malformed.json", profile.read_text()[:200])
    files["empty"] = write("empty.json", "")
    files["v2"] = write("v2.json", json.dumps({**data, "schema_version": 2}))
    files["v3"] = write("v3.json", json.dumps({**data, "schema_version": 3}))  # plans read 1 and 2 (offload)
    files["nolayers"] = write("nolayers.json", json.dumps({k: v for k, v in data.items() if k != "layers"}))
    bad_type = json.loads(json.dumps(data))
    bad_type["parallel"]["tp"] = "four"
    files["badtype"] = write("badtype.json", json.dumps(bad_type))
    files["list"] = write("list.json", "[1, 2, 3]")
    hw = HARDWARE["a100-80g-nvlink"].model_dump()
    hw["memory_bytes"] = -1
    files["badhw"] = write("badhw.json", json.dumps(hw))
    files["binary"] = d / "binary.json"
    files["binary"].write_bytes(b"\xff\xfe\x00\x81")
    return files


def run_bad(args: list, out: Path | None = None, needle: str | tuple[str, ...] = ()):
    before = set(out.parent.iterdir()) if out is not None and out.parent.is_dir() else set()
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    assert r.stderr.strip(), "the reason goes to stderr"
    assert len(r.stderr.strip().splitlines()) <= 8, r.stderr
    for n in (needle,) if isinstance(needle, str) else needle:
        assert n in r.stderr, (n, r.stderr)
    if out is not None:
        assert not out.exists()
        if out.parent.is_dir():
            assert set(out.parent.iterdir()) == before, "a temporary file was left behind"
    return r


# --- input files ---------------------------------------------------------------------------------------------

FILE_CASES = [
    ("malformed", "not valid JSON"),
    ("empty", "not valid JSON"),
    ("binary", "cannot read"),
    ("v2", "schema_version"),
    ("nolayers", "layers"),
    ("badtype", "parallel.tp"),
    ("list", "profile"),
    ("missing", "no such file"),
]


@pytest.mark.parametrize("which,needle", FILE_CASES)
@pytest.mark.parametrize("cmd", ["plan", "compare"])
def test_bad_profile_file(files, tmp_path, cmd, which, needle):
    path = files.get(which, files["dir"] / "does-not-exist.json")
    out = tmp_path / "plan.json"
    args = [cmd, path] + (["--algo", "full", "-o", out] if cmd == "plan" else ["--algos", "full"])
    run_bad(args, out if cmd == "plan" else None, (str(path), needle) if which != "list" else str(path))


@pytest.mark.parametrize("which,needle", [c for c in FILE_CASES if c[0] != "list"])
@pytest.mark.parametrize("cmd", ["simulate", "check"])
def test_bad_plan_file(files, cmd, which, needle):
    path = files.get("v3" if which == "v2" else which, files["dir"] / "does-not-exist.json")
    if which in ("v2", "nolayers", "badtype"):
        needle = {"v2": "schema_version", "nolayers": "algo", "badtype": "algo"}[which]  # a profile is no plan
    run_bad([cmd, path], None, (str(path), needle))


def test_plan_given_for_profile(files, tmp_path):
    run_bad(["plan", files["plan"], "--algo", "full", "-o", tmp_path / "x.json"], tmp_path / "x.json",
            (str(files["plan"]), "field"))


@pytest.mark.parametrize("cmd", ["simulate", "check"])
def test_bad_profile_for_plan(files, cmd):
    run_bad([cmd, files["plan"], "--profile", files["malformed"]], None, (str(files["malformed"]), "not valid JSON"))


def test_plan_whose_recorded_profile_is_gone(files, tmp_path):
    data = json.loads(files["plan"].read_text())
    data["profile_path"] = str(tmp_path / "gone.json")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    run_bad(["check", plan], None, ("profile_path", "--profile"))


def test_simulate_plan_with_wrong_stage_count(files, tmp_path):
    other = tmp_path / "pp1.json"
    assert runner.invoke(app, ["profile", "gpt-1.3b", "--tp", "2", "--pp", "1", "-o", str(other)]).exit_code == 0
    run_bad(["simulate", files["plan"], "--profile", other], None, "stages")


# --- names ---------------------------------------------------------------------------------------------------


def test_unknown_model(tmp_path):
    out = tmp_path / "p.json"
    run_bad(["profile", "gpt-99b", "-o", out], out, ("gpt-99b", "gpt-13b"))


def test_missing_model_file(tmp_path):
    out = tmp_path / "p.json"
    run_bad(["profile", tmp_path / "nope.py", "-o", out], out, "nope.py")


def test_unknown_hardware(tmp_path):
    out = tmp_path / "p.json"
    run_bad(["profile", "gpt-1.3b", "--hardware", "tpu-v9", "-o", out], out, ("--hardware", "tpu-v9"))


def test_invalid_hardware_file(files, tmp_path):
    out = tmp_path / "p.json"
    run_bad(["profile", "gpt-1.3b", "--hardware", files["badhw"], "-o", out], out, (str(files["badhw"]),
                                                                                     "memory_bytes"))


def test_unknown_algo(files, tmp_path):
    out = tmp_path / "plan.json"
    run_bad(["plan", files["profile"], "--algo", "magic", "-o", out], out, ("--algo", "magic"))
    run_bad(["compare", files["profile"], "--algos", "full,magic"], None, ("--algos", "magic"))


@pytest.mark.parametrize("choice", [["--attention", "sparse"], ["--method", "guess"], ["--schedule", "zb"],
                                    ["--device", "tpu"], ["--tp", "0"], ["--pp", "-2"], ["--tp", "two"]])
def test_bad_option_values(choice, tmp_path):
    out = tmp_path / "p.json"
    run_bad(["profile", "gpt-1.3b", *choice, "-o", out], out, choice[0])


def test_schema_unknown():
    run_bad(["schema", "weights"], None, "weights")


# --- sizes and numbers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", ["-5GB", "0", "0GiB", "lots", "12XB", ""])
def test_bad_sizes(files, tmp_path, size):
    out = tmp_path / "plan.json"
    run_bad(["plan", files["profile"], "--algo", "full", "--memory-limit", size, "-o", out], out, "--memory-limit")
    run_bad(["compare", files["profile"], "--memory-limit", size, "--algos", "full"], None, "--memory-limit")


@pytest.mark.parametrize("dropout", ["1", "1.5", "-0.1"])
def test_bad_dropout(tmp_path, dropout):
    out = tmp_path / "p.json"
    run_bad(["profile", "gpt-1.3b", "--dropout", dropout, "-o", out], out, "--dropout")


def test_tp_must_divide_heads(tmp_path):
    out = tmp_path / "p.json"
    run_bad(["profile", "gpt-1.3b", "--tp", "3", "-o", out], out, ("--tp 3", "heads"))


def test_more_stages_than_layers(tmp_path):
    out = tmp_path / "p.json"
    run_bad(["profile", "gpt-1.3b", "--pp", "64", "-o", out], out, ("gpt-1.3b", "pp"))


def test_sequence_parallel_needs_tp(tmp_path):
    out = tmp_path / "p.json"
    run_bad(["profile", "gpt-1.3b", "--sequence-parallel", "-o", out], out, "sequence_parallel")


def test_measure_needs_model_file(tmp_path):
    out = tmp_path / "p.json"
    run_bad(["profile", "gpt-1.3b", "--method", "measure", "-o", out], out, ("--method measure", "model file"))


def test_bad_time_limit(files, tmp_path):
    out = tmp_path / "plan.json"
    run_bad(["plan", files["profile"], "--algo", "full", "--time-limit", "-1", "-o", out], out, "--time-limit")


# --- memory that no strategy meets ------------------------------------------------------------------------------


def test_memory_limit_below_full_recomputation(files, tmp_path):
    profile = load_model(files["profile"], Profile)
    full = solve(profile, "full", 2**62).evaluation.peak_bytes
    out = tmp_path / "plan.json"
    r = run_bad(["plan", files["profile"], "--algo", "full", "--memory-limit", "1GiB", "-o", out], out, "needs")
    assert f"{full / 2**30:.2f} GiB" in r.stderr  # the minimum needed
    r = run_bad(["plan", files["profile"], "--algo", "none", "--memory-limit", "1GiB", "-o", out], out, "needs")
    assert f"full recomputation needs {full / 2**30:.2f} GiB" in r.stderr


# --- outputs -------------------------------------------------------------------------------------------------


def test_output_in_missing_directory(files, tmp_path):
    out = tmp_path / "no" / "such" / "dir" / "x.json"
    run_bad(["profile", "gpt-1.3b", "-o", out], out, ("does not exist", str(out.parent)))
    run_bad(["plan", files["profile"], "--algo", "full", "-o", out], out, "does not exist")
    run_bad(["simulate", files["plan"], "--trace", out], out, "does not exist")


def test_output_is_a_directory(files, tmp_path):
    run_bad(["plan", files["profile"], "--algo", "full", "-o", tmp_path], None, "directory")


def test_existing_output_untouched_on_failure(files, tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("previous")
    r = runner.invoke(app, ["plan", str(files["profile"]), "--algo", "full", "--memory-limit", "1GiB", "-o", str(out)])
    assert r.exit_code == 2
    assert out.read_text() == "previous"


# --- model files and the runtime ------------------------------------------------------------------------------


def test_failing_model_file(tmp_path, monkeypatch):
    def profile_model_file(path, **kw):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setitem(sys.modules, "lynx_planner.profiler",
                        types.SimpleNamespace(profile_model_file=profile_model_file))
    model = tmp_path / "model.py"
    model.write_text("raise SystemExit\n")
    out = tmp_path / "p.json"
    run_bad(["profile", model, "-o", out], out, (str(model), "mat1 and mat2"))


def test_apply_needs_dry_run_and_a_model_file(files, tmp_path):
    run_bad(["apply", files["plan"], tmp_path / "nope.py", "--dry-run"], None, "nope.py")
    model = tmp_path / "m.py"
    model.write_text("")
    run_bad(["apply", files["plan"], model], None, "--dry-run")


def test_bench_bad_suite(tmp_path):
    run_bad(["bench", "--suite", tmp_path, "--out", tmp_path / "out"], None, "suite.json")
    (tmp_path / "suite.json").write_text(json.dumps([{"profile": "nope.json", "memory_limits": ["1GiB"]}]))
    run_bad(["bench", "--suite", tmp_path, "--out", tmp_path / "out"], None, ("[0].profile", "nope.json"))


def test_compare_when_nothing_fits(files):
    """compare still prints its results, then reports the limit no strategy meets (exit 2)."""
    r = runner.invoke(app, ["compare", str(files["profile"]), "--memory-limit", "1GiB", "--algos", "none,full",
                            "--json"])
    assert r.exit_code == 2, r.output
    rows = json.loads(r.stdout)
    assert [row["fits"] for row in rows] == [False, False]
    assert "least needed" in r.stderr and "full" in r.stderr


# --- nothing destroyed: outputs only replace regular files, never an input ------------------------------------


def test_output_equal_to_an_input_is_refused(files, tmp_path):
    prof = tmp_path / "p.json"
    prof.write_bytes(files["profile"].read_bytes())
    before = prof.read_bytes()
    run_bad(["plan", prof, "--algo", "full", "-o", prof], None, ("-o", "input"))
    (tmp_path / "alias.json").symlink_to(prof)
    run_bad(["plan", prof, "--algo", "full", "-o", tmp_path / "alias.json"], None, "input")
    run_bad(["plan", tmp_path / "alias.json", "--algo", "full", "-o", prof], None, "input")
    assert prof.read_bytes() == before
    plan = tmp_path / "plan.json"
    plan.write_bytes(files["plan"].read_bytes())
    plan_bytes = plan.read_bytes()
    run_bad(["simulate", plan, "--profile", files["profile"], "--trace", plan], None, ("--trace", "input"))
    run_bad(["simulate", plan, "--profile", prof, "--trace", prof], None, ("--trace", "input"))
    assert plan.read_bytes() == plan_bytes and prof.read_bytes() == before
    model = tmp_path / "model.py"
    model.write_text("raise SystemExit('must not run')\n")
    run_bad(["profile", model, "-o", model], None, "input")
    assert model.read_text() == "raise SystemExit('must not run')\n"


def test_outputs_never_replace_what_is_not_a_regular_file(files, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    run_bad(["plan", files["profile"], "--algo", "full", "-o", fifo], None, "not a regular file")
    run_bad(["simulate", files["plan"], "--trace", fifo], None, "not a regular file")
    run_bad(["profile", "gpt-1.3b", "-o", fifo], None, "not a regular file")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"], "no temporary file left behind"


def test_output_through_a_symlink_replaces_the_file_it_names(files, tmp_path):
    """A symlink to a regular file is followed (decision: the link stays, the plan lands where it points)."""
    (tmp_path / "plans").mkdir()
    target = tmp_path / "plans" / "v1.json"
    target.write_text("old")
    link = tmp_path / "plan.json"
    link.symlink_to(target)
    r = runner.invoke(app, ["plan", str(files["profile"]), "--algo", "full", "-o", str(link)])
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and json.loads(target.read_text())["algo"] == "full"
    assert sorted(p.name for p in (tmp_path / "plans").iterdir()) == ["v1.json"]


def test_written_files_get_the_umasks_mode(files, tmp_path):
    old = os.umask(0o027)
    try:
        new = tmp_path / "new.json"
        assert runner.invoke(app, ["plan", str(files["profile"]), "--algo", "full", "-o", str(new)]).exit_code == 0
        assert stat.S_IMODE(new.stat().st_mode) == 0o640
        kept = tmp_path / "kept.json"
        kept.write_text("old")
        kept.chmod(0o604)
        assert runner.invoke(app, ["plan", str(files["profile"]), "--algo", "full", "-o", str(kept)]).exit_code == 0
        assert stat.S_IMODE(kept.stat().st_mode) == 0o604, "a replaced file keeps its mode"
    finally:
        os.umask(old)


# --- limits: fail fast with a message ----------------------------------------------------------------------------


@pytest.mark.parametrize("option,value", [("--num-microbatches", "10000000"), ("--num-microbatches", "4097"),
                                          ("--seq-len", "1000000000"), ("--micro-batch-size", "1000000"),
                                          ("--dp", "100000000"), ("--tp", "100000")])
def test_sizes_are_bounded(tmp_path, option, value):
    out = tmp_path / "p.json"
    t0 = time.process_time()
    run_bad(["profile", "gpt-1.3b", option, value, "-o", out], out, (option, "less than or equal"))
    assert time.process_time() - t0 < 5


def test_profile_file_with_too_many_microbatches_is_refused_fast(files, tmp_path):
    data = json.loads(files["profile"].read_text())
    data["parallel"]["num_microbatches"] = 1_000_000
    prof = tmp_path / "big.json"
    prof.write_text(json.dumps(data))
    out = tmp_path / "plan.json"
    t0 = time.process_time()
    run_bad(["plan", prof, "--algo", "heu", "-o", out], out, (str(prof), "parallel.num_microbatches"))
    run_bad(["compare", prof, "--algos", "full"], None, "parallel.num_microbatches")
    assert time.process_time() - t0 < 5


@pytest.mark.parametrize("size", ["9" * 309, "1" * 400 + "GiB", "9" * 30, "99999999999TiB"])
def test_huge_sizes_are_input_errors(files, tmp_path, size):
    out = tmp_path / "plan.json"
    run_bad(["plan", files["profile"], "--algo", "full", "--memory-limit", size, "-o", out], out,
            ("--memory-limit", "too large"))
    run_bad(["compare", files["profile"], "--memory-limit", size, "--algos", "full"], None, "too large")


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_time_limit_must_be_finite(files, tmp_path, value):
    out = tmp_path / "plan.json"
    run_bad(["plan", files["profile"], "--algo", "opt", "--time-limit", value, "-o", out], out, "--time-limit")


# --- model files that exit, and Ctrl-C ---------------------------------------------------------------------------


@pytest.mark.parametrize("body,code,needle", [("import sys\nsys.exit(0)\n", 2, "sys.exit(0)"),
                                              ("raise SystemExit(3)\n", 2, "sys.exit(3)"),
                                              ("raise SystemExit\n", 2, "sys.exit(None)"),
                                              ("raise KeyboardInterrupt\n", 130, "interrupted")])
def test_model_file_that_exits(tmp_path, body, code, needle):
    pytest.importorskip("torch")
    model = tmp_path / "model.py"
    model.write_text(body)
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["profile", str(model), "-o", str(out)])
    assert r.exit_code == code, (r.exit_code, r.output)
    assert needle in r.stderr and "Traceback" not in r.output, r.stderr
    if code == 2:
        assert str(model) in r.stderr
    assert not out.exists()


def _swallowing(real):
    """A solve that, like HiGHS inside pyomo, swallows the KeyboardInterrupt of a Ctrl-C and returns its result."""

    def solve(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):
                time.sleep(0.01)  # the handler runs here
        except KeyboardInterrupt:
            pass
        return real(*args, **kwargs)

    return solve


@pytest.fixture
def sigint_default():
    """Ctrl-C handled as a terminal's interactive session does, whatever pytest inherited (a background job or CI
    runner starts with SIGINT ignored, and lynx then rightly keeps ignoring it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _sigint_default_in_child() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # then Python installs its KeyboardInterrupt handler at start


def test_ctrl_c_swallowed_by_a_solver_still_exits_130(files, tmp_path, monkeypatch, sigint_default):
    from lynx_planner import solvers

    monkeypatch.setattr(solvers, "solve", _swallowing(solvers.solve))
    out = tmp_path / "plan.json"
    r = runner.invoke(app, ["plan", str(files["profile"]), "--algo", "full", "-o", str(out)])
    assert r.exit_code == 130, r.output
    assert not out.exists() and list(tmp_path.iterdir()) == []
    r = runner.invoke(app, ["compare", str(files["profile"]), "--algos", "full", "--json"])
    assert r.exit_code == 130, r.output
    assert r.stdout.strip() == "", "nothing printed as if the comparison had finished"


def _wait_for_highs(proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until HiGHS's library is loaded in the process (lynx imports it lazily, inside the command, once its Ctrl-C
    handler is installed)."""
    maps = Path(f"/proc/{proc.pid}/maps")
    if not maps.exists():
        pytest.skip("needs /proc to see when the solver starts")
    end = time.monotonic() + timeout
    while "highs" not in maps.read_text().lower():
        assert proc.poll() is None and time.monotonic() < end, "lynx ended or never started HiGHS"
        time.sleep(0.05)


def test_ctrl_c_during_highs_exits_130_and_writes_nothing(tmp_path):
    """The real thing: SIGINT while HiGHS solves OPT's MILP (qwen3-32b's bench case: about a minute), at two
    moments (two processes side by side), each of which must stop lynx within seconds, with exit 130 and no plan."""
    root = Path(__file__).resolve().parent.parent
    prof = root / "profiles" / "qwen3-32b-h100-80g-nvlink-tp4-sp-pp4-mb1-s4096-m16.json"
    delays, procs = (0.5, 3.0), []
    for i in range(len(delays)):
        procs.append(subprocess.Popen([sys.executable, "-m", "lynx_planner.cli", "plan", str(prof), "--algo", "opt",
                                       "--memory-limit", "40.3125GiB", "-o", str(tmp_path / f"plan{i}.json")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=root,
                                      preexec_fn=_sigint_default_in_child))
    for proc, delay in zip(procs, delays):
        _wait_for_highs(proc)  # the moments count from the solver's start, not from a start-up a loaded machine slows
        time.sleep(delay)
        assert proc.poll() is None, "OPT finished before the interrupt"
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, stderr = proc.communicate(timeout=90)
        assert proc.returncode == 130, (delay, proc.returncode, stderr.decode()[-500:])
        assert b"interrupted" in stderr
        assert time.monotonic() - t0 < 20, f"interrupt at {delay} s took {time.monotonic() - t0:.0f} s to stop lynx"
    assert list(tmp_path.iterdir()) == []
