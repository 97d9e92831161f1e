"""`lynx bench --audit`: the generated suite covers what issue 29 asks, the independent search finds what an
exhaustive search over coarse per-chunk choices finds, and its bad input exits 2."""

import itertools

from lynx_planner import audit
from lynx_planner import evaluate as ev
from lynx_planner.schedules import NAMES
from lynx_planner.solvers.partition import even_bounds
from conftest import lynx


def test_full_suite_covers_the_grid():
    cases = audit.suite("full")
    assert len(cases) >= 100
    assert {c.schedule for c in cases} == set(NAMES)
    assert any(c.virtual_stages > 1 for c in cases)
    moe = {c.model for c in cases if c.ep > 1}
    assert {"mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"} <= moe
    assert {c.partition for c in cases} == {"even", "auto"} and len({c.between for c in cases}) >= 2
    assert len({c.name for c in cases}) == len(cases)
    assert set(audit.suite("ci")) < set(cases)


def test_descent_matches_exhaustive_search_on_a_small_case():
    """Every per-chunk plan of {keep all, full} on interleaved llama: the audit's search does at least as well."""
    prof = audit.case_profile("llama3-8b", "interleaved-1f1b", 2, 1)
    limit = audit.limit_of(prof, 0.3)
    bounds = even_bounds(prof, 8)
    search = audit._Search(prof, bounds, limit)
    best = None
    for choice in itertools.product((0, 1), repeat=8):
        state = tuple(choice[c] if i in search.free[c] else 0 for c in range(8)
                      for i in range(bounds[c], bounds[c + 1]))
        over, _, t, _ = search.score(state)
        if not over and (best is None or t < best):
            best = t
    got = search.run()
    assert got is not None and got[1] <= limit
    assert got[0] <= best * (1 + 1e-12)


def test_report_flags_beaten_cases(capsys):
    from rich.console import Console

    rows = [{"case": "a", "heu": {"iteration_time_s": 1.0, "beaten_by": 0.01}, "opt": {"iteration_time_s": 0.99,
             "beaten_by": 0.0}, "audit": {"iteration_time_s": 0.99}},
            {"case": "b", "heu": {"iteration_time_s": 1.0, "beaten_by": 0.001},
             "opt": {"iteration_time_s": 0.9, "beaten_by": 0.0}, "audit": {"iteration_time_s": 0.999}}]
    assert audit.report(rows, Console(width=200)) == 1  # 1 % > 0.5 %
    out = " ".join(capsys.readouterr().out.split())  # titles wrap to the table's width
    assert "audit, heu: 2 cases; beaten in 2, by more than 0.5% in 1" in out
    assert "audit, opt: 2 cases; beaten in 0" in out
    assert [r["case"] for r in audit.worst(rows, "heu")] == ["a", "b"]  # worst first
    assert [r["case"] for r in audit.worst(rows, "heu", 1)] == ["a"]
    rows[0]["heu"]["beaten_by"] = 0.004
    assert audit.report(rows, Console(width=200)) == 0
    assert audit.beaten(rows)[0][:2] == (0.004, "heu")
    rows[1]["opt"] = None  # OPT found no plan where the audit found one
    assert audit.report(rows, Console(width=200)) == 1


def test_audit_bad_input_exits_2():
    for args in (["--audit", "--check"], ["--audit", "--audit-cases", "huge"], ["--audit", "--algos", "none"]):
        r = lynx("bench", *args)
        assert r.exit_code == 2, (args, r.output)
