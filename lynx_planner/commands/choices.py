"""The fixed choices of command-line options (typer lists them in --help and refuses others)."""

from __future__ import annotations

from enum import Enum


class Attention(str, Enum):
    flash = "flash"
    math = "math"


class Method(str, Enum):
    analytic = "analytic"
    measure = "measure"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class Schedule(str, Enum):  # lynx_planner/schedules
    one_f_one_b = "1f1b"
    gpipe = "gpipe"
    interleaved_1f1b = "interleaved-1f1b"
    zero_bubble = "zero-bubble"


class Partition(str, Enum):
    even = "even"
    auto = "auto"


class Dtype(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class AutocastDtype(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"


class Framework(str, Enum):
    megatron = "megatron"
    torchtitan = "torchtitan"
    torchtitan_02 = "torchtitan-0.2"


class SchemaName(str, Enum):
    profile = "profile"
    plan = "plan"
    hardware = "hardware"
    model = "model"
