"""lynx validate runs plans in a real 2-stage gloo pipeline and reports predicted vs measured; lynx hardware
calibrate writes a Hardware file that lynx profile accepts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lynx_planner import solvers
from lynx_planner.cli import app
from lynx_planner.io import dumps, file_sha256, load_model
from lynx_planner.schema import Hardware

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_gpt_pipeline.py"


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> list[Path]:
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_gpt_pipeline as example
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    out = tmp_path_factory.mktemp("validate")
    (out / "profile.json").write_text(dumps(example.profile()))
    profile = load_model(out / "profile.json", type(example.profile()))
    paths = []
    for algo in ("none", "full"):
        plan = solvers.plan(profile, "profile.json", file_sha256(out / "profile.json"), algo, 1 << 60)
        (out / f"{algo}.json").write_text(dumps(plan))
        paths.append(out / f"{algo}.json")
    return paths


def test_validate_runs_both_plans_and_measures_each_stage(plans):
    # a warm-up iteration (the first sets up the stages' buffers and exchanges their shapes: one-off CPU work
    # outside the chunks), then the median of three: the claims below are about a steady iteration, also on a busy
    # machine
    result = CliRunner().invoke(app, ["validate", str(plans[0]), str(EXAMPLE), "--also", str(plans[1]),
                                      "--repeats", "3", "--warmup", "1", "--json"])
    assert result.exit_code == 0, result.output
    none, full = json.loads(result.output)
    assert (none["algo"], full["algo"]) == ("none", "full")
    for summary in (none, full):
        assert [s["stage"] for s in summary["stages"]] == [0, 1]
        for s in summary["stages"]:
            assert s["measured"]["forward_s"] > 0 and s["measured"]["backward_s"] > 0
            assert s["measured"]["held_at_backward_bytes"] > 0
            # the schedule's own work (posting 2 x 2 sends and receives, bookkeeping) costs CPU besides the chunks,
            # and it is a small share of the stage's: the chunks are timed apart from it
            outside = s["measured"]["outside_compute_s"]
            assert 0 < outside < s["measured"]["forward_s"] + s["measured"]["backward_s"]
        assert summary["iteration"]["measured_s"] > 0
    for a, b in zip(none["stages"], full["stages"]):
        assert a["measured"]["recompute_in_backward_s"] == 0 < b["measured"]["recompute_in_backward_s"]
        assert b["measured"]["held_at_backward_bytes"] < a["measured"]["held_at_backward_bytes"]


def test_validate_needs_the_plans_profile(plans, tmp_path):
    lone = tmp_path / "plan.json"
    lone.write_text(plans[0].read_text())
    result = CliRunner().invoke(app, ["validate", str(lone), str(EXAMPLE)])
    assert result.exit_code == 2
    assert "profile" in result.output and "Traceback" not in result.output


def test_calibrate_writes_hardware_that_profile_accepts(tmp_path):
    hw_path = tmp_path / "hw.json"
    result = CliRunner().invoke(app, ["hardware", "calibrate", "-o", str(hw_path), "--repeats", "1"])
    assert result.exit_code == 0, result.output
    hw = load_model(hw_path, Hardware)
    assert (hw.device, hw.backend, hw.threads) == ("cpu", "gloo", 1)
    assert hw.peak_flops > 1e8 and hw.hbm_bytes_per_s > 1e8 and hw.p2p_bytes_per_s > 0 and hw.interference >= 1
    profile = tmp_path / "p.json"
    result = CliRunner().invoke(app, ["profile", "gpt-1.3b", "--hardware", str(hw_path), "-o", str(profile)])
    assert result.exit_code == 0, result.output
    assert json.loads(profile.read_text())["hardware"]["backend"] == "gloo"


def test_hardware_without_action_still_lists_and_rejects_unknown_actions():
    assert "a100-80g-nvlink" in CliRunner().invoke(app, ["hardware"]).output
    result = CliRunner().invoke(app, ["hardware", "measure"])
    assert result.exit_code == 2 and "calibrate" in result.output
    assert CliRunner().invoke(app, ["hardware", "calibrate"]).exit_code == 2  # -o is required


@pytest.mark.parametrize("model", ["gpt_model.py", "hf_gpt2.py"])
def test_validate_model_files_without_own_stages(model, tmp_path):
    """The README's model files: gpt_model.py has no stage_module (the fallback chain nests the model under
    `model.`; the plan's layers are found there), hf_gpt2.py defines one."""
    path = EXAMPLE.parent / model
    runner = CliRunner()
    r = runner.invoke(app, ["profile", str(path), "--pp", "2", "--seq-len", "32", "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["plan", str(tmp_path / "p.json"), "--algo", "full", "-o", str(tmp_path / "full.json")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["validate", str(tmp_path / "full.json"), str(path), "--repeats", "1", "--warmup", "0",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    (summary,) = json.loads(r.output)
    assert all(s["measured"]["recompute_in_backward_s"] > 0 for s in summary["stages"])


def test_validate_failure_is_one_line_without_child_traceback(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text((EXAMPLE.parent / "gpt_model.py").read_text() + """

_original = lynx_model


class _Broken(torch.nn.Module):  # keeps the model's paths under `model.`, fails in its forward
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        raise ValueError("broken stage")


def lynx_model(**kw):
    model, inputs = _original(**kw)
    model.stage_module = lambda names: _Broken(model)
    return model, inputs
""")
    runner = CliRunner()
    r = runner.invoke(app, ["profile", str(EXAMPLE.parent / "gpt_model.py"), "--pp", "2", "--seq-len", "32",
                            "-o", str(tmp_path / "p.json")])
    r = runner.invoke(app, ["plan", str(tmp_path / "p.json"), "--algo", "none", "-o", str(tmp_path / "none.json")])
    r = runner.invoke(app, ["validate", str(tmp_path / "none.json"), str(bad), "--repeats", "1", "--warmup", "0"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert "ValueError: broken stage (at bad.py:" in r.output


def test_each_round_starts_one_plan_later():
    from lynx_planner.validate import _rotated

    rounds = [_rotated(3, k) for k in range(3)]
    assert rounds == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    assert [r[0] for r in rounds] == [0, 1, 2]  # each plan first once; each round runs every plan once


def test_zero_bubble_weight_pass_recomputation_counts_in_backward(tmp_path):
    """torch's first stage runs its whole backward in the W pass (its input needs no gradient): a full plan's
    recomputation runs there, on the critical path, not early."""
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_gpt_pipeline as example
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    prof = example.profile()
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"schedule": "zero-bubble"})})
    (tmp_path / "profile.json").write_text(dumps(prof))
    plan = solvers.plan(prof, "profile.json", file_sha256(tmp_path / "profile.json"), "full", 1 << 60)
    (tmp_path / "full.json").write_text(dumps(plan))
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "full.json"), str(EXAMPLE), "--repeats", "1",
                                      "--warmup", "0", "--json"])
    assert result.exit_code == 0, result.output
    (full,) = json.loads(result.output)
    for stage in full["stages"]:
        assert stage["measured"]["recompute_in_backward_s"] > 0
    assert full["stages"][0]["measured"]["recompute_early_s"] == 0  # nothing releases stage 0's early


def test_validate_runs_fsdp_plans_in_a_two_rank_fsdp2_job(tmp_path):
    """An --fsdp profile (dp 2, pp 1) of the example GPT: its none and full plans run in a real 2-rank FSDP2 job
    (fully_shard per layer, gloo); the full plan recomputes in backward, the none plan does not and holds more."""
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_gpt_pipeline as example
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    from lynx_planner.analytic import gpt_profile
    from lynx_planner.models.hardware import HARDWARE
    from lynx_planner.schema import ParallelConfig

    par = ParallelConfig(dp=2, fsdp=True, seq_len=example.SEQ, micro_batch_size=example.MICRO_BATCH,
                         num_microbatches=2)
    prof = gpt_profile(example.CONFIG, par, HARDWARE["a100-80g-nvlink"], dropout=example.DROPOUT)
    (tmp_path / "profile.json").write_text(dumps(prof))
    paths = []
    for algo in ("none", "full"):
        plan = solvers.plan(prof, "profile.json", file_sha256(tmp_path / "profile.json"), algo, 1 << 60)
        (tmp_path / f"{algo}.json").write_text(dumps(plan))
        paths.append(tmp_path / f"{algo}.json")
    result = CliRunner().invoke(app, ["validate", str(paths[0]), str(EXAMPLE), "--also", str(paths[1]),
                                      "--repeats", "1", "--warmup", "0", "--json"])
    assert result.exit_code == 0, result.output
    none, full = json.loads(result.output[result.output.index("["):])
    for summary in (none, full):
        (stage,) = summary["stages"]
        assert stage["measured"]["forward_s"] > 0 and stage["measured"]["backward_s"] > 0
        assert summary["iteration"]["measured_s"] > 0
    assert none["stages"][0]["measured"]["recompute_in_backward_s"] == 0
    assert full["stages"][0]["measured"]["recompute_in_backward_s"] > 0
    assert full["stages"][0]["measured"]["held_at_backward_bytes"] < none["stages"][0]["measured"][
        "held_at_backward_bytes"]
