"""The `lynx` command line: profile a model, plan its recomputation, compare strategies, simulate, check, bench.

Exit codes (see shared/CONTRACT.md): 0 done; 1 a check, comparison or regression found a violation; 2 bad input
(usage, unreadable or invalid file, a memory limit no strategy meets, a model file that fails). Bad input is
reported in one place (`_guarded`) as a few lines on stderr naming the file and field, never as a traceback, and no
output file is left behind (files are written with `io.write_atomic` once everything succeeded).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import json
import math
import os
import shlex
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
import typer.core
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from .io import (
    InputError,
    catch_interrupts,
    describe_validation,
    dumps,
    dumps_json,
    file_sha256,
    find_beside,
    format_bytes,
    load_model,
    output_target,
    parse_size,
    raise_if_interrupted,
    restore_interrupts,
    same_file,
    write_atomic,
)
from .models.hardware import default_memory_limit
from .schema import Hardware, ParallelConfig, Plan, Profile

# typer 0.29 shows flags (--sequence-parallel, --help) with a '<bool>' type they take no value of: none for flags.
_display_type_rich = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = (  # type: ignore[method-assign]
    lambda self, ctx: None if getattr(self, "is_flag", False) else _display_type_rich(self, ctx))

# One default for profile and tune (plan reads the profile's): Megatron-LM and torchtitan users shard optimizer state
# over data-parallel ranks; it only matters with --dp > 1.
DISTRIBUTED_OPTIMIZER = True
DISTRIBUTED_OPTIMIZER_HELP = ("Shard optimizer state over data-parallel ranks (Megatron --use-distributed-optimizer, "
                              "torchtitan's FSDP); matters with --dp > 1.")

app = typer.Typer(
    name="lynx",
    help="Plan activation recomputation for pipeline-parallel transformer training (the Lynx method: hide "
    "recomputation inside communication waits). Typical use: `lynx profile gpt-13b --tp 4 --pp 4 -o p.json`, "
    "`lynx compare p.json`, `lynx plan p.json --algo heu -o plan.json`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

def _version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"lynx-planner {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Plan activation recomputation for pipeline-parallel transformer training (the Lynx method: hide recomputation
    inside communication waits). Typical use: `lynx profile gpt-13b --tp 4 --pp 4 -o p.json`, `lynx compare p.json`,
    `lynx plan p.json --algo heu -o plan.json`."""


out = Console(highlight=False, soft_wrap=True)  # stdout (resolved at print time, so test runners can capture it)
err = Console(stderr=True, highlight=False, soft_wrap=True)

DEFAULT_HARDWARE = "a100-80g-nvlink"


# --------------------------------------------------------------------------------------------------------------
# error handling: one wrapper for every command


def _fail(message: str, code: int = 2) -> None:
    lines = str(message).strip().splitlines() or ["error"]
    typer.echo(f"error: {lines[0]}", err=True)
    for line in lines[1:]:
        typer.echo(f"  {line}", err=True)
    raise typer.Exit(code)


def _guarded(fn: Callable) -> Callable:
    """Turn bad input into exit 2 with a short message on stderr (set LYNX_DEBUG=1 to see tracebacks), and Ctrl-C
    into exit 130, also when a native solver swallowed it (io.catch_interrupts records it)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = catch_interrupts()
        try:
            try:
                result = fn(*args, **kwargs)
                raise_if_interrupted()
            except typer.Exit:
                _flush_stdout()  # a check's verdict (exit 1) that could not be printed is not a verdict
                raise
            _flush_stdout()
            return result
        except OSError as e:  # stdout full or closed (`lynx check p.json > /dev/full`), or a file that vanished
            if os.environ.get("LYNX_DEBUG"):
                raise
            _silence_stdout()
            _fail(f"cannot write output: {e.strerror or e}" if e.errno in _WRITE_ERRNOS else f"{e}")
        except InputError as e:
            if os.environ.get("LYNX_DEBUG"):
                raise
            _fail(str(e))
        except ValidationError as e:
            if os.environ.get("LYNX_DEBUG"):
                raise
            _fail(describe_validation(e.title, e))
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        finally:
            restore_interrupts(previous)

    return wrapper


# Shown at the end of each command's --help (each line a runnable example).
EXAMPLES = {
    "profile": ["lynx profile gpt-13b --tp 4 --pp 4 -o profile.json",
                "lynx profile examples/gpt_model.py --pp 2 -o small.json"],
    "plan": ["lynx plan profile.json --algo heu -o plan.json",
             "lynx plan profile.json --algo opt --memory-limit 40GiB --time-limit 30 -o opt.json"],
    "compare": ["lynx compare profile.json", "lynx compare profile.json --memory-limit 40GiB --algos heu,full --json"],
    "simulate": ["lynx simulate plan.json", "lynx simulate plan.json --plot timeline.png"],
    "check": ["lynx check plan.json"],
    "apply": ["lynx apply small-plan.json examples/gpt_model.py --dry-run",
              "lynx apply small-plan.json examples/gpt_model.py --dry-run --json"],
    "validate": ["lynx validate small-plan.json examples/gpt_model.py --repeats 3"],
    "tune": ["lynx tune gpt-13b --gpus 16 --hardware a100-80g-nvlink --global-batch 64",
             "lynx tune gpt-1.3b --gpus 8 --hardware a100-80g-nvlink --global-batch 32 --json"],
    "export": ["lynx export plan.json --to megatron", "lynx export plan.json --to torchtitan"],
    "bench": ["lynx bench --suite bench/ci --check --baseline bench/ci/baseline.json"],
}


def _epilog(name: str) -> str | None:
    examples = EXAMPLES.get(name)
    return None if not examples else "Examples:\n\n" + "\n\n".join(f"  $ {e}" for e in examples)


_WRITE_ERRNOS = {errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EFBIG, errno.EDQUOT, errno.EBADF}


def _flush_stdout() -> None:
    """Push printed output out now, inside the guard (else a full disk surfaces at interpreter exit as a traceback
    with exit 120)."""
    sys.stdout.flush()


def _silence_stdout() -> None:
    """After a failed write to stdout, point it at /dev/null so the interpreter's own flush at exit cannot fail
    again (the recipe of Python's signal docs for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no real file (a test runner's buffer)
        pass


def command(name: str, **kwargs: Any) -> Callable:
    kwargs.setdefault("epilog", _epilog(name))

    def register(fn: Callable) -> Callable:
        app.command(name, **kwargs)(_guarded(fn))
        return fn

    return register


# --------------------------------------------------------------------------------------------------------------
# helpers


def _check_output(path: Path, option: str = "-o", inputs: tuple[Path | str | None, ...] = ()) -> None:
    """Fail before any work when the output cannot be written (write_atomic checks again at the end): it must be a
    regular file or a new path in an existing directory, and not one of the command's inputs."""
    if path.is_dir():
        raise InputError(f"{path}: {option} is a directory, expected a file path")
    output_target(path)
    for given in inputs:
        if given is not None and same_file(path, given):
            raise InputError(f"{path}: {option} is the input file {given}; writing it would destroy the input")


def _size(text: str | None, option: str) -> int | None:
    return None if text is None else parse_size(text, option)


def _seconds(value: float | None, option: str = "--time-limit") -> float | None:
    if value is not None and not math.isfinite(value):
        raise InputError(f"{option}: {value} is not a finite number of seconds")
    return value


def _threads(value: int | None, option: str = "--threads") -> int | None:
    """Threads are bounded by this machine's CPUs (torch crashes on absurd counts, and more threads than CPUs
    would only measure contention)."""
    cpus = os.cpu_count() or 1
    if value is not None and value > cpus:
        raise InputError(f"{option}: {value} threads, but this machine has {cpus} CPUs")
    return value


def _hardware(spec: str) -> Hardware:
    from .models.hardware import HARDWARE

    if spec in HARDWARE:
        return HARDWARE[spec]
    if spec.endswith(".json") or Path(spec).is_file():
        return load_model(spec, Hardware)
    raise InputError(f"--hardware: unknown hardware {spec!r} (expected one of {', '.join(HARDWARE)} or a JSON file "
                     "of the Hardware schema)")


def _load_profile(path: Path | str) -> Profile:
    return load_model(path, Profile)


def _load_plan(path: Path | str) -> Plan:
    return load_model(path, Plan)


def _plan_profile_path(plan: Plan, plan_path: Path, given: Path | None) -> Path:
    """--profile, else the path recorded in the plan (relative to the working directory, else to the plan file)."""
    found = given or find_beside(plan.profile_path, plan_path)
    if found is None:
        raise InputError(f"{plan_path}: field profile_path: {plan.profile_path!r} does not exist (pass --profile)")
    return found


def _algos(text: str | None) -> list[str]:
    from .solvers import ALGOS

    if text is None:
        return list(ALGOS)
    names = [a.strip() for a in text.split(",") if a.strip()]
    for a in names:
        if a not in ALGOS:
            raise InputError(f"--algos: unknown algorithm {a!r} (expected a comma-separated list of "
                             f"{', '.join(ALGOS)})")
    if not names:
        raise InputError("--algos: empty list")
    return list(dict.fromkeys(names))


class _HardExit(BaseException):
    def __init__(self, code: object) -> None:
        self.code = code


@contextlib.contextmanager
def _no_hard_exit():
    """os._exit in a model file would end lynx at once with the file's code (0: success, nothing written): in this
    process it raises instead while user code runs. Forked children (data loaders, workers) still exit for real."""
    real, me = os._exit, os.getpid()

    def refuse(code: int) -> None:
        if os.getpid() != me:
            real(code)
        raise _HardExit(code)

    os._exit = refuse  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = real


def _call_model_file(path: Path, what: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run user code (a model file): any failure is bad input (exit 2), reported without a traceback; so is a model
    file that exits (sys.exit would otherwise end lynx with the file's own code and no output). Ctrl-C, or a
    KeyboardInterrupt the file raises, stays an interrupt (exit 130)."""
    try:
        with _no_hard_exit():
            return fn(*args, **kwargs)
    except (InputError, typer.Exit, KeyboardInterrupt):
        raise
    except _HardExit as e:
        raise InputError(f"{path}: {what} failed: the model file called os._exit({e.code!r}) (a model file must "
                         "build the model and return)") from None
    except SystemExit as e:
        raise InputError(f"{path}: {what} failed: the model file called sys.exit({e.code!r}) (a model file must "
                         "build the model and return)") from None
    except Exception as e:  # the model file's own error
        if os.environ.get("LYNX_DEBUG"):
            raise
        raise InputError(f"{path}: {what} failed: {type(e).__name__}: {e} (set LYNX_DEBUG=1 for the traceback)") \
            from None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def _unit(values: list[float | None]) -> tuple[str, int]:
    """One unit for a table's byte column: GiB, or MiB/KiB where GiB would print 0.0x (tiny models)."""
    top = max((abs(v) for v in values if v is not None), default=0)
    return next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20)) if top >= 0.1 * s), ("KiB", 2**10))


def _in(n: float | None, size: int) -> str:
    return "-" if n is None else f"{n / size:.2f}"


def _percent(fraction: float) -> str:
    """'+1.2%', '-0.3%', '+0.0%' (never '+-0.0%')."""
    value = round(fraction * 100, 1)
    return f"{value + 0.0:+.1f}%"  # + 0.0 turns -0.0 into 0.0


# --------------------------------------------------------------------------------------------------------------
# lynx profile


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


@command("profile")
def profile_cmd(
    model: Annotated[str, typer.Argument(
        metavar="MODEL",
        help="A catalog name (`lynx models`: gpt-1.3b ... gpt-175b) or the path of a .py file that builds a "
             "PyTorch model.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the profile JSON.")],
    hardware: Annotated[str, typer.Option(
        help="Hardware catalog name (`lynx hardware`) or a JSON file of the Hardware schema.")] = DEFAULT_HARDWARE,
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel size.")] = 1,
    pp: Annotated[int, typer.Option("--pp", min=1, help="Pipeline-parallel size (number of stages).")] = 1,
    dp: Annotated[int, typer.Option("--dp", min=1, help="Data-parallel size (shards the distributed optimizer's "
                                    "state).")] = 1,
    micro_batch_size: Annotated[Optional[int], typer.Option(
        min=1, show_default="1; model files: their example inputs'",
        help="Sequences per micro-batch (model files: passed to lynx_model(batch_size=...)).")] = None,
    seq_len: Annotated[Optional[int], typer.Option(
        min=1, show_default="2048; model files: their example inputs'",
        help="Sequence length in tokens (model files: passed to lynx_model(seq_len=...)).")] = None,
    num_microbatches: Annotated[Optional[int], typer.Option(
        min=1, show_default="2·pp", help="Micro-batches per iteration (gradient accumulation steps).")] = None,
    sequence_parallel: Annotated[bool, typer.Option(
        "--sequence-parallel", help="Megatron sequence parallelism (needs --tp > 1).")] = False,
    ep: Annotated[int, typer.Option(
        "--ep", min=1, help="Expert parallelism (MoE models): experts sharded over EP of the DP ranks; divides "
        "--dp and the experts.")] = 1,
    attention: Annotated[Optional[Attention], typer.Option(
        show_default="flash; model files: as built",
        help="flash: store only what a fused attention kernel keeps; math: also the softmax output and dropout "
             "mask, as Megatron's core attention does (model files: passed to lynx_model(attention=...)).")] = None,
    dropout: Annotated[float, typer.Option(
        help="Dropout probability of catalog models, in [0, 1); 0 means no dropout masks.")] = 0.0,
    method: Annotated[Method, typer.Option(
        help="analytic: roofline op times from the hardware's datasheet; measure: time the ops of a model file "
             "on --device.")] = Method.analytic,
    device: Annotated[Device, typer.Option(help="Device that runs a model file's trace or measurement.")]
    = Device.cpu,
    dtype: Annotated[Optional[Dtype], typer.Option(
        show_default="the weights' dtype as the model file builds them",
        help="Training precision of a model file's weights: the model is converted with model.to(dtype).")] = None,
    autocast: Annotated[Optional[AutocastDtype], typer.Option(
        help="Run a model file's forward under torch.autocast in this dtype (fp32 weights: the usual mixed "
             "precision recipe).")] = None,
    threads: Annotated[Optional[int], typer.Option(
        min=1, show_default="torch's default", help="--method measure: CPU threads of the measured runs.")] = None,
    repeats: Annotated[Optional[int], typer.Option(
        min=1, show_default="5", help="--method measure: timed runs per block type (after 2 warm-up runs).")] = None,
    schedule: Annotated[Schedule, typer.Option(
        help="Pipeline schedule: 1f1b, gpipe, interleaved-1f1b (virtual stages, Megatron's interleaved order; needs "
             "--virtual-stages >= 2), zero-bubble (torch's ScheduleInterleavedZeroBubble, ZB1P: backward split into "
             "input and weight gradients; docs/schedules.md).")] = Schedule.one_f_one_b,
    virtual_stages: Annotated[int, typer.Option(
        min=1, help="Model chunks per pipeline rank (Megatron's --virtual-pipeline-model-parallel-size): >= 2 for "
                    "interleaved-1f1b, any for zero-bubble, 1 otherwise.")] = 1,
    distributed_optimizer: Annotated[bool, typer.Option(
        "--distributed-optimizer/--no-distributed-optimizer", help=DISTRIBUTED_OPTIMIZER_HELP)
    ] = DISTRIBUTED_OPTIMIZER,
    overlap_grad_reduce: Annotated[bool, typer.Option(
        "--overlap-grad-reduce/--no-overlap-grad-reduce", help="Reduce DP gradients during the last backward "
        "(Megatron --overlap-grad-reduce).")] = True,
    overlap_param_gather: Annotated[bool, typer.Option(
        "--overlap-param-gather", help="With --distributed-optimizer: all-gather the updated weights during the "
        "next forward (Megatron --overlap-param-gather).")] = False,
    tp_comm_overlap: Annotated[bool, typer.Option(
        "--tp-comm-overlap", help="Overlap TP collectives with their GEMMs (Megatron --tp-comm-overlap).")] = False,
) -> None:
    """Write the profile of MODEL in one parallel setup on one kind of hardware: op graph, times, sizes."""
    _check_output(output, "-o", (model, hardware))
    if not 0.0 <= dropout < 1.0:
        raise InputError(f"--dropout: {dropout} is not in [0, 1)")
    if method is not Method.measure and (threads is not None or repeats is not None):
        raise InputError(f"{'--threads' if threads is not None else '--repeats'} applies to --method measure only")
    _threads(threads)
    hw = _hardware(hardware)
    try:
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch_size=micro_batch_size or 1, seq_len=seq_len or 2048,
                             num_microbatches=num_microbatches or 2 * pp, sequence_parallel=sequence_parallel,
                             schedule=schedule.value, distributed_optimizer=distributed_optimizer,
                             overlap_grad_reduce=overlap_grad_reduce, overlap_param_gather=overlap_param_gather,
                             tp_comm_overlap=tp_comm_overlap, virtual_stages=virtual_stages, ep=ep)
    except ValidationError as e:
        raise InputError(_option_errors(e)) from None

    from .build import build_profile, is_model_file

    if is_model_file(model) and dropout:
        err.print("note: --dropout applies to catalog models; a model file's own dropout modules are profiled")
    overrides = {k: v for k, v in (("batch_size", micro_batch_size), ("seq_len", seq_len)) if v is not None}
    profile = _call_model_file(Path(model), "profiling", build_profile, model, par, hw,
                               attention=attention.value if attention else None, dropout=dropout,
                               method=method.value, device=device.value, overrides=overrides,
                               dtype=dtype.value if dtype else None, autocast=autocast.value if autocast else None,
                               threads=threads, repeats=repeats or 5, progress=True,
                               warn=lambda message: err.print(f"warning: {message}"))
    write_atomic(output, dumps(profile))
    _profile_summary(profile, output)


def _option_errors(e: ValidationError) -> str:
    """Validation errors of options, named as options (--tp) rather than as model fields."""
    parts = []
    for item in e.errors():
        msg = item["msg"].removeprefix("Value error, ")
        loc = [str(x) for x in item["loc"]]
        parts.append(f"--{loc[-1].replace('_', '-')}: {msg}" if loc else f"invalid options: {msg}")
    return "; ".join(parts)


def _precision(profile: Profile) -> str:
    if profile.autocast:
        return f"fp32 weights, {profile.autocast} autocast"
    return f"{profile.dtype} weights" if profile.dtype else "bf16 (analytic)"


def _profile_summary(profile: Profile, path: Path) -> None:
    par, hw = profile.parallel, profile.hardware
    params = profile.model.params
    cfg = profile.model.config
    size = f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.1f} M"
    if "device" not in cfg:  # a model description (catalog, config.json, model JSON), profiled analytically
        shapes = f"seq {par.seq_len}"
        how = f"{profile.method} on {hw.name}"
    else:  # what was really run: the device, precision and example inputs of the model file
        shapes = f"inputs {cfg.get('inputs', '?')}"
        how = (f"measured on {cfg.get('device')} ({cfg.get('threads')} threads, {cfg.get('repeats')} runs, spread "
               f"{cfg.get('spread', 0):.0%}), planned for {hw.name}" if profile.method == "measure" else
               f"traced on {cfg.get('device')}, times analytic for {hw.name}")
    out.print(f"wrote {path}: {profile.model.name} ({size} params, {len(profile.layers)} layers), "
              f"{_precision(profile)}, {how} ({format_bytes(hw.memory_bytes)}), tp {par.tp} pp {par.pp} dp {par.dp}"
              f"{f' ep {par.ep}' if par.ep > 1 else ''}, "
              f"micro-batch {par.micro_batch_size} x {par.num_microbatches}, {shapes}, {par.schedule}"
              f"{f' x {par.virtual_stages} virtual stages' if par.virtual_stages > 1 else ''}, "
              f"{profile.attention.replace('none', 'no')} attention, dropout {profile.dropout}")
    try:
        from .solvers import solve

        peaks = {a: solve(profile, a, 2**62).evaluation.peak_bytes for a in ("none", "full")}
        out.print(f"peak memory per device on Megatron's even split: no recomputation {format_bytes(peaks['none'])}, "
                  f"full recomputation {format_bytes(peaks['full'])}")
    except Exception:  # a summary line is not worth failing for
        pass


# --------------------------------------------------------------------------------------------------------------
# lynx plan


@command("plan")
def plan_cmd(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE.json", help="A profile from `lynx profile`.")],
    algo: Annotated[str, typer.Option(
        help="heu (Lynx heuristic), opt (Lynx MILP), none, full, selective, uniform, block (Megatron-LM), "
             "checkmate, adapipe.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the plan JSON.")],
    memory_limit: Annotated[Optional[str], typer.Option(
        show_default="the device memory less the reserve (1 GiB + 4%; docs/accuracy.md)",
        help="Per-device memory budget: 80GiB, 40GB, 512MiB or a number of bytes.")] = None,
    time_limit: Annotated[Optional[float], typer.Option(
        min=0.001, show_default="the solver's own", help="Seconds the MILP solvers (opt, checkmate) may search.")]
    = None,
    partition: Annotated[Optional[Partition], typer.Option(
        show_default="auto for heu, opt, adapipe; even (Megatron) otherwise",
        help="Stage split: even (Megatron's) or auto (recomputation-aware).")] = None,
    reproducible: Annotated[bool, typer.Option(
        "--reproducible",
        help="Write solver.search_time_s as 0.0 so identical inputs give byte-identical plan files. Without it "
             "only that field (wall time of the search) differs between runs.")] = False,
) -> None:
    """Search a recomputation strategy for PROFILE within the memory limit and write it as a plan."""
    from . import solvers

    if algo not in solvers.ALGOS:
        raise InputError(f"--algo: unknown algorithm {algo!r} (expected one of {', '.join(solvers.ALGOS)})")
    _check_output(output, "-o", (profile_path,))
    time_limit = _seconds(time_limit)
    profile = _load_profile(profile_path)
    sha = file_sha256(profile_path)
    limit = _size(memory_limit, "--memory-limit") or default_memory_limit(profile.hardware)
    try:
        with err.status(f"searching ({algo}) ..."):
            plan = solvers.plan(profile, str(profile_path), sha, algo, limit, time_limit,
                                partition.value if partition else None)
        raise_if_interrupted()  # HiGHS may have swallowed a Ctrl-C and returned its incumbent
    except ModuleNotFoundError as e:
        raise InputError(f"--algo: {algo!r} is not available in this installation ({e})") from None
    except solvers.Infeasible as e:
        raise solvers.Infeasible(f"{profile_path}: {e}{_least_memory_hint(profile, algo)}", e.needed) from None
    if reproducible:
        plan = plan.model_copy(update={"solver": plan.solver.model_copy(update={"search_time_s": 0.0})})
    write_atomic(output, dumps(plan))
    _plan_summary(plan, output)


def _least_memory_hint(profile: Profile, algo: str) -> str:
    if algo == "full":
        return ""
    from .solvers import solve

    try:
        full = solve(profile, "full", 2**62).evaluation.peak_bytes
    except Exception:
        return ""
    return f"; full recomputation needs {format_bytes(full)}"


def _plan_summary(plan: Plan, path: Path) -> None:
    pred = plan.predicted
    t, ideal = pred.iteration_time_s, pred.ideal_iteration_time_s
    from rich import box

    table = Table(title=f"{plan.algo}: {path}, memory limit {format_bytes(plan.memory_limit_bytes)}",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    unit, size = _unit([pr.peak_memory_bytes for pr in pred.stages])
    for col in ("stage", "layers", f"peak\n{unit}", f"static\n{unit}", f"activations\n{unit}", "recompute\nexposed",
                "recompute\nhidden"):
        table.add_column(col, justify="right", no_wrap=True)
    pp = plan.parallel.pp
    for pr in pred.stages:  # per rank; interleaved: its chunks' layers
        layers = ", ".join(f"{st.layers[0]}-{st.layers[1] - 1}" for st in plan.stages if st.stage % pp == pr.stage)
        table.add_row(str(pr.stage), layers, _in(pr.peak_memory_bytes, size),
                      _in(pr.static_bytes, size), _in(pr.activation_bytes, size),
                      _ms(pr.exposed_recompute_s), _ms(pr.hidden_recompute_s))
    out.print(table)
    out.print(f"iteration time {t:.4f} s; ideal (no recomputation, unlimited memory) {ideal:.4f} s: "
              f"{ideal / t:.3f}x of ideal speed ({_percent(t / ideal - 1)})")
    out.print(f"solver {plan.solver.name}: {plan.solver.status}, search time {_ms(plan.solver.search_time_s)}"
              + (f", gap {plan.solver.gap:.2%}" if plan.solver.gap else ""))


# --------------------------------------------------------------------------------------------------------------
# lynx compare


def compare_rows(profile: Profile, algos: list[str], limit: int, time_limit: float | None,
                 progress: bool = True) -> list[dict]:
    """One row per algorithm: the contract's keys plus `available`, `peak_per_stage` and `note`."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .solvers import Infeasible, solve

    rows: list[dict] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True, disable=not progress) as bar:
        task = bar.add_task("solving", total=len(algos))
        for algo in algos:
            bar.update(task, description=f"solving {algo}")
            row: dict[str, Any] = {"algo": algo, "iteration_time_s": None, "speedup_vs_full": None,
                                   "peak_memory_bytes": None, "fits": False, "search_time_s": None,
                                   "available": True, "peak_per_stage": None, "note": ""}
            t0 = time.perf_counter()
            try:
                solved = solve(profile, algo, limit, time_limit)
                raise_if_interrupted()
            except ModuleNotFoundError as e:
                row.update(available=False, note=f"not available ({e.name or e})")
            except Infeasible as e:
                row.update(peak_memory_bytes=e.needed, search_time_s=round(time.perf_counter() - t0, 6),
                           note=str(e))
            else:
                ev = solved.evaluation
                row.update(iteration_time_s=ev.predicted.iteration_time_s, peak_memory_bytes=ev.peak_bytes,
                           fits=ev.fits(limit), search_time_s=solved.solver.search_time_s,
                           peak_per_stage=[s.peak_memory_bytes for s in ev.predicted.stages])
            rows.append(row)
            bar.advance(task)
    full = next((r["iteration_time_s"] for r in rows if r["algo"] == "full"), None)
    if full is None and "full" not in algos:
        try:
            full = solve(profile, "full", limit).evaluation.predicted.iteration_time_s
        except Exception:
            full = None
    for r in rows:
        if full is not None and r["iteration_time_s"]:
            r["speedup_vs_full"] = full / r["iteration_time_s"]
    return rows


@command("compare")
def compare_cmd(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE.json", help="A profile from `lynx profile`.")],
    memory_limit: Annotated[Optional[str], typer.Option(
        show_default="the device memory less the reserve (1 GiB + 4%; docs/accuracy.md)",
        help="Per-device memory budget: 80GiB, 40GB, 512MiB or a number of bytes.")] = None,
    algos: Annotated[Optional[str], typer.Option(
        show_default="all: heu,opt,none,full,selective,uniform,block,checkmate,adapipe",
        help="Comma-separated algorithms to compare.")] = None,
    time_limit: Annotated[Optional[float], typer.Option(
        min=0.001, show_default="the solver's own", help="Seconds each MILP solver may search.")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print a JSON list of {"algo", "iteration_time_s", "speedup_vs_full", "peak_memory_bytes", '
        '"fits", "search_time_s"} instead of a table.')] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Also list each stage's peak memory (folded to the terminal's width).")] = False,
    plot: Annotated[Optional[Path], typer.Option(
        metavar="FILE.png", help="Draw iteration time against peak memory, one point per algorithm.")] = None,
) -> None:
    """Run several algorithms on PROFILE under one memory limit and compare time, memory and search time."""
    if plot is not None:
        _check_output(plot, "--plot")
    names = _algos(algos)
    time_limit = _seconds(time_limit)
    profile = _load_profile(profile_path)
    limit = _size(memory_limit, "--memory-limit") or default_memory_limit(profile.hardware)
    rows = compare_rows(profile, names, limit, time_limit, progress=True)
    for r in rows:
        if not r["available"]:
            err.print(f"note: {r['algo']}: {r['note']}")
    if as_json:
        keys = ("algo", "iteration_time_s", "speedup_vs_full", "peak_memory_bytes", "fits", "search_time_s")
        typer.echo(dumps_json([{k: r[k] for k in keys} for r in rows], "--json", indent=1), nl=False)
    else:
        _compare_table(profile_path, profile, limit, rows, verbose)
    if plot is not None:
        from .plot import time_memory

        par = profile.parallel
        time_memory([{**r, "label": r["algo"], "iteration_time_s": r["iteration_time_s"] if r["fits"] else None}
                     for r in rows if r.get("available", True)], limit,
                    f"{profile.model.name} on {profile.hardware.name}, tp {par.tp} pp {par.pp}, "
                    f"{par.num_microbatches} micro-batches: limit {format_bytes(limit)}", plot)
        if not as_json:
            out.print(f"wrote {plot}")
    _fail_if_nothing_fits(rows, limit)


def _fail_if_nothing_fits(rows: list[dict], limit: int) -> None:
    """A memory limit that no strategy meets is bad input (exit 2), after the results are shown."""
    ran = [r for r in rows if r["available"]]
    if ran and not any(r["fits"] for r in ran):
        least = min((r for r in ran if r["peak_memory_bytes"]), key=lambda r: r["peak_memory_bytes"], default=None)
        need = f"; the least needed is {format_bytes(least['peak_memory_bytes'])} ({least['algo']})" if least else ""
        raise InputError(f"--memory-limit: no algorithm fits in {format_bytes(limit)}{need}")


def _compare_table(profile_path: Path, profile: Profile, limit: int, rows: list[dict], verbose: bool = False
                   ) -> None:
    """Time, speedup, memory and fit columns always; each stage's peak only with --verbose, as a folding column."""
    from rich import box

    table = Table(title=f"{profile_path}: memory limit {format_bytes(limit)}, pp {profile.parallel.pp}",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    unit, size = _unit([r.get("peak_memory_bytes") for r in rows])
    for col, just in (("algo", "left"), ("iteration s", "right"), ("vs full", "right"), (f"peak {unit}", "right"),
                      ("fits", "left"), ("search", "right")):
        table.add_column(col, justify=just, no_wrap=True)
    if verbose:
        table.add_column(f"peak {unit} per stage", justify="left", overflow="fold", ratio=1)
    for r in rows:
        if not r["available"]:
            table.add_row(r["algo"], "-", "-", "-", "n/a", "-", *([""] if verbose else []))
            continue
        if r["peak_per_stage"]:
            peak, stages = _in(r["peak_memory_bytes"], size), " ".join(_in(p, size) for p in r["peak_per_stage"])
        else:
            peak, stages = (f"needs {_in(r['peak_memory_bytes'], size)}" if r["peak_memory_bytes"] else "-"), ""
        table.add_row(r["algo"], f"{r['iteration_time_s']:.4f}" if r["iteration_time_s"] else "-",
                      f"{r['speedup_vs_full']:.3f}x" if r["speedup_vs_full"] else "-", peak,
                      "yes" if r["fits"] else "[red]no[/red]",
                      _ms(r["search_time_s"]) if r["search_time_s"] is not None else "-",
                      *([stages] if verbose else []))
    out.print(table)


# --------------------------------------------------------------------------------------------------------------
# lynx simulate


_STREAMS = ("compute", "tp collective", "recompute (side)")


def chrome_trace(events: list[dict], stages: int) -> dict:
    """Chrome trace-event JSON: one process per stage, one thread per stream, with name metadata for Perfetto."""
    streams = list(_STREAMS) + sorted({e["tid"] for e in events} - set(_STREAMS))
    tid = {name: i for i, name in enumerate(streams)}
    meta: list[dict] = []
    for s in range(stages):
        meta.append({"name": "process_name", "ph": "M", "pid": s, "tid": 0, "args": {"name": f"stage {s}"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": s, "tid": 0, "args": {"sort_index": s}})
        for name in streams:
            meta.append({"name": "thread_name", "ph": "M", "pid": s, "tid": tid[name], "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": s, "tid": tid[name],
                         "args": {"sort_index": tid[name]}})
    body = [{**e, "cat": e["tid"], "tid": tid[e["tid"]]} for e in events]
    body.sort(key=lambda e: (e["pid"], e["tid"], e["ts"]))
    return {"traceEvents": meta + body, "displayTimeUnit": "ms"}


@command("simulate")
def simulate_cmd(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.json", help="A plan from `lynx plan`.")],
    profile: Annotated[Optional[Path], typer.Option(
        metavar="PROFILE.json", show_default="the plan's profile_path", help="Profile to simulate against.")]
    = None,
    trace: Annotated[Optional[Path], typer.Option(
        metavar="TRACE.json", help="Write a Chrome trace (open in Perfetto or chrome://tracing): one track per "
        "stage and stream.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the predicted block as JSON.")] = False,
    plot: Annotated[Optional[Path], typer.Option(
        metavar="TIMELINE.png", help="Draw the pipeline per stage (forward, backward, collectives, hidden and "
        "exposed recomputation) with each stage's memory over time under it.")] = None,
) -> None:
    """Re-simulate a plan: per-stage memory and time, and optionally a timeline trace or picture."""
    from .evaluate import evaluate

    if trace is not None:
        _check_output(trace, "--trace", (plan_path, profile))
    if plot is not None:
        _check_output(plot, "--plot", (plan_path, profile))
    plan = _load_plan(plan_path)
    prof_path = _plan_profile_path(plan, plan_path, profile)
    if trace is not None:
        _check_output(trace, "--trace", (plan_path, prof_path))
    prof = _load_profile(prof_path)
    if file_sha256(prof_path) != plan.profile_sha256:
        err.print(f"warning: {prof_path} is not the profile the plan was made for (sha256 differs)")
    if len(plan.stages) != prof.parallel.pp * prof.parallel.virtual_stages:
        raise InputError(f"{plan_path}: field stages: {len(plan.stages)} stages, the profile {prof_path} has "
                         f"pp {prof.parallel.pp} x {prof.parallel.virtual_stages} virtual stages")
    from .evaluate import structure_problems

    broken = structure_problems(plan, prof)  # cheap, and bounds every layer range before the simulator expands it
    if broken:
        raise InputError(f"{plan_path}: field stages: {broken[0]}; run `lynx check {plan_path}`")
    try:
        ev = evaluate(prof, plan.stages, trace=trace is not None or plot is not None)
    except (KeyError, IndexError, ValueError) as e:
        raise InputError(f"{plan_path}: the plan does not fit the profile {prof_path} ({type(e).__name__}: {e}); "
                         "run `lynx check`") from None
    if trace is not None:
        write_atomic(trace, dumps_json(chrome_trace(ev.sim.trace, prof.parallel.pp), str(trace)))
    if plot is not None:
        from .plot import timeline

        timeline(ev.sim.trace, ev.sim.memory, [s.static_bytes for s in ev.predicted.stages], plan.memory_limit_bytes,
                 f"{plan_path.name} ({plan.algo}): {prof.model.name} on {prof.hardware.name}, tp {prof.parallel.tp} "
                 f"pp {prof.parallel.pp} dp {prof.parallel.dp}, {prof.parallel.num_microbatches} micro-batches, "
                 f"{ev.predicted.iteration_time_s:.4f} s", plot)
    pred = ev.predicted
    if as_json:
        typer.echo(dumps_json(pred.model_dump(mode="json"), "--json", indent=1), nl=False)
        return
    from rich import box

    table = Table(title=f"{plan_path} ({plan.algo}) on {prof_path}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    unit, size = _unit([s.peak_memory_bytes for s in pred.stages])
    for col in ("stage", f"peak\n{unit}", f"static\n{unit}", f"activations\n{unit}", "busy s", "recompute\nexposed",
                "recompute\nhidden"):
        table.add_column(col, justify="right", no_wrap=True)
    for s in pred.stages:
        table.add_row(str(s.stage), _in(s.peak_memory_bytes, size), _in(s.static_bytes, size),
                      _in(s.activation_bytes, size), f"{s.busy_time_s:.4f}", _ms(s.exposed_recompute_s),
                      _ms(s.hidden_recompute_s))
    out.print(table)
    t, ideal = pred.iteration_time_s, pred.ideal_iteration_time_s
    out.print(f"iteration time {t:.4f} s, ideal {ideal:.4f} s ({_percent(t / ideal - 1)}); memory limit "
              f"{format_bytes(plan.memory_limit_bytes)}, peak {format_bytes(ev.peak_bytes)}")
    if trace is not None:
        out.print(f"wrote {trace} ({len(ev.sim.trace)} events)")
    if plot is not None:
        out.print(f"wrote {plot}")


# --------------------------------------------------------------------------------------------------------------
# lynx check


@command("check")
def check_cmd(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.json", help="A plan from `lynx plan`.")],
    profile: Annotated[Optional[Path], typer.Option(
        metavar="PROFILE.json", show_default="the plan's profile_path", help="Profile the plan must be valid for.")]
    = None,
) -> None:
    """Verify a plan against its profile and a fresh simulation; exit 1 with the problems if anything differs.

    Checked: made for this profile (sha256); stage numbering, layer names, parallel setup and precision are the
    profile's; legal policies whose modes match them; placements that fire; fits memory; every predicted figure and
    the solver's status match a fresh simulation. Prints the simulated figures."""
    from .evaluate import TIME_RTOL, Verdict, verify

    plan = _load_plan(plan_path)
    prof_path = _plan_profile_path(plan, plan_path, profile)
    prof = _load_profile(prof_path)
    sha = file_sha256(prof_path)
    if sha != plan.profile_sha256:
        out.print(f"{plan_path}: profile_sha256 {plan.profile_sha256[:12]}... does not match {prof_path} "
                  f"({sha[:12]}...): the profile changed since the plan was made; re-run `lynx plan`")
        raise typer.Exit(1)
    try:
        verdict = verify(plan, prof)
    except (KeyError, IndexError, ValueError) as e:  # a plan too broken for the checks themselves
        verdict = Verdict([f"the plan does not fit the profile ({type(e).__name__}: {e})"], None)
    if verdict.problems:
        for p in verdict.problems:
            out.print(f"{plan_path}: {p}")
        raise typer.Exit(1)
    sim = verdict.evaluation.predicted  # what is printed is simulated here, never read from the plan
    out.print(f"ok: {plan_path} ({plan.algo}) is valid for {prof_path}: simulated peak "
              f"{format_bytes(verdict.evaluation.peak_bytes)} <= limit {format_bytes(plan.memory_limit_bytes)}, "
              f"iteration time {sim.iteration_time_s:.4f} s (ideal {sim.ideal_iteration_time_s:.4f} s); every "
              f"predicted figure within {TIME_RTOL:g} (relative) of the simulation, bytes exact")


# --------------------------------------------------------------------------------------------------------------
# lynx apply


@command("apply")
def apply_cmd(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.json", help="A plan from `lynx plan`.")],
    model_path: Annotated[Path, typer.Argument(metavar="MODEL.py", help="The model file the plan was made for.")],
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show what apply_plan would do to each layer, without training.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the layers as a JSON list (stage, layer, module, "
                                          "mode, keep, recompute, when).")] = False,
) -> None:
    """Show how a plan maps onto a model's modules (--dry-run). Training scripts call lynx_planner.apply_plan."""
    if not dry_run:
        raise InputError("lynx apply needs --dry-run: plans are applied inside the training script, with "
                         "`module = lynx_planner.apply_plan(module, 'plan.json', stage=STAGE)`")
    if not model_path.is_file():
        raise InputError(f"{model_path}: no such model file")
    _load_plan(plan_path)  # a clear error for a bad plan before running user code
    try:
        from .runtime import dry_run as _dry_run
    except ImportError as e:
        raise InputError(f"the runtime (lynx_planner.runtime) is not available in this installation ({e})") from None
    rows = _call_model_file(model_path, "dry run", _dry_run, str(plan_path), str(model_path))
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    out.print(f"{plan_path} on {model_path}")
    for line in dry_run_lines(rows, _width()):
        out.print(line, markup=False)
    plan = _load_plan(plan_path)
    precision = (f"fp32 weights under {plan.autocast} autocast" if plan.autocast else
                 f"{plan.dtype} weights" if plan.dtype else "the weights as built")
    out.print(f"ok: a training forward and backward of {model_path} ran with every stage of the plan applied "
              f"({precision})")


def _width() -> int:
    import shutil

    return max(60, shutil.get_terminal_size((100, 24)).columns)


def dry_run_lines(rows: list[dict], width: int) -> list[str]:
    """One heading per layer, then its kept and recomputed op ids wrapped at spaces so that no id is cut."""
    import textwrap

    lines = []
    for r in rows:
        when = r.get("when", r.get("at", ""))
        lines.append(f"stage {r['stage']}  layer {r['layer']}  {r['module']}  {r['mode']}  at {when}")
        for key in ("keep", "recompute"):
            if r[key]:
                lines += textwrap.wrap(", ".join(r[key]), width=width, initial_indent=f"  {key}: ",
                                       subsequent_indent=" " * (len(key) + 4), break_long_words=False,
                                       break_on_hyphens=False)
    return lines


# --------------------------------------------------------------------------------------------------------------
# lynx validate (logic in validate.py)


@command("validate")
def validate_cmd(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.json", help="A plan from `lynx plan` (pp stages).")],
    model_path: Annotated[Path, typer.Argument(metavar="MODEL.py", help="The model file the plan was made for.")],
    repeats: Annotated[int, typer.Option(min=1, help="Timed iterations per plan.")] = 5,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed iterations per plan first.")] = 2,
    threads: Annotated[Optional[int], typer.Option(
        min=1, show_default="the profile's, else 1", help="CPU threads per stage process.")] = None,
    also: Annotated[Optional[list[Path]], typer.Option(
        "--also", metavar="PLAN.json", help="More plans of the same model, run interleaved in the same job.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Run plans for real in a torch.distributed.pipelining job here and print predicted vs measured.

    One gloo process per stage, plans interleaved; per stage forward, backward, recomputation and activation bytes,
    then the iteration time with its spread over the repeats."""
    from . import validate

    if not model_path.is_file():
        raise InputError(f"{model_path}: no such model file")
    _threads(threads)
    paths = [plan_path, *(also or [])]
    for p in paths:
        _load_plan(p)
    runs = _call_model_file(model_path, "validation", validate.run, [str(p) for p in paths], str(model_path),
                            repeats=repeats, warmup=warmup, threads=threads)
    summaries = [validate.summary(r) for r in runs]
    if as_json:
        typer.echo(json.dumps(summaries, indent=1))
    else:
        out.print(validate.table(summaries), markup=False)


# --------------------------------------------------------------------------------------------------------------
# lynx bench


@command("bench")
def bench_cmd(
    suite: Annotated[Path, typer.Option(
        help="Suite directory holding suite.json (a list of {profile, memory_limits}).")] = Path("bench"),
    baseline: Annotated[Optional[Path], typer.Option(
        show_default="SUITE/baseline.json", help="Quality baseline to check against or update.")] = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Exit 1 if a heu/opt plan got >0.5% slower than the baseline (the suite's tolerance, not "
        "the baseline file's), broke memory, or any plan failed `lynx check`. Refused (exit 2) without heu and opt, "
        "or with a baseline that is empty or lacks a case or an algorithm that runs.")] = False,
    update: Annotated[bool, typer.Option(
        "--update", help="Write the baseline from this run (quality numbers only, no search times).")] = False,
    algos: Annotated[Optional[str], typer.Option(
        show_default="all", help="Comma-separated algorithms to run.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for bench.md and bench.json (created).")]
    = Path("bench/out"),
    time_limit: Annotated[Optional[float], typer.Option(
        min=0.001, show_default="the solver's own", help="Seconds each MILP solver may search.")] = None,
) -> None:
    """Run every algorithm on a suite of profiles and memory limits; report quality and search time."""
    from . import bench

    # CI logs: no squashing (a width the user sets with COLUMNS is kept)
    wide = out if out.is_terminal or os.environ.get("COLUMNS") else Console(highlight=False, soft_wrap=True, width=200)
    code = bench.main(suite, baseline=baseline, check=check, update=update, algos=_algos(algos), out_dir=out_dir,
                      time_limit=_seconds(time_limit), console=wide)
    raise typer.Exit(code)


# --------------------------------------------------------------------------------------------------------------
# lynx tune, lynx export (layouts and launch settings; logic in tune.py, export.py, plot.py)


def _progress_bar(description: str):
    """A transient progress bar on stderr, and the callback tune.py reports to."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), console=err, transient=True)
    task = bar.add_task(description, total=None)

    def report(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, description=f"{description} {label}".rstrip())

    return bar, report


def _layout_cells(lay) -> list[str]:
    v = f" v{lay.virtual_stages}" if lay.virtual_stages > 1 else ""
    pp = f"{lay.pp}" if lay.schedule == "1f1b" else f"{lay.pp}({lay.schedule}{v})"
    return [f"{lay.tp}x{pp}x{lay.dp}" + (f" ep{lay.ep}" if lay.ep > 1 else ""),
            f"{lay.micro_batch_size}x{lay.num_microbatches}",
            "y" if lay.sequence_parallel else "-"]


def _tune_table(title: str, result, best_meg) -> Table:
    from rich import box

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col, just in (("#", "right"), ("tp×pp×dp", "left"), ("mb×M", "left"), ("sp", "left"), ("algo", "left"),
                      ("tok/s/GPU", "right"), ("iter s", "right"), ("GiB", "right"), ("fits", "left"),
                      ("speedup", "right")):
        table.add_column(col, justify=just, no_wrap=True, min_width=2 if col == "#" else None)
    base = best_meg.tokens_per_s_per_gpu if best_meg else None
    for i, r in enumerate(result.top, 1):
        rate = r.tokens_per_s_per_gpu
        table.add_row(str(i), *_layout_cells(r.layout), r.algo, f"{rate:.1f}" if rate < 1e6 else f"{rate:.3g}",
                      f"{r.iteration_time_s:.3f}" if r.iteration_time_s >= 0.01 else f"{r.iteration_time_s:.2e}",
                      _gib(r.peak_memory_bytes), "yes" if r.fits else "[red]no[/red]",
                      f"{r.tokens_per_s_per_gpu / base:.3f}x" if base else "-")
    return table


@command("tune")
def tune_cmd(
    model: Annotated[str, typer.Argument(
        metavar="MODEL", help="A catalog name (`lynx models`) or the path of a .py file that builds a PyTorch model.")],
    global_batch: Annotated[int, typer.Option("--global-batch", min=1, help="Sequences per iteration.")],
    hardware: Annotated[str, typer.Option(
        help="Hardware catalog name or JSON file; several kinds comma-separated (a100-80g-nvlink,h100-80g-nvlink).")]
    = DEFAULT_HARDWARE,
    gpus: Annotated[Optional[int], typer.Option(
        "--gpus", min=1, show_default="per kind, the fewest that fit and a few sizes above",
        help="Number of GPUs.")] = None,
    seq_len: Annotated[int, typer.Option(min=1, help="Sequence length in tokens.")] = 2048,
    memory_limit: Annotated[Optional[str], typer.Option(
        show_default="the device memory less the reserve (1 GiB + 4%)",
        help="Per-device memory budget: 80GiB, 40GB, 512MiB or bytes.")] = None,
    time_limit: Annotated[Optional[float], typer.Option(
        min=0.001, help="Seconds the layout search may take; layouts not reached by then are not planned.")] = 300.0,
    top: Annotated[int, typer.Option(min=1, help="Configurations to show.")] = 10,
    ep: Annotated[Optional[int], typer.Option(
        "--ep", min=1, show_default="MoE models: every size dividing dp and the experts",
        help="Expert parallelism to use (MoE models) instead of searching it.")] = None,
    distributed_optimizer: Annotated[bool, typer.Option(
        "--distributed-optimizer/--no-distributed-optimizer", help=DISTRIBUTED_OPTIMIZER_HELP)
    ] = DISTRIBUTED_OPTIMIZER,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print one JSON row per (layout, algorithm) planned instead of the table.")] = False,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", metavar="DIR", help="Write the best layout's profile.json and plan.json there (created).")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        metavar="FILE.png", help="Draw tokens/s per GPU against peak memory of every planned configuration.")]
    = None,
    schedule: Annotated[str, typer.Option(
        help="Pipeline schedules to search, comma-separated, or 'all' (1f1b, gpipe, interleaved-1f1b, zero-bubble; "
             "docs/schedules.md).")] = "1f1b",
    virtual_stages: Annotated[Optional[int], typer.Option(
        min=1, show_default="searched: 2, 3, 4, 6, 8 where the layers split evenly",
        help="Chunks per rank for interleaved-1f1b and zero-bubble.")] = None,
) -> None:
    """Search parallel layouts and recomputation together: the best launch configurations of MODEL on GPUS GPUs."""
    from . import schedules as schedule_names
    from . import tune

    names = schedule_names.NAMES if schedule.strip() == "all" else tuple(s.strip() for s in schedule.split(",")
                                                                         if s.strip())
    unknown = [s for s in names if s not in schedule_names.NAMES]
    if unknown or not names:
        raise InputError(f"--schedule: unknown schedule {unknown[0] if unknown else schedule!r} (expected 'all' or "
                         f"some of {', '.join(schedule_names.NAMES)})")

    kinds = [_hardware(h.strip()) for h in hardware.split(",") if h.strip()]
    if not kinds:
        raise InputError("--hardware: empty list")
    if out_dir is not None and (len(kinds) > 1 or gpus is None):
        raise InputError("--out: needs one --hardware and --gpus (it writes that configuration's files)")
    if out_dir is not None:
        _check_out_dir(out_dir)
    if plot is not None:
        if len(kinds) > 1 or gpus is None:
            raise InputError("--plot: needs one --hardware and --gpus (it draws that search's configurations)")
        _check_output(plot, "--plot")
    limit = _size(memory_limit, "--memory-limit")
    if gpus is None:
        if names != ("1f1b",) or virtual_stages is not None:
            raise InputError("--schedule/--virtual-stages: need --gpus (sizing up searches 1F1B layouts)")
        return _size_up(model, kinds, global_batch, seq_len, limit, time_limit, distributed_optimizer, as_json)
    json_rows = []
    for hw in kinds:
        profiles = tune.Profiles(model, hw, seq_len, distributed_optimizer,
                                 call=lambda fn, *a, **k: _call_model_file(Path(model), "profiling", fn, *a, **k))
        bar, report = _progress_bar(f"{hw.name}:")
        with bar:
            result = tune.tune(model, gpus, hw, global_batch, seq_len, limit, time_limit, top,
                               distributed_optimizer, profiles, progress=report, make_plan=out_dir is not None
                               or not as_json, names=names, virtual=virtual_stages, ep=ep)
        if as_json:
            json_rows += [{"hardware": hw.name, "gpus": gpus, **r.json()} for r in result.rows]
        else:
            _print_tune(model, gpus, hw, global_batch, seq_len, limit or default_memory_limit(hw), result)
        if result.time_limit_hit:
            left = result.enumerated - result.planned - result.megatron_only - result.too_big - result.pruned
            err.print(f"note: --time-limit {time_limit:g} s reached: {left} of {result.enumerated} layouts were not "
                      "planned; the table covers those reached")
        if not result.top and result.time_limit_hit:
            raise InputError(f"--time-limit: {time_limit:g} s ran out before any layout of {model} on {gpus} x "
                             f"{hw.name} was planned")
        if not result.top:
            raise InputError(f"--memory-limit: no layout of {model} on {gpus} x {hw.name} fits in "
                             f"{format_bytes(limit or default_memory_limit(hw))}, even with full recomputation")
        if out_dir is not None:
            if result.best_plan is None:
                raise InputError(f"--out: HEU found no plan for the best layout {result.top[0].layout.label()}")
            _check_out_dir(out_dir)
            written = tune.write_outputs(result, out_dir)
            if not as_json:
                out.print(f"wrote {written[0]} and {written[1]} ({result.top[0].layout.label()}; check with "
                          f"`lynx check {written[1]}`)")
        if plot is not None:
            from .plot import time_memory

            labelled = {id(r) for r in result.top[:5]}
            points = [{"algo": r.algo, "peak_memory_bytes": r.peak_memory_bytes,
                       "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
                       "label": r.layout.label() if id(r) in labelled else ""} for r in result.rows if r.fits]
            time_memory(points, limit or default_memory_limit(hw), f"{model} on {gpus} x {hw.name}, global batch "
                        f"{global_batch}", plot, y="tokens_per_s_per_gpu")
            if not as_json:
                out.print(f"wrote {plot}")
    if as_json:
        typer.echo(json.dumps(json_rows, indent=1))


def _check_out_dir(out_dir: Path) -> None:
    """--out: a directory (created here) where profile.json and plan.json can both be written; checked before the
    search, so a bad target costs nothing and no file in it is replaced."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: --out is a file, expected a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{out_dir}: --out: cannot create the directory: {e.strerror}") from None
    for name in ("profile.json", "plan.json"):
        _check_output(out_dir / name, "--out")


def _print_tune(model: str, gpus: int, hw: Hardware, global_batch: int, seq_len: int, limit: int, result) -> None:
    title = (f"{model} on {gpus} x {hw.name}, global batch {global_batch} x {seq_len} tokens, "
             f"limit {format_bytes(limit)}")
    out.print(_tune_table(title, result, result.best_megatron))
    meg = result.best_megatron
    if meg is not None:
        out.print(f"speedup: over the best Megatron-style configuration, {meg.layout.label()} {meg.algo} "
                  f"({meg.tokens_per_s_per_gpu:.1f} tok/s/GPU, {meg.iteration_time_s:.3f} s)")
    out.print(f"{result.enumerated} layouts: {result.planned} planned with HEU and Megatron, {result.megatron_only} "
              f"with Megatron only, {result.too_big} do not fit even with full recomputation, {result.pruned} skipped "
              f"(their balanced ideal cannot enter the table); {result.elapsed_s:.1f} s")


def _size_up(model: str, kinds: list[Hardware], global_batch: int, seq_len: int, limit: int | None,
             time_limit: float | None, distributed_optimizer: bool, as_json: bool) -> None:
    from rich import box

    from . import tune

    rows = []
    for hw in kinds:
        bar, report = _progress_bar(f"{hw.name}:")
        with bar:
            sizing = tune.size_up(model, hw, global_batch, seq_len, limit, time_limit=time_limit,
                                  distributed_optimizer=distributed_optimizer, progress=report)
        if sizing.fewest_gpus is None:
            rows.append({"hardware": hw.name, "gpus": None, "fewest": True, "row": None})
        for n, result in sizing.results:
            best = result.top[0] if result.top else None
            rows.append({"hardware": hw.name, "gpus": n, "fewest": n == sizing.fewest_gpus, "row": best})
    if as_json:
        typer.echo(json.dumps([{"hardware": r["hardware"], "gpus": r["gpus"], "fewest_gpus": r["fewest"],
                                **(r["row"].json() if r["row"] else {})} for r in rows], indent=1))
        return
    table = Table(title=f"{model}: global batch {global_batch} x {seq_len} tokens; the fewest GPUs that fit, and "
                  "twice and four times that", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for col, just in (("hardware", "left"), ("GPUs", "right"), ("tp×pp×dp", "left"), ("mb×M", "left"),
                      ("sp", "left"), ("algo", "left"), ("tok/s/GPU", "right"), ("iter s", "right"),
                      ("GiB", "right")):
        table.add_column(col, justify=just, no_wrap=True)
    for r in rows:
        best = r["row"]
        if best is None:
            table.add_row(r["hardware"], "-" if r["gpus"] is None else str(r["gpus"]), "does not fit", "", "", "",
                          "", "", "")
            continue
        table.add_row(r["hardware"], f"{r['gpus']}{' *' if r['fewest'] else ''}", *_layout_cells(best.layout),
                      best.algo, f"{best.tokens_per_s_per_gpu:.1f}", f"{best.iteration_time_s:.3f}",
                      _gib(best.peak_memory_bytes))
    out.print(table)
    out.print("* the fewest GPUs (powers of two) on which some layout fits in memory")


class Framework(str, Enum):
    megatron = "megatron"
    torchtitan = "torchtitan"
    torchtitan_02 = "torchtitan-0.2"


@command("export")
def export_cmd(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.json", help="A plan from `lynx plan` or `lynx tune`.")],
    to: Annotated[Framework, typer.Option("--to", help="megatron: Megatron-LM arguments; torchtitan: torchtitan "
                                          "0.3 command-line arguments and the LynxAC hook; torchtitan-0.2: a "
                                          "torchtitan 0.2.2 TOML job file and the apply_plan call.")],
    profile: Annotated[Optional[Path], typer.Option(
        metavar="PROFILE.json", show_default="the plan's profile_path", help="The plan's profile.")] = None,
) -> None:
    """Print the launch settings that reproduce a plan's layout and (the nearest) recomputation."""
    from . import export

    from .evaluate import verify

    plan = _load_plan(plan_path)
    prof_path = _plan_profile_path(plan, plan_path, profile)
    prof = _load_profile(prof_path)
    if file_sha256(prof_path) != plan.profile_sha256:
        raise InputError(f"{plan_path}: field profile_sha256: {prof_path} is not the profile the plan was made for "
                         "(it changed since); re-run `lynx plan`, or pass the right --profile")
    problems = verify(plan, prof).problems  # what `lynx check` rejects is not exported
    if problems:
        raise InputError(f"{plan_path}: `lynx check` rejects this plan, not exporting it: "
                         + "\n".join(problems[:5]) + ("\n..." if len(problems) > 5 else ""))
    if to is Framework.torchtitan:
        args, notes = export.torchtitan_args(plan, prof)
        typer.echo(f"# {plan_path} ({plan.algo}) for {export.TORCHTITAN_VERSION}: arguments of torchtitan's train "
                   "(python -m torchtitan.train ...)")
        typer.echo(" \\\n".join(shlex.join(line) for line in args))
        for note in notes:
            typer.echo(f"# {note}")
        typer.echo(export.TORCHTITAN_HOOK.format(module=args[0][1], config=args[1][1], plan=plan_path.name))
        return
    if to is Framework.torchtitan_02:
        typer.echo(f"# {plan_path} ({plan.algo}) for {export.TORCHTITAN_02_VERSION}: job config (TOML)")
        typer.echo(export.toml(export.torchtitan(plan, prof)))
        typer.echo(export.TORCHTITAN_APPLY)
        return
    got = export.megatron(plan, prof)
    typer.echo(f"# {plan_path} ({plan.algo}, {plan.predicted.iteration_time_s:.4f} s) for {export.MEGATRON_VERSION}")
    typer.echo(" \\\n".join(got.flags + (got.recompute.flags if got.recompute else [])))
    typer.echo("")
    if got.recompute is None:
        typer.echo(f"# no Megatron recomputation fits the plan's limit of {format_bytes(plan.memory_limit_bytes)}")
    else:
        rc = got.recompute
        typer.echo(f"# nearest Megatron recomputation within {format_bytes(plan.memory_limit_bytes)}: {rc.name}, "
                   f"predicted {rc.iteration_time_s:.4f} s ({rc.iteration_time_s / got.plan_time_s:.3f}x the plan's "
                   f"{got.plan_time_s:.4f} s), peak {format_bytes(rc.peak_memory_bytes)}")
    for note in got.not_expressible:
        typer.echo(f"# not expressible in Megatron: {note}")
    typer.echo("# Megatron's choices on this split: " + "; ".join(
        f"{c.name} {c.iteration_time_s:.4f} s {_gib(c.peak_memory_bytes)} GiB{'' if c.fits else ' (over)'}"
        for c in got.choices))


# --------------------------------------------------------------------------------------------------------------
# catalogs and schemas


@command("models")
def models_cmd() -> None:
    """List the catalog models."""
    from .models.catalog import MODELS, as_spec

    from rich import box

    # Narrow enough for 80 columns; the sources, long, follow the table one per line.
    table = Table(title="catalog models (MODEL may also be a config.json, a model JSON or a .py file)",
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=0)
    for col in ("name", "family", "params", "layers", "hidden", "heads", "ffn", "experts"):
        table.add_column(col, justify="left" if col in ("name", "family") else "right", no_wrap=True)
    specs = list(map(as_spec, MODELS.values()))

    def billions(n: int) -> str:
        return f"{n / 1e9:.0f}B" if n >= 100e9 else f"{n / 1e9:.1f}B"

    for m in specs:  # MoE: total/active parameters, top-k/experts x expert FFN width
        params = billions(m.params()) + (f"/{billions(m.active_params())}" if m.moe else "")
        moe = f"{m.moe.top_k}/{m.moe.experts}x{m.moe.expert_ffn}" if m.moe else "-"
        table.add_row(m.name, m.family, params, str(m.num_layers), str(m.hidden), f"{m.heads}/{m.kv}",
                      str(m.ffn_hidden), moe)
    out.print(table)
    out.print("sources:")
    for m in specs:
        out.print(f"  {m.name}: {m.source} (vocab {m.vocab})", soft_wrap=True)


@command("hardware")
def hardware_cmd(
    action: Annotated[Optional[str], typer.Argument(
        metavar="[calibrate]", help="calibrate: measure this machine and write a Hardware file (-o).")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", help="calibrate: the Hardware JSON to write (for `lynx profile --hardware FILE`).")] = None,
    name: Annotated[str, typer.Option(help="calibrate: the name written into the file.")] = "local",
    threads: Annotated[int, typer.Option(min=1, help="calibrate: CPU threads per rank.")] = 1,
    repeats: Annotated[int, typer.Option(min=1, help="calibrate: timed runs per measurement.")] = 10,
) -> None:
    """List the hardware catalog (use --hardware FILE.json for your own), or `calibrate -o FILE` this machine."""
    if action is not None:
        if action != "calibrate":
            raise InputError(f"lynx hardware: unknown action {action!r} (expected nothing or 'calibrate')")
        if output is None:
            raise InputError("lynx hardware calibrate: -o FILE.json is required")
        _check_output(output)
        _threads(threads)
        from .calibrate import calibrate

        hw = calibrate(name=name, threads=threads, repeats=repeats)
        write_atomic(output, dumps(hw))
        out.print(f"wrote {output}: GEMM {hw.peak_flops / 1e9:.1f} GFLOP/s, memory "
                  f"{hw.hbm_bytes_per_s / 1e9:.1f} GB/s, {hw.backend} p2p {hw.p2p_bytes_per_s / 1e9:.2f} GB/s + "
                  f"{hw.p2p_latency_s * 1e6:.0f} us, all-reduce busbw {hw.intra_node_bus_bytes_per_s / 1e9:.2f} "
                  f"GB/s + {hw.intra_node_latency_s * 1e6:.0f} us, interference {hw.interference:.2f}")
        return
    if output is not None:
        raise InputError("lynx hardware: -o applies to `lynx hardware calibrate`")
    from .models.hardware import HARDWARE

    from rich import box

    table = Table(title="hardware (efficiencies and bus bandwidths are assumptions to calibrate)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("name", "memory", "peak\nTFLOP/s", "HBM\nGB/s", "intra-node\nbusbw GB/s", "inter-node\nbusbw GB/s"):
        table.add_column(col, justify="left" if col == "name" else "right", no_wrap=True)
    for h in HARDWARE.values():
        table.add_row(h.name, format_bytes(h.memory_bytes), f"{h.peak_flops / 1e12:.1f}",
                      f"{h.hbm_bytes_per_s / 1e9:.0f}", f"{h.intra_node_bus_bytes_per_s / 1e9:.0f}",
                      f"{h.inter_node_bus_bytes_per_s / 1e9:.0f}")
    out.print(table)


class SchemaName(str, Enum):
    profile = "profile"
    plan = "plan"
    hardware = "hardware"
    model = "model"


@command("schema")
def schema_cmd(
    name: Annotated[SchemaName, typer.Argument(help="Which file format.")],
) -> None:
    """Print the JSON Schema of a lynx file format."""
    from .models.spec import ModelSpec

    cls = {"profile": Profile, "plan": Plan, "hardware": Hardware, "model": ModelSpec}[name.value]
    typer.echo(json.dumps(cls.model_json_schema(), indent=1))


def main() -> None:  # pragma: no cover - `python -m lynx_planner.cli`
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
