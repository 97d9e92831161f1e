"""The `lynx` command line: profile a model, plan its recomputation, compare strategies, simulate, check, bench.

Wiring only: each command declares its options here and calls its module in lynx_planner/commands/, where its logic,
tables and checks live. Exit codes (see shared/CONTRACT.md): 0 done; 1 a check, comparison or regression found a
violation; 2 bad input (usage, unreadable or invalid file, a memory limit no strategy meets, a model file that
fails). Bad input is reported in one place (`commands.terminal.guarded`) as a few lines on stderr naming the file and
field, never as a traceback, and no output file is left behind (`io.Outputs` puts a command's files in place only
once it succeeded and its report reached stdout).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from .commands import apply, bench, catalogs, check, compare, export, helptext, plan, profile, simulate, tune, validate
from .commands.choices import (
    Attention,
    AutocastDtype,
    Device,
    Dtype,
    Framework,
    Kernels,
    Method,
    Partition,
    Schedule,
    SchemaName,
)
from .commands.helptext import EXAMPLES  # noqa: F401  (tests and scripts read the examples from here)
from .commands.tables import percent as _percent  # noqa: F401  (kept importable from here)
from .commands.terminal import guarded

# One default for profile and tune (plan reads the profile's): Megatron-LM and torchtitan users shard optimizer state
# over data-parallel ranks; it only matters with --dp > 1.
DISTRIBUTED_OPTIMIZER = None  # on, unless --fsdp (which shards the optimizer state itself)
DISTRIBUTED_OPTIMIZER_HELP = helptext.DISTRIBUTED_OPTIMIZER

# Declarations several commands share: one spelling, one help, one default.
PlanFile = Annotated[Path, typer.Argument(metavar="PLAN.json", help="A plan from `lynx plan`.")]
ProfileFile = Annotated[Path, typer.Argument(metavar="PROFILE.json", help="A profile from `lynx profile`.")]
ModelFile = Annotated[Path, typer.Argument(metavar="MODEL.py", help="The model file the plan was made for.")]
MemoryLimit = Annotated[Optional[str], typer.Option(
    show_default="the device memory less the reserve (1 GiB + 4%; docs/accuracy.md)",
    help="Per-device memory budget: 80GiB, 40GB, 512MiB or a number of bytes.")]
DistributedOptimizer = Annotated[Optional[bool], typer.Option(
    "--distributed-optimizer/--no-distributed-optimizer", show_default="on; off with --fsdp",
    help=DISTRIBUTED_OPTIMIZER_HELP)]
Fsdp = Annotated[bool, typer.Option("--fsdp", help=helptext.FSDP)]
ReshardAfterForward = Annotated[bool, typer.Option(
    "--reshard-after-forward/--no-reshard-after-forward", help=helptext.RESHARD_AFTER_FORWARD)]
HsdpShardSize = Annotated[Optional[int], typer.Option("--hsdp-shard-size", min=1, show_default="dp (plain FSDP)",
                                                      help=helptext.HSDP_SHARD_SIZE)]
ContextParallel = Annotated[int, typer.Option("--cp", min=1, help=helptext.CP)]

app = typer.Typer(
    name="lynx",
    help=helptext.APP,
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
    """The options before a command (--version); `lynx --help` shows helptext.APP."""


DEFAULT_HARDWARE = "a100-80g-nvlink"


def command(name: str, **kwargs: Any) -> Callable:
    """Register a command: its examples at the end of its --help, bad input and Ctrl-C handled by `guarded`."""
    kwargs.setdefault("epilog", helptext.epilog(name))

    def register(fn: Callable) -> Callable:
        app.command(name, **kwargs)(guarded(fn))
        return fn

    return register


# --------------------------------------------------------------------------------------------------------------
# profile, plan, compare


@command("profile")
def profile_cmd(
    model: Annotated[str, typer.Argument(
        metavar="MODEL",
        help="A catalog name (`lynx models`: gpt-1.3b ... gpt-175b, llama3-8b, mixtral-8x7b, ...), a Hugging Face "
             "config.json, a lynx model JSON, or the path of a .py file that builds a PyTorch model.")],
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
        metavar="METHOD", help="analytic: roofline op times from the hardware's datasheet; measure: time the ops of a model file "
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
    schedule: Annotated[Schedule, typer.Option(metavar="SCHEDULE", help=helptext.SCHEDULE)] = Schedule("1f1b"),
    virtual_stages: Annotated[int, typer.Option(
        min=1, help="Model chunks per pipeline rank (Megatron-LM's --num-virtual-stages-per-pipeline-rank): >= 2 for "
                    "interleaved-1f1b, any for zero-bubble, 1 otherwise.")] = 1,
    distributed_optimizer: DistributedOptimizer = DISTRIBUTED_OPTIMIZER,
    overlap_grad_reduce: Annotated[bool, typer.Option(
        "--overlap-grad-reduce/--no-overlap-grad-reduce", help="Reduce DP gradients during the last backward "
        "(Megatron --overlap-grad-reduce).")] = True,
    overlap_param_gather: Annotated[bool, typer.Option(
        "--overlap-param-gather", help="With --distributed-optimizer: all-gather the updated weights during the "
        "next forward (Megatron --overlap-param-gather).")] = False,
    tp_comm_overlap: Annotated[bool, typer.Option(
        "--tp-comm-overlap", help="Overlap TP collectives with their GEMMs (Megatron --tp-comm-overlap).")] = False,
    overlap_p2p_comm: Annotated[bool, typer.Option(
        "--overlap-p2p-communication/--no-overlap-p2p-communication", show_default=False, help="Pipeline sends "
        "beside the compute (the default: torch's schedules, Megatron's interleaved one), or blocking as Megatron's "
        "1F1B runs them.")] = True,
    fsdp: Fsdp = False,
    reshard_after_forward: ReshardAfterForward = True,
    hsdp_shard_size: HsdpShardSize = None,
    cp: ContextParallel = 1,
    kernels: Annotated[Optional[Kernels], typer.Option(
        metavar="KERNELS", show_default="hf", help="How a catalog or config.json decoder layer runs (what it saves): hf (Hugging Face "
        "eager modules), te (Megatron-core with Transformer Engine: fused norm+linear, rotary, SwiGLU) or "
        "torchtitan (its eager Llama 3 block).")] = None,
    fp8: Annotated[bool, typer.Option(
        "--fp8", help="With --kernels te: Transformer Engine's fp8 linear layers (their saved inputs in fp8).")]
    = False,
    compile_: Annotated[bool, typer.Option(
        "--compile", help="With --method measure: time each block type as torch.compile (inductor) runs it (fused "
        "elementwise ops) and measure what its compiled graph saves; plans of the profile are for compiled training.")]
    = False,
) -> None:
    """Write the profile of MODEL in one parallel setup on one kind of hardware: op graph, times, sizes."""
    profile.run(model, output, hardware, tp, pp, dp, micro_batch_size, seq_len, num_microbatches, sequence_parallel,
                ep, attention, dropout, method, device, dtype, autocast, threads, repeats, schedule, virtual_stages,
                distributed_optimizer, overlap_grad_reduce, overlap_param_gather, tp_comm_overlap, overlap_p2p_comm,
                fsdp=fsdp, reshard_after_forward=reshard_after_forward, hsdp_shard_size=hsdp_shard_size, cp=cp, kernels=kernels, fp8=fp8,
                compile=compile_)


@command("plan")
def plan_cmd(
    profile_path: ProfileFile,
    algo: Annotated[str, typer.Option(
        help="heu (Lynx heuristic), opt (Lynx MILP), none, full, selective, uniform, block (Megatron-LM), "
             "checkmate, adapipe; offloading to host memory: heu-offload (HEU trading recomputation for offload "
             "where the host link carries it), opt-offload (OPT's MILP with offload as a third choice), offload "
             "(Megatron's fine-grained activation offloading), "
             "full-offload (torch save_on_cpu / Transformer Engine layer offload).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the plan JSON.")],
    memory_limit: MemoryLimit = None,
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
    compile_: Annotated[bool, typer.Option(
        "--compile",
        help="Plan for torch.compile: every recomputation on demand (a compiled layer recomputes inside its fused "
             "backward), simulated so; the plan records compiled: true.")] = False,
    offload_modules: Annotated[Optional[str], typer.Option(
        show_default="what Megatron's docs advise, the fastest that fits",
        help="--algo offload: Megatron's --offload-modules, comma-separated (attn_norm, qkv_linear, core_attn, "
             "attn_proj, mlp_norm, expert_fc1, moe_act, layer_input); layernorm and moe_act are recomputed.")] = None,
) -> None:
    """Search a recomputation strategy for PROFILE within the memory limit and write it as a plan."""
    plan.run(profile_path, algo, output, memory_limit, time_limit, partition, reproducible, compile_, offload_modules)


@command("compare")
def compare_cmd(
    profile_path: ProfileFile,
    memory_limit: MemoryLimit = None,
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
    compare.run(profile_path, memory_limit, algos, time_limit, as_json, verbose, plot)


# --------------------------------------------------------------------------------------------------------------
# simulate, check, apply, validate


@command("simulate")
def simulate_cmd(
    plan_path: PlanFile,
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
    simulate.run(plan_path, profile, trace, as_json, plot)


@command("check", help=helptext.CHECK)
def check_cmd(
    plan_path: PlanFile,
    profile: Annotated[Optional[Path], typer.Option(
        metavar="PROFILE.json", show_default="the plan's profile_path", help="Profile the plan must be valid for.")]
    = None,
) -> None:
    check.run(plan_path, profile)


@command("apply")
def apply_cmd(
    plan_path: PlanFile,
    model_path: ModelFile,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show what apply_plan would do to each layer, without training.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the layers as a JSON list (stage, layer, module, "
                                          "mode, keep, recompute, when).")] = False,
    compile_: Annotated[bool, typer.Option(
        "--compile", help="Run the forward and backward under torch.compile: the planned layers as "
                          "selective-checkpoint regions (docs/composition.md).")] = False,
    compile_backend: Annotated[str, typer.Option(
        help="torch.compile backend for --compile (aot_eager: the partitioner without inductor's C++ build).")]
    = "inductor",
) -> None:
    """Show how a plan maps onto a model's modules (--dry-run). Training scripts call lynx_planner.apply_plan."""
    apply.run(plan_path, model_path, dry_run, as_json, compile_, compile_backend)


@command("validate", help=helptext.VALIDATE)
def validate_cmd(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.json", help="A plan from `lynx plan` (pp stages).")],
    model_path: ModelFile,
    repeats: Annotated[int, typer.Option(min=1, help="Timed iterations per plan.")] = 5,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed iterations per plan first.")] = 2,
    threads: Annotated[Optional[int], typer.Option(
        min=1, show_default="the profile's, else 1", help="CPU threads per stage process.")] = None,
    also: Annotated[Optional[list[Path]], typer.Option(
        "--also", metavar="PLAN.json", help="More plans of the same model, run interleaved in the same job.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    validate.run(plan_path, model_path, repeats, warmup, threads, also, as_json)


# --------------------------------------------------------------------------------------------------------------
# bench, tune, export


@command("bench")
def bench_cmd(
    suite: Annotated[Path, typer.Option(
        help="Suite directory holding suite.json (a list of {profile, memory_limits}).")] = Path("bench"),
    baseline: Annotated[Optional[Path], typer.Option(
        show_default="SUITE/baseline.json", help="Quality baseline to check against or update.")] = None,
    check: Annotated[bool, typer.Option("--check", help=helptext.BENCH_CHECK)] = False,
    update: Annotated[bool, typer.Option(
        "--update", help="Write the baseline from this run (quality numbers only, no search times).")] = False,
    algos: Annotated[Optional[str], typer.Option(
        show_default="all", help="Comma-separated algorithms to run.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for bench.md and bench.json (created).")]
    = Path("bench/out"),
    time_limit: Annotated[Optional[float], typer.Option(
        min=0.001, show_default="the solver's own", help="Seconds each MILP solver may search.")] = None,
    audit: Annotated[bool, typer.Option("--audit", help=helptext.BENCH_AUDIT)] = False,
    audit_cases: Annotated[str, typer.Option(
        help="--audit's generated suite: 'full' (128 cases) or 'ci' (4).")] = "full",
) -> None:
    """Run every algorithm on a suite of profiles and memory limits; report quality and search time."""
    bench.run(suite, baseline, check, update, algos, out_dir, time_limit, audit, audit_cases)


@command("tune")
def tune_cmd(
    model: Annotated[str, typer.Argument(
        metavar="MODEL", help="A catalog name (`lynx models`), a Hugging Face config.json, a lynx model JSON, or the "
                              "path of a .py file that builds a PyTorch model.")],
    global_batch: Annotated[int, typer.Option("--global-batch", min=1, help="Sequences per iteration.")],
    hardware: Annotated[str, typer.Option(
        help="Hardware catalog name or JSON file; several kinds comma-separated (a100-80g-nvlink,h100-80g-nvlink).")]
    = DEFAULT_HARDWARE,
    gpus: Annotated[Optional[str], typer.Option(
        "--gpus", metavar="N|N,M,...|LO-HI", show_default="per kind, the fewest that fit and a few sizes above",
        help="Number of GPUs; a list (32,64,128) or a range of powers of two (32-256) ends with the fastest "
             "configuration and the one with the fewest GPU-hours across all types and counts.")] = None,
    seq_len: Annotated[int, typer.Option(min=1, help="Sequence length in tokens.")] = 2048,
    memory_limit: MemoryLimit = None,
    time_limit: Annotated[Optional[float], typer.Option(
        min=0.001, help="Seconds the layout search may take; layouts not reached by then are not planned.")] = 300.0,
    top: Annotated[int, typer.Option(min=1, help="Configurations to show.")] = 10,
    ep: Annotated[Optional[int], typer.Option(
        "--ep", min=1, show_default="MoE models: every size dividing dp and the experts",
        help="Expert parallelism to use (MoE models) instead of searching it.")] = None,
    distributed_optimizer: DistributedOptimizer = DISTRIBUTED_OPTIMIZER,
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
    fsdp: Annotated[bool, typer.Option("--fsdp", help=helptext.FSDP + " tune also tries HSDP with a node's worth "
                                       "of DP ranks per shard group.")] = False,
    reshard_after_forward: ReshardAfterForward = True,
    hsdp_shard_size: HsdpShardSize = None,
    cp: Annotated[Optional[int], typer.Option(
        "--cp", min=1, show_default="searched where the sequence is long: powers of two leaving >= 16384 tokens "
        "per rank", help=helptext.CP)] = None,
    kernels: Annotated[Optional[Kernels], typer.Option(
        metavar="KERNELS", show_default="hf", help="How the layers run, as in `lynx profile --kernels`: hf, te (Megatron-core with "
        "Transformer Engine, what the Megatron layouts tune ranks launch) or torchtitan.")] = None,
    fp8: Annotated[bool, typer.Option("--fp8", help="With --kernels te: Transformer Engine's fp8 linear layers.")]
    = False,
) -> None:
    """Search parallel layouts and recomputation together: the best launch configurations of MODEL on GPUS GPUs."""
    tune.run(model, global_batch, hardware, gpus, seq_len, memory_limit, time_limit, top, ep, distributed_optimizer,
             as_json, out_dir, plot, schedule, virtual_stages, fsdp=fsdp, reshard_after_forward=reshard_after_forward,
             hsdp_shard_size=hsdp_shard_size, cp=cp, kernels=kernels, fp8=fp8)


@command("export")
def export_cmd(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.json", help="A plan from `lynx plan` or `lynx tune`.")],
    to: Annotated[Framework, typer.Option("--to", metavar="FRAMEWORK", help=helptext.EXPORT_TO)],
    profile: Annotated[Optional[Path], typer.Option(
        metavar="PROFILE.json", show_default="the plan's profile_path", help="The plan's profile.")] = None,
) -> None:
    """Print the launch settings that reproduce a plan's layout and (the nearest) recomputation."""
    export.run(plan_path, to, profile)


# --------------------------------------------------------------------------------------------------------------
# catalogs and schemas


@command("models")
def models_cmd() -> None:
    """List the catalog models."""
    catalogs.models()


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
    catalogs.hardware(action, output, name, threads, repeats)


@command("schema")
def schema_cmd(
    name: Annotated[SchemaName, typer.Argument(help="Which file format.")],
) -> None:
    """Print the JSON Schema of a lynx file format."""
    catalogs.schema(name)


def main() -> None:  # pragma: no cover - `python -m lynx_planner.cli`
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
