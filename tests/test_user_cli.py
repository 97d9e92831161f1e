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
    assert defaults == {"profile": True, "tune": True}
