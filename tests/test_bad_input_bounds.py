"""Bad inputs that used to get through: absurd sizes (bounded work and a clear message), outputs checked before the
work, a full stdout, a model file that exits hard, too many threads, plots written like every other output, and
`check` / `export` refusing what does not hold."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import lynx
from lynx_planner import tune
from lynx_planner.models.hardware import HARDWARE

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bounds")
    profile, plan = d / "profile.json", d / "plan.json"
    assert lynx("profile", "gpt-1.3b", "--tp", "2", "--pp", "2", "-o", profile).exit_code == 0
    assert lynx("plan", profile, "--algo", "heu", "--memory-limit", "20GiB", "-o", plan).exit_code == 0
    return {"dir": d, "profile": profile, "plan": plan}


def edited(files, tmp_path, name, change) -> Path:
    data = json.loads(files["plan"].read_text())
    change(data)
    data["profile_path"] = str(files["profile"])
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def run_cli(*args, stdout=None, timeout=120, limit_memory=False):
    """`lynx` in a child process (for real file descriptors and memory limits)."""
    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    return subprocess.run([sys.executable, "-m", "lynx_planner.cli", *map(str, args)], cwd=ROOT, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=limit if limit_memory else None)


# ----------------------------------------------------------------------------------------------------------------
# check, simulate and export of plans that do not hold


def test_check_of_a_policy_spanning_a_billion_layers_is_bounded(files, tmp_path):
    def huge(d):
        d["stages"][0]["policies"][0]["layers"] = [0, 1_000_000_000]

    path = edited(files, tmp_path, "huge.json", huge)
    for cmd, code in (("check", 1), ("simulate", 2)):
        r = run_cli(cmd, path, stdout=subprocess.PIPE, limit_memory=True, timeout=60)
        assert r.returncode == code, (cmd, r.stdout, r.stderr)
        assert "outside the stage" in r.stdout + r.stderr and "Traceback" not in r.stderr
    r = lynx("export", path, "--to", "megatron")
    assert r.exit_code == 2 and "outside the stage" in r.output


def test_check_refuses_a_limit_above_the_devices_memory(files, tmp_path):
    device = HARDWARE["a100-80g-nvlink"].memory_bytes
    path = edited(files, tmp_path, "big.json", lambda d: d.update(memory_limit_bytes=device + 1))
    r = lynx("check", path)
    assert r.exit_code == 1 and "exceeds the device's memory" in r.output
    at_device = edited(files, tmp_path, "device.json", lambda d: d.update(memory_limit_bytes=device))
    assert lynx("check", at_device).exit_code == 0


def test_export_refuses_a_plan_check_rejects(files, tmp_path):
    def slower(d):
        d["predicted"]["iteration_time_s"] *= 0.5

    path = edited(files, tmp_path, "wrong.json", slower)
    assert lynx("check", path).exit_code == 1
    for to in ("megatron", "torchtitan"):
        r = lynx("export", path, "--to", to)
        assert r.exit_code == 2 and "lynx check" in r.output and "iteration_time_s" in r.output
        assert "--tensor-model-parallel-size" not in r.output and "[parallelism]" not in r.output


def test_export_refuses_a_profile_that_changed(files, tmp_path):
    changed = tmp_path / "profile.json"
    data = json.loads(files["profile"].read_text())
    data["dropout"] = 0.0 if data.get("dropout") else 0.1
    changed.write_text(json.dumps(data))
    r = lynx("export", files["plan"], "--profile", changed, "--to", "megatron")
    assert r.exit_code == 2 and "profile_sha256" in r.output


def test_export_precision_flag_follows_the_profile(files):
    from lynx_planner.export import precision_flags
    from lynx_planner.io import load_model
    from lynx_planner.schema import Profile

    prof = load_model(files["profile"], Profile)
    assert precision_flags(prof) == ["--bf16"]  # analytic profiles are bf16
    assert precision_flags(prof.model_copy(update={"dtype": "fp32"})) == []
    assert precision_flags(prof.model_copy(update={"dtype": "fp16"})) == ["--fp16"]
    assert precision_flags(prof.model_copy(update={"dtype": "fp32", "autocast": "bf16"})) == ["--bf16"]
    r = lynx("export", files["plan"], "--to", "megatron")
    assert r.exit_code == 0 and "--bf16" in r.output and "--fp16" not in r.output


# ----------------------------------------------------------------------------------------------------------------
# tune: outputs first, bounded work, the right option blamed


def test_tune_out_checked_before_the_search(files, tmp_path, monkeypatch):
    out = tmp_path / "best"
    (out / "plan.json").mkdir(parents=True)
    (out / "profile.json").write_text("mine")
    searched = []
    monkeypatch.setattr(tune, "tune", lambda *a, **k: searched.append(1) or (_ for _ in ()).throw(SystemExit(9)))
    r = lynx("tune", "gpt-1.3b", "--gpus", "8", "--global-batch", "16", "--out", out)
    assert r.exit_code == 2 and "plan.json" in r.output
    assert (out / "profile.json").read_text() == "mine"
    assert not searched  # refused before the search starts


def test_tune_out_in_proc_is_a_clear_error():
    r = lynx("tune", "gpt-1.3b", "--gpus", "8", "--global-batch", "16", "--out", "/proc/lynx-no/x")
    assert r.exit_code == 2 and "--out" in r.output


def test_tune_with_a_trillion_gpus_returns_at_once():
    assert tune.divisors(10**12)[:4] == [1, 2, 4, 5] and len(tune.divisors(10**12)) == 169  # (12+1)^2
    assert tune.divisors(999999000001) == [1, 999999000001]  # a prime near 10^12: sqrt-bounded trial division
    t0 = time.process_time()
    r = lynx("tune", "gpt-1.3b", "--gpus", 10**12, "--global-batch", "16", "--time-limit", "5")
    assert r.exit_code == 2 and "--gpus" in r.output
    assert time.process_time() - t0 < 30


def test_tune_with_no_legal_layout_blames_the_global_batch():
    r = lynx("tune", "gpt-1.3b", "--gpus", "1024", "--global-batch", "3")
    assert r.exit_code == 2 and "--global-batch" in r.output and "--memory-limit" not in r.output


def test_tune_skips_layouts_with_too_many_micro_batches():
    from lynx_planner.schema import MAX_MICROBATCHES

    found = tune.layouts(8, HARDWARE["a100-80g-nvlink"], 8 * MAX_MICROBATCHES, 24, 16, 2048)
    assert found and all(l.num_microbatches <= MAX_MICROBATCHES for l in found)
    # dp 1 at micro-batch 1 would need 8 x 4096 micro-batches: skipped, while larger micro-batches stay
    assert not [l for l in found if l.dp == 1 and l.micro_batch_size == 1]
    assert [l for l in found if l.dp == 1 and l.micro_batch_size == 8]


# ----------------------------------------------------------------------------------------------------------------
# a full stdout


@pytest.mark.parametrize("args", [
    ["check", "{plan}"], ["models"], ["simulate", "{plan}"], ["export", "{plan}", "--to", "megatron"],
    ["compare", "{profile}", "--algos", "none,full"], ["plan", "{profile}", "--algo", "full", "-o", "{tmp}/p.json"],
    ["tune", "gpt-1.3b", "--gpus", "4", "--global-batch", "8", "--json", "--time-limit", "20"],
])
def test_a_full_stdout_is_exit_2_with_a_message(files, tmp_path, args):
    args = [a.format(plan=files["plan"], profile=files["profile"], tmp=tmp_path) for a in args]
    with open("/dev/full", "w") as full:
        r = run_cli(*args, stdout=full)
    assert r.returncode == 2, r.stderr
    assert "No space left" in r.stderr and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------------------------------------------
# model files and threads


def test_a_model_file_calling_os_exit_is_an_error_and_writes_nothing(tmp_path):
    model = tmp_path / "quits.py"
    model.write_text("import os\nos._exit(0)\n")
    out = tmp_path / "p.json"
    r = run_cli("profile", model, "-o", out, stdout=subprocess.PIPE)
    assert r.returncode == 2 and "os._exit(0)" in r.stderr and not out.exists()


@pytest.mark.parametrize("args", [["hardware", "calibrate", "-o", "{tmp}/hw.json"],
                                  ["profile", str(ROOT / "tests/models/own_llama.py"), "--method", "measure", "-o",
                                   "{tmp}/p.json"]])
def test_threads_beyond_the_machine_are_refused(tmp_path, args):
    r = lynx(*[a.format(tmp=tmp_path) for a in args], "--threads", "100000")
    assert r.exit_code == 2 and "--threads" in r.output and "CPUs" in r.output
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------------------------------------------
# plots are outputs like the others


def test_plot_gets_the_umask_mode_and_replaces_a_symlinks_target(files, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "real.png"
    target.write_bytes(b"old")
    link = tmp_path / "link.png"
    link.symlink_to(target)
    old = os.umask(0o022)
    try:
        assert lynx("simulate", files["plan"], "--plot", link).exit_code == 0
        fresh = tmp_path / "fresh.png"
        assert lynx("simulate", files["plan"], "--plot", fresh).exit_code == 0
    finally:
        os.umask(old)
    assert link.is_symlink() and target.read_bytes()[:4] == b"\x89PNG"
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
