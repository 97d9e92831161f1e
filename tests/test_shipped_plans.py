"""Every example plan in plans/ is valid for its shipped profile: a change to the simulator, the cost model or the
solvers that would make a shipped plan lie fails here (regenerate with `python scripts/regenerate.py plans`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lynx_planner.evaluate import check
from lynx_planner.io import file_sha256, load_model
from lynx_planner.schema import Plan, Profile

ROOT = Path(__file__).resolve().parent.parent
PLANS = sorted((ROOT / "plans").glob("*.json"))


def test_plans_are_shipped():
    assert len(PLANS) >= 5


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_shipped_plan_checks(path):
    plan = load_model(path, Plan)
    profile_path = ROOT / plan.profile_path
    assert file_sha256(profile_path) == plan.profile_sha256
    assert check(plan, load_model(profile_path, Profile)) == []
