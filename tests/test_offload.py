"""Activation offload: the host link, the copy engine in the timeline (by hand), plans that offload, `lynx check`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lynx_planner import evaluate as ev
from lynx_planner import offload, policy, solvers
from lynx_planner.io import dumps, load_model
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import BLOCK_INPUT, Hardware, Plan, Profile
from tests.conftest import lynx, small_profile

ROOT = Path(__file__).resolve().parent.parent


def with_link(profile: Profile, gbs: float, pinned: int = 1 << 40, h2d_gbs: float | None = None,
              latency: float = 0.0) -> Profile:
    """The profile on a host link of `gbs` GB/s each way (`h2d_gbs`: host to device, where it differs), `latency`
    seconds per copy."""
    hw = profile.hardware.model_copy(update={"host_link": "pcie4-x16", "host_d2h_bytes_per_s": gbs * 1e9,
                                             "host_h2d_bytes_per_s": (h2d_gbs or gbs) * 1e9, "pinned_host_bytes": pinned,
                                             "host_link_shared_with_nic": False, "host_copy_latency_s": latency})
    return profile.model_copy(update={"hardware": hw})


def offloading(profile: Profile, layers: list[int], reload: str = "layer_above") -> list:
    """Keep everything; layers `layers` offload all they keep and their input."""
    pols = [ev.none_policy(profile, i) for i in range(len(profile.layers))]
    for i in layers:
        pols[i] = pols[i].model_copy(update={"offload": [BLOCK_INPUT] + list(pols[i].keep), "reload": reload})
    return ev.stage_plans(profile, [0, len(profile.layers)], pols)


def layer_bytes(profile: Profile, i: int) -> int:
    """What layer i keeps, by hand: its input and every unit's output and saved statistics."""
    block = profile.blocks[profile.layers[i].block]
    info = policy.analyse(block)
    return block.input_bytes + sum(info.unit_bytes[u] for u in info.units)


# ----------------------------------------------------------------------------------------------------- hardware

def test_catalog_hardware_keeps_its_bytes_and_gets_its_link_by_name():
    hw = HARDWARE["h100-80g-nvlink"]
    assert "host" not in hw.model_dump_json() and "pinned" not in hw.model_dump_json()
    link = offload.host_link(hw)
    assert link.kind == "pcie5-x16" and link.d2h_bytes_per_s == 55.6e9 and link.shared_with_nic
    a100 = offload.host_link(HARDWARE["a100-80g-nvlink"])
    assert a100.kind == "pcie4-x16" and 25e9 < a100.h2d_bytes_per_s < 31.5e9  # measured share of the datasheet rate
    assert 5e-6 <= link.latency_s <= 7e-6  # DualPath's measured 5-7 us per cudaMemcpyAsync
    # a hardware file's own latency wins, 0 included
    assert offload.host_link(hw.model_copy(update={"host_copy_latency_s": 0.0})).latency_s == 0.0


def test_hardware_file_fields_win_and_a_cpu_has_nothing_to_offload_to():
    hw = HARDWARE["h100-80g-nvlink"].model_copy(update={"host_d2h_bytes_per_s": 40e9, "pinned_host_bytes": 1 << 30})
    assert Hardware.model_validate_json(hw.model_dump_json()).host_d2h_bytes_per_s == 40e9
    link = offload.host_link(hw)
    assert link.d2h_bytes_per_s == 40e9 and link.h2d_bytes_per_s == 55.6e9 and link.pinned_bytes == 1 << 30
    assert offload.host_link(hw.model_copy(update={"device": "cpu"})) is None
    assert offload.host_link(hw.model_copy(update={"name": "mystery", "host_d2h_bytes_per_s": None})) is None


def test_nic_takes_its_share_where_groups_leave_the_node():
    from lynx_planner.schema import ParallelConfig

    prof = small_profile(tp=1, pp=1, m=1, hardware="h100-80g-nvlink")
    assert offload.rank_link(prof).d2h_bytes_per_s == 55.6e9  # one rank: no inter-node traffic
    wide = prof.model_copy(update={"parallel": ParallelConfig(tp=1, pp=1, dp=16, seq_len=1024)})
    # 8 NICs per 8 GPUs: one NIC's 45 GB/s inter-node bus bandwidth per GPU would leave 10.6 GB/s; the link keeps
    # at least half (the NIC's traffic is not all in one direction at once)
    assert wide.hardware.inter_node_bus_bytes_per_s == 45e9
    assert offload.rank_link(wide).d2h_bytes_per_s == pytest.approx(55.6e9 / 2)
    narrow = wide.model_copy(update={"hardware": wide.hardware.model_copy(update={"nics_per_node": 1})})
    assert offload.rank_link(narrow).d2h_bytes_per_s == pytest.approx(55.6e9 - 45e9 / 8)


# ------------------------------------------------------------------------------------------------ the timeline

def _fwd_bwd(profile: Profile, i: int) -> tuple[float, float]:
    block = profile.blocks[profile.layers[i].block]
    return sum(op.fwd_s for op in block.ops), sum(op.bwd_s for op in block.ops)


@pytest.mark.parametrize("d2h, h2d", [(0.05, 0.05), (0.05, 0.2)])
def test_a_slow_link_stalls_the_backward_by_hand(d2h, h2d):
    """One micro-batch, one stage, tp 1: layer 2's copy out (at the device-to-host rate) starts when its forward
    ends and its copy back (host to device) when backward enters layer 3, not before the copy out has ended; layer
    2's backward waits for it. Each tensor is one copy and pays the link's fixed latency (1 ms here) each way."""
    prof = with_link(small_profile(tp=1, pp=1, m=1, dropout=0.0), gbs=d2h, h2d_gbs=h2d, latency=1e-3)
    j, n = 2, len(prof.layers)
    nbytes = layer_bytes(prof, j)
    copies = 1 + len(ev.none_policy(prof, j).keep)  # the input and every kept unit
    f = [_fwd_bwd(prof, i)[0] for i in range(n)]
    b = [_fwd_bwd(prof, i)[1] for i in range(n)]
    out_way = copies * 1e-3 + nbytes / (d2h * 1e9)
    back_way = copies * 1e-3 + nbytes / (h2d * 1e9)
    out_end = sum(f[:j + 1]) + out_way
    enter_above = sum(f) + sum(b[j + 2:])  # backward starts when the forward ends (one stage)
    assert out_end > enter_above  # the copy back waits for the copy out
    back_end = max(enter_above, out_end) + back_way
    stall = back_end - (sum(f) + sum(b[j + 1:]))
    base = ev.evaluate(prof, offloading(prof, []))
    got = ev.evaluate(prof, offloading(prof, [j]))
    st = got.predicted.stages[0]
    assert st.offload_stall_s == pytest.approx(stall, rel=1e-9)
    assert got.predicted.iteration_time_s - base.predicted.iteration_time_s == pytest.approx(stall, rel=1e-9)
    assert st.offloaded_bytes == nbytes and st.host_peak_bytes == nbytes
    assert st.link_busy_s == pytest.approx(max(out_way, back_way))  # the busier direction
    # the copy out has not ended when the forward does: the device still holds the layer at the peak
    assert st.activation_bytes == base.predicted.stages[0].activation_bytes


def test_a_fast_link_frees_the_layer_before_the_peak():
    prof = with_link(small_profile(tp=1, pp=1, m=1, dropout=0.0), gbs=1e4)
    base = ev.evaluate(prof, offloading(prof, []))
    got = ev.evaluate(prof, offloading(prof, [1]))
    st = got.predicted.stages[0]
    assert st.offload_stall_s == 0.0
    assert got.predicted.iteration_time_s == pytest.approx(base.predicted.iteration_time_s, rel=1e-12)
    assert st.activation_bytes == base.predicted.stages[0].activation_bytes - layer_bytes(prof, 1)


def test_copies_queue_on_the_link_and_host_memory_adds_up():
    """Every layer offloaded over one link: the copies out run back to back, so the link is busy their sum; the host
    holds all of them at once (one micro-batch in flight)."""
    prof = with_link(small_profile(tp=1, pp=1, m=1, dropout=0.0), gbs=0.05)
    layers = [i for i, l in enumerate(prof.layers) if l.block == "gpt_layer"]
    got = ev.evaluate(prof, offloading(prof, layers)).predicted.stages[0]
    total = sum(layer_bytes(prof, i) for i in layers)
    assert got.offloaded_bytes == total and got.host_peak_bytes == total
    assert got.link_busy_s == pytest.approx(total / 0.05e9)


def test_grad_wait_reload_fetches_at_the_backward_start_and_holds_more():
    prof = with_link(small_profile(tp=1, pp=1, m=1, dropout=0.0), gbs=1e4)
    layers = [i for i, l in enumerate(prof.layers) if l.block == "gpt_layer"]
    ahead = ev.evaluate(prof, offloading(prof, layers)).predicted.stages[0]
    first = ev.evaluate(prof, offloading(prof, layers, "grad_wait")).predicted.stages[0]
    assert first.activation_bytes > ahead.activation_bytes  # all of them back at once


def test_trace_draws_the_copy_engine():
    prof = with_link(small_profile(tp=1, pp=1, m=2, dropout=0.0), gbs=0.05)
    sim = ev.evaluate(prof, offloading(prof, [2]), trace=True).sim
    copies = [e for e in sim.trace if e["tid"] == "copy engine"]
    assert {e["name"] for e in copies} == {"D2H mb0 L2", "H2D mb0 L2", "D2H mb1 L2", "H2D mb1 L2"}
    assert any(e["name"].startswith("wait H2D") for e in sim.trace)


# --------------------------------------------------------------------------------------------------- the plans

@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    path = d / "p.json"
    r = lynx("profile", "llama3-8b", "-o", str(path), "--hardware", "h100-80g-nvlink", "--seq-len", "8192",
             "--dp", "8", "--num-microbatches", "2")
    assert r.exit_code == 0, r.output
    return path


def test_heu_offload_beats_heu_and_checks(llama, tmp_path):
    prof = load_model(llama, Profile)
    limit = 75 << 30
    heu = solvers.solve(prof, "heu", limit).evaluation.predicted.iteration_time_s
    s = solvers.solve(prof, "heu-offload", limit)
    assert s.evaluation.predicted.iteration_time_s < heu
    assert any(p.offload for st in s.stages for p in st.policies)
    out = tmp_path / "plan.json"
    assert lynx("plan", str(llama), "--algo", "heu-offload", "-o", str(out)).exit_code == 0
    assert json.loads(out.read_text())["schema_version"] == 2
    r = lynx("check", str(out))
    assert r.exit_code == 0, r.output


def test_check_rejects_a_plan_that_offloads_more_than_arrives(llama, tmp_path):
    out = tmp_path / "plan.json"
    assert lynx("plan", str(llama), "--algo", "heu-offload", "-o", str(out)).exit_code == 0
    data = json.loads(out.read_text())
    prof = load_model(llama, Profile)
    for st in data["stages"]:  # hand-edit: every layer keeps and offloads everything
        for p in st["policies"]:
            info = policy.analyse(prof.blocks[p["block"]])
            if p["block"].endswith("DecoderLayer"):
                p.update(keep=list(info.units), recompute=[], mode="none", at="on_demand",
                         offload=["input"] + [u for u in info.units if info.unit_bytes[u]])
    out.write_text(json.dumps(data))
    r = lynx("check", str(out))
    assert r.exit_code == 1
    assert "does not carry the offloaded tensors in time" in r.output
    plan = load_model(out, Plan)
    stall = ev.verify(plan, prof).evaluation.predicted.stages[0].offload_stall_s
    assert stall > 0.1  # the stall is in the simulation, and in its iteration time


def test_check_rejects_offloading_what_is_not_kept_and_host_overflow(llama, tmp_path):
    prof = load_model(llama, Profile)
    s = solvers.solve(prof, "full", 1 << 40)
    stages = [st.model_copy(deep=True) for st in s.stages]
    pol = next(p for p in stages[0].policies if p.block.endswith("DecoderLayer"))
    pol.offload = [pol.recompute[3]]
    plan = ev.make_plan(prof, str(llama), "0" * 64, "full", 75 << 30, stages, s.solver)
    assert any("not kept" in p for p in ev.check(plan, prof))
    small = prof.model_copy(update={"hardware": prof.hardware.model_copy(update={"pinned_host_bytes": 1 << 20})})
    f = solvers.solve(small, "full-offload", 1 << 40)
    plan = ev.make_plan(small, "p", "0" * 64, "full-offload", small.hardware.memory_bytes, f.stages, f.solver,
                        f.evaluation)
    assert any("pinned host memory" in p for p in ev.check(plan, small))


def test_full_offload_sends_every_saved_byte(llama):
    prof = load_model(llama, Profile)
    s = solvers.solve(prof, "full-offload", 1 << 40)
    layers = [i for i, l in enumerate(prof.layers) if l.block.endswith("DecoderLayer")]
    assert s.evaluation.predicted.stages[0].offloaded_bytes == sum(layer_bytes(prof, i) for i in layers)
    assert s.evaluation.predicted.stages[0].exposed_recompute_s == 0.0


def test_megatron_modules_on_llama(llama):
    """attn_proj offloads what o_proj saves (the attention output); core_attn what flash attention saves (q, k after
    RoPE, v, its output and statistics); layer_input the block input."""
    prof = load_model(llama, Profile)
    block = prof.blocks["LlamaDecoderLayer"]
    assert offload.module_units(block, ["attn_proj"]) == (["self_attn:_scaled_dot_product_flash_attention#0"], False)
    core, _ = offload.module_units(block, ["core_attn"])
    assert set(core) == {"self_attn:add#0", "self_attn:add#1", "self_attn.v_proj:mm#0",
                         "self_attn:_scaled_dot_product_flash_attention#0"}
    assert offload.module_units(block, ["layer_input"]) == ([], True)
    s = solvers.solve(prof, "offload", 1 << 40, offload_modules=("core_attn",))
    pol = next(p for p in s.stages[0].policies if p.block == "LlamaDecoderLayer")
    assert set(pol.offload) == set(core) and "input_layernorm:mul#1" in pol.recompute  # layernorm recomputed
    # Megatron's --offload-modules layer_input: the block's input goes to the host beside core_attn's tensors
    s = solvers.solve(prof, "offload", 1 << 40, offload_modules=("core_attn", "layer_input"))
    pol = next(p for p in s.stages[0].policies if p.block == "LlamaDecoderLayer")
    assert set(pol.offload) == set(core) | {BLOCK_INPUT}


def test_offload_needs_a_host_link(tmp_path):
    prof = small_profile(tp=1, pp=1, m=1)
    cpu = prof.model_copy(update={"hardware": prof.hardware.model_copy(update={"host_link": "none"})})
    with pytest.raises(Exception, match="no host link"):
        solvers.solve(cpu, "full-offload", 1 << 40)


# ----------------------------------------------------------------------------------------------- plan versions

def test_old_plans_load_with_their_meaning_and_bytes():
    for path in sorted((ROOT / "plans").glob("*.json")):
        plan = load_model(path, Plan)
        assert plan.schema_version == 1 and not any(p.offload for st in plan.stages for p in st.policies)
        assert dumps(plan) == path.read_text()


def test_unknown_plan_version_exits_2(tmp_path):
    path = next((ROOT / "plans").glob("*heu.json"))
    data = json.loads(path.read_text())
    data["schema_version"] = 3
    bad = tmp_path / "v3.json"
    bad.write_text(json.dumps(data))
    r = lynx("check", str(bad), "--profile", str(ROOT / data["profile_path"]))
    assert r.exit_code == 2 and "schema_version" in r.output and "Traceback" not in r.output


def test_bad_offload_modules_exit_2(llama, tmp_path):
    r = lynx("plan", str(llama), "--algo", "offload", "--offload-modules", "core_attn,bogus", "-o",
             str(tmp_path / "x.json"))
    assert r.exit_code == 2 and "--offload-modules" in r.output and not (tmp_path / "x.json").exists()


def test_export_round_trips_megatron_offload_modules(tmp_path):
    """A plan made as Megatron's `--offload-modules core_attn attn_proj` (layernorm recomputed) exports as exactly
    those flags; torchtitan 0.3 gets a note (it offloads no activations)."""
    llama = tmp_path / "p.json"
    r = lynx("profile", "llama3-8b", "-o", str(llama), "--hardware", "h100-80g-nvlink", "--seq-len", "2048",
             "--dp", "8", "--num-microbatches", "2")
    assert r.exit_code == 0, r.output
    out = tmp_path / "plan.json"
    r = lynx("plan", str(llama), "--algo", "offload", "--offload-modules", "core_attn,attn_proj", "-o", str(out))
    assert r.exit_code == 0, r.output
    plan, prof = load_model(out, Plan), load_model(llama, Profile)
    assert offload.nearest_modules(plan, prof) == (["core_attn", "attn_proj"], ["layernorm"])
    r = lynx("export", str(out), "--to", "megatron")
    assert r.exit_code == 0, r.output
    assert "--fine-grained-activation-offloading" in r.output and "--offload-modules core_attn attn_proj" in r.output
    r = lynx("export", str(out), "--to", "torchtitan")
    assert r.exit_code == 0 and "torchtitan 0.3 offloads only parameters" in r.output


# ------------------------------------------------------------------------------------------ the link as bottleneck

@pytest.fixture(scope="module")
def gen4_long(tmp_path_factory):
    """llama3-8b at seq 10240 on an H100 behind a PCIe 4.0 host link (benchmarks/offload_cases.py, case B)."""
    from benchmarks.offload_cases import gen4_h100

    d = tmp_path_factory.mktemp("gen4")
    hw, path = d / "hw.json", d / "p.json"
    hw.write_text(dumps(gen4_h100()))
    r = lynx("profile", "llama3-8b", "-o", path, "--hardware", hw, "--seq-len", "10240", "--dp", "8",
             "--num-microbatches", "2")
    assert r.exit_code == 0, r.output
    return path


def test_a_link_bound_plan_offloads_what_the_window_carries_and_recomputes_the_rest(gen4_long, tmp_path):
    prof = load_model(gen4_long, Profile)
    limit = 75 << 30
    got = solvers.solve(prof, "heu-offload", limit).evaluation.predicted.stages[0]
    link = offload.rank_link(prof)
    fwd = sum(op.fwd_s for l in prof.layers for op in prof.blocks[l.block].ops)
    # what leaves fits in one forward window, and recomputation is still exposed: memory asks for more than that
    assert 0 < got.offloaded_bytes / link.d2h_bytes_per_s < fwd
    assert got.exposed_recompute_s > 0.2 and got.offload_stall_s == 0.0
    # the link is what bounds it: with twice the bandwidth the same search offloads more and recomputes less
    fast = with_link(prof, gbs=2 * link.d2h_bytes_per_s / 1e9, latency=link.latency_s)
    more = solvers.solve(fast, "heu-offload", limit).evaluation.predicted.stages[0]
    assert more.offloaded_bytes > 1.5 * got.offloaded_bytes and more.exposed_recompute_s < got.exposed_recompute_s


def test_check_rejects_a_link_bound_plan_edited_to_offload_more(gen4_long, tmp_path):
    """Hand-edit: every layer that recomputes keeps all and offloads what it recomputed (twice what the window
    carries). The fresh simulation stalls the backward on late prefetches; `lynx check` says so and exits 1."""
    from lynx_planner.solvers.offload import offloaded_instead

    out = tmp_path / "plan.json"
    assert lynx("plan", gen4_long, "--algo", "heu-offload", "--memory-limit", "75GiB", "-o", out).exit_code == 0
    plan = load_model(out, Plan)
    prof = load_model(gen4_long, Profile)
    data = json.loads(out.read_text())
    for st, st_json in zip(plan.stages, data["stages"]):
        st_json["policies"] = [json.loads(offloaded_instead(prof, p).model_copy(update={"layers": p.layers})
                                          .model_dump_json(exclude_defaults=True))
                               if p.recompute else st_json["policies"][j] for j, p in enumerate(st.policies)]
    out.write_text(json.dumps(data))
    r = lynx("check", out)
    assert r.exit_code == 1
    assert "does not carry the offloaded tensors in time" in r.output
    sim = ev.verify(load_model(out, Plan), prof).evaluation.predicted
    assert sim.stages[0].offload_stall_s > 0.05  # the stall is in the simulation, and in its iteration time
    assert sim.iteration_time_s > plan.predicted.iteration_time_s


# ------------------------------------------------------------------------------------------------ OPT with offload

def _milp_choices(prof: Profile, limit: int):
    from lynx_planner.schema import PLACEMENTS
    from lynx_planner.solvers import milp
    from lynx_planner.solvers.stage_model import stage_model

    models = [stage_model(prof, 0, 0, len(prof.layers), limit, 0.0)]
    return models[0], milp.solve(prof, models, PLACEMENTS, "iteration", 60.0, None, offload.rank_link(prof))


def test_opt_offload_milp_keeps_its_copies_in_the_windows():
    """The MILP's offloaded layers: their copies out fit in the forward after the lowest layer's, each copy back in
    the backward of the layer above (summed here by hand from the profile's blocks); none at the top."""
    from lynx_planner.solvers.milp import Offloaded

    prof = with_link(small_profile(tp=1, pp=1, m=2, dropout=0.0, layers=8, seq=4096), gbs=200.0, latency=1e-5)
    full = ev.evaluate(prof, ev.stage_plans(prof, [0, len(prof.layers)],
                                            [ev.none_policy(prof, i) for i in range(len(prof.layers))]), ideal=False)
    limit = full.peak_bytes - (full.peak_bytes - full.predicted.stages[0].static_bytes) // 3  # a third must go
    model, result = _milp_choices(prof, limit)
    picks = [(slot, c) for slot, (c, _) in zip(model.slots, result.choices[0]) if isinstance(c, Offloaded)]
    assert picks, "with a link and memory short, the MILP offloads"
    fwd = sum(_fwd_bwd(prof, i)[0] for i in range(len(prof.layers)))
    d2h = sum(c.off_bytes / 200e9 + len(c.offload) * 1e-5 for _, c in picks)
    assert d2h <= fwd * (1 - 1 / len(prof.layers)) + 1e-9
    for slot, c in picks:
        assert not slot.top
        assert c.off_bytes / 200e9 + len(c.offload) * 1e-5 <= _fwd_bwd(prof, slot.layer + 1)[1] + 1e-9
    # a link too slow for any layer's copy back within a layer's backward: the MILP offloads nothing
    slow = with_link(prof, gbs=0.01)
    _, none = _milp_choices(slow, limit)
    assert not any(isinstance(c, Offloaded) for c, _ in none.choices[0])


def test_opt_offload_plans_check_and_its_milp_beats_heu_offload(llama, tmp_path):
    """opt-offload returns the MILP's plan only where it simulates faster than heu-offload's (its baseline): here it
    does. Its status is never `optimal` (a restricted model's optimum proves nothing of the problem)."""
    out = tmp_path / "plan.json"
    assert lynx("plan", llama, "--algo", "opt-offload", "--memory-limit", "75GiB", "-o", out).exit_code == 0
    r = lynx("check", out)
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["solver"]["source"] == "milp" and data["solver"]["status"] in ("feasible", "time_limit")
    assert data["schema_version"] == 2 and any(p.get("offload") for st in data["stages"] for p in st["policies"])
    data["solver"].update(status="optimal", gap=0.0)  # hand-edited to claim optimality: check refuses
    out.write_text(json.dumps(data))
    r = lynx("check", out)
    assert r.exit_code == 1 and "proves no optimum" in r.output


def test_opt_offload_needs_a_host_link(tmp_path):
    prof = small_profile(tp=1, pp=1, m=1)
    cpu = prof.model_copy(update={"hardware": prof.hardware.model_copy(update={"host_link": "none"})})
    path = tmp_path / "p.json"
    path.write_text(dumps(cpu))
    r = lynx("plan", path, "--algo", "opt-offload", "-o", tmp_path / "plan.json")
    assert r.exit_code == 2 and "no host link" in r.output
    assert not (tmp_path / "plan.json").exists()


# ------------------------------------------------------------------------------------------------------ lynx tune

TUNE = ("tune", "gpt-1.3b", "--gpus", "1", "--global-batch", "8", "--seq-len", "8192", "--memory-limit", "29GiB",
        "--json")


def test_tune_plans_offload_where_the_hardware_has_a_host_link(tmp_path):
    """At 29 GiB HEU recomputes on every layout; over the A100's PCIe link HEU with offload wins the table, and
    --out writes its plan, which checks. The same hardware with no host link gets no offload rows."""
    out = tmp_path / "out"
    r = lynx(*TUNE, "--hardware", "a100-40g-nvlink", "--out", out)
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output[r.output.index("["):])
    fits = [row for row in rows if row["fits"]]
    assert fits[0]["algo"] == "heu-offload"
    heu = next(row for row in fits if row["algo"] == "heu" and all(row[k] == fits[0][k] for k in
                                                                     ("tp", "pp", "dp", "micro_batch_size")))
    assert fits[0]["iteration_time_s"] < heu["iteration_time_s"]
    assert json.loads((out / "plan.json").read_text())["algo"] == "heu-offload"
    assert lynx("check", out / "plan.json").exit_code == 0
    hw = tmp_path / "hw.json"
    hw.write_text(dumps(HARDWARE["a100-40g-nvlink"].model_copy(update={"host_link": "none"})))
    r = lynx(*TUNE, "--hardware", hw)
    assert r.exit_code == 0, r.output
    assert not any(row["algo"] == "heu-offload" for row in json.loads(r.output[r.output.index("["):]))
