"""The command line's house rules and terminal leftovers: cli.py only declares options and calls a command module;
every option name whole in --help at 80 columns; a memory limit above the device refused by plan, compare and tune;
`tune --out DIR` made only when results are written; a command whose stdout fails leaves no output file; one
version string."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import lynx, small_profile
from typer.main import get_command
from typer.testing import CliRunner

from lynx_planner import __version__
from lynx_planner.cli import app
from lynx_planner.io import dumps

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = get_command(app).commands


# ----------------------------------------------------------------------------------------------------------------
# cli.py is wiring only


def test_each_command_in_cli_py_is_one_call_to_its_module():
    """A command function's body is (after its docstring) a single call `module.function(...)` whose arguments are
    its own parameters: no logic, no formatting, no checks in cli.py."""
    tree = ast.parse((ROOT / "lynx_planner" / "cli.py").read_text())
    commands = [f for f in tree.body if isinstance(f, ast.FunctionDef)
                and any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "command" for d in f.decorator_list)]
    assert len(commands) == len(COMMANDS)
    for f in commands:
        body = f.body[1:] if isinstance(f.body[0], ast.Expr) and isinstance(f.body[0].value, ast.Constant) else f.body
        assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Call), f.name
        call = body[0].value
        assert isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name), f.name
        params = {a.arg for a in f.args.args}
        passed = [a.id for a in call.args if isinstance(a, ast.Name)] + [k.value.id for k in call.keywords]
        assert len(passed) == len(call.args) + len(call.keywords) and set(passed) == params, f.name


# ----------------------------------------------------------------------------------------------------------------
# --help at 80 columns


def help80(*args: str) -> str:
    r = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("name", ["", *sorted(COMMANDS)])
def test_every_option_name_shows_whole_at_80_columns(name):
    import click

    text = help80(*([name] if name else []))
    cmd = COMMANDS[name] if name else get_command(app)
    ctx = click.Context(cmd, help_option_names=["-h", "--help"])  # as app.context_settings
    names = [o for p in cmd.get_params(ctx) for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]
    assert "--help" in names and "-h" in names
    for option in names:
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), (option, text)
    assert "…" not in text, text  # nor any help text cut
    assert max(len(line) for line in text.splitlines()) <= 80


def test_negative_flag_stands_under_its_flag():
    lines = help80("tune").splitlines()
    at = next(i for i, line in enumerate(lines) if "--distributed-optimizer" in line)
    assert "--no-distributed-optimizer" in lines[at + 1]
    assert lines[at + 1].index("--no-") == lines[at].index("--distributed-optimizer")


# ----------------------------------------------------------------------------------------------------------------
# a memory limit above the device


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("wiring") / "p.json"
    path.write_text(dumps(small_profile()))  # a100-80g-pcie: 80 GiB
    return path


@pytest.mark.parametrize("limit", ["81GiB", "100GB"])
def test_plan_refuses_a_memory_limit_above_the_device(profile_path, tmp_path, limit):
    out = tmp_path / "plan.json"
    r = lynx("plan", profile_path, "--algo", "full", "--memory-limit", limit, "-o", out)
    assert r.exit_code == 2 and not out.exists()
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --memory-limit: ")
    assert "exceeds the device's memory" in lines[0] and "85899345920 B" in lines[0]  # the device's capacity
    assert "a100-80g-pcie" in lines[0] and ("81.00 GiB" in lines[0] or "93.13 GiB" in lines[0])  # the value
    r = lynx("compare", profile_path, "--memory-limit", limit, "--algos", "full")
    assert r.exit_code == 2 and "exceeds the device's memory" in r.output


def test_plan_accepts_the_whole_device_as_its_limit(profile_path, tmp_path):
    """`lynx check` refuses only a limit above the device: a plan at exactly its memory is valid."""
    out = tmp_path / "plan.json"
    assert lynx("plan", profile_path, "--algo", "full", "--memory-limit", "80GiB", "-o", out).exit_code == 0
    assert lynx("check", out).exit_code == 0


def test_tune_refuses_a_memory_limit_above_any_of_its_devices(tmp_path):
    r = lynx("tune", "gpt-1.3b", "--gpus", "8", "--global-batch", "16", "--hardware",
             "a100-80g-nvlink,a100-40g-nvlink", "--memory-limit", "60GiB")
    assert r.exit_code == 2 and "exceeds the device's memory" in r.output and "a100-40g-nvlink" in r.output


# ----------------------------------------------------------------------------------------------------------------
# tune --out: made when written


def test_tune_out_is_not_made_by_a_search_that_fails(tmp_path):
    out = tmp_path / "new" / "best"
    r = lynx("tune", "gpt-1.3b", "--gpus", "8", "--global-batch", "16", "--memory-limit", "1GiB", "--out", out)
    assert r.exit_code == 2 and "--memory-limit" in r.output
    assert not (tmp_path / "new").exists()
    r = lynx("tune", "gpt-1.3b", "--gpus", "8", "--global-batch", "16", "--out", out)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "profile.json"]


def test_tune_out_that_cannot_be_made_is_refused_before_the_search(tmp_path):
    (tmp_path / "file").write_text("")
    r = lynx("tune", "gpt-1.3b", "--gpus", "8", "--global-batch", "16", "--out", tmp_path / "file" / "best")
    assert r.exit_code == 2 and "--out" in r.output and "cannot create" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# ----------------------------------------------------------------------------------------------------------------
# a full stdout leaves no output file


def run_to_dev_full(*args, cwd: Path) -> subprocess.CompletedProcess:
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "lynx_planner.cli", *map(str, args)], cwd=cwd, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})


@pytest.mark.parametrize("args, written", [
    (["profile", "gpt-1.3b", "--pp", "2", "-o", "out.json"], "out.json"),
    (["plan", "{profile}", "--algo", "full", "-o", "out.json"], "out.json"),
    (["simulate", "{plan}", "--trace", "out.json"], "out.json"),
    (["tune", "gpt-1.3b", "--gpus", "4", "--global-batch", "8", "--out", "best/dir", "--time-limit", "20"], "best"),
])
def test_a_command_whose_stdout_fails_leaves_no_output(profile_path, tmp_path, args, written):
    plan = tmp_path / "plan.json"
    assert lynx("plan", profile_path, "--algo", "full", "-o", plan).exit_code == 0
    work = tmp_path / "work"
    work.mkdir()
    r = run_to_dev_full(*[a.format(profile=profile_path, plan=plan) for a in args], cwd=work)
    assert r.returncode == 2 and "No space left" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert list(work.iterdir()) == []  # neither the output nor a temporary file beside it


def test_outputs_appear_only_on_commit(tmp_path):
    from lynx_planner.io import Outputs, make_directory, write_atomic

    with Outputs() as outputs:
        make_directory(tmp_path / "a" / "b", "--out")
        write_atomic(tmp_path / "a" / "b" / "x.json", "1")
        assert not (tmp_path / "a" / "b" / "x.json").exists()
        outputs.commit()
    assert (tmp_path / "a" / "b" / "x.json").read_text() == "1"
    with pytest.raises(RuntimeError), Outputs():
        make_directory(tmp_path / "c" / "d", "--out")
        write_atomic(tmp_path / "c" / "d" / "y.json", "2")
        write_atomic(tmp_path / "a" / "b" / "x.json", "3")
        raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # c/d made for the failed writes: removed
    assert [p.name for p in (tmp_path / "a" / "b").iterdir()] == ["x.json"]
    assert (tmp_path / "a" / "b" / "x.json").read_text() == "1"  # the earlier file untouched
    write_atomic(tmp_path / "z.json", "4")  # outside a command: written at once
    assert (tmp_path / "z.json").read_text() == "4"


# ----------------------------------------------------------------------------------------------------------------
# one version string


def test_the_package_version_is_the_one_string():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lynx_planner.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert lynx("--version").output == f"lynx-planner {__version__}\n"


def test_setuptools_reads_the_version_from_the_package(tmp_path):
    """What `pip install` will call the distribution: setuptools' own reading of pyproject.toml."""
    pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import read_configuration

    config = read_configuration(ROOT / "pyproject.toml", expand=True)
    assert config["project"]["version"] == __version__


# ----------------------------------------------------------------------------------------------------------------
# choices


def test_every_schedule_module_is_a_choice_of_profile(tmp_path):
    """`--schedule` offers exactly the schedules of lynx_planner/schedules (a new module is a new choice), each
    recorded in the profile it writes."""
    import json

    from lynx_planner.schedules import NAMES, SCHEDULES

    r = CliRunner().invoke(app, ["profile", "gpt-1.3b", "--schedule", "bogus", "-o", tmp_path / "x.json"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 2 and "is not one of " + ", ".join(f"'{n}'" for n in NAMES) + "." in r.output
    for name in NAMES:
        out = tmp_path / f"{name}.json"
        virtual = max(1, SCHEDULES[name].virtual[0])
        r = lynx("profile", "gpt-1.3b", "--pp", 2, "--num-microbatches", 4, "--schedule", name,
                 "--virtual-stages", virtual, "-o", out)
        assert r.exit_code == 0, r.output
        assert json.loads(out.read_text())["parallel"]["schedule"] == name
