"""Candidate search at the size of real blocks (issue 15): the O(n log n) pruning against the quadratic definition,
repeated sub-structures (experts) decided as a group, bounded frontiers and what the plan says about them, the MILP
time limit charged with the candidate build (issue 21.6), and HEU's ties going to less recomputation (issue 20.7)."""

from __future__ import annotations

import gzip
import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lynx_planner import policy, solvers
from lynx_planner.schema import Profile
from lynx_planner.solvers import candidates, repeats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_models import synthetic_moe_block, synthetic_moe_profile  # noqa: E402
from test_properties import blocks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fresh():
    candidates.reset_caches()
    yield
    candidates.reset_caches()


def _quadratic_prune(partials, tol_s=0.0, tol_b=0.0):
    """The definition: by (costs, sorted keep), drop what a kept one beats or ties within the tolerances."""
    out = []
    for p in sorted(partials, key=lambda x: (x[0], x[1], x[2], x[3], sorted(_letters(x[4])))):
        if not any(q[0] <= p[0] and q[1] <= p[1] + tol_s and q[2] <= p[2] + tol_b and q[3] <= p[3] for q in out):
            out.append(p)
    return out


def _letters(bits):
    return ["abcde"[i] for i in range(5) if bits >> i & 1]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 6), st.booleans(),
                          st.lists(st.sampled_from("abcde"), max_size=3, unique=True).map(tuple)), max_size=40),
       st.sampled_from([0, 1, 2]))
def test_prune_is_the_quadratic_definition(partials, tol):
    # keep sets as the search holds them: one bit per op, by the rank of its id (here a letter) among the sorted ids
    ps = [(k, float(s), b, r, sum(1 << "abcde".index(x) for x in keep), 0) for k, s, b, r, keep in partials]
    assert candidates._prune(list(ps), tol, tol) == _quadratic_prune(ps, tol, tol)


def _brute_frontier(block):
    """Every keep set of the keepable ops, its closure, the Pareto set of their costs."""
    info = policy.analyse(block)
    cands = []
    for n in range(len(info.keepable) + 1):
        for keep in itertools.combinations(info.keepable, n):
            rec = policy.closure(info, frozenset(keep))
            c = policy.cost(info, frozenset(keep), rec)
            cands.append((c.kept_bytes, c.recompute_s, c.recomputed_bytes, c.replays_collective))
    return {c for c in cands if not any(d != c and d[0] <= c[0] and d[1] <= c[1] and d[2] <= c[2] and d[3] <= c[3]
                                        for d in cands)}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(blocks())
def test_exact_frontier_is_the_brute_force_one(block):
    got = candidates.frontier(block)
    assert got.exact
    costs = {(c.kept_bytes, c.rec_s, c.rec_bytes, c.replays_collective) for c in got.candidates}
    brute = _brute_frontier(block)
    # every brute-force Pareto point is matched by a candidate at least as good (collective replays may differ:
    # the search may keep a collective's output where the brute force recomputes it)
    for b in brute:
        assert any(c[0] <= b[0] and c[1] <= b[1] + 1e-12 and c[2] <= b[2] and c[3] <= b[3] for c in costs), b


def test_experts_are_found_and_folded():
    block = synthetic_moe_block(8)
    assert repeats.find(block) == [(10, 6, 8)]  # 10 ops before the experts, 6 ops each, 8 experts
    folded = repeats.fold(block)
    assert len(folded.block.ops) == len(block.ops) - 7 * 6 and folded.groups == 1
    # the folded op sums the copies
    w1 = next(o for o in folded.block.ops if o.id == "mlp.experts.0.w1:mm#0")
    assert w1.out_bytes == sum(o.out_bytes for o in block.ops if o.id.endswith(".w1:mm#0"))
    assert "mlp.experts:zeros_like#0" in next(o for o in folded.block.ops
                                              if o.id == "mlp.experts.0:index_add_#0").inputs


def test_dense_blocks_have_no_repeats():
    prof = Profile.model_validate_json((ROOT / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json").read_text())
    assert all(repeats.find(b) == [] for b in prof.blocks.values())


def test_a_break_in_the_pattern_ends_the_repeat():
    block = synthetic_moe_block(6)
    ops = list(block.ops)
    i = next(i for i, o in enumerate(ops) if o.id == "mlp.experts.4.w1:mm#0")
    ops[i] = ops[i].model_copy(update={"inputs": [ops[1].id]})  # expert 4 reads something else
    changed = block.model_copy(update={"ops": ops})
    assert [k for _, _, k in repeats.find(changed)] == [4]  # experts 0-3 only


@pytest.mark.parametrize("experts", [4, 8])
def test_grouped_candidates_are_executable_uniform_and_priced_exactly(experts, monkeypatch):
    monkeypatch.setattr(candidates, "FOLD_CAP", 1)  # fold even where the exact search would be quick
    block = synthetic_moe_block(experts)
    info = policy.analyse(block)
    got = candidates.frontier(block)
    assert got.groups == 1 and not got.exact and len(got.candidates) > 2
    for c in got.candidates:
        assert policy.validate(info, sorted(c.keep), list(c.recompute)) is None
        cost = policy.cost(info, c.keep, c.recompute)
        assert (cost.kept_bytes, cost.recomputed_bytes) == (c.kept_bytes, c.rec_bytes)
        assert cost.recompute_s == pytest.approx(c.rec_s, rel=1e-9, abs=1e-15)
        for role in ("w1:mm#0", "act:gelu#0", "w2:mm#0", ":index#0"):  # every expert decided alike
            kept = {f"mlp.experts.{e}.{role}".replace("..", ".") in c.keep for e in range(experts)}
            assert len(kept) == 1, (role, c.keep)


def _promise_kept(exact_points, bounded, eps, total_s, total_b):
    """Every exact Pareto point has a bounded candidate keeping no more bytes, replaying no more collectives, and
    recomputing at most eps of the forward time (regenerating at most eps of the saved bytes) more."""
    return all(any(c.kept_bytes <= k and c.replays_collective <= rep and c.rec_s <= s + eps * total_s + 1e-9
                   and c.rec_bytes <= b + eps * total_b + 1e-9 for c in bounded)
               for k, s, b, rep in exact_points)


def _totals(info):
    return sum(info.fwd_s.values()), sum(info.unit_bytes[u] for u in info.units)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(blocks(), st.sampled_from([1, 2, 3]))
def test_bounded_search_keeps_its_promise_against_brute_force(block, step_cap):
    """A search whose steps may keep only a few partial policies states an eps, and that eps holds against the brute
    force Pareto set (the tolerance charged per crowded step adds up)."""
    info = policy.analyse(block)
    cands, eps = candidates._search(info, None, step_cap)
    assert cands and all(policy.validate(info, sorted(c.keep), list(c.recompute)) is None for c in cands)
    assert _promise_kept(_brute_frontier(block), cands, eps, *_totals(info))


def test_bounded_frontier_keeps_its_promise(monkeypatch):
    prof = Profile.model_validate_json((ROOT / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json").read_text())
    block = max(prof.blocks.values(), key=lambda b: len(b.ops))
    exact = candidates.frontier(block)
    assert exact.exact
    candidates.reset_caches()
    monkeypatch.setattr(candidates, "WORK_CAP", 1)  # the exact search is over its cap at once
    monkeypatch.setattr(candidates, "FOLD_CAP", 1)
    monkeypatch.setattr(candidates, "STEP_CAP", 32)
    bounded = candidates.frontier(block)
    assert 0 < bounded.eps < 0.5 and len(bounded.candidates) < len(exact.candidates)
    info = policy.analyse(block)
    points = [(e.kept_bytes, e.rec_s, e.rec_bytes, e.replays_collective) for e in exact.candidates]
    assert _promise_kept(points, bounded.candidates, bounded.eps, *_totals(info))
    # and the eps is needed: a tenth of it does not cover every exact point
    assert not _promise_kept(points, bounded.candidates, bounded.eps / 10, *_totals(info))


def test_exact_search_gives_up_at_a_crowded_step():
    """The first, exact try of a block stops as soon as one step holds more than the step cap (that block would be
    searched bounded anyway), not only past its total work cap; without a step cap it finishes."""
    prof = Profile.model_validate_json((ROOT / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json").read_text())
    info = policy.analyse(max(prof.blocks.values(), key=lambda b: len(b.ops)))
    with pytest.raises(candidates._OverWork):
        candidates._search(info, 10**9, 4)
    assert candidates._search(info, 10**9, None)[1] == 0.0


def test_plan_says_when_candidates_were_grouped_and_opt_claims_nothing(monkeypatch):
    monkeypatch.setattr(candidates, "FOLD_CAP", 1)
    prof = synthetic_moe_profile(4)
    full, none = (solvers.solve(prof, a, 1 << 62).evaluation.peak_bytes for a in ("full", "none"))
    limit = int(full + 0.5 * (none - full))
    heu = solvers.solve(prof, "heu", limit)
    assert heu.solver.candidates.blocks == ["gpt_layer"] and heu.solver.candidates.groups == 1
    assert "candidates" in heu.solver.model_dump()
    opt = solvers.solve(prof, "opt", limit, time_limit=30)
    assert opt.solver.status != "optimal" and opt.solver.bound_s is None and opt.solver.gap is None
    dense = solvers.solve(Profile.model_validate_json(
        (ROOT / "profiles/gpt-1.3b-a100-80g-nvlink-tp1-pp2-mb4-m8.json").read_text()), "heu", 1 << 50)
    assert dense.solver.candidates is None and "candidates" not in dense.solver.model_dump_json()


def test_milp_time_limit_charges_the_candidate_build(monkeypatch):
    """With no work cap and no folding, the exact frontier of a 16-expert block is a long search; a time limit of
    zero must coarsen it at once (by construction: the deadline has passed before the first candidate)."""
    monkeypatch.setattr(candidates, "WORK_CAP", 10**12)
    monkeypatch.setattr(repeats, "fold", lambda block: None)
    searched = []
    real = candidates._search
    sizes = []

    def search(info, work, step, *resume):
        searched.append((work, step))
        got = real(info, work, step, *resume)
        sizes.append(len(got[0]))
        return got

    monkeypatch.setattr(candidates, "_search", search)
    prof = synthetic_moe_profile(16)
    solved = solvers.solve(prof, "checkmate", 1 << 62, time_limit=0.0)
    assert solved.solver.candidates.eps > 0
    assert searched and set(searched) == {(None, candidates.STEP_CAP)}  # never the exact search
    assert max(sizes) <= candidates.LATE_CAP  # late: a few candidates
    assert len(candidates.frontier(prof.blocks["gpt_layer"]).candidates) > 16  # coarse frontiers are not remembered
    assert candidates.frontier(prof.blocks["gpt_layer"]).eps == 0.0


def test_heu_plans_an_autocast_moe_profile_at_every_limit():
    """A tiny Qwen3-MoE under bf16 autocast, profiled on a CPU (tests/moe_models.py, frozen in tests/data): grouped
    and bounded candidates, and HEU's repair of over-limit stages has to step many layers down their (dense) frontier
    before the simulation fits at the upper limit."""
    prof = Profile.model_validate_json(gzip.decompress((ROOT / "tests/data/qwen3_moe-bf16-autocast.profile.json.gz")
                                                       .read_bytes()))
    full, none = (solvers.solve(prof, a, 1 << 62).evaluation.peak_bytes for a in ("full", "none"))
    for frac in (0.25, 0.5, 0.75):
        limit = int(full + frac * (none - full))
        heu = solvers.solve(prof, "heu", limit)
        assert heu.evaluation.fits(limit)
        assert heu.solver.candidates.groups == 2 and 0 < heu.solver.candidates.eps < 0.5


def test_ties_go_to_less_recomputation():
    """At a limit far above need HEU keeps everything: hiding recomputation is no reason to do it."""
    prof = Profile.model_validate_json((ROOT / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json").read_text())
    solved = solvers.solve(prof, "heu", 1 << 50)
    assert all(not p.recompute for st in solved.stages for p in st.policies)
    none = solvers.solve(prof, "none", 1 << 50)
    assert solved.evaluation.predicted.iteration_time_s <= none.evaluation.predicted.iteration_time_s * (1 + 1e-9)


# catalog models at layouts of benchmarks/heu_scaling.py: (tp, ep); Qwen3-32B's exact search there stays under the cap
LAYOUTS = {"llama3-8b": (2, 1), "qwen3-32b": (4, 1), "mixtral-8x7b": (2, 8)}


def _catalog_layer(name: str):
    """The catalog model's largest block at its benchmark layout (pp 4, seq 4096: the block's ops do not depend on
    either)."""
    from lynx_planner.analytic import profile as analytic_profile
    from lynx_planner.models.catalog import MODELS
    from lynx_planner.models.hardware import HARDWARE
    from lynx_planner.schema import ParallelConfig

    tp, ep = LAYOUTS[name]
    par = ParallelConfig(tp=tp, pp=4, dp=8, ep=ep, seq_len=4096, num_microbatches=8, sequence_parallel=True)
    prof = analytic_profile(MODELS[name], par, HARDWARE["h100-80g-nvlink"])
    return max(prof.blocks.values(), key=lambda b: len(b.ops))


def _steps(info):
    """Every step of the uncapped exact search: (states after it, its size)."""
    ops = [o for o in info.block.ops if not o.view][::-1]
    units, keepable = set(info.units), set(info.keepable)
    holds = {o.id for o in ops if o.id in info.needed_out or o.id in info.collective}
    states = candidates._start(info)
    out = []
    for op in ops:
        states = candidates._step(info, op, states, units, keepable, holds)
        out.append((states, sum(map(len, states.values()))))
    return ops, units, keepable, holds, out


@pytest.mark.parametrize("name", ["llama3-8b", "qwen3-32b"])
def test_least_work_left_is_a_lower_bound(name):
    """_work_exceeds never says a search must create more partial policies than the uncapped exact search does after
    any of its steps (else a block the cap allows would lose its exact frontier), and is tight enough to say so one
    below the truth somewhere."""
    info = policy.analyse(_catalog_layer(name))
    ops, units, keepable, holds, steps = _steps(info)
    sizes = [size for _, size in steps]
    told = 0
    for k in range(0, len(ops), 5):
        left = sum(sizes[k + 1:])
        states = steps[k][0]
        assert not candidates._work_exceeds(info, ops, k, states, left, units, keepable, holds)
        told += candidates._work_exceeds(info, ops, k, states, left // 2, units, keepable, holds)
    assert told > 0


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-32b"])
def test_stopping_exact_searches_early_keeps_the_frontier(name, monkeypatch):
    """The frontier with the early stop (work left proven over the cap) is the one the search gives without it, run
    to its cap: bounded and the same where the cap is passed (Mixtral), exact where it is not (Qwen3-32B)."""
    block = _catalog_layer(name)
    got = candidates.frontier(block)
    candidates.reset_caches()
    monkeypatch.setattr(candidates._LeastLeft, "exceeds", lambda self, budget: False)
    want = candidates.frontier(block)
    assert got == want
    assert got.exact == (name == "qwen3-32b")


def test_frontier_search_leaves_the_garbage_collector_as_it_was(monkeypatch):
    """The search pauses the cyclic collector (candidates.collector_paused): on after it if it was on, off if it was
    off, and on again after a search that fails."""
    import gc

    block = synthetic_moe_block(8)
    assert gc.isenabled()
    candidates.frontier(block)
    assert gc.isenabled()
    candidates.reset_caches()
    gc.disable()
    try:
        candidates.frontier(block)
        assert not gc.isenabled()
    finally:
        gc.enable()
    candidates.reset_caches()

    def fail(*a, **k):
        assert not gc.isenabled()  # paused during the search
        raise RuntimeError("stop")

    monkeypatch.setattr(candidates, "_search", fail)
    with pytest.raises(RuntimeError):
        candidates.frontier(block)
    assert gc.isenabled()


def test_keep_sets_compare_on_their_bits_as_sorted_ids():
    """Ties between partial policies go to the least sorted keep set; the search holds keep sets as bits by the rank
    of each id among the sorted ids, and compares those bits: against sorted lists, over every pair of subsets of six
    ids (prefixes, disjoint sets, one inside the other)."""
    ids = ["q:mm#0", "a:mul#1", "k:norm#0", "a:mul#0", "z:add#0", "b:cat#0"]
    rank = {o: i for i, o in enumerate(sorted(ids))}
    subsets = [frozenset(c) for n in range(len(ids) + 1) for c in itertools.combinations(ids, n)]
    for a in subsets:
        for b in subsets:
            bits_a, bits_b = (sum(1 << rank[o] for o in x) for x in (a, b))
            assert candidates._keep_less(bits_a, bits_b) == (sorted(a) < sorted(b)), (sorted(a), sorted(b))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 199), max_size=40))
def test_a_set_listed_from_its_bits(positions):
    """_lister lists the values at an int's set bits in ascending order, across 16-bit chunks and remembered ones."""
    values = tuple(f"op{i}" for i in range(200))
    listed = candidates._lister(values)
    bits = sum(1 << i for i in set(positions))
    for _ in range(2):  # the second time from what it remembered
        assert listed(bits) == [values[i] for i in sorted(set(positions))]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(blocks())
def test_candidates_are_priced_as_policy_prices_them(block):
    """A candidate's costs come from its partial policy's sums (kept and regenerated bytes) and its recompute set's
    bits: they are policy.cost's, bit for bit (seconds summed in op order), its recompute set is in op order and
    executable."""
    info = policy.analyse(block)
    for c in candidates.frontier(block).candidates:
        cost = policy.cost(info, c.keep, c.recompute)
        assert (c.kept_bytes, c.rec_bytes, c.rec_s, c.replays_collective) == (
            cost.kept_bytes, cost.recomputed_bytes, cost.recompute_s, cost.replays_collective)
        assert list(c.recompute) == sorted(c.recompute, key=info.order.__getitem__)
        assert policy.validate(info, sorted(c.keep), list(c.recompute)) is None


@pytest.mark.parametrize("name", ["llama3-8b", "qwen3-32b"])
def test_catalog_candidates_are_priced_as_policy_prices_them(name):
    block = _catalog_layer(name)
    info = policy.analyse(block)
    got = candidates.frontier(block)
    assert got.exact
    for c in got.candidates:
        cost = policy.cost(info, c.keep, c.recompute)
        assert (c.kept_bytes, c.rec_bytes, c.rec_s, c.replays_collective) == (
            cost.kept_bytes, cost.recomputed_bytes, cost.recompute_s, cost.replays_collective)
        assert c.recompute == policy.closure(info, c.keep)  # what the keep set leaves to recompute, in op order
