"""What a new user meets on the command line: the right option blamed (--ep, --virtual-stages), a unitless tiny
--memory-limit questioned, output piped into `head` (the files still written, exit 0), no empty first line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import lynx

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_tune_blames_ep_when_only_ep_leaves_no_layout():
    r = lynx("tune", "mixtral-8x7b", "--gpus", "16", "--global-batch", "64", "--ep", "3")
    assert r.exit_code == 2 and "--ep 3" in r.output and "--global-batch" not in r.output
    assert "1, 2, 4, 8" in r.output  # the sizes that would do


def test_tune_blames_virtual_stages_when_only_they_leave_no_layout():
    r = lynx("tune", "gpt-1.3b", "--gpus", "8", "--global-batch", "16", "--schedule", "interleaved-1f1b",
             "--virtual-stages", "7")
    assert r.exit_code == 2 and "--virtual-stages 7" in r.output and "--global-batch" not in r.output
    assert "24 layers" in r.output


def test_a_memory_limit_of_a_few_bytes_is_questioned(tmp_path):
    for args in (["plan", "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json", "--algo", "heu", "-o",
                  tmp_path / "plan.json"], ["tune", "gpt-1.3b", "--gpus", "8", "--global-batch", "16"]):
        r = lynx(*args, "--memory-limit", "16")
        assert r.exit_code == 2 and "did you mean 16GiB" in r.output, r.output
    assert not (tmp_path / "plan.json").exists()
    r = lynx("plan", "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json", "--algo", "heu", "-o",
             tmp_path / "plan.json", "--memory-limit", "512KiB")
    assert r.exit_code == 2 and "below 1 MiB" in r.output and "did you mean" not in r.output


def test_output_piped_into_a_reader_that_leaves_still_writes_the_file(tmp_path):
    """`lynx profile ... | head -1`: the reader closes the pipe before lynx prints (here: at once); the profile is
    written all the same and lynx exits 0 without a word."""
    out = tmp_path / "p.json"
    proc = subprocess.Popen([sys.executable, "-m", "lynx_planner.cli", "profile", "gpt-1.3b", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=tmp_path)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert out.exists() and err == ""


def test_error_output_starts_with_the_error_not_an_empty_line():
    proc = subprocess.run([sys.executable, "-m", "lynx_planner.cli", "tune", "gpt-1.3b", "--gpus", "8",
                           "--global-batch", "3"], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("gpt-1.3b on 8 x")
    proc = subprocess.run([sys.executable, "-m", "lynx_planner.cli", "tune", "mixtral-8x7b", "--gpus", "16",
                           "--global-batch", "64", "--ep", "3"], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --ep 3")


def test_schedule_all_lists_one_stage_layouts_once():
    from lynx_planner import schedules, tune
    from lynx_planner.models.hardware import HARDWARE

    lays = tune.layouts(8, HARDWARE["a100-80g-nvlink"], 16, 24, 16, 2048, names=schedules.NAMES)
    one = [(l.tp, l.dp, l.micro_batch_size, l.sequence_parallel) for l in lays if l.pp == 1]
    assert one and len(one) == len(set(one))
    assert {l.schedule for l in lays if l.pp == 1} == {"1f1b"}
    assert {l.schedule for l in lays if l.pp > 1} == set(schedules.NAMES)


def test_model_name_typo_gets_a_short_suggestion():
    r = lynx("profile", "lama3-8b", "-o", "x.json")
    assert r.exit_code == 2 and "did you mean llama3-8b" in r.output and len(r.output) < 300


def test_timeline_legend_names_the_optimizer_step_apart_from_dp_collectives():
    from lynx_planner.plot import _category

    assert _category({"tid": "dp collective", "name": "optimizer step"}) == "optimizer step"
    assert _category({"tid": "dp collective", "name": "DP grad L3"}) == "DP collective"


def test_a_point_on_top_of_another_is_drawn_as_a_ring(monkeypatch, tmp_path):
    """compare's full and uniform (same time, same peak) both stay visible: the second a ring around the first."""
    import pytest

    pytest.importorskip("matplotlib")
    from lynx_planner import plot

    figs = []
    monkeypatch.setattr(plot, "_save", lambda fig, path: figs.append(fig))
    pts = [{"algo": a, "peak_memory_bytes": 2**30, "iteration_time_s": 3.0} for a in ("full", "uniform")]
    plot.time_memory(pts, 2 * 2**30, "t", tmp_path / "x.png")
    marks = [c for c in figs[0].axes[0].collections if len(c.get_offsets())]
    assert len(marks) == 2
    assert marks[0].get_sizes()[0] < marks[1].get_sizes()[0] and len(marks[1].get_facecolors()) == 0


def test_profile_help_fits_80_columns_with_a_readable_description_column():
    """At 80 columns the option's type stands under its name: the description column keeps ~37 characters (it
    had 18, and 214 lines for fewer options: 185 now holds the FSDP, CP and kernel options), and no word is split."""
    from typer.testing import CliRunner

    from lynx_planner.cli import app

    text = CliRunner().invoke(app, ["profile", "--help"], env={"COLUMNS": "80", "TERM": "dumb"}).output
    lines = text.splitlines()
    assert len(lines) < 185 and max(len(ln) for ln in lines) <= 80
    tp = next(ln for ln in lines if "--tp " in ln)
    assert tp.index("Tensor-parallel") < 45
    assert "lynx_model(batch_size=...))" in text  # whole (it was folded mid-token: 'lynx_model(batch_s' 'ize=')


def test_validate_says_what_it_is_doing(tmp_path, monkeypatch):
    """The dry run, then the pipeline run, each announced before it starts (the whole takes tens of seconds)."""
    import pytest
    import torch.multiprocessing as mp

    from lynx_planner import runtime, validate

    prof, plan = tmp_path / "p.json", tmp_path / "plan.json"
    assert lynx("profile", "examples/gpt_model.py", "--pp", "2", "-o", prof).exit_code == 0
    assert lynx("plan", prof, "--algo", "full", "-o", plan).exit_code == 0
    said = []
    monkeypatch.setattr(runtime, "dry_run", lambda *a, **k: said.append("dry run ran"))

    def spawn(*a, **k):
        said.append("spawned")
        raise mp.ProcessExitedException("stop here", 0, 1, 1)

    monkeypatch.setattr(mp, "spawn", spawn)
    with pytest.raises(Exception):
        validate.run([str(plan)], "examples/gpt_model.py", repeats=1, warmup=0, progress=said.append)
    assert said[0].startswith(f"checking {plan} against examples/gpt_model.py") and said[1] == "dry run ran"
    assert said[2].startswith("running 1 plan(s) in a 2-stage gloo pipeline") and said[3] == "spawned"
