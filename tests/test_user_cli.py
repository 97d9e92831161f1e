"""The terminal: `lynx --version`, examples in each command's --help, no '<bool>' for flags, one default for the
distributed optimizer in profile and tune."""

from __future__ import annotations

import json

import pytest
from conftest import lynx

from lynx_planner import __version__
from lynx_planner.cli import EXAMPLES


def test_version():
    r = lynx("--version")
    assert r.exit_code == 0 and r.output.strip() == f"lynx-planner {__version__}"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_help_has_examples_and_no_bool_metavar(name):
    r = lynx(name, "--help")
    assert r.exit_code == 0, r.output
    assert "Examples:" in r.output and f"$ lynx {name}" in r.output
    assert "<bool>" not in r.output


def test_profile_and_tune_share_the_distributed_optimizer_default(tmp_path):
    r = lynx("profile", "gpt-1.3b", "--dp", 2, "--pp", 2, "-o", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "p.json").read_text())["parallel"]["distributed_optimizer"] is True
    r = lynx("profile", "gpt-1.3b", "--dp", 2, "--pp", 2, "--no-distributed-optimizer", "-o", tmp_path / "q.json")
    assert json.loads((tmp_path / "q.json").read_text())["parallel"]["distributed_optimizer"] is False
    from typer.main import get_command

    from lynx_planner.cli import app
    cmds = get_command(app).commands
    defaults = {name: next(p.default for p in cmds[name].params if p.name == "distributed_optimizer")
                for name in ("profile", "tune")}
    assert defaults == {"profile": None, "tune": None}  # one default: on, off under --fsdp (resolved in commands)


ZERO_GIB = __import__("re").compile(r"(?<![\d.])0\.0\d GiB")  # a tiny model's size printed in GiB


def run80(*args, cwd=None):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"COLUMNS": "80", "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-m", "lynx_planner.cli", *map(str, args)], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def assert_fits_80(text: str) -> None:
    """No cell cut ('…'); table rows and op-id lines (indented) within 80 columns (prose lines wrap at spaces)."""
    assert "…" not in text, text
    rows = [line for line in text.splitlines() if line.startswith(" ")]
    assert rows and max(len(line) for line in rows) <= 80, text


def test_tables_keep_op_ids_and_figures_whole_at_80_columns(tmp_path):
    """plan, simulate, compare, hardware and apply --dry-run at COLUMNS=80: no cut ('…'), no line over 80; tiny
    models in MiB, not 0.00 GiB; the percentage never '+-'."""
    from pathlib import Path

    model = Path(__file__).resolve().parents[1] / "examples" / "gpt_model.py"
    lynx("profile", model, "--pp", 2, "--seq-len", 32, "-o", tmp_path / "p.json")
    text = run80("plan", tmp_path / "p.json", "--algo", "selective", "-o", tmp_path / "plan.json")
    assert_fits_80(text)
    assert "MiB" in text and not ZERO_GIB.search(text) and "+-" not in text
    for args in (("simulate", tmp_path / "plan.json"), ("compare", tmp_path / "p.json"), ("hardware",)):
        text = run80(*args)
        assert_fits_80(text)
        assert not ZERO_GIB.search(text) and "+-" not in text
    text = run80("apply", tmp_path / "plan.json", model, "--dry-run")
    assert_fits_80(text)
    profile = json.loads((tmp_path / "p.json").read_text())
    ids = {op["id"] for block in profile["blocks"].values() for op in block["ops"]}
    plan = json.loads((tmp_path / "plan.json").read_text())
    named = {op for st in plan["stages"] for p in st["policies"] for op in p["keep"] + p["recompute"]}
    assert named and named <= ids
    words = set(text.replace(",", " ").split())
    assert named <= words, named - words  # every op id of the plan printed whole
    rows = json.loads(run80("apply", tmp_path / "plan.json", model, "--dry-run", "--json"))
    assert {op for r in rows for op in r["keep"] + r["recompute"]} == named


def test_validate_report_fits_80_columns(monkeypatch):
    import shutil

    from lynx_planner.validate import table
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=None: __import__("os").terminal_size((80, 24)))
    figures = {"forward_s": 0.1234, "backward_s": 0.2, "recompute_in_backward_s": 0.0, "recompute_early_s": 0.01,
               "held_at_backward_bytes": 2**21, "activation_bytes": 2**22}
    summary = {"plan": "heu", "algo": "heu", "profile_method": "analytic", "hardware": "a100-80g-nvlink",
               "stages": [{"stage": 0, "predicted": figures, "measured": figures}], "cpu_share": 0.5,
               "iteration": {"predicted_s": 1.0, "measured_s": 2.0, "spread_s": [1.0, 3.0],
                             "predicted_over_measured": 0.5}}
    text = table([summary])
    assert_fits_80(text)
    assert "0.1234" in text and "[1.0000-3.0000]" in text
    measured = figures | {"outside_compute_s": 0.0042, "comm_threads_s": 0.0173}  # the CPU besides the chunks
    summary["stages"][0]["measured"] = measured
    text = table([summary])
    assert_fits_80(text)
    assert "0.0042" in text and "0.0173" in text


def test_percent_never_prints_plus_minus():
    from lynx_planner.cli import _percent
    assert _percent(-1e-9) == "+0.0%" and _percent(0.0123) == "+1.2%" and _percent(-0.031) == "-3.1%"


def test_label_groups_join_labels_that_would_overprint():
    from lynx_planner.plot import label_groups
    groups = label_groups([(15.42, 3.03, "full"), (15.42, 3.03, "uniform"), (15.43, 3.02, "block"),
                           (15.9, 2.18, "heu"), (15.0, 2.5, None)], 1.0, 1.0)
    assert groups == [((15.42, 3.03), ["full", "uniform", "block"]), ((15.9, 2.18), ["heu"])]


def test_compare_plot_says_which_algorithms_it_leaves_out(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    texts = []
    original = matplotlib.axes.Axes.text
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda self, x, y, s, *a, **k: (texts.append(s),
                                                                                     original(self, x, y, s, *a, **k))[1])
    from conftest import small_profile

    from lynx_planner.io import dumps
    prof = small_profile()
    (tmp_path / "p.json").write_text(dumps(prof))
    from conftest import between
    r = lynx("compare", tmp_path / "p.json", "--memory-limit", between(prof, 0.3), "--plot", tmp_path / "c.png")
    assert r.exit_code == 0, r.output
    assert any(t.startswith("not shown (no plan within the limit): none needs") for t in texts), texts


def test_plot_follows_a_symlink_and_gets_the_umask_mode(tmp_path):
    pytest.importorskip("matplotlib")
    import os
    import stat

    from conftest import small_profile

    from lynx_planner.io import dumps
    (tmp_path / "p.json").write_text(dumps(small_profile()))
    target = tmp_path / "real.png"
    target.write_bytes(b"old")
    os.chmod(target, 0o644)
    (tmp_path / "link.png").symlink_to(target)
    r = lynx("compare", tmp_path / "p.json", "--plot", tmp_path / "link.png")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "link.png").is_symlink() and target.read_bytes()[:4] == b"\x89PNG"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    r = lynx("compare", tmp_path / "p.json", "--plot", tmp_path / "new.png")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.png").stat().st_mode) == 0o666 & ~umask


def test_format_bytes_switches_to_mib_and_kib():
    from lynx_planner.io import format_bytes
    assert format_bytes(80 * 2**30) == "80.00 GiB" and format_bytes(0.1 * 2**30) == "0.10 GiB"
    assert format_bytes(11 * 2**20) == "11.00 MiB" and format_bytes(3 * 2**10) == "3.00 KiB"
