"""torchtitan 0.3: `LynxAC`, an activation-checkpointing policy that applies a lynx plan where torchtitan applies AC
(`ac_config.build(...).apply(model)` in each model's parallelize function), `with_lynx_plan`, which puts it in a
trainer config torchtitan's ConfigManager parses, and `debug_llama3`, torchtitan's own Llama 3 debug model built for
the CPU (tests, docs/integrations.md).

Importing this module imports torchtitan (the `torchtitan` extra: pip install 'lynx-planner[torchtitan]').
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import nn
import tyro
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointing, ActivationCheckpointingConfig

from ..io import load_model
from ..runtime import apply_plan
from ..runtime.names import stage_of
from ..schema import Plan


def plan_stage(model: nn.Module, plan: Plan) -> int:
    """The plan's stage whose layers this model part holds (torchtitan's pipeline split keeps `layers.N`)."""
    return stage_of(model, plan, "torchtitan")


class LynxAC(ActivationCheckpointing):
    """Apply a lynx plan (keep/recompute per layer) instead of torchtitan's full or selective AC.

    In a config_registry function: `return with_lynx_plan(config, "plan.json")`; torchtitan's parallelize then calls
    `apply(model)` once per model part (pipeline stage), and the stage is found from the layers the part holds. The
    plan's layer and op names are mapped onto torchtitan's (runtime/names.py).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(ActivationCheckpointing.Config):
        plan: str = "plan.json"
        """the lynx plan file (lynx plan ... -o plan.json)"""

        stage: int | None = None
        """the plan's pipeline stage of this model part (None: found from the layers the part holds)"""

    def apply(self, model: nn.Module) -> None:
        plan = load_model(self.config.plan, Plan)
        stage = self.config.stage if self.config.stage is not None else plan_stage(model, plan)
        apply_plan(model, plan, stage=stage, names="torchtitan")


@functools.cache
def _with_lynx_ac(base: type) -> type:
    """`base` (a trainer config class) whose `activation_checkpoint` may also be LynxAC.Config: torchtitan's field is
    a union of its own AC configs (tyro subcommands), which ConfigManager parses the config against."""
    ns: dict[str, Any] = {
        "__annotations__": {"activation_checkpoint": ActivationCheckpointingConfig
                            | Annotated[LynxAC.Config, tyro.conf.subcommand("lynx")]},
        "activation_checkpoint": dataclasses.field(default_factory=LynxAC.Config),
        "__module__": __name__, "__qualname__": f"with_lynx_plan.{base.__qualname__}"}
    return dataclass(kw_only=True, slots=True)(type(base.__name__, (base,), ns))


def with_lynx_plan(config: Any, plan: str, stage: int | None = None) -> Any:
    """`config` (a torchtitan trainer config) with the lynx plan as its activation checkpointing, in a class whose
    field admits it: on the command line, `activation-checkpoint:lynx --activation-checkpoint.plan P` then selects
    another plan."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    values["activation_checkpoint"] = LynxAC.Config(plan=plan, stage=stage)
    return _with_lynx_ac(type(config))(**values)


def debug_llama3(layers: int = 6, fuse_qkv: bool = True, dtype: torch.dtype | None = None) -> nn.Module:
    """torchtitan's `llama3 debugmodel` (dim 256, 16 heads, vocab 2048) with `layers` blocks, initialised, with
    SDPA inner attention: flex attention, its language-model default, has no backward on the CPU. `dtype`: its
    floating weights and buffers in that precision (`model.to(dtype)` would also cast the complex rotary cache to a
    real one, dropping its imaginary part)."""
    from torchtitan.models.common import compute_ffn_hidden_dim
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import _build_llama3_layers, model_registry

    config = model_registry("debugmodel", attn_backend="flex").model
    rope = config.layers[0].attention.rope
    config.layers = _build_llama3_layers(fuse_qkv=fuse_qkv, n_layers=layers, dim=config.dim, n_heads=16,
                                         hidden_dim=compute_ffn_hidden_dim(config.dim, multiple_of=256), rope=rope,
                                         attn_backend="flex")
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    model = config.build()
    model.init_states()
    if dtype is not None:
        for t in (*model.parameters(), *model.buffers()):
            if t.is_floating_point():
                t.data = t.data.to(dtype)
    return model
