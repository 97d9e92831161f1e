"""`lynx export`: Megatron-LM arguments and torchtitan settings that reproduce a plan; the pictures of `--plot`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import between, small_profile
from typer.testing import CliRunner

from lynx_planner import evaluate as ev
from lynx_planner import export, solvers
from lynx_planner.cli import app
from lynx_planner.io import dumps
from lynx_planner.solvers.partition import even_bounds

runner = CliRunner()


def plan_of(profile, algo: str, limit: int, partition: str | None = None):
    return solvers.plan(profile, "p.json", "0" * 64, algo, limit, partition=partition)


def layout_counts(flag: str) -> list[int]:
    """Transformer layers per stage of a --pipeline-model-parallel-layout string."""
    body = re.search(r'"(.*)"', flag).group(1)
    counts = []
    for stage in body.split("|"):
        n = 0
        for part in stage.split(","):
            tok, _, k = part.partition("*")
            n += int(k or 1) if tok == "t" else 0
        counts.append(n)
    return counts


@pytest.mark.parametrize("pp", [2, 4])
def test_even_split_needs_no_flags(pp):
    """Megatron splits the decoder layers evenly by itself: no flag (with two stages, not even a first-stage count
    equal to half of them)."""
    prof = small_profile(pp=pp, layers=8)
    assert export.split_flags(prof, even_bounds(prof, pp)) == []


def test_uneven_ends_use_first_and_last_stage_flags():
    prof = small_profile(pp=4, layers=8)  # layers: embedding 0, transformer 1..8, head 9: 1 | 3 | 3 | 1
    assert export.split_flags(prof, [0, 2, 5, 8, 10]) == ["--decoder-first-pipeline-num-layers 1",
                                                           "--decoder-last-pipeline-num-layers 1"]
    assert export.split_flags(prof, [0, 3, 6, 9, 10]) == ['--pipeline-model-parallel-layout "E,t*2|t*3|t*3|L"']
    ten = small_profile(pp=4, layers=10)  # 1 | 2 | 2 | 5: each end its own count
    assert export.split_flags(ten, [0, 2, 4, 6, 12]) == ["--decoder-first-pipeline-num-layers 1",
                                                          "--decoder-last-pipeline-num-layers 5"]


@pytest.mark.parametrize("bounds", [[0, 2, 4, 7, 10], [0, 4, 5, 8, 10], [0, 1, 3, 6, 10]])
def test_other_splits_use_the_layout_string(bounds):
    prof = small_profile(pp=4, layers=8)
    flags = export.split_flags(prof, bounds)
    expected = [sum(prof.layers[i].block == "gpt_layer" for i in range(bounds[s], bounds[s + 1])) for s in range(4)]
    if flags[0].startswith("--pipeline-model-parallel-layout"):
        assert layout_counts(flags[0]) == expected
        assert flags[0].count("E") == 1 and flags[0].count("L") == 1
    else:  # equal middle stages
        assert len(set(expected[1:-1])) == 1


def test_megatron_choice_is_the_fastest_builtin_that_fits():
    prof = small_profile(pp=2, m=8)
    limit = between(prof, 0.5)
    plan = plan_of(prof, "heu", limit)
    got = export.megatron(plan, prof)
    assert "--tensor-model-parallel-size 2" in got.flags and "--pipeline-model-parallel-size 2" in got.flags
    assert any(f.startswith("--global-batch-size 8") for f in got.flags)
    assert got.recompute is not None and got.recompute.fits
    assert all(not c.fits or c.iteration_time_s >= got.recompute.iteration_time_s for c in got.choices)
    assert got.recompute.iteration_time_s >= plan.predicted.iteration_time_s - 1e-12  # HEU is at least as fast
    # on Megatron's own even split, its block choice is what `--algo block` plans
    block = plan_of(prof, "block", limit)
    on_even = export.megatron(block, prof)
    same = [c for c in on_even.choices if c.iteration_time_s == pytest.approx(block.predicted.iteration_time_s)]
    assert same and on_even.recompute.iteration_time_s <= block.predicted.iteration_time_s + 1e-12


def test_early_placements_are_reported_as_not_expressible():
    prof = small_profile(pp=2, m=8)
    plan = plan_of(prof, "heu", between(prof, 0.3))
    placements = {p.at for st in plan.stages for p in st.policies if p.recompute}
    notes = export.megatron(plan, prof).not_expressible
    assert bool(placements - {"on_demand"}) == any("on demand" in n for n in notes)


def test_torchtitan_settings_cover_every_layer_once():
    prof = small_profile(pp=2, m=8)
    plan = plan_of(prof, "heu", between(prof, 0.5))
    cfg = export.torchtitan(plan, prof)
    par = cfg["parallelism"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (2, 2)
    names = [n for part in par["module_fqns_per_model_part"] for n in part]
    assert names == ["tok_embeddings"] + [f"layers.{i}" for i in range(8)] + ["norm", "output"]
    assert cfg["activation_checkpoint"] == {"mode": "none"}
    assert cfg["training"]["local_batch_size"] == 8 and cfg["training"]["global_batch_size"] == 8
    assert export.toml(cfg).startswith("[parallelism]\n")


@pytest.fixture
def plan_file(tmp_path):
    prof = small_profile(pp=2, m=8)
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(dumps(prof))
    from lynx_planner.io import file_sha256

    limit = between(prof, 0.5)
    plan = solvers.plan(prof, str(profile_path), file_sha256(profile_path), "heu", limit)
    path = tmp_path / "plan.json"
    path.write_text(dumps(plan))
    return path


def test_cli_export(plan_file):
    r = runner.invoke(app, ["export", str(plan_file), "--to", "megatron"])
    assert r.exit_code == 0, r.output
    assert "--tensor-model-parallel-size 2" in r.stdout and "core_v0.20.0" in r.stdout
    assert "nearest Megatron recomputation" in r.stdout
    r = runner.invoke(app, ["export", str(plan_file), "--to", "torchtitan"])  # torchtitan builds no Megatron GPT
    assert r.exit_code == 2 and "Megatron GPT" in r.output, r.output  # (test_torchtitan_export.py: a Llama's)
    r = runner.invoke(app, ["export", str(plan_file), "--to", "torchtitan-0.2"])
    assert r.exit_code == 0, r.output
    assert "apply_plan" in r.stdout and "[activation_checkpoint]" in r.stdout
    r = runner.invoke(app, ["export", str(plan_file), "--to", "deepspeed"])
    assert r.exit_code == 2


def test_plots_are_pictures(plan_file, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "timeline.png"
    r = runner.invoke(app, ["simulate", str(plan_file), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    profile_path = plan_file.parent / "profile.json"
    cmp_png = tmp_path / "compare.png"
    r = runner.invoke(app, ["compare", str(profile_path), "--algos", "heu,full,block", "--plot", str(cmp_png)])
    assert r.exit_code == 0, r.output
    assert cmp_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = runner.invoke(app, ["simulate", str(plan_file), "--plot", str(tmp_path / "missing" / "t.png")])
    assert r.exit_code == 2 and not (tmp_path / "missing").exists()


def test_trace_memory_timeline_matches_the_peak(plan_file):
    from lynx_planner.io import load_model
    from lynx_planner.schema import Plan, Profile

    plan = load_model(plan_file, Plan)
    prof = load_model(plan_file.parent / "profile.json", Profile)
    e = ev.evaluate(prof, plan.stages, trace=True)
    for deltas, st in zip(e.sim.memory, e.predicted.stages):
        cur = peak = 0
        for _, d in sorted(deltas):
            cur += d
            peak = max(peak, cur)
        assert peak == st.activation_bytes and cur == 0


def test_compare_table_fits_80_columns_with_32_stages(tmp_path):
    prof = small_profile(pp=32, layers=32, m=32, tp=1)
    path = tmp_path / "deep.json"
    path.write_text(dumps(prof))
    for extra in ([], ["--verbose"]):
        r = runner.invoke(app, ["compare", str(path), "--algos", "heu,full,block", *extra], env={"COLUMNS": "80"},
                          terminal_width=80)
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()[1:]  # the title names the (long, temporary) profile path
        assert max(len(line) for line in lines) <= 80
        header = next(line for line in lines if "algo" in line)
        assert all(col in header for col in ("iteration s", "vs full", "peak GiB", "fits"))
        heu = next(line for line in lines if line.strip().startswith("heu"))
        assert "yes" in heu and "x" in heu


MEGATRON_FLAGS = Path(__file__).parent / "data" / "megatron_flags.txt"


@pytest.mark.parametrize("pp,dp,sp,algo,partition", [(2, 1, False, "heu", None), (4, 2, True, "full", "auto"),
                                                      (4, 1, False, "none", None)])
def test_megatron_flags_exist_in_megatrons_parser(pp, dp, sp, algo, partition):
    """Every flag of the export is one Megatron-LM's parser accepts (tests/data/megatron_flags.txt: read from
    Megatron-LM's source by scripts/megatron_flags.py; its first line names the version)."""
    known = {line for line in MEGATRON_FLAGS.read_text().splitlines() if line.startswith("--")}
    prof = small_profile(pp=pp, m=8, layers=8, sp=sp)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(update={"dp": dp,
                                                                                "distributed_optimizer": True})})
    plan = plan_of(prof, algo, between(prof, 0.5) if algo == "heu" else 10**15, partition=partition)
    got = export.megatron(plan, prof)
    emitted = got.flags + [f for c in got.choices for f in c.flags]
    names = {f.split()[0] for f in emitted}
    assert names and names <= known, sorted(names - known)
    assert export.MEGATRON_VERSION.split()[-1] in MEGATRON_FLAGS.read_text().splitlines()[0]


def test_torchtitan_02_hook_applies_each_virtual_stage_to_its_model_part(tmp_path):
    """pp 2 x 2 virtual stages: torchtitan's split makes 4 model parts, two per rank (chunks r and r + 2); the printed
    hook finds each part's chunk from the layers it holds, where the pipeline rank would name chunk 0 or 1 only."""
    import tomllib

    import torch
    from torch import nn

    from lynx_planner.runtime import runtime_of

    prof, plan = tmp_path / "profile.json", tmp_path / "plan.json"
    r = runner.invoke(app, ["profile", "gpt-1.3b", "--pp", "2", "--schedule", "interleaved-1f1b",
                            "--virtual-stages", "2", "--num-microbatches", "4", "-o", str(prof)])
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["plan", str(prof), "--algo", "full", "-o", str(plan)]).exit_code == 0
    r = runner.invoke(app, ["export", str(plan), "--to", "torchtitan-0.2"])
    assert r.exit_code == 0, r.output
    toml, hook = r.stdout.split("\n", 1)[1].split("\n# module_fqns_per_model_part", 1)
    parts = tomllib.loads(toml)["parallelism"]["module_fqns_per_model_part"]
    assert len(parts) == 4
    hook = "#" + hook.replace('"plan.json"', repr(str(plan)))

    for chunk, fqns in enumerate(parts):
        # torchtitan 0.2.2's Llama layout, split as its pipeline_module_split does: what the part lacks is dropped
        part = nn.Module()
        part.tok_embeddings = nn.Embedding(8, 4) if "tok_embeddings" in fqns else None
        part.layers = nn.ModuleDict({f.split(".")[1]: nn.Linear(4, 4) for f in fqns if f.startswith("layers.")})
        part.norm = nn.LayerNorm(4) if "norm" in fqns else None
        part.output = nn.Linear(4, 8) if "output" in fqns else None
        scope = {"model": part, "torch": torch}
        exec(hook, scope)  # noqa: S102 - the hook text the export prints, as a user pastes it
        assert runtime_of(scope["model"]).stage == chunk
