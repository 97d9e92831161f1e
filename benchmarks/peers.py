"""lynx against its peers on a real CPU training step, matched on measured kept bytes.

    python benchmarks/peers.py [--rounds 15] [--layers 8] [--hidden 256] [--seq-len 256] [--budgets 3]
                               [--backend inductor] [--repeats 5]

The model is benchmarks/peers_llama.py: a Hugging Face Llama (8 layers, GQA with 8 query and 2 key/value heads,
SwiGLU), fp32, one thread, a training step of forward, the logits' sum and backward. Peers, each on its own copy of
the same weights, every decoder layer and the final norm compiled on its own (torchtitan compiles the layers) except
lynx eager's:

  lynx-twin      the same plan as lynx-compiled, built and compiled again: two builds of one program time a few
                 percent apart (memory layout), and more rounds do not average that away
  lynx-eager     HEU's plan of the eager profile (`lynx profile --method measure`), applied eagerly
  lynx-compiled  HEU's plan of the compiled profile (`lynx profile --method measure --compile`), applied compiled
  budget         torch.compile's own partitioner at `torch._functorch.config.activation_memory_budget` = r
  budget-below   the same at the next budget down (0.01 steps), where it keeps less than lynx-compiled: the two
                 bracket lynx's memory (the partitioner's kept bytes jump between neighbouring budgets)
  sac-torchtitan torchtitan's SelectiveAC (its op save list, every second mm recomputed) on some layers, FullAC or
                 nothing on the others
  block          torchtitan's FullAC (checkpoint the whole block) on some layers, nothing on the others
  sac-ilp        PyTorch's SAC ILP (torch.distributed._tools.sac_ilp): needs PuLP; reported as not run without it

Budgets: lynx plans at `--budgets` memory limits evenly between the profile's peaks of full and of no recomputation.
Kept bytes are measured on the real step: the storages the autograd graph behind the logits saves (parameters and
the tokens excluded) for the compiled peers, the storages the forward creates and leaves alive, logits excluded
(profiler.memory.LiveBytes), for lynx eager, whose saved tensors its hooks stand in for. Each peer's knob (r, the
number of layers under each policy) is the one with the fewest kept bytes at or above lynx-compiled's at that budget:
each peer holds at least lynx's memory, never less. Then `--rounds` interleaved rounds (the peers' order rotated each
round) time one step of each in this thread's CPU time; each peer's time is divided by lynx-compiled's of the same
round, and the table gives those paired ratios' median and spread (25th-75th percentile), with the machine's load.

Programs: each peer's program is the code inductor generates for its compiled graphs (recorded as they compile, or
load from compile's caches, at the build's first step; with another backend none is recorded). Peers of one program
run the same kernels: the table letters them alike (column 'prog'), and a partitioner peer of lynx-compiled's program
meets the comparison by construction (it is lynx's program). The widest gap between two peers of one program over the
budgets (lynx-twin and lynx-compiled always; e.g. the budget of 1.0, block with no full layers and a plan recomputing
nothing are plain compile's program) is the table's resolution: a peer faster than lynx-compiled by no more is a tie.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import importlib
import os
import statistics
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from lynx_planner import apply_plan, solvers  # noqa: E402
from lynx_planner.models.hardware import HARDWARE  # noqa: E402
from lynx_planner.profiler import profile_model_file  # noqa: E402
from lynx_planner.profiler.compiled import saved_bytes  # noqa: E402
from lynx_planner.profiler.memory import LiveBytes  # noqa: E402
from lynx_planner.schema import ParallelConfig  # noqa: E402

MODEL = str(HERE / "peers_llama.py")
REFERENCE = "lynx-compiled"
TWIN = "lynx-twin"


class Compiled(nn.Module):
    """A layer compiled on its own, through a function of its own: every peer's layers get their own dynamo cache
    (the partitioner's budget and the checkpoint policies are read when a graph is compiled, and a cache shared with
    another peer's layers would hand it their graphs)."""

    def __init__(self, layer: nn.Module, backend: str):
        super().__init__()
        self.layer = layer
        scope: dict = {}
        exec("def run(*args, **kwargs):\n    return layer(*args, **kwargs)\n", {"layer": layer}, scope)
        self._run = torch.compile(scope["run"], backend=backend)

    def forward(self, *args, **kwargs):
        return self._run(*args, **kwargs)


def torchtitan_wrappers() -> dict:
    """torchtitan's own block wrappers: SelectiveAC (its per-op policy) and FullAC."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    sac, full = SelectiveAC(SelectiveAC.Config()), FullAC(FullAC.Config())
    return {"sac": lambda m, fqn: sac._wrap_block(m, base_fqn=fqn),
            "full": lambda m, fqn: full._wrap_block(m, base_fqn=fqn)}


# The program each built model runs: digests of the generated code of its compiled graphs, sorted (build()).
PROGRAM: weakref.WeakKeyDictionary[nn.Module, tuple[str, ...]] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def programs(found: list[str]):
    """Records a digest of the code inductor generates for each graph compiled, or loaded from compile's caches,
    inside: two models whose records match (as sets: a fresh compile compiles a backward when it first runs, a cached
    one loads it with its forward) run the same kernels. The code's 'AOT ID' header, a count of the process's
    compilations, is left out."""
    from torch._inductor.output_code import CompiledFxGraph

    post_compile = CompiledFxGraph.post_compile

    def recording(self, *args, **kwargs):
        code = "\n".join(line for line in self.source_code.splitlines() if not line.startswith("# AOT ID"))
        found.append(hashlib.sha256(code.encode()).hexdigest()[:16])
        return post_compile(self, *args, **kwargs)

    CompiledFxGraph.post_compile = recording
    try:
        yield found
    finally:
        CompiledFxGraph.post_compile = post_compile


@dataclass
class Peer:
    name: str
    knob: str
    model: nn.Module
    kept: int
    eager: bool = False
    times: list[float] = field(default_factory=list)
    program: tuple[str, ...] | None = None  # None: not recorded (eager, or a backend without inductor's code)

    def __post_init__(self):
        if self.program is None and not self.eager:
            self.program = PROGRAM.get(self.model)


def build(base: nn.Module, backend: str, *, plan=None, compiled: bool = True, budget: float | None = None,
          tiers: tuple[str, ...] = ()) -> nn.Module:
    """A copy of `base`: the plan applied, or each layer wrapped by its tier ('none', 'sac', 'full'); compiled layer by
    layer, under the partitioner's budget when given (read when the graphs compile: at the first step, run here)."""
    model = copy.deepcopy(base).train()
    layers = model.model.layers
    if plan is not None:
        apply_plan(model, plan)
    wrap = torchtitan_wrappers() if tiers else {}
    for i, layer in enumerate(layers):
        tier = tiers[i] if tiers else "none"
        if tier != "none":
            layer = wrap[tier](layer, f"layers.{i}")
        layers[i] = Compiled(layer, backend) if compiled else layer
    if compiled:  # the final norm too: the compiled profile prices it compiled, and lynx's plans recompute in it
        model.model.norm = Compiled(model.model.norm, backend)
    if compiled:
        with torch._functorch.config.patch(activation_memory_budget=1.0 if budget is None else budget), \
                programs([]) as found:
            step(model, example[0])
        if found:
            PROGRAM[model] = tuple(sorted(found))
    return model


def step(model: nn.Module, tokens: torch.Tensor) -> None:
    model(tokens).logits.float().sum().backward()
    for p in model.parameters():
        p.grad = None


def kept_bytes(model: nn.Module, tokens: torch.Tensor, eager: bool) -> int:
    """Bytes the forward keeps for backward, measured (see the module's docstring)."""
    params = list(model.parameters())
    if eager:
        with LiveBytes(ignore=[*params, tokens]) as probe:
            logits = model(tokens).logits
        held = probe.live - probe.bytes_of([logits])
    else:
        logits = model(tokens).logits
        held = saved_bytes(logits, [*params, tokens])
    logits.float().sum().backward()
    for p in params:
        p.grad = None
    return held


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def timed(model: nn.Module, tokens: torch.Tensor) -> float:
    t0 = time.thread_time()
    step(model, tokens)
    return time.thread_time() - t0


def least_at_or_above(options: list, make, target: int) -> tuple[object, nn.Module, int]:
    """The option of fewest kept bytes at or above `target` (the peer holds at least lynx's memory); `options` run
    from most to fewest kept bytes (binary search: kept bytes fall along them)."""
    return bracket(options, make, target)[0]


def bracket(options: list, make, target: int) -> tuple[tuple[object, nn.Module, int], tuple | None]:
    """The option of fewest kept bytes at or above `target` and the one of most kept bytes below it (None: none
    below), found by binary search over `options` (most to fewest kept bytes)."""
    lo, hi, best, below = 0, len(options) - 1, None, None
    while lo <= hi:
        mid = (lo + hi) // 2
        model = make(options[mid])
        kept = kept_bytes(model, example[0], eager=False)
        if kept >= target:
            best, lo = (options[mid], model, kept), mid + 1
        else:
            below, hi = (options[mid], model, kept), mid - 1
    if best is None:  # even the first option keeps less: report it as it is
        model = make(options[0])
        best = (options[0], model, kept_bytes(model, example[0], eager=False))
    return best, below


def tier_options(n: int) -> list[tuple[str, ...]]:
    """SAC on k layers (nothing on the rest), then full on k layers (SAC on the rest): most to fewest kept bytes."""
    return ([("sac",) * k + ("none",) * (n - k) for k in range(n + 1)]
            + [("full",) * k + ("sac",) * (n - k) for k in range(1, n + 1)])


def describe(tiers: tuple[str, ...]) -> str:
    return ", ".join(f"{tiers.count(t)} {t}" for t in ("full", "sac", "none") if tiers.count(t))


def ratios(peer: Peer, ref: Peer) -> list[float]:
    return [a / b for a, b in zip(peer.times, ref.times)]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, statistics.median(values), q3


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    load = os.getloadavg()
    rows, ilp = run(args)
    print(table(rows, args, load, os.getloadavg(), ilp))
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--budgets", type=int, default=3, choices=(1, 2, 3))
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: no C++ build)")
    ap.add_argument("--repeats", type=int, default=5, help="profile: timed runs per block type")
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> tuple[list, str]:
    """Each budget's (fraction, memory limit, peers with their kept bytes and step times), and what became of the
    SAC ILP. One thread while it runs (the caller's count restored: a test process's other results depend on it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def measured_profiles(args: argparse.Namespace) -> dict:
    """The model's eager (False) and compiled (True) profiles, measured in this thread."""
    overrides = {"layers": args.layers, "hidden": args.hidden, "seq_len": args.seq_len}
    return {c: profile_model_file(MODEL, parallel=ParallelConfig(), hardware=HARDWARE["a100-80g-nvlink"],
                                  method="measure", threads=1, repeats=args.repeats, overrides=overrides,
                                  progress=False, warn=lambda m: print(f"warning: {m}"), compile=c,
                                  compile_backend=args.backend)
            for c in (False, True)}


def peaks_of(profiles: dict) -> list[int]:
    """The eager profile's peaks of full and of no recomputation: the budgets lie between them."""
    return [solvers.plan(profiles[False], "p.json", "0" * 64, a, 1 << 62).predicted.stages[0].peak_memory_bytes
            for a in ("full", "none")]


def _run(args: argparse.Namespace) -> tuple[list, str]:
    load = os.getloadavg()
    profiles = measured_profiles(args)
    from peers_llama import lynx_model

    base, inputs = lynx_model(**{"seq_len": args.seq_len, "hidden": args.hidden, "layers": args.layers})
    example[:] = inputs
    n = args.layers
    peaks = peaks_of(profiles)
    fractions = [(i + 1) / (args.budgets + 1) for i in range(args.budgets)]
    try:
        importlib.import_module("torch.distributed._tools.sac_ilp")
        ilp = "available but not wired: it plans for a GPU memory tracker"
    except ImportError as e:
        ilp = f"not run ({e.msg if hasattr(e, 'msg') else e})"
    rows = []
    progress(f"profiled; peaks of full and no recomputation {peaks[0]:,} B, {peaks[1]:,} B")
    for fraction in fractions:
        limit = int(peaks[0] + fraction * (peaks[1] - peaks[0]))
        plans = {c: solvers.plan(profiles[c], "p.json", "0" * 64, "heu", limit, compiled=c) for c in (False, True)}
        progress(f"budget {fraction:.2f}: lynx-compiled's plan: {plan_layers(plans[True])}")
        ref_model = build(base, args.backend, plan=plans[True])
        ref = Peer(REFERENCE, "HEU, compiled profile", ref_model, kept_bytes(ref_model, inputs[0], eager=False))
        eager_model = build(base, args.backend, plan=plans[False], compiled=False)
        twin_model = build(base, args.backend, plan=plans[True])
        peers = [ref, Peer(TWIN, "the same plan, built again", twin_model,
                           kept_bytes(twin_model, inputs[0], eager=False)),
                 Peer("lynx-eager", "HEU, eager profile", eager_model,
                      kept_bytes(eager_model, inputs[0], eager=True), eager=True)]
        budgets = [round(1 - i / 100, 2) for i in range(101)]  # kept bytes jump between budgets: fine steps
        (r, model, kept), below = bracket(budgets, lambda b: build(base, args.backend, budget=b), ref.kept)
        peers.append(Peer("budget", f"activation_memory_budget={r}", model, kept))
        if below is not None and below[2] < ref.kept:  # the partitioner's next budget down: less memory than lynx's
            peers.append(Peer("budget-below", f"activation_memory_budget={below[0]}", below[1], below[2]))
        tiers, model, kept = least_at_or_above(tier_options(n), lambda t: build(base, args.backend, tiers=t), ref.kept)
        peers.append(Peer("sac-torchtitan", describe(tiers), model, kept))
        blocks = [("full",) * k + ("none",) * (n - k) for k in range(n + 1)]
        tiers, model, kept = least_at_or_above(blocks, lambda t: build(base, args.backend, tiers=t), ref.kept)
        peers.append(Peer("block", describe(tiers), model, kept))
        progress(f"budget {fraction:.2f}: " + ", ".join(f"{p.name} {p.knob} keeps {p.kept:,} B" for p in peers))
        for p in peers:  # warm: every graph compiled, caches filled
            step(p.model, inputs[0])
        for k in range(args.rounds):
            for p in peers[k % len(peers):] + peers[:k % len(peers)]:
                p.times.append(timed(p.model, inputs[0]))
        rows.append((fraction, limit, peers))
        progress(table(rows[-1:], args, load, os.getloadavg(), ilp))
    return rows, ilp


example: list[torch.Tensor] = []


def plan_layers(plan) -> str:
    """The plan's decoder layers, run by run: mode, and for selective layers what they recompute."""
    stage = plan.stages[0]
    runs = []
    for p in stage.policies:
        if p.block != "LlamaDecoderLayer":
            continue
        names = stage.layer_names[p.layers[0] - stage.layers[0]:p.layers[1] - stage.layers[0]]
        what = f"recompute {', '.join(p.recompute)}" if p.mode == "selective" else p.mode
        runs.append(f"{names[0]}-{names[-1].rsplit('.', 1)[-1]} {what}")
    return "; ".join(runs)


def table(rows, args, load_before, load_after, ilp: str) -> str:
    lines = [f"peers: HF Llama {args.layers} layers, hidden {args.hidden}, seq {args.seq_len}, GQA 8/2, SwiGLU, fp32, "
             f"1 thread, {args.backend}, {args.rounds} interleaved rounds; load average {load_before[0]:.2f} before, "
             f"{load_after[0]:.2f} after ({os.cpu_count()} CPUs)",
             f"{'budget':>6}  {'peer':<15} {'knob':<34} {'prog':>4} {'kept MiB':>9} {'step ms':>8} "
             f"{'÷ lynx-compiled':>16} {'spread':>13}"]
    widest, where = resolution(rows)
    verdicts = []
    for fraction, _, peers in rows:
        ref = ref_of(peers)
        marks = program_letters(peers)
        for p in peers:
            q1, med, q3 = quartiles(ratios(p, ref))
            lines.append(f"{fraction:>6.2f}  {p.name:<15} {p.knob:<34} {marks[p.name]:>4} {p.kept / 2**20:>9.2f} "
                         f"{statistics.median(p.times) * 1e3:>8.1f} {med:>16.3f} {f'{q1:.3f}-{q3:.3f}':>13}")
        budget = next(p for p in peers if p.name == "budget")
        med = quartiles(ratios(budget, ref))[1]
        verdicts.append(f"{fraction:.2f}: {verdict(med, ref.kept <= budget.kept, widest, same_program(budget, ref))} "
                        f"(budget ÷ lynx-compiled {med:.3f}, kept {budget.kept / 2**20:.2f} vs "
                        f"{ref.kept / 2**20:.2f} MiB)")
        below = next((p for p in peers if p.name == "budget-below"), None)
        if below is not None:
            verdicts[-1] += (f", the next budget down keeps {below.kept / 2**20:.2f} MiB at "
                             f"{quartiles(ratios(below, ref))[1]:.3f}")
    lines.append(f"sac-ilp: {ilp}")
    lines.append("budget: fraction of the way from full to no recomputation's peak; ratio > 1: slower than "
                 "lynx-compiled; prog: peers of one letter run the same generated code ('-': not recorded)")
    lines.append(f"resolution: two builds of one program time up to {widest:.3f} apart ({where})")
    lines.append("lynx-compiled at least as fast as the budget partitioner at equal or lower kept bytes: "
                 + "; ".join(verdicts))
    return "\n".join(lines)


def ref_of(peers: list[Peer]) -> Peer:
    return next(p for p in peers if p.name == REFERENCE)


def same_program(p: Peer, q: Peer) -> bool:
    """p and q run the same generated code (lynx-compiled and its twin by construction, recorded or not)."""
    if {p.name, q.name} == {REFERENCE, TWIN}:
        return True
    return p.program is not None and p.program == q.program


def program_letters(peers: list[Peer]) -> dict[str, str]:
    """Each peer's program as a letter, alike for peers of one program, in the table's order ('-': not recorded)."""
    letters: list[Peer] = []
    out = {}
    for p in peers:
        first = next((i for i, q in enumerate(letters) if same_program(p, q)), None)
        if first is None and (p.program is not None or p.name in (REFERENCE, TWIN)):
            letters.append(p)
            first = len(letters) - 1
        out[p.name] = "-" if first is None else chr(ord("A") + first)
    return out


def resolution(rows) -> tuple[float, str]:
    """The widest gap (paired median ratio's distance from 1) between two peers of one program over the budgets, and
    which: a copy's memory layout moves its step time by a few percent that more rounds do not average away."""
    gaps = []
    for fraction, _, peers in rows:
        for i, p in enumerate(peers):
            for q in peers[i + 1:]:
                if same_program(p, q):
                    gaps.append((abs(quartiles(ratios(q, p))[1] - 1), f"{q.name} ÷ {p.name} at {fraction:.2f}"))
    return max(gaps)


def verdict(ratio: float, no_more_memory: bool, resolution: float, same: bool = False) -> str:
    """'met' (the partitioner's step is no faster, or it runs lynx-compiled's own program), 'tie' (faster by no more
    than two builds of one program differ), 'not met' (faster beyond that, or lynx keeps more)."""
    if not no_more_memory:
        return "not met"
    if same:
        return "met: the same program"
    return "met" if ratio >= 1.0 else "tie within the resolution" if ratio >= 1.0 - resolution else "not met"


if __name__ == "__main__":
    sys.exit(main())
