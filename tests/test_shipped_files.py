"""Shipped files and quoted figures reproduce from the current code (scripts/regenerate.py writes them all): the
README's worked-example table from a fresh profile, and a few shipped profiles and plans byte for byte."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("regenerate", ROOT / "scripts" / "regenerate.py")
regenerate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(regenerate)


def _readme_table() -> dict[str, tuple[float | None, float]]:
    """algo -> (iteration s or None where it does not fit, peak GiB) of the README's worked-example compare."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("lynx compare p.json --memory-limit"):]
    block = block[block.index("```\n", block.index("```\n") + 4):]  # the output block after the command's
    rows = {}
    for line in block.split("```")[1].splitlines():
        cells = line.split()
        if cells and cells[0] in ("heu", "opt", "none", "full", "selective", "uniform", "block", "checkmate",
                                  "adapipe"):
            secs = None if cells[1] == "-" else float(cells[1])
            rows[cells[0]] = (secs, float(cells[-4] if cells[-3] in ("yes", "no") else cells[-3]))
    return rows


def test_readme_worked_example_figures_reproduce(tmp_path):
    """The README's compare table (iteration time, peak or need) and its ideal of the even split, from a fresh
    profile of the worked example."""
    p = tmp_path / "p.json"
    run = [sys.executable, "-m", "lynx_planner.cli"]
    subprocess.run([*run, "profile", *regenerate.EXAMPLE, "-o", p], check=True, capture_output=True, cwd=tmp_path)
    quoted = _readme_table()
    algos = [a for a in quoted if a not in ("opt", "checkmate")]  # the MILPs: their time limits bound the search
    out = subprocess.run([*run, "compare", p, "--memory-limit", regenerate.EXAMPLE_LIMIT, "--json", "--algos",
                          ",".join(algos)], check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    fresh = {r["algo"]: r for r in json.loads(out)}
    for algo in algos:
        secs, gib = quoted[algo]
        if secs is None:
            assert not fresh[algo]["fits"], algo
        else:
            assert fresh[algo]["fits"] and round(fresh[algo]["iteration_time_s"], 4) == secs, algo
        assert round(fresh[algo]["peak_memory_bytes"] / 2**30, 2) == gib, algo
    from lynx_planner import evaluate as ev
    from lynx_planner.io import load_model
    from lynx_planner.schema import Profile
    from lynx_planner.solvers.partition import even_bounds

    prof = load_model(p, Profile)
    ideal = ev.ideal_time(prof, even_bounds(prof, prof.parallel.pp))
    assert f"{ideal:.4f} s), `block`" in (ROOT / "README.md").read_text()  # "... the even split (...: 2.2806 s)"


CHECKED = ["gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16", "gpt-1.3b-a100-80g-pcie-tp2-pp2-mb2-m8"]


def test_shipped_profiles_and_plans_reproduce_byte_for_byte(tmp_path):
    rows = [r for r in regenerate.PROFILES if regenerate.profile_name(*r) in CHECKED]
    for row in rows:
        fresh = regenerate.make_profile(tmp_path, row)
        assert fresh.read_bytes() == (ROOT / "profiles" / fresh.name).read_bytes(), fresh.name
    name, limit, _ = next(p for p in regenerate.PLANS if p[0] == CHECKED[1])
    fresh = regenerate.make_plan(tmp_path, name, limit, "heu")
    assert fresh.read_bytes() == (ROOT / "plans" / fresh.name).read_bytes(), fresh.name


def test_regenerate_covers_every_shipped_profile_and_plan():
    profiles = {f"{regenerate.profile_name(*r)}.json" for r in regenerate.PROFILES} | \
        {f"{name}.json" for name, _ in regenerate.MODERN_PROFILES}
    assert profiles == {p.name for p in (ROOT / "profiles").glob("*.json")}
    plans = {f"{n}-{a}.json" for n, _, algos in regenerate.PLANS for a in algos}
    assert plans == {p.name for p in (ROOT / "plans").glob("*.json")}
