"""HEU's repair of over-limit stages keeps its promise: it returns a plan over the limit only when no layer of an
over-limit rank has a step down its frontier left (never because it stopped counting rounds)."""

from __future__ import annotations

import gzip
from pathlib import Path

from lynx_planner import schedules, solvers
from lynx_planner.schema import Profile
from lynx_planner.solvers import heu

ROOT = Path(__file__).resolve().parent.parent


def test_repair_gives_up_only_when_nothing_is_left_to_give(monkeypatch):
    """A tiny Qwen3-MoE under bf16 autocast (tests/data) three quarters of the way from full recomputation's peak to
    no recomputation's: its repair needs more than a dozen simulated rounds."""
    prof = Profile.model_validate_json(gzip.decompress((ROOT / "tests/data/qwen3_moe-bf16-autocast.profile.json.gz")
                                                       .read_bytes()))
    full, none = (solvers.solve(prof, a, 1 << 62).evaluation.peak_bytes for a in ("full", "none"))
    limit = int(full + 0.75 * (none - full))
    real, calls = heu.repair, []

    def checked(profile, lim, bounds, models, chosen, caches, *a, **k):
        pols, result = real(profile, lim, bounds, models, chosen, caches, *a, **k)
        over = [st.stage for st in result.predicted.stages if st.peak_memory_bytes > lim]
        p = profile.parallel.pp
        for rank in over:
            mine = [c for c in range(len(models)) if schedules.rank_of(p, c) == rank]
            assert all(heu._cheapest_step_down(chosen[c], caches) is None for c in mine), \
                f"repair left rank {rank} over the limit with steps down left"
        calls.append(len(over))
        return pols, result

    monkeypatch.setattr(heu, "repair", checked)
    solved = solvers.solve(prof, "heu", limit)
    assert calls and solved.evaluation.fits(limit)
