"""Model files from the command line: the lynx_model()/module-level convention, options a file cannot honour, the
option checks catalog models get, layer discovery in every container, and a summary of what was really profiled."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import lynx
from torch import nn

from lynx_planner.io import load_model
from lynx_planner.profiler.structure import layer_modules
from lynx_planner.schema import Profile

ROOT = Path(__file__).resolve().parent.parent
GPT = str(ROOT / "examples" / "gpt_model.py")
BLOCK = "from lynx_planner.models.gpt_block import GPTBlock\n"




def write(tmp_path, text: str) -> Path:
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent(text))
    return path


FALLBACK = """
    import torch
    from lynx_planner.models.gpt_block import GPT
    model = GPT(vocab=64, hidden=32, heads=2, layers=2, seq_len=16)
    example_inputs = (torch.zeros(3, 16, dtype=torch.long),)
"""
SHAPES_ONLY = """
    import torch
    from lynx_planner.models.gpt_block import GPT
    def lynx_model(batch_size, seq_len):
        return GPT(vocab=64, hidden=32, heads=2, layers=2, seq_len=seq_len), torch.zeros(batch_size, seq_len,
                                                                                        dtype=torch.long)
"""


@pytest.mark.parametrize("text,shape", [(FALLBACK, "int64[3, 16]"), (SHAPES_ONLY, "int64[2, 24]")])
def test_files_that_take_no_attention(tmp_path, text, shape):
    """Module-level model/example_inputs and lynx_model(batch_size, seq_len) profile from the CLI; the profile and
    its summary say what ran (device, precision, the example inputs' shapes), not the CLI's defaults."""
    out = tmp_path / "p.json"
    extra = ["--seq-len", "24", "--micro-batch-size", "2"] if "batch_size" in text else []
    r = lynx("profile", write(tmp_path, text), "-o", out, *extra)
    assert r.exit_code == 0, r.output
    assert f"inputs {shape}" in r.output and "fp32 weights, traced on cpu" in r.output and "seq 2048" not in r.output
    p = load_model(out, Profile)
    b, s = (int(x) for x in shape[6:-1].split(", "))
    assert (p.parallel.micro_batch_size, p.parallel.seq_len, p.dtype, p.model.config["device"]) == (b, s, "fp32",
                                                                                                     "cpu")
    assert [layer.name for layer in p.layers] == ["embed", "layers.0", "layers.1", "norm", "head"]


def test_options_a_file_cannot_honour(tmp_path):
    path = write(tmp_path, FALLBACK)
    for option in (["--seq-len", "32"], ["--micro-batch-size", "4"], ["--attention", "math"]):
        r = lynx("profile", path, "-o", tmp_path / "p.json", *option)
        name = {"--seq-len": "seq_len", "--micro-batch-size": "batch_size", "--attention": "attention"}[option[0]]
        assert r.exit_code == 2 and f"does not accept {name}" in r.output, r.output
        assert "Traceback" not in r.output and not (tmp_path / "p.json").exists()


def test_no_model_in_file(tmp_path):
    r = lynx("profile", write(tmp_path, "x = 1\n"), "-o", tmp_path / "p.json")
    assert r.exit_code == 2 and "defines neither lynx_model() nor model/example_inputs" in r.output


@pytest.mark.parametrize("options,message", [
    (["--tp", "8"], "--tp 8 does not divide the model's"),
    (["--tp", "2", "--sequence-parallel", "--seq-len", "63"], "does not divide the sequence length 63"),
    (["--pp", "8"], "--pp 8: .* has only 7 layers"),
])
def test_option_checks_as_for_catalog_models(tmp_path, options, message):
    r = lynx("profile", GPT, "-o", tmp_path / "p.json", *options)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "validation error" not in r.output
    assert re.search(message, r.output), r.output


class Nested(nn.Module):
    """Layers in a ModuleDict, in a ModuleList of ModuleLists (two stages of two), and in a Sequential."""

    def __init__(self):
        super().__init__()
        from lynx_planner.models.gpt_block import GPTBlock

        self.embed = nn.Embedding(10, 16)
        self.blocks = nn.ModuleDict({"a": GPTBlock(16, 2, 8), "b": GPTBlock(16, 2, 8)})
        self.stages = nn.ModuleList(nn.ModuleList(GPTBlock(16, 2, 8) for _ in range(2)) for _ in range(2))
        self.tail = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
        self.head = nn.Linear(16, 10)


def test_layer_discovery_in_every_container():
    names = [path for path, _ in layer_modules(Nested())]
    assert names == ["embed", "blocks.a", "blocks.b", "stages.0.0", "stages.0.1", "stages.1.0", "stages.1.1",
                     "tail.0", "tail.1", "head"]
    encoder = nn.Sequential(nn.Embedding(10, 16), nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 3, enable_nested_tensor=False))
    assert [p for p, _ in layer_modules(encoder)] == ["0", "1.layers.0", "1.layers.1", "1.layers.2"]


HIDDEN_BLOCKS = """
    import torch
    from torch import nn
    from lynx_planner.models.gpt_block import GPTBlock

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(64, 32)
            self.body = nn.Module()
            self.body.first = GPTBlock(32, 2, 16)
            self.body.second = GPTBlock(32, 2, 16)
            self.head = nn.Linear(32, 64)

        def forward(self, tokens):
            x = self.embed(tokens.t())
            for layer in (self.body.first, self.body.second):
                x = layer(x)
            return self.head(x)

    model, example_inputs = Model(), (torch.zeros(2, 16, dtype=torch.long),)
"""


def test_parameters_outside_the_layers_are_reported(tmp_path):
    """A module holding the blocks that is never called itself: its blocks are not found; the profile says so."""
    r = lynx("profile", write(tmp_path, HIDDEN_BLOCKS), "-o", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    assert "warning:" in r.output and "of the parameters" in r.output and "never called: body" in r.output


def test_pipeline_example_profiles_every_layer(tmp_path):
    """examples/train_gpt_pipeline.py keeps its blocks in a ModuleDict: all 6 layers, every parameter covered."""
    out = tmp_path / "p.json"
    r = lynx("profile", ROOT / "examples" / "train_gpt_pipeline.py", "--pp", "2", "-o", out)
    assert r.exit_code == 0 and "warning" not in r.output, r.output
    p = load_model(out, Profile)
    assert [layer.name for layer in p.layers] == ["embedding", "layers.0", "layers.1", "layers.2", "layers.3",
                                                   "lm_head"]
    assert p.model.config["outside_params"] == 0 and sum(layer.params for layer in p.layers) == p.model.params


def test_measure_threads_repeats_spread(tmp_path):
    out = tmp_path / "p.json"
    before = torch.get_num_threads()
    r = lynx("profile", GPT, "-o", out, "--method", "measure", "--threads", "1", "--repeats", "3")
    assert r.exit_code == 0, r.output
    cfg = load_model(out, Profile).model.config
    assert cfg["threads"] == 1 and cfg["repeats"] == 3 and cfg["spread"] >= 0
    assert f"spread {cfg['spread']:.0%}" in r.output
    assert torch.get_num_threads() == before  # restored after measuring
    r = lynx("profile", GPT, "-o", out, "--threads", "1")
    assert r.exit_code == 2 and "--threads applies to --method measure" in r.output


def test_pipeline_example_trains_on_two_processes_with_a_cli_plan(tmp_path):
    """The README's pipeline example end to end: lynx profile / plan / apply --dry-run from the CLI, then torchrun
    on 2 processes (gloo) with that plan; and a plan that leaves layers out is refused, not trained without them."""
    import subprocess
    import sys

    from lynx_planner import solvers

    prof_path, plan_path = tmp_path / "pipe.json", tmp_path / "plan.json"
    assert lynx("profile", ROOT / "examples" / "train_gpt_pipeline.py", "--pp", "2", "-o", prof_path).exit_code == 0
    prof = load_model(prof_path, Profile)
    full, none = (solvers.solve(prof, a, 1 << 60).evaluation.peak_bytes for a in ("full", "none"))
    r = lynx("plan", prof_path, "--algo", "heu", "--memory-limit", int(full + 0.3 * (none - full)), "-o", plan_path)
    assert r.exit_code == 0, r.output
    r = lynx("apply", plan_path, ROOT / "examples" / "train_gpt_pipeline.py", "--dry-run")
    assert r.exit_code == 0 and "ran with every stage of the plan applied" in r.output, r.output
    # each rank's stdout to its own file: two ranks printing into one pipe can interleave within a line
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
           "--log-dir", str(logs), "--redirects", "1",
           str(ROOT / "examples" / "train_gpt_pipeline.py"), "--plan", str(plan_path), "--steps", "3"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    ranks = {int(p.parent.name): p.read_text() for p in logs.rglob("stdout.log")}
    assert sorted(ranks) == [0, 1], sorted(logs.rglob("*"))
    everything = ranks[0] + ranks[1]
    losses = [float(line.split()[-1]) for line in everything.splitlines() if line.startswith("step ")]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert "stage 0: (0, 1)" in everything and "stage 1: " in everything

    text = plan_path.read_text().replace('"layers.3"', '"layers.9"')
    (tmp_path / "bad.json").write_text(text)
    cmd = [sys.executable, str(ROOT / "examples" / "train_gpt_pipeline.py"), "--plan", str(tmp_path / "bad.json")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)  # refused before gloo
    assert run.returncode != 0 and "a plan made for another model would train without some" in run.stderr


STATEFUL = """
    import torch
    from torch import nn

    class Flaky(nn.Module):  # takes another path on every call: no profile can name the ops training runs
        def __init__(self):
            super().__init__()
            self.lin, self.calls = nn.Linear(8, 8), 0

        def forward(self, x):
            self.calls += 1
            return self.lin(x).relu() if self.calls % 2 else self.lin(x).tanh()

    model = nn.Sequential(Flaky(), Flaky())
    example_inputs = (torch.zeros(2, 8),)
"""


def test_unfaithful_profile_is_refused(tmp_path):
    r = lynx("profile", write(tmp_path, STATEFUL), "-o", tmp_path / "p.json")
    assert r.exit_code == 2 and "its forward is not deterministic" in r.output, r.output
    assert not (tmp_path / "p.json").exists()
