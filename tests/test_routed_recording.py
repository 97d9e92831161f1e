"""What recording a routed (MoE) layer at every forward costs, from the profile to the plan: the torch runtime records
such a layer op by op where it keeps some ops (routing.py, region.py); `lynx profile --method measure` measures that
(Block.record_s), the simulator adds it to those layers' forwards, and the searches drop the candidates that full
recomputation, unrecorded, then beats."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import lynx
from models.moe import lynx_model as moe_model

from lynx_planner import apply_plan, evaluate, policy, simulator, solvers
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.profiler import profile_model_file
from lynx_planner.runtime import runtime_of
from lynx_planner.schema import ParallelConfig, Profile
from lynx_planner.solvers import candidates

MOE = str(Path(__file__).resolve().parent / "models" / "moe.py")
HW = HARDWARE["a100-80g-nvlink"]


@pytest.fixture(scope="module")
def plain():
    """The plain top-2 MoE's analytic profile (no recording measured)."""
    return profile_model_file(MOE, parallel=ParallelConfig(), hardware=HW, overrides={"name": "plain"},
                              progress=False, warn=lambda m: None)


def with_record_s(prof, seconds: float):
    """The profile with its MoE block's recording measured at `seconds` per forward."""
    blocks = dict(prof.blocks)
    blocks["Block"] = blocks["Block"].model_copy(update={"record_s": seconds})
    return prof.model_copy(update={"blocks": blocks})


def test_measured_profiles_time_the_recording_of_routed_layers_only(tmp_path):
    out = tmp_path / "moe.json"
    result = lynx("profile", MOE, "--method", "measure", "--repeats", "3", "-o", out)  # the plain MoE
    assert result.exit_code == 0, result.output
    prof = Profile.model_validate_json(out.read_text())
    # its experts follow the routing: recorded at every forward, op by op, which on this tiny layer costs 5-8 times
    # its forward (a region that keeps by storage, unrecorded, adds about half of it)
    block = prof.blocks["Block"]
    assert block.record_s > 2 * sum(op.fwd_s for op in block.ops)
    assert all(b.record_s == 0 for name, b in prof.blocks.items() if name != "Block")
    assert "record_s" not in prof.blocks["Embedding"].model_dump(mode="json")  # other profiles keep their bytes
    assert "routed layers recorded at every forward under a selective plan, per forward: Block " in result.output


def test_the_simulator_adds_the_recording_where_the_runtime_records(plain):
    prof = with_record_s(plain, 0.01)
    i = next(i for i, layer in enumerate(prof.layers) if layer.block == "Block")
    info = policy.analyse(prof.blocks["Block"])
    none = evaluate.none_policy(prof, i)
    plans = {"none": (none, False), "full": (evaluate.layer_policy(prof, i, frozenset()), False),
             "selective": (evaluate.layer_policy(prof, i, policy.selective_keep(info)), True),
             "none, offloading its input": (none.model_copy(update={"offload": ["input"]}), True)}
    for name, (pol, records) in plans.items():
        base, priced = (sum(simulator.layer_run(p, i, pol, 0).fwd) for p in (plain, prof))
        assert priced == pytest.approx(base + (0.01 if records else 0.0), abs=1e-12), name


def test_a_routed_layer_with_a_collective_is_recorded_recomputed_in_full_too():
    """Under TP the layer's forward runs collectives, whose outputs its replay reads as captured: full recomputation
    records it at every forward too, so it is priced there, and no candidate is dropped in its favour."""
    prof = profile_model_file(MOE, parallel=ParallelConfig(tp=2), hardware=HW, overrides={"name": "qwen2_moe"},
                              progress=False, warn=lambda m: None)
    name = "Qwen2MoeDecoderLayer"
    assert policy.analyse(prof.blocks[name]).collective
    blocks = dict(prof.blocks)
    blocks[name] = blocks[name].model_copy(update={"record_s": 1.0})
    priced = prof.model_copy(update={"blocks": blocks})
    i = next(i for i, layer in enumerate(prof.layers) if layer.block == name)
    full = evaluate.layer_policy(prof, i, frozenset())
    base, got = (sum(simulator.layer_run(p, i, full, 0).fwd) for p in (prof, priced))
    assert full.mode == "full" and got == pytest.approx(base + 1.0, abs=1e-12)
    assert candidates.pareto(priced.blocks[name]) == candidates.pareto(prof.blocks[name])


def test_the_searches_drop_what_unrecorded_full_recomputation_beats(plain):
    prof = with_record_s(plain, 1.0)  # recording costs far more than recomputing the whole layer
    before, after = candidates.pareto(plain.blocks["Block"]), candidates.pareto(prof.blocks["Block"])
    full = next(c for c in after if not c.keep and c.recompute)
    # dropped: each candidate that records (keeps some ops, recomputes others) and holds no fewer bytes than full,
    # kept or kept plus regenerated (full recomputes in less time than it does with the recording counted)
    beaten = [bool(c.keep and c.recompute) and full.kept_bytes <= c.kept_bytes and
              full.kept_bytes + full.rec_bytes <= c.kept_bytes + c.rec_bytes for c in before]
    assert any(beaten) and not all(beaten)
    assert [c in after for c in before] == [not b for b in beaten]
    # between full's peak and keeping everything, HEU's plan is at least as fast as full recomputation's
    full_plan = solvers.solve(prof, "full", 1 << 62).evaluation
    none_plan = solvers.solve(prof, "none", 1 << 62).evaluation
    limit = (full_plan.peak_bytes + none_plan.peak_bytes) // 2
    heu = solvers.solve(prof, "heu", limit).evaluation
    assert heu.fits(limit) and heu.predicted.iteration_time_s <= full_plan.predicted.iteration_time_s


@pytest.mark.parametrize("algo,records", [("selective", True), ("full", False), ("none", True)])
def test_the_runtime_records_routed_layers_where_their_policy_keeps_some_ops(plain, algo, records):
    model, inputs = moe_model("plain")
    plan = solvers.plan(plain, "p.json", "0" * 64, algo, 1 << 60)
    if algo == "none":  # keeping everything, the MoE layers offload their input: their regions send it away
        for pol in plan.stages[0].policies:
            if pol.block == "Block":
                pol.offload = ["input"]
    apply_plan(model.train(), plan)
    runtime = runtime_of(model)
    for step in range(2):
        out = model(*inputs)
        regions = list(runtime._regions.values())
        assert regions and all(r.recorded == (records or step == 0) for r in regions)
        out.float().sum().backward()
