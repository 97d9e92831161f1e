"""`lynx export --to torchtitan` names the torchtitan 0.3 config that builds the profiled model: its shape table is
torchtitan's own configs (rebuilt here), a catalog Llama 3 8B and DeepSeek-V3 (with EP) export to `llama3_8b` and
`deepseek_v3_671b` and parse with torchtitan's ConfigManager, and what torchtitan has no config of (another depth,
Mixtral, the Megatron GPT) is refused with exit 2."""

from __future__ import annotations

import shlex

import pytest
from typer.testing import CliRunner

from lynx_planner import analytic, export, solvers
from lynx_planner.cli import app
from lynx_planner.io import InputError, dumps, file_sha256
from lynx_planner.exports.torchtitan_model import FLAVORS
from lynx_planner.models.catalog import HF_CONFIGS, MODELS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.models.hf_config import spec_from_hf
from lynx_planner.schema import ParallelConfig

runner = CliRunner()
H100 = HARDWARE["h100-80g-nvlink"]


def export_run(tmp_path, spec, **par):
    prof = analytic.profile(spec, ParallelConfig(**par), H100)
    p = tmp_path / "p.json"
    p.write_text(dumps(prof))
    plan = solvers.plan(prof, str(p), file_sha256(p), "full", H100.memory_bytes)
    (tmp_path / "plan.json").write_text(dumps(plan))
    return runner.invoke(app, ["export", str(tmp_path / "plan.json"), "--to", "torchtitan"])


def args_of(output: str) -> list[str]:
    lines = output.split("\n# Apply the plan")[0].splitlines()
    return shlex.split(" ".join(line.rstrip("\\") for line in lines if not line.startswith("#")))


@pytest.mark.parametrize("key", list(FLAVORS))
def test_flavor_table_is_torchtitans(key):
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install 'lynx-planner[torchtitan]')")
    from torchtitan_shapes import shape

    assert shape(*key) == FLAVORS[key]


def test_llama3_8b_exports_its_own_config(tmp_path):
    r = export_run(tmp_path, MODELS["llama3-8b"], tp=2, pp=2, num_microbatches=4, seq_len=8192)
    assert r.exit_code == 0, r.output
    args = args_of(r.stdout)
    assert args[:4] == ["--module", "llama3", "--config", "llama3_8b"]
    assert "scaling" in r.stdout  # torchtitan's 8B is Llama 3.1's rotary scaling: said in a note
    assert "--parallelism.pipeline_parallel_degree 2" in r.stdout and "activation-checkpoint:none" in r.stdout
    assert "--training.disable_cuda_graphs" in r.stdout and "with_lynx_plan(" in r.stdout
    assert "tok_embeddings,layers.0" in r.stdout and ",norm,lm_head" in r.stdout  # 0.3.0: lm_head, not output
    pytest.importorskip("torchtitan")
    from torchtitan.config.manager import ConfigManager

    config = ConfigManager().parse_args(args)
    assert config.model_spec.flavor == "8B" and len(config.model_spec.model.layers) == 32
    parts = config.parallelism.module_fqns_per_model_part
    assert [n for part in parts for n in part if n.startswith("layers.")] == [f"layers.{i}" for i in range(32)]


def test_deepseek_v3_exports_its_config_and_expert_parallelism(tmp_path):
    r = export_run(tmp_path, MODELS["deepseek-v3"], tp=2, pp=16, dp=64, ep=32, sequence_parallel=True,
                   distributed_optimizer=True, num_microbatches=16, seq_len=4096)
    assert r.exit_code == 0, r.output
    args = args_of(r.stdout)
    assert args[:4] == ["--module", "deepseek_v3", "--config", "deepseek_v3_671b"]
    pytest.importorskip("torchtitan")
    from torchtitan.config.manager import ConfigManager

    config = ConfigManager().parse_args(args)
    assert config.parallelism.expert_parallel_degree == 64 and config.parallelism.data_parallel_shard_degree == 64
    assert "ep 32 x tp 2" in r.stdout  # torchtitan's EP takes the TP ranks too: said in a note
    assert config.model_spec.model.layers[-1].moe.num_experts == 256


@pytest.mark.parametrize("name,layers", [("llama3-8b", 4), ("mixtral-8x7b", 4), ("qwen3-235b-a22b", 2)])
def test_a_model_torchtitan_has_no_config_of_is_refused(tmp_path, name, layers):
    cfg = dict(HF_CONFIGS[name][1], **({"num_hidden_layers": layers} if layers else {}))
    r = export_run(tmp_path, spec_from_hf(cfg, name, name), pp=2, num_microbatches=4, seq_len=1024)
    assert r.exit_code == 2 and "torchtitan 0.3 has no config" in r.output and "Traceback" not in r.output, r.output


def test_the_megatron_gpt_is_refused(tmp_path):
    r = export_run(tmp_path, MODELS["gpt-1.3b"], pp=2, num_microbatches=4, seq_len=1024)
    assert r.exit_code == 2 and "Megatron GPT" in r.output, r.output


def test_ep_without_fsdp_ranks_is_refused():
    spec = MODELS["deepseek-v3"]
    prof = analytic.profile(spec, ParallelConfig(pp=4, dp=8, ep=8, num_microbatches=8, seq_len=4096), H100)
    plan = solvers.plan(prof, "p.json", "0" * 64, "none", 1 << 50)
    with pytest.raises(InputError, match="expert parallelism"):
        export.torchtitan_args(plan, prof)


def test_gpt_oss_exports_its_config_with_windows_sinks_and_biases(tmp_path):
    """The published gpt-oss-120b config (alternating 128-token windows, sinks, biased attention, router and
    experts, clamped SwiGLU) is torchtitan's gpt_oss_120b: named, and parsed back it is that model."""
    import json
    from pathlib import Path

    cfg = json.loads((Path(__file__).parent / "data" / "hf" / "gpt-oss-120b.json").read_text())
    spec = spec_from_hf(cfg, "gpt-oss-120b", "test")
    r = export_run(tmp_path, spec, tp=2, pp=4, dp=8, ep=8, sequence_parallel=True, distributed_optimizer=True,
                   num_microbatches=8, seq_len=4096)
    assert r.exit_code == 0, r.output
    args = args_of(r.stdout)
    assert args[:4] == ["--module", "gpt_oss", "--config", "gpt_oss_120b"]
    pytest.importorskip("torchtitan")
    from torchtitan.config.manager import ConfigManager

    config = ConfigManager().parse_args(args)
    layers = config.model_spec.model.layers
    assert [layer.attention.sliding_window_size for layer in layers] == \
        [cfg["sliding_window"] if t == "sliding_attention" else None for t in cfg["layer_types"]]
    assert layers[0].moe.routed_experts.inner_experts.swiglu_limit == cfg["swiglu_limit"]
    assert config.parallelism.expert_parallel_degree == 16  # ep 8 x tp 2: torchtitan has no expert TP
    parts = config.parallelism.module_fqns_per_model_part
    assert [n for part in parts for n in part if n.startswith("layers.")] == [f"layers.{i}" for i in range(36)]


def test_a_window_torchtitans_config_lacks_is_refused(tmp_path):
    """gpt-oss with another window is not gpt_oss_120b: refused, never exported as torchtitan's."""
    import json
    from pathlib import Path

    cfg = json.loads((Path(__file__).parent / "data" / "hf" / "gpt-oss-120b.json").read_text())
    spec = spec_from_hf(cfg | {"sliding_window": 256}, "gpt-oss-120b", "test")
    r = export_run(tmp_path, spec, tp=2, pp=4, dp=8, ep=8, sequence_parallel=True, distributed_optimizer=True,
                   num_microbatches=8, seq_len=4096)
    assert r.exit_code == 2 and "has no config" in r.output, r.output

