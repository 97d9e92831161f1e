"""The fixed choices of command-line options (typer lists them in --help and refuses others)."""

from __future__ import annotations

from enum import Enum

from ..kernels import KERNELS
from ..schedules import NAMES as SCHEDULES


def choices(name: str, values: tuple[str, ...]) -> type[Enum]:
    """A str Enum whose members are named and valued by the choices themselves (`Method.measure`,
    `Schedule("1f1b")`)."""
    return Enum(name, [(v, v) for v in values], type=str)  # type: ignore[return-value]


Attention = choices("Attention", ("flash", "math"))
Method = choices("Method", ("analytic", "measure"))
Device = choices("Device", ("cpu", "cuda"))
Schedule = choices("Schedule", SCHEDULES)  # one per module of lynx_planner/schedules
Partition = choices("Partition", ("even", "auto"))
Dtype = choices("Dtype", ("fp32", "bf16", "fp16"))
AutocastDtype = choices("AutocastDtype", ("bf16", "fp16"))
Kernels = choices("Kernels", KERNELS)  # one per module of lynx_planner/kernels
Framework = choices("Framework", ("megatron", "torchtitan", "torchtitan-0.2"))
SchemaName = choices("SchemaName", ("profile", "plan", "hardware", "model"))
