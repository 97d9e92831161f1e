"""Checks of the command-line options and of the files they name, made before any work starts: outputs that can be
written and are no input, sizes, seconds, thread counts, hardware names, algorithm lists; profiles and plans read
with errors naming the file and field."""

from __future__ import annotations

import math
import os
from pathlib import Path

from pydantic import ValidationError

from ..io import InputError, find_beside, format_bytes, load_model, output_target, parse_size, same_file
from ..schema import Hardware, Plan, Profile


def check_output(path: Path, option: str = "-o", inputs: tuple[Path | str | None, ...] = ()) -> None:
    """Fail before any work when the output cannot be written (write_atomic checks again at the end): it must be a
    regular file or a new path in an existing directory, and not one of the command's inputs."""
    if path.is_dir():
        raise InputError(f"{path}: {option} is a directory, expected a file path")
    output_target(path)
    for given in inputs:
        if given is not None and same_file(path, given):
            raise InputError(f"{path}: {option} is the input file {given}; writing it would destroy the input")


MIN_MEMORY_LIMIT = 2**20  # no device trains in less than a MiB: a smaller --memory-limit is a missing unit


def size(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    value = parse_size(text, option)
    if option == "--memory-limit" and value < MIN_MEMORY_LIMIT:
        number = str(text).strip()
        hint = f"; did you mean {number}GiB? (a number without a unit is bytes)" if number.replace(".", "").isdigit() \
            else ""
        raise InputError(f"--memory-limit: {number} is {value} bytes, below 1 MiB{hint}")
    return value


def device_limit(limit: int | None, hw: Hardware, where: str = "") -> int:
    """The memory limit on this device: --memory-limit, else the device less its reserve. A limit above the device's
    memory is refused, as `lynx check` refuses a plan made with one."""
    from ..models.hardware import default_memory_limit

    if limit is None:
        return default_memory_limit(hw)
    if limit > hw.memory_bytes:
        raise InputError(f"--memory-limit: {format_bytes(limit)} ({limit} B) exceeds the device's memory "
                         f"{format_bytes(hw.memory_bytes)} ({hw.memory_bytes} B, {hw.name}{where})")
    return limit


def seconds(value: float | None, option: str = "--time-limit") -> float | None:
    if value is not None and not math.isfinite(value):
        raise InputError(f"{option}: {value} is not a finite number of seconds")
    return value


def threads(value: int | None, option: str = "--threads") -> int | None:
    """Threads are bounded by this machine's CPUs (torch crashes on absurd counts, and more threads than CPUs
    would only measure contention)."""
    cpus = os.cpu_count() or 1
    if value is not None and value > cpus:
        raise InputError(f"{option}: {value} threads, but this machine has {cpus} CPUs")
    return value


def hardware(spec: str) -> Hardware:
    from ..models.hardware import HARDWARE

    if spec in HARDWARE:
        return HARDWARE[spec]
    if spec.endswith(".json") or Path(spec).is_file():
        return load_model(spec, Hardware)
    raise InputError(f"--hardware: unknown hardware {spec!r} (expected one of {', '.join(HARDWARE)} or a JSON file "
                     "of the Hardware schema)")


def load_profile(path: Path | str) -> Profile:
    return load_model(path, Profile)


def load_plan(path: Path | str) -> Plan:
    return load_model(path, Plan)


def plan_profile_path(plan: Plan, plan_path: Path, given: Path | None) -> Path:
    """--profile, else the path recorded in the plan (relative to the working directory, else to the plan file)."""
    found = given or find_beside(plan.profile_path, plan_path)
    if found is None:
        raise InputError(f"{plan_path}: field profile_path: {plan.profile_path!r} does not exist (pass --profile)")
    return found


def algos(text: str | None) -> list[str]:
    from ..solvers import ALGOS, ALL_ALGOS

    if text is None:
        return list(ALGOS)
    names = [a.strip() for a in text.split(",") if a.strip()]
    for a in names:
        if a not in ALL_ALGOS:
            raise InputError(f"--algos: unknown algorithm {a!r} (expected a comma-separated list of "
                             f"{', '.join(ALL_ALGOS)})")
    if not names:
        raise InputError("--algos: empty list")
    return list(dict.fromkeys(names))


def option_errors(e: ValidationError) -> str:
    """Validation errors of options, named as options (--tp) rather than as model fields."""
    parts = []
    for item in e.errors():
        msg = item["msg"].removeprefix("Value error, ")
        loc = [str(x) for x in item["loc"]]
        parts.append(f"--{loc[-1].replace('_', '-')}: {msg}" if loc else f"invalid options: {msg}")
    return "; ".join(parts)
