"""The text of `lynx --help` and of each command's --help: the app's description, the longer command descriptions,
shared option help, the examples at the end of each page, and typer's layout of flags fixed."""

from __future__ import annotations

import typer.core
import typer.rich_utils

APP = ("Plan activation recomputation for pipeline-parallel transformer training (the Lynx method: hide "
       "recomputation inside communication waits). Typical use: `lynx profile gpt-13b --tp 4 --pp 4 -o p.json`, "
       "`lynx compare p.json`, `lynx plan p.json --algo heu -o plan.json`.")

# One line per paragraph: typer keeps a docstring's line breaks, which at other widths break sentences mid-line.
CHECK = ("Verify a plan against its profile and a fresh simulation; exit 1 with the problems if anything differs.\n\n"
         "Checked: made for this profile (sha256); stage numbering, layer names, parallel setup and precision are the "
         "profile's; legal policies whose modes match them; placements that fire; fits memory; every predicted figure "
         "and the solver's status match a fresh simulation. Prints the simulated figures.")

VALIDATE = ("Run plans for real in a torch.distributed.pipelining job here and print predicted vs measured.\n\n"
            "One gloo process per stage, plans interleaved; per stage forward, backward, recomputation and activation "
            "bytes, then the iteration time with its spread over the repeats.")

# Option help too long to read inside the declarations.
SCHEDULE = ("Pipeline schedule: 1f1b, gpipe, interleaved-1f1b (virtual stages, Megatron's interleaved order; needs "
            "--virtual-stages >= 2), zero-bubble (torch's ScheduleInterleavedZeroBubble, ZB1P: backward split into "
            "input and weight gradients; docs/schedules.md).")

BENCH_CHECK = ("Exit 1 if a heu/opt plan got >0.5% slower than the baseline (the suite's tolerance, not the baseline "
               "file's), broke memory, or any plan failed `lynx check`. Refused (exit 2) without heu and opt, or with "
               "a baseline that is empty or lacks a case or an algorithm that runs.")

BENCH_AUDIT = ("Run an independent second search (coordinate descent over coarse per-chunk policies, judged by the "
               "simulator) against heu and opt on a generated suite (every schedule, dense and MoE, with and without "
               "EP, two memory limits, even and auto split); print the cases where it wins, write OUT/audit.json; "
               "exit 1 if it beats one by more than 0.5%.")

EXPORT_TO = ("megatron: Megatron-LM arguments; torchtitan: torchtitan 0.3 command-line arguments and the LynxAC hook; "
             "torchtitan-0.2: a torchtitan 0.2.2 TOML job file and the apply_plan call.")

DISTRIBUTED_OPTIMIZER = ("ZeRO-1: shard the optimizer state (fp32 master weights, Adam m and v) over data-parallel "
                         "ranks; weights and gradients stay whole on every rank (Megatron --use-distributed-optimizer)"
                         ". Matters with --dp > 1. For parameters and gradients sharded too, use --fsdp.")
FSDP = ("FSDP2 / ZeRO-3: shard parameters, gradients and optimizer state over the data-parallel ranks; each layer's "
        "parameters are all-gathered before its forward and backward and its gradients reduce-scattered after "
        "(torchtitan's default, Megatron --use-megatron-fsdp). Not with --distributed-optimizer.")
RESHARD_AFTER_FORWARD = ("With --fsdp: free each layer's gathered parameters after its forward and gather them again "
                         "for its backward (FSDP2's default); --no-reshard-after-forward keeps them (more memory, "
                         "no backward all-gather).")
HSDP_SHARD_SIZE = ("With --fsdp: HSDP, parameters sharded over groups of N data-parallel ranks (e.g. a node) and "
                   "replicated across dp / N groups; N divides --dp (torchtitan data_parallel_shard_degree).")
CP = ("Context parallelism: split each sequence over N ranks (ring attention exchanges K/V chunks); N divides "
      "--seq-len. GPUs = tp x cp x dp x pp.")

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


def epilog(name: str) -> str | None:
    examples = EXAMPLES.get(name)
    return None if not examples else "Examples:\n\n" + "\n\n".join(f"  $ {e}" for e in examples)


# typer 0.29 shows flags (--sequence-parallel, --help) with a '<bool>' type they take no value of: none for flags.
_display_type_rich = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = (  # type: ignore[method-assign]
    lambda self, ctx: None if getattr(self, "is_flag", False) else _display_type_rich(self, ctx))


def whole_option_names(panel):
    """Typer lays an options panel out as columns of long names, short names, negative long names (--no-x), negative
    short names, type and help, all squeezable: at 80 columns rich cuts `--distributed-optimizer` to
    `--distributed-…`. Stack each negative name under its positive one and keep the name columns on one line, so
    that the help column alone gives way (folding, not cutting, its longest words)."""
    from rich.table import Table
    from rich.text import Text

    table = getattr(panel, "renderable", None)
    columns = table.columns if isinstance(table, Table) else []
    cells = [getattr(column, "_cells", None) for column in columns[-6:]]
    if len(columns) < 6 or not all(isinstance(c, list) and all(isinstance(x, Text) for x in c) for c in cells[:4]):
        return panel  # not the layout this was written for (another typer or rich): leave it as typer made it
    long, short, negative, negative_short = columns[-6], columns[-5], columns[-4], columns[-3]
    long._cells = [Text("\n").join([name, no]) if no.plain else name for name, no in zip(long._cells, negative._cells)]
    for column in (long, short):
        column.no_wrap = True
    for cell in columns[-1]._cells:  # typer's help cell: Columns of Texts; a word longer than the column folds
        for part in getattr(cell, "renderables", [cell]):
            if isinstance(part, Text):
                part.overflow = "fold"
    table.columns.remove(negative)
    if not any(cell.plain for cell in negative_short._cells):
        table.columns.remove(negative_short)
    kind = columns[-2]  # '<int range> [x>=1]': stacked under the name, so the help column keeps the width
    if all(isinstance(x, Text) for x in kind._cells):
        long._cells = [Text("\n").join([name, Text(" ") + k]) if k.plain else name
                       for name, k in zip(long._cells, kind._cells)]
        table.columns.remove(kind)
    return panel


def _print_options_panel(*args, **kwargs) -> None:
    """typer's own, printing what it made through whole_option_names."""
    printed = []

    class Capture:
        def print(self, panel) -> None:
            printed.append(panel)

    console = kwargs.pop("console", None)
    if args or console is None:  # not the call this was written for
        return _typer_options_panel(*args, **kwargs, **({"console": console} if console is not None else {}))
    _typer_options_panel(console=Capture(), **kwargs)
    for panel in printed:
        console.print(whole_option_names(panel))


_typer_options_panel = getattr(typer.rich_utils, "_print_options_panel", None)
if _typer_options_panel is not None:
    typer.rich_utils._print_options_panel = _print_options_panel
