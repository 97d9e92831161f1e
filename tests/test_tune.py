"""`lynx tune`: legal layouts, the pruning bound, the search's best configuration and its files, sizing, and the
memory prediction against a real CPU run."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from lynx_planner import evaluate as ev
from lynx_planner import tune
from lynx_planner.cli import app
from lynx_planner.io import file_sha256, load_model
from lynx_planner.models.catalog import MODELS, GPTConfig
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import Plan, Profile

TINY = GPTConfig("gpt-tune-tiny", num_layers=8, hidden=1024, heads=16, vocab=8192)
HW = HARDWARE["a100-80g-pcie"]
SEQ = 1024
runner = CliRunner()


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(MODELS, TINY.name, TINY)
    return TINY.name


def limit_between(model: str, gpus: int, batch: int, frac: float) -> int:
    """A limit `frac` of the way from full recomputation's least peak to no recomputation's, over the layouts."""
    from lynx_planner.solvers import solve

    profiles = tune.Profiles(model, HW, SEQ, True)
    lo = hi = None
    for lay in tune.layouts(gpus, HW, batch, TINY.num_layers, TINY.heads, SEQ):
        prof = profiles(lay)
        full, none = (solve(prof, a, 2**62).evaluation.peak_bytes for a in ("full", "none"))
        lo, hi = min(lo or full, full), min(hi or none, none)
    return int(lo + frac * (hi - lo))


def test_layouts_are_legal():
    found = tune.layouts(32, HW, 64, 8, 16, SEQ)
    assert found
    for lay in found:
        assert lay.tp * lay.pp * lay.dp == 32
        assert lay.tp <= HW.gpus_per_node and 16 % lay.tp == 0 and lay.pp <= 8
        assert lay.micro_batch_size * lay.num_microbatches * lay.dp == 64
        assert not lay.sequence_parallel or lay.tp > 1
    assert tune.Layout(8, 4, 1, 1, 64, True) in found
    assert tune.Layout(2, 16, 1, 1, 64, False) not in found  # more stages than layers
    assert not [l for l in tune.layouts(32, HW, 64, 8, 12, SEQ) if l.tp == 8]  # 8 does not divide 12 heads
    assert len(set(found)) == len(found)


@pytest.mark.parametrize("lay", [tune.Layout(1, 1, 1, 2, 4, False), tune.Layout(2, 4, 1, 1, 8, True),
                                 tune.Layout(4, 2, 2, 2, 3, False)])
def test_balanced_ideal_bounds_the_simulated_ideal(tiny, lay):
    prof = tune.Profiles(tiny, HW, SEQ, True)(lay)
    from lynx_planner.solvers.partition import even_bounds

    bound, ideal = tune.balanced_ideal_s(prof), ev.ideal_time(prof, even_bounds(prof, lay.pp))
    assert bound <= ideal + 1e-12
    if lay.pp == 1 and lay.dp == 1:
        assert bound == pytest.approx(ideal, rel=1e-12)  # one stage, nothing to transfer: the bound is exact


def test_pruning_keeps_the_best(tiny):
    limit = limit_between(tiny, 8, 16, 1.5)
    pruned = tune.tune(tiny, 8, HW, 16, SEQ, limit, top=1, make_plan=False)
    everything = tune.tune(tiny, 8, HW, 16, SEQ, limit, top=1000, make_plan=False)
    assert everything.pruned == 0 and pruned.pruned > 0
    assert pruned.top[0].layout == everything.top[0].layout
    assert pruned.top[0].tokens_per_s_per_gpu == pytest.approx(everything.top[0].tokens_per_s_per_gpu)
    best_meg = max(everything.rows, key=lambda r: (r.fits and r.algo in tune.MEGATRON_ROWS,
                                                    r.tokens_per_s_per_gpu or 0))
    assert pruned.best_megatron.tokens_per_s_per_gpu == pytest.approx(everything.best_megatron.tokens_per_s_per_gpu)
    assert everything.best_megatron.tokens_per_s_per_gpu >= best_meg.tokens_per_s_per_gpu * (1 - 1e-9)


def test_offload_pass_skips_only_layouts_that_cannot_enter_the_table(tiny):
    """HEU with offload runs once every layout has its HEU row, on the layouts whose balanced ideal can still beat the
    table: a one-row table tries fewer of them than a whole one, and finds the same best row."""
    limit = limit_between(tiny, 8, 16, 1.5)
    one = tune.tune(tiny, 8, HW, 16, SEQ, limit, top=1, make_plan=False)
    everything = tune.tune(tiny, 8, HW, 16, SEQ, limit, top=1000, make_plan=False)
    tried = [sum(r.algo == "heu-offload" for r in t.rows) for t in (one, everything)]
    assert 0 < tried[0] < tried[1]
    assert (one.top[0].layout, one.top[0].algo) == (everything.top[0].layout, everything.top[0].algo)
    assert one.top[0].tokens_per_s_per_gpu == pytest.approx(everything.top[0].tokens_per_s_per_gpu)


def test_table_bar_is_the_places_th_layouts_best_row():
    """A row enters the table by beating the best row of the `places`-th distinct layout (0 while fewer fit)."""
    a, b, c = (tune.Layout(1, pp, 1, 1, 4, False) for pp in (1, 2, 4))
    rows = [tune.Row(a, "heu", 1.0, 0, True, 300.0), tune.Row(a, "full", 1.0, 0, True, 250.0),
            tune.Row(b, "heu", 1.0, 0, True, 200.0), tune.Row(c, "heu", None, 0, False, None)]
    assert tune._table_bar(rows, 1) == 300.0
    assert tune._table_bar(rows, 2) == 200.0  # a's second row is not a second layout
    assert tune._table_bar(rows, 3) == 0.0  # c does not fit


def test_best_layout_plan_checks_and_fits(tiny, tmp_path):
    limit = limit_between(tiny, 8, 16, 1.5)
    result = tune.tune(tiny, 8, HW, 16, SEQ, limit, top=3)
    rates = [r.tokens_per_s_per_gpu for r in result.top]
    assert rates == sorted(rates, reverse=True)
    assert all(r.fits and r.peak_memory_bytes <= limit and r.simulated == "full" for r in result.top)
    assert any(not r.fits for r in result.rows)  # the limit rules out some (layout, algorithm) pairs
    profile_path, plan_path = tune.write_outputs(result, tmp_path)
    plan, profile = load_model(plan_path, Plan), load_model(profile_path, Profile)
    assert plan.profile_sha256 == file_sha256(profile_path)
    assert ev.check(plan, profile) == []
    best = result.top[0]
    assert (plan.parallel.tp, plan.parallel.pp, plan.parallel.dp) == (best.layout.tp, best.layout.pp, best.layout.dp)
    tokens = 16 * SEQ
    assert best.tokens_per_s_per_gpu == pytest.approx(tokens / plan.predicted.iteration_time_s / 8)


def test_time_limit_stops_the_search(tiny):
    result = tune.tune(tiny, 8, HW, 16, SEQ, time_limit=1e-9, make_plan=False)
    assert result.time_limit_hit and result.planned == 0


def test_fewest_gpus_is_the_least_that_fits(tiny):
    limit = 2**30
    sizing = tune.size_up(tiny, HW, 16, SEQ, limit, sizes_above=1)
    n = sizing.fewest_gpus
    assert n is not None and n > 1
    profiles = tune.Profiles(tiny, HW, SEQ, True)
    assert tune.fits_somewhere(tiny, n, HW, 16, SEQ, limit, profiles)
    assert not tune.fits_somewhere(tiny, n // 2, HW, 16, SEQ, limit, profiles)
    assert [g for g, _ in sizing.results] == [n, 2 * n]
    assert all(res.top and res.top[0].peak_memory_bytes <= limit for _, res in sizing.results)


def test_cli_json_rows_and_out(tiny, tmp_path):
    r = runner.invoke(app, ["tune", tiny, "--gpus", "8", "--hardware", HW.name, "--global-batch", "16",
                            "--seq-len", str(SEQ), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    keys = {"tp", "pp", "dp", "micro_batch_size", "num_microbatches", "sequence_parallel", "algo",
            "iteration_time_s", "tokens_per_s_per_gpu", "peak_memory_bytes", "fits"}
    assert rows and all(keys <= set(row) for row in rows)
    assert {row["algo"] for row in rows} >= {"heu", "full", "selective"}
    assert {row["algo"] for row in rows} & {"block", "none"}
    out = tmp_path / "best"
    r = runner.invoke(app, ["tune", tiny, "--gpus", "8", "--hardware", HW.name, "--global-batch", "16",
                            "--seq-len", str(SEQ), "--out", str(out), "--top", "3"])
    assert r.exit_code == 0, r.output
    assert "speedup" in r.stdout
    r = runner.invoke(app, ["check", str(out / "plan.json")])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args, message", [
    (["--gpus", "8", "--hardware", "tpu-v9"], "--hardware"),
    (["--gpus", "8", "--hardware", "a100-80g-pcie,h100-80g-nvlink", "--out", "x"], "--out"),
    (["--gpus", "8", "--hardware", "a100-80g-pcie", "--memory-limit", "1MiB"], "--memory-limit"),
    (["--gpus", "8", "--hardware", "a100-80g-pcie", "--time-limit", "0.001"], "--time-limit"),
    (["--hardware", "a100-80g-pcie", "--plot", "t.png"], "--plot"),
])
def test_cli_bad_input(tiny, args, message):
    r = runner.invoke(app, ["tune", tiny, "--global-batch", "16", "--seq-len", str(SEQ), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_memory_prediction_matches_a_cpu_run():
    """The memory side of sizing against a real run: the last stage's GPT blocks (bf16, CPU) with their micro-batches
    in flight keep, before the first backward, the activation bytes the profile and simulator predict, with nothing
    recomputed and with full recomputation (torch checkpointing)."""
    from torch.utils.checkpoint import checkpoint

    from lynx_planner.analytic import gpt_profile
    from lynx_planner.models.gpt_block import GPTBlock
    from lynx_planner.profiler.memory import LiveBytes
    from lynx_planner.schema import ParallelConfig
    from lynx_planner.simulator import expand_policies, layer_run
    from lynx_planner.solvers import Problem, megatron

    cfg = GPTConfig("gpt-mem", num_layers=4, hidden=256, heads=4, vocab=512)
    seq, mb, pp, m, stage = 128, 2, 2, 4, 0
    prof = gpt_profile(cfg, ParallelConfig(pp=pp, micro_batch_size=mb, seq_len=seq, num_microbatches=m), HW)
    torch.manual_seed(0)
    blocks = [GPTBlock(cfg.hidden, cfg.heads, seq).to(torch.bfloat16).train() for _ in range(cfg.num_layers)]
    params = [p for b in blocks for p in b.parameters()]
    for algo in ("none", "full"):
        strategy = megatron.search(Problem(prof, 2**62), algo)
        plans = ev.stage_plans(prof, strategy.bounds, strategy.policies)
        first = plans[stage].layers[0]
        pols = expand_policies(plans[stage].policies)
        layers = [i for i in range(*plans[stage].layers) if prof.layers[i].block == "gpt_layer"]
        in_flight = min(m, pp - stage)
        predicted = in_flight * sum(layer_run(prof, i, pols[i], first).kept_bytes for i in layers)
        inputs = [torch.randn(seq, mb, cfg.hidden, dtype=torch.bfloat16, requires_grad=True)
                  for _ in range(in_flight)]
        graphs = []
        with LiveBytes(ignore=params + inputs) as mem:
            for x in inputs:
                for i in layers:
                    x = checkpoint(blocks[i - 1], x, use_reentrant=False) if algo == "full" else blocks[i - 1](x)
                graphs.append(x.grad_fn)  # what backward needs stays alive; the stage's output itself does not
                del x
            # the first layer keeps its input, the stage input (ignored above: it lives outside the stage)
            measured = mem.live + in_flight * prof.blocks["gpt_layer"].input_bytes
        # CPU's LayerNorm keeps its mean and rstd in bf16, CUDA's (which the profile models) in fp32: 2 norms x 2
        # statistics x tokens x 2 bytes less per layer that keeps them
        if algo == "none":
            predicted -= in_flight * len(layers) * 2 * 2 * seq * mb * 2
        assert measured == predicted, (algo, measured, predicted)
        sim = ev.evaluate(prof, plans, ideal=False).sim.stages[stage].activation_peak_bytes
        assert sim >= predicted  # the simulated peak adds the embedding and what a backward regenerates
        del graphs


def test_megatron_baseline_runs_only_megatrons_schedules(tiny):
    """Megatron-LM runs 1F1B and interleaved 1F1B (no GPipe, no zero bubble): the Megatron-style best is on one of
    those, and there is none when only zero bubble was searched, though its rows use Megatron's recomputation."""
    limit = limit_between(tiny, 8, 16, 3.0)  # where zero-bubble layouts fit
    only_zb = tune.tune(tiny, 8, HW, 16, SEQ, limit, top=3, make_plan=False, names=("zero-bubble", "gpipe"))
    assert any(r.fits and r.algo in tune.MEGATRON_ROWS for r in only_zb.rows)
    assert only_zb.best_megatron is None
    both = tune.tune(tiny, 8, HW, 16, SEQ, limit, top=3, make_plan=False, names=("zero-bubble", "1f1b"))
    assert both.best_megatron is not None and both.best_megatron.layout.schedule == "1f1b"
    assert tune.MEGATRON_SCHEDULES == ("1f1b", "interleaved-1f1b")
