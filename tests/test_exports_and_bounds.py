"""Plans with expert parallelism, virtual stages and zero bubble sent through `lynx export` on the command line
(asserting on what it prints, not on export.py's functions), and tune's per-layout bound against the simulator's
time for every schedule (a bound above what a plan achieves would prune the winner)."""

from __future__ import annotations

import pytest

from conftest import lynx, small_profile
from lynx_planner import evaluate as ev
from lynx_planner import schedules, simulator, tune


def _plan(tmp_path, *profile_args, algo="full"):
    prof, plan = tmp_path / "p.json", tmp_path / "plan.json"
    r = lynx("profile", *profile_args, "-o", prof)
    assert r.exit_code == 0, r.output
    r = lynx("plan", prof, "--algo", algo, "-o", plan)
    assert r.exit_code == 0, r.output
    return plan


def _flags(output: str) -> dict[str, str]:
    """`--flag value` pairs (and bare `--flag`s) anywhere in the output."""
    words = output.replace("\\\n", " ").split()
    out = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else ""
            out[w] = "" if nxt.startswith("--") else nxt
    return out


def test_megatron_export_of_an_ep_plan_sets_the_expert_parallel_size(tmp_path):
    plan = _plan(tmp_path, "mixtral-8x7b", "--hardware", "h100-80g-nvlink", "--tp", "2", "--pp", "4", "--dp", "4",
                 "--ep", "4", "--seq-len", "1024", "--num-microbatches", "8")
    r = lynx("export", plan, "--to", "megatron")
    assert r.exit_code == 0, r.output
    flags = _flags(r.output)
    assert flags.get("--expert-model-parallel-size") == "4"
    assert flags.get("--tensor-model-parallel-size") == "2" and flags.get("--pipeline-model-parallel-size") == "4"


def test_megatron_export_of_an_interleaved_plan_names_the_virtual_stages(tmp_path):
    """gpt-1.3b's 24 layers on 2 ranks x 3 chunks, split evenly: 4 layers per virtual stage (Megatron-LM's
    --num-layers-per-virtual-pipeline-stage, or its layout string covering all 6 stages)."""
    plan = _plan(tmp_path, "gpt-1.3b", "--hardware", "a100-80g-nvlink", "--pp", "2", "--num-microbatches", "4",
                 "--schedule", "interleaved-1f1b", "--virtual-stages", "3", "--seq-len", "1024")
    r = lynx("export", plan, "--to", "megatron")
    assert r.exit_code == 0, r.output
    flags = _flags(r.output)
    if "--num-layers-per-virtual-pipeline-stage" in flags:
        assert flags["--num-layers-per-virtual-pipeline-stage"] == str(24 // 6)
    else:
        layout = flags["--pipeline-model-parallel-layout"].strip("'\"")
        assert layout.count("|") == 5  # six (virtual) stages
    assert "zero-bubble" not in r.output


@pytest.mark.parametrize("virtual", ["1", "2"])
def test_megatron_export_of_a_zero_bubble_plan_warns_it_runs_another_schedule(tmp_path, virtual):
    plan = _plan(tmp_path, "gpt-1.3b", "--hardware", "a100-80g-nvlink", "--pp", "2", "--num-microbatches", "4",
                 "--schedule", "zero-bubble", "--virtual-stages", virtual, "--seq-len", "1024")
    r = lynx("export", plan, "--to", "megatron")
    assert r.exit_code == 0, r.output
    assert "no zero-bubble schedule" in r.output
    runs = "these flags run interleaved 1F1B" if virtual == "2" else "these flags run 1F1B"
    assert runs in r.output


@pytest.mark.parametrize("schedule,virtual,torchtitan_name", [
    ("1f1b", "1", "1F1B"), ("gpipe", "1", "GPipe"), ("interleaved-1f1b", "2", "Interleaved1F1B"),
    ("zero-bubble", "2", "InterleavedZeroBubble")])
def test_torchtitan_export_names_the_plans_schedule(tmp_path, schedule, virtual, torchtitan_name):
    """torchtitan's --parallelism.pipeline_parallel_schedule values are the names of torch's schedule classes
    without 'Schedule' (torchtitan/distributed/pipeline_parallel.py: get_schedule_class)."""
    plan = _plan(tmp_path, "llama3-8b", "--hardware", "h100-80g-nvlink", "--pp", "2", "--num-microbatches", "4",
                 "--schedule", schedule, "--virtual-stages", virtual, "--seq-len", "1024")
    r = lynx("export", plan, "--to", "torchtitan")
    assert r.exit_code == 0, r.output
    words = r.output.replace("=", " ").replace('"', " ").split()
    i = words.index("--parallelism.pipeline_parallel_schedule")
    assert words[i + 1] == torchtitan_name


def _free_uniform(prof):
    """One block repeated, free transfers: the case the bound is exact for 1F1B."""
    rep = max(set(l.block for l in prof.layers), key=[l.block for l in prof.layers].count)
    uniform = prof.model_copy(update={"layers": [l for l in prof.layers if l.block == rep], "extra_static_bytes": 0})
    return uniform.model_copy(update={"hardware": uniform.hardware.model_copy(update={
        "intra_node_bus_bytes_per_s": 1e30, "inter_node_bus_bytes_per_s": 1e30, "intra_node_latency_s": 0.0,
        "inter_node_latency_s": 0.0, "p2p_bytes_per_s": None, "p2p_latency_s": None})})


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("zero-bubble", 1),
                                        ("zero-bubble", 2)])
@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8)])
def test_tune_bound_is_below_the_simulated_time_of_every_schedule(schedule, v, pp, m):
    """A bound on a layout's time must not exceed what the simulator gives its best plan (no recomputation, even
    split, here): zero bubble fills the bubble with weight gradients, so a bound charging 1F1B's bubble would prune
    zero-bubble layouts that win. Zero bubble's bound is m x one stage's work: no bubble at all."""
    base = small_profile(tp=1, pp=1, layers=8)
    par = base.parallel.model_copy(update={"pp": pp, "num_microbatches": m, "schedule": schedule,
                                           "virtual_stages": v})
    free = _free_uniform(base.model_copy(update={"parallel": par}))
    n = len(free.layers)
    bounds = [s * n // (pp * v) for s in range(pp * v + 1)]
    simulated = ev.ideal_time(free, bounds)
    bound = tune.balanced_ideal_s(free)
    assert bound <= simulated * (1 + 1e-9)
    fwd, bwd = simulator.block_segments(free.blocks[free.layers[0].block])
    if schedules.get(schedule).splits_backward:
        assert bound == pytest.approx(m * n / pp * (sum(fwd) + sum(bwd)), rel=1e-9)
