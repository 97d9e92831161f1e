"""torchtitan 0.3 as a target: `lynx export --to torchtitan` parsed by torchtitan's own ConfigManager, and the LynxAC
hook applying a plan to torchtitan's Llama 3 debug model (CPU) with the gradients and the step of the unplanned model.
Skipped when torchtitan is absent (the `torchtitan` extra)."""

from __future__ import annotations

import copy
import shlex
import sys
import warnings

import pytest
import torch
from conftest import between, lynx

from lynx_planner.io import load_model
from lynx_planner.schema import Plan, Profile

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install 'lynx-planner[torchtitan]')")

from torchtitan.config.manager import ConfigManager  # noqa: E402

from lynx_planner.integrations.torchtitan import LynxAC, debug_llama3, plan_stage  # noqa: E402
from lynx_planner.runtime import runtime_of  # noqa: E402


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A profile of torchtitan's debug Llama 3 (its 6 layers, pp 2) and a HEU plan between no and full recomputation."""
    d = tmp_path_factory.mktemp("tt")
    r = lynx("profile", "examples/torchtitan_llama3.py", "--pp", 2, "--num-microbatches", 4, "-o", d / "profile.json")
    assert r.exit_code == 0, r.output
    profile = load_model(d / "profile.json", Profile)
    r = lynx("plan", d / "profile.json", "--algo", "heu", "--memory-limit", between(profile, 0.5),
             "-o", d / "plan.json")
    assert r.exit_code == 0, r.output
    return d


def export_args(plan_dir) -> list[str]:
    r = lynx("export", plan_dir / "plan.json", "--to", "torchtitan")
    assert r.exit_code == 0, r.output
    lines = r.stdout.split("\n# Apply the plan")[0].splitlines()
    text = " ".join(line.rstrip("\\") for line in lines if not line.startswith("#"))
    return shlex.split(text)


def test_export_parses_with_torchtitans_config_manager(planned):
    args = export_args(planned)
    config = ConfigManager().parse_args(args)
    par = config.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (1, 2)
    parts = par.module_fqns_per_model_part
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    assert [n for part in parts for n in part if n.startswith("layers.")] == [f"layers.{i}" for i in range(6)]
    assert config.training.disable_cuda_graphs is True
    assert config.activation_checkpoint is None  # lynx's plan replaces torchtitan's AC
    assert config.training.local_batch_size == 2 * 4


def test_hook_config_passes_the_config_manager(planned, tmp_path, monkeypatch):
    r = lynx("export", planned / "plan.json", "--to", "torchtitan")
    hook = r.stdout.split("\n# Apply the plan", 1)[1].split("\n", 1)[1]
    (tmp_path / "lynx_configs.py").write_text(hook)
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # tyro warns (TyroWarning) when the AC config fits no type
        config = ConfigManager().parse_args(["--module", "lynx_configs", "--config", "llama3_debugmodel_lynx"])
        assert isinstance(config.activation_checkpoint, LynxAC.Config)
        assert config.activation_checkpoint.plan == "plan.json"
        assert config.model_spec is not None and config.training.steps > 0  # the rest of the config is kept
        # the plan is a command-line setting like any AC option
        config = ConfigManager().parse_args(["--module", "lynx_configs", "--config", "llama3_debugmodel_lynx",
                                             "activation-checkpoint:lynx", "--activation-checkpoint.plan", "other.json",
                                             "--activation-checkpoint.stage", "1"])
        assert (config.activation_checkpoint.plan, config.activation_checkpoint.stage) == ("other.json", 1)
        config = ConfigManager().parse_args(["--module", "lynx_configs", "--config", "llama3_debugmodel_lynx",
                                             "activation-checkpoint:full"])
        assert not isinstance(config.activation_checkpoint, LynxAC.Config)
    sys.modules.pop("lynx_configs", None)


def one_step(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """One training step (AdamW); the gradients, then the updated parameters."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    logits = model(tokens)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten()).backward()
    grads = {f"grad {n}": p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    return grads | {n: p.detach().clone() for n, p in model.named_parameters()}


def test_lynx_ac_trains_torchtitans_llama3_with_equal_gradients(planned):
    plan = load_model(planned / "plan.json", Plan)
    assert any(p.mode != "none" for st in plan.stages for p in st.policies), "the plan should recompute something"
    torch.manual_seed(0)
    base = debug_llama3(layers=6)
    tokens = torch.randint(0, 2048, (2, 64))
    model = copy.deepcopy(base)
    # what torchtitan's parallelize_llama does: ac_config.build(dump_folder=...).apply(model)
    LynxAC.Config(plan=str(planned / "plan.json")).build(dump_folder=str(planned)).apply(model)
    runtime = runtime_of(model)
    assert runtime.stage == 0 and [layer.path for layer in runtime.layers][:2] == ["tok_embeddings", "layers.0"]
    expected, got = one_step(base, tokens), one_step(model, tokens)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def test_lynx_ac_finds_the_stage_of_a_pipeline_part(planned):
    """torchtitan's pipeline split keeps `layers.N` of the whole model (ModuleDict) and sets the rest to None."""
    plan = load_model(planned / "plan.json", Plan)
    part = debug_llama3(layers=6)
    last = plan.stages[-1]
    for i in range(last.layers[0] - 1):  # the layers of stage 0 (index 0 is tok_embeddings)
        del part.layers[str(i)]
    part.tok_embeddings = None
    assert plan_stage(part, plan) == 1
    LynxAC.Config(plan=str(planned / "plan.json")).build().apply(part)
    assert runtime_of(part).stage == 1


def test_fsdp_hsdp_and_cp_export_parse_with_torchtitans_config_manager(tmp_path):
    """HSDP (shards of 2 of 4 DP ranks) and CP 2 on a catalog Llama: torchtitan's own parser reads the degrees, and
    their product with TP and PP is the job's GPUs."""
    r = lynx("profile", "llama3-8b", "--dp", 4, "--fsdp", "--hsdp-shard-size", 2, "--cp", 2, "--seq-len", 4096,
             "-o", tmp_path / "profile.json")
    assert r.exit_code == 0, r.output
    r = lynx("plan", tmp_path / "profile.json", "--algo", "full", "-o", tmp_path / "plan.json")
    assert r.exit_code == 0, r.output
    config = ConfigManager().parse_args(export_args(tmp_path))
    par = config.parallelism
    assert (par.data_parallel_shard_degree, par.data_parallel_replicate_degree, par.context_parallel_degree) == \
        (2, 2, 2)


def test_export_refuses_a_depth_torchtitans_split_would_cut(planned):
    """A model-file profile 4 layers deep: torchtitan's debug model has 6, and its pipeline split would drop the two
    the plan does not list: refused, not exported."""
    from lynx_planner import export, solvers
    from lynx_planner.io import InputError

    profile = load_model(planned / "profile.json", Profile)
    short = profile.model_copy(update={"layers": [l for l in profile.layers if l.name not in ("layers.4", "layers.5")]})
    plan = solvers.plan(short, "p.json", "0" * 64, "none", short.hardware.memory_bytes)
    with pytest.raises(InputError, match="drop the layers"):
        export.torchtitan_args(plan, short)


def compiled_steps(model: torch.nn.Module, tokens: torch.Tensor, backend: str, steps: int = 2) -> dict:
    """torchtitan's compile path (distributed/compile.py apply_compile: each block compiled whole, fullgraph=True, as
    parallelize_llama does after AC), then a few training steps; the gradients of each step and the final weights."""
    from types import SimpleNamespace

    from torchtitan.config import CompileConfig
    from torchtitan.distributed.compile import apply_compile

    apply_compile(model, compile_config=CompileConfig(enable=True, backend=backend),
                  parallel_dims=SimpleNamespace(tp_enabled=False))
    out = {}
    for step in range(steps):
        model.zero_grad()
        out |= {f"step {step} {k}": v for k, v in one_step(model, tokens).items()}
    return out


def test_torchtitans_compile_path_trains_a_compiled_plan_with_equal_gradients(planned):
    """`lynx plan --compile` (every recomputation on demand) applied by LynxAC, then torchtitan's apply_compile: the
    planned blocks run as selective-checkpoint regions under fullgraph compilation (no graph break), and two steps'
    gradients and weights equal torchtitan's compiled unplanned run (aot_eager: AOTAutograd's partitioner, no C++
    build; bit for bit)."""
    r = lynx("plan", planned / "profile.json", "--algo", "heu", "--compile", "--memory-limit",
             between(load_model(planned / "profile.json", Profile), 0.5), "-o", planned / "compiled.json")
    assert r.exit_code == 0, r.output
    plan = load_model(planned / "compiled.json", Plan)
    assert plan.compiled and any(p.mode == "selective" for st in plan.stages for p in st.policies)
    torch.manual_seed(0)
    base = debug_llama3(layers=4)
    tokens = torch.randint(0, 2048, (2, 64))
    model = copy.deepcopy(base)
    LynxAC.Config(plan=str(planned / "compiled.json")).build(dump_folder=str(planned)).apply(model)
    torch._dynamo.reset()
    expected = compiled_steps(base, tokens, "aot_eager")
    got = compiled_steps(model, tokens, "aot_eager")
    torch._dynamo.reset()
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    held = [saved_bytes(m(tokens), list(m.parameters())) for m in (base, model)]
    assert held[1] < held[0]  # the planned blocks' compiled graphs hold less: the plan did apply


def saved_bytes(out: torch.Tensor, ignore: list[torch.Tensor]) -> int:
    """Bytes the autograd graph behind `out` holds for backward (compiled graphs' saved tensors included)."""
    skip = {t.untyped_storage()._cdata for t in ignore}
    counted: dict[int, int] = {}
    todo, done = [out.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in done:
            continue
        done.add(node)
        for t in getattr(node, "saved_tensors", None) or ():
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in skip:
                counted[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        todo.extend(f for f, _ in node.next_functions)
    return sum(counted.values())


def test_torchtitans_inductor_compile_trains_a_compiled_plan_within_compiles_tolerance(planned):
    """The same with inductor, torchtitan's default backend (C++ kernels on the CPU): the planned blocks' recomputation
    fused into their backward kernels. Fusion reorders fp32 sums, so the gradients of two steps equal the compiled
    unplanned run's within compile's own tolerance, not bit for bit; the planned graphs hold fewer bytes."""
    r = lynx("plan", planned / "profile.json", "--algo", "heu", "--compile", "--memory-limit",
             between(load_model(planned / "profile.json", Profile), 0.5), "-o", planned / "compiled.json")
    assert r.exit_code == 0, r.output
    torch.manual_seed(0)
    base = debug_llama3(layers=4)
    tokens = torch.randint(0, 2048, (2, 64))
    model = copy.deepcopy(base)
    LynxAC.Config(plan=str(planned / "compiled.json")).build(dump_folder=str(planned)).apply(model)
    torch._dynamo.reset()
    expected = compiled_steps(base, tokens, "inductor")
    got = compiled_steps(model, tokens, "inductor")
    torch._dynamo.reset()
    grads = [name for name in expected if " grad " in name]
    assert grads and expected.keys() == got.keys()
    for name in grads:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)
    held = [saved_bytes(m(tokens), list(m.parameters())) for m in (base, model)]
    assert held[1] < held[0]
