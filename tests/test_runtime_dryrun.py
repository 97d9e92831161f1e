"""dry_run: a plan checked against its profile and a model file, one row per layer, clear errors on mismatch."""

from __future__ import annotations

import pytest
from runtime_utils import Spec, plan_from_policies, tiny_profile

from lynx_planner.io import InputError, dumps, file_sha256
from lynx_planner.runtime import dry_run

MODEL_FILE = '''
from torch import nn
from lynx_planner.models.gpt_block import GPTBlock
import torch

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.embedding = nn.Module()
        self.embedding.embed = nn.Embedding(128, 64)
        self.layers = nn.ModuleList(GPTBlock(64, 4, 32, dropout={dropout}) for _ in range(n))
        self.lm_head = nn.Linear(64, 128)

    def forward(self, tokens):
        x = self.embedding.embed(tokens.t())
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)

def lynx_model():
    return Model({n}), (torch.zeros(1, 32, dtype=torch.long),)
'''
STAGES = [[Spec("none"), Spec("full", "layer_above"), Spec("selective", "grad_wait")],
          [Spec("selective", "prev_forward"), Spec("full"), Spec("none")]]


def _files(tmp_path, n_model_layers: int = 4, stages=STAGES, profile_layers: int = 4, dropout: float = 0.1):
    profile = tiny_profile(profile_layers)
    (tmp_path / "profile.json").write_text(dumps(profile))
    plan = plan_from_policies(profile, stages, first_layer=0, profile_sha256=file_sha256(tmp_path / "profile.json"))
    (tmp_path / "plan.json").write_text(dumps(plan))
    (tmp_path / "model.py").write_text(MODEL_FILE.replace("{n}", str(n_model_layers)).replace("{dropout}",
                                                                                               str(dropout)))
    return str(tmp_path / "plan.json"), str(tmp_path / "model.py")


def test_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path.parent)  # the profile path resolves relative to the plan's directory
    rows = dry_run(*_files(tmp_path))
    assert [(r["stage"], r["layer"], r["module"], r["mode"], r["when"]) for r in rows] == [
        (0, 0, "embedding", "none", "on_demand"), (0, 1, "layers.0", "full", "layer_above"),
        (0, 2, "layers.1", "selective", "grad_wait"), (1, 3, "layers.2", "selective", "prev_forward"),
        (1, 4, "layers.3", "full", "on_demand"), (1, 5, "lm_head", "none", "on_demand")]
    assert rows[2]["recompute"] == ["attn.core:_scaled_dot_product_flash_attention#0"]
    assert "attn.qkv:addmm#0" in rows[2]["keep"] and rows[1]["keep"] == []


def test_changed_profile(tmp_path):
    plan, model = _files(tmp_path)
    (tmp_path / "profile.json").write_text(dumps(tiny_profile(4, dropout=0.0)))
    with pytest.raises(InputError, match="profile changed since the plan was made"):
        dry_run(plan, model)


def test_missing_layer_path(tmp_path):
    with pytest.raises(InputError, match="no submodule 'layers.3'"):
        dry_run(*_files(tmp_path, n_model_layers=3))


def test_unknown_op(tmp_path):
    plan_path, model = _files(tmp_path)
    text = (tmp_path / "plan.json").read_text().replace("mlp.fc1:addmm#0", "mlp.fc9:addmm#0", 1)
    (tmp_path / "plan.json").write_text(text)
    with pytest.raises(InputError, match="ops not in block 'gpt_layer'.*mlp.fc9:addmm#0"):
        dry_run(plan_path, model)


def test_layer_ranges_must_cover_the_profile(tmp_path):
    with pytest.raises(InputError, match="the stages cover 5 layers, the profile has 6"):
        dry_run(*_files(tmp_path, stages=[STAGES[0], STAGES[1][:2]]))


def test_forward_with_the_plan_catches_ops_the_model_does_not_run(tmp_path):
    """Module paths and op ids match the profile, but the model file's layers have no dropout: only running the
    forward with the plan applied finds that the plan's dropout ops never run."""
    with pytest.raises(InputError, match="the plan names ops its forward never runs: attn_dropout:native_dropout#0"):
        dry_run(*_files(tmp_path, dropout=0.0))
    assert dry_run(*_files(tmp_path, dropout=0.0), run=False)  # the static checks alone pass it
