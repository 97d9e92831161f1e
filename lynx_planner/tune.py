"""`lynx tune`: from a model, a number of GPUs of one kind and a global batch to the best launch configuration.

Enumerates the parallel layouts Megatron-LM can run (TP within a node dividing the heads, PP up to the number of
transformer layers, DP = GPUs / (TP x PP), micro-batch size, micro-batch count from the global batch, sequence
parallelism), discards those that do not fit even with full recomputation, and plans each of the others with
Megatron's built-in recomputation (full, selective, block) and with HEU, so the layout that wins is the one whose
recomputation hides best. Where HEU recomputes and the hardware has a host link (offload.py), HEU with offload is
planned too, once every layout has its HEU row, on the layouts that can still enter the table: a layout may win by
sending some of its activations to host memory.

Layouts are visited from the fastest balanced ideal down (no recomputation, no transfers, equal stages: a bound that
no plan of the layout beats), and a layout whose bound cannot enter the table any more is not planned. Searches run
on a pipeline shortened to at most p + 9 micro-batches (same peaks under 1F1B) and their times are projected to the
full count by the measured steady-state period; the rows of the table, and the best layout's plan, are then simulated
on the full pipeline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from . import evaluate as ev
from . import offload, schedules
from .analytic import bytes_per_param
from .build import build_profile, is_model_file, model_spec
from .io import InputError, LayoutError
from .models.hardware import default_memory_limit
from .schema import MAX_DP, MAX_MICROBATCHES, Hardware, ParallelConfig, Plan, Profile
from .simulator import optimizer_step_s, segments

MEGATRON = ("full", "selective", "block")  # Megatron-LM's built-in recomputation methods
MEGATRON_ROWS = MEGATRON + ("none",)  # block with N = 0 is Megatron without recomputation
# The pipeline schedules Megatron-LM runs (core_v0.20.0, d98e8a6: get_forward_backward_func picks 1F1B, interleaved
# 1F1B with virtual stages, or no pipelining; no GPipe, no zero bubble): the Megatron-style baseline is one of these.
MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b")


def is_megatron(row: Row) -> bool:
    """A row Megatron-LM could run as it is: its recomputation and its pipeline schedule."""
    return row.algo in MEGATRON_ROWS and row.layout.schedule in MEGATRON_SCHEDULES
MICRO_BATCH_SIZES = (1, 2, 4, 8)
VIRTUAL_STAGES = (2, 3, 4, 6, 8)  # chunks per rank tried for interleaved schedules (Megatron: layers divide evenly)


@dataclass(frozen=True, order=True)
class Layout:
    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    num_microbatches: int
    sequence_parallel: bool
    schedule: str = "1f1b"
    virtual_stages: int = 1
    ep: int = 1  # expert parallelism (MoE models), carved out of dp
    cp: int = 1  # context parallelism: GPUs = tp x cp x pp x dp
    fsdp: bool = False  # FSDP2 sharding over the DP (x CP) ranks instead of ZeRO-1
    hsdp_shard_size: int | None = None  # HSDP: shard groups of this many DP ranks

    def parallel(self, seq_len: int, distributed_optimizer: bool, reshard_after_forward: bool = True
                 ) -> ParallelConfig:
        return ParallelConfig(tp=self.tp, pp=self.pp, dp=self.dp, micro_batch_size=self.micro_batch_size,
                              seq_len=seq_len, num_microbatches=self.num_microbatches,
                              sequence_parallel=self.sequence_parallel,
                              distributed_optimizer=distributed_optimizer and self.dp * self.cp > 1 and not self.fsdp,
                              schedule=self.schedule, virtual_stages=self.virtual_stages, ep=self.ep, cp=self.cp,
                              fsdp=self.fsdp, hsdp_shard_size=self.hsdp_shard_size,
                              reshard_after_forward=reshard_after_forward or not self.fsdp)

    def label(self) -> str:
        sp = " sp" if self.sequence_parallel else ""
        ep = f" ep{self.ep}" if self.ep > 1 else ""
        cp = f" cp{self.cp}" if self.cp > 1 else ""
        shard = (f" hsdp{self.hsdp_shard_size}" if self.hsdp_shard_size else " fsdp") if self.fsdp else ""
        sched = "" if self.schedule == "1f1b" else f" {self.schedule}" + (
            f" v{self.virtual_stages}" if self.virtual_stages > 1 else "")
        return (f"tp{self.tp}{cp} pp{self.pp} dp{self.dp}{ep}{shard} mb{self.micro_batch_size}x{self.num_microbatches}"
                f"{sp}{sched}")


@dataclass(frozen=True)
class ParallelSearch:
    """How tune shards and splits the sequence: ZeRO-1 or FSDP (with HSDP shard groups: `hsdp_shard_size`, or one
    node's worth of the DP ranks tried beside plain FSDP), and context parallelism (`cp`, or searched where the
    sequence is long: every power of two leaving at least CP_MIN_TOKENS tokens per rank)."""

    fsdp: bool = False
    reshard_after_forward: bool = True
    hsdp_shard_size: int | None = None
    cp: int | None = None

    def cps(self, seq_len: int, gpus: int, model_file: bool) -> tuple[int, ...]:
        if self.cp is not None:
            return (self.cp,)
        if model_file:  # CP is priced for model descriptions only (build.py)
            return (1,)
        out, c = [1], 2
        while c <= gpus and seq_len % c == 0 and seq_len // c >= CP_MIN_TOKENS:
            out.append(c)
            c *= 2
        return tuple(out)

    def shards(self, dp: int, per_node: int) -> tuple[int | None, ...]:
        """HSDP shard sizes to try on `dp` DP ranks, `per_node` of them on one node (None: plain FSDP)."""
        if not self.fsdp:
            return (None,)
        if self.hsdp_shard_size is not None:
            return (self.hsdp_shard_size,) if dp % self.hsdp_shard_size == 0 and self.hsdp_shard_size < dp else ()
        return (None,) + ((per_node,) if 1 < per_node < dp and dp % per_node == 0 else ())


CP_MIN_TOKENS = 16384  # tune searches CP only where each rank keeps at least this many tokens of a sequence


# --------------------------------------------------------------------------------------------------------------
# profiles of a model in one layout


def with_layout(base: Profile, par: ParallelConfig) -> Profile:
    """A profile traced in the same TP, micro-batch and SP setup, moved to another PP, DP and micro-batch count:
    only the parallel block and the optimizer-state bytes change."""
    bpp = bytes_per_param(par)
    layers = [l.model_copy(update={"static_bytes": int(l.params * bpp)}) for l in base.layers]
    return base.model_copy(update={"parallel": par, "layers": layers})


class Profiles:
    """Profiles per layout: catalog models are built directly; a model file is traced once per (TP, micro-batch,
    SP) and moved to each PP and DP."""

    def __init__(self, model: str, hw: Hardware, seq_len: int, distributed_optimizer: bool, dropout: float = 0.0,
                 call: Callable = lambda fn, *a, **k: fn(*a, **k), search: ParallelSearch = ParallelSearch(),
                 kernels: str = "hf", fp8: bool = False):
        self.model, self.hw, self.seq_len, self.distopt, self.dropout = model, hw, seq_len, distributed_optimizer, \
            dropout
        self.search = search  # FSDP / HSDP / CP: which layouts tune enumerates
        self.kernels, self.fp8 = kernels, fp8  # how the layers run (lynx_planner/kernels)
        self.call = call  # wraps user code (a model file's failures are bad input)
        self.traced: dict[tuple, Profile | None] = {}

    def __call__(self, layout: Layout) -> Profile | None:
        """None if the model cannot run in this layout (TP does not divide it, its layers cannot use CP)."""
        par = layout.parallel(self.seq_len, self.distopt, self.search.reshard_after_forward)
        if not is_model_file(self.model):
            try:
                return build_profile(self.model, par, self.hw, dropout=self.dropout, kernels=self.kernels, fp8=self.fp8)
            except LayoutError:
                return None
        key = (layout.tp, layout.micro_batch_size, layout.sequence_parallel)
        if key not in self.traced:
            traced_par = par.model_copy(update={"pp": 1, "dp": 1, "num_microbatches": 1})
            try:
                self.traced[key] = self.call(build_profile, self.model, traced_par, self.hw)
            except LayoutError:
                self.traced[key] = None
        base = self.traced[key]
        if base is None or layout.pp * layout.virtual_stages > len(base.layers):
            return None
        return with_layout(base, par)


def model_shape(model: str, profiles: Profiles) -> tuple[int, int | None]:
    """(transformer layers, attention heads or None when unknown) of the model."""
    if not is_model_file(model):
        spec = model_spec(model)
        return spec.num_layers, spec.kv  # TP splits the key/value heads too (GQA), and kv divides heads
    base = profiles(Layout(1, 1, 1, 1, 1, False))
    if base is None:
        raise InputError(f"{model}: cannot be profiled on one GPU")
    from .solvers.partition import repeated_block

    rep = repeated_block(base)
    heads = base.model.config.get("heads") or base.model.config.get("num_attention_heads")
    return sum(l.block == rep for l in base.layers), int(heads) if isinstance(heads, (int, float)) else None


# --------------------------------------------------------------------------------------------------------------
# layouts


def divisors(n: int, at_most: int | None = None) -> list[int]:
    """The divisors of n (up to `at_most`), in order: by trial division up to sqrt(n), so an absurd n (10^12 GPUs)
    costs a million steps at most, not n."""
    small, large, d = [], [], 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return [d for d in small + large[::-1] if at_most is None or d <= at_most]


def pipeline_schedules(names: tuple[str, ...], pp: int, m: int, num_layers: int,
                       virtual: int | None = None) -> list[tuple[str, int]]:
    """(schedule, virtual stages) to try on a pipeline of pp stages and m micro-batches: the one-chunk schedules as
    they are; several chunks per rank (interleaved; zero bubble beyond 1) only with pp > 1, at `virtual` or each of
    VIRTUAL_STAGES, where the transformer layers split evenly over the pp x v chunks, as Megatron requires."""
    out = []
    for name in names:
        lo, hi = schedules.get(name).virtual
        if lo == hi == 1:
            options = [1]
        elif pp == 1:
            continue
        else:
            options = [virtual] if virtual is not None else sorted({lo, *VIRTUAL_STAGES})
        for v in options:
            if (v == 1 or num_layers % (pp * v) == 0) and schedules.problem(name, pp, v, m) is None and \
                    pp * v <= num_layers:
                out.append((name, v))
    if pp == 1:  # one stage: no bubble to fill, and 1F1B's order (gradient accumulation) holds the fewest
        return sorted(out, key=lambda sv: sv[0] != "1f1b")[:1]  # micro-batches: one row, not one per schedule
    return out


def model_experts(model: str) -> int:
    """Routed experts per MoE layer of a described model (0: dense, or a model file: EP is not searched there)."""
    if is_model_file(model):
        return 0
    moe = model_spec(model).moe
    return moe.experts if moe is not None else 0


def layouts(gpus: int, hw: Hardware, global_batch: int, num_layers: int, heads: int | None, seq_len: int,
            names: tuple[str, ...] = ("1f1b",), virtual: int | None = None, experts: int = 0,
            ep: int | None = None, search: ParallelSearch = ParallelSearch(), model_file: bool = False
            ) -> list[Layout]:
    """Every layout Megatron-LM accepts on `gpus` GPUs for this global batch, under each of the pipeline schedules
    `names` (and their virtual stages), and lynx can simulate (at most MAX_MICROBATCHES micro-batches); for MoE models
    (`experts` > 0) every expert-parallel size dividing both dp and the experts (or only `ep` when given); with the
    context-parallel sizes and FSDP / HSDP shardings of `search`."""
    out = []
    for tp in divisors(min(gpus, hw.gpus_per_node)):
        if gpus % tp or (heads is not None and heads % tp):
            continue
        for cp in search.cps(seq_len, gpus // tp, model_file):
            if gpus % (tp * cp) or seq_len % cp:
                continue
            for pp in divisors(gpus // (tp * cp), at_most=num_layers):
                dp = gpus // (tp * cp * pp)
                if dp > MAX_DP:
                    continue
                for mbs in MICRO_BATCH_SIZES:
                    if global_batch % (mbs * dp) or global_batch // (mbs * dp) > MAX_MICROBATCHES:
                        continue
                    m = global_batch // (mbs * dp)
                    eps = [e for e in divisors(dp) if experts % e == 0] if experts else [1]
                    for sp in ((False, True) if tp > 1 and (seq_len // cp) % tp == 0 else (False,)):
                        for name, v in pipeline_schedules(names, pp, m, num_layers, virtual):
                            for shard in search.shards(dp, max(1, hw.gpus_per_node // (tp * cp))):
                                out += [Layout(tp, pp, dp, mbs, m, sp, name, v, e, cp, search.fsdp, shard)
                                        for e in eps if ep is None or e == ep]
    return out


def option_reason(gpus: int, hw: Hardware, global_batch: int, num_layers: int, heads: int | None, seq_len: int,
                  names: tuple[str, ...], virtual: int | None, experts: int, ep: int | None) -> str | None:
    """Where `--ep` or `--virtual-stages` alone leaves no layout (there are some without it): why, naming it."""
    if ep is not None:
        some = layouts(gpus, hw, global_batch, num_layers, heads, seq_len, names, virtual, experts)
        if some:
            sizes = sorted({lay.ep for lay in some})
            what = ("the model has no experts (--ep 1 only)" if not experts else
                    f"EP must divide the model's {experts} experts and a layout's data-parallel size; here: "
                    f"{', '.join(map(str, sizes))}")
            return f"--ep {ep}: no layout has it: {what}"
    if virtual is not None:
        some = layouts(gpus, hw, global_batch, num_layers, heads, seq_len, names, None, experts, ep)
        if some:
            counts = sorted({lay.virtual_stages for lay in some})
            return (f"--virtual-stages {virtual}: no layout has it (the {num_layers} layers must split evenly over "
                    f"pp x {virtual} chunks, pp > 1, and the schedule must accept it); possible here: "
                    f"{', '.join(map(str, counts))}")
    return None


def no_layout_reason(model: str, gpus: int, hw: Hardware, global_batch: int, num_layers: int, heads: int | None
                     ) -> str:
    """Why `layouts` found nothing, naming the option to change."""
    splits = [(tp, pp) for tp in divisors(min(gpus, hw.gpus_per_node)) if not gpus % tp and
              (heads is None or not heads % tp) for pp in divisors(gpus // tp, at_most=num_layers)]
    if not splits:
        return (f"--gpus: {gpus} GPUs cannot be split as TP (dividing {heads} heads, at most {hw.gpus_per_node} per "
                f"node) x PP (at most {num_layers} layers) x DP")
    least_dp = min(gpus // (tp * pp) for tp, pp in splits)
    if least_dp > MAX_DP:
        return (f"--gpus: {gpus} GPUs need a data-parallel size of at least {least_dp}; lynx simulates up to "
                f"{MAX_DP}")
    return (f"--global-batch: {global_batch} sequences cannot be split over {gpus} GPUs: every layout of {model} has "
            f"a data-parallel size of at least {least_dp}, and DP x micro-batch size must divide the global batch "
            f"(with at most {MAX_MICROBATCHES} micro-batches)")


def balanced_ideal_s(profile: Profile) -> float:
    """(M + bubble) x W / p: one micro-batch's forward and backward over all layers (W, TP waits included), on p
    perfectly equal stages, with free transfers, no recomputation and no data-parallel tail (the optimizer step of
    an equal share of the parameters where the profile has one): a bound no plan of the layout beats. The bubble is
    p - 1 micro-batches' steps, (p - 1) / v with v chunks per rank (Narayanan et al.), none where the weight
    gradients can fill it (zero bubble)."""
    work = 0.0
    for layer in profile.layers:
        fwd, bwd = segments(profile, profile.blocks[layer.block])
        work += sum(fwd) + sum(bwd)
    par = profile.parallel
    p, m = par.pp, par.num_microbatches
    bubble = 0.0 if schedules.get(par.schedule).splits_backward else (p - 1) / par.virtual_stages
    step = 0.0
    if par.optimizer_step:
        step = optimizer_step_s(profile, sum(layer.params for layer in profile.layers) // p, 0, p,
                                sum(layer.expert_params for layer in profile.layers) // p)
    return (m + bubble) * work / p + step


# --------------------------------------------------------------------------------------------------------------
# planning one layout


@dataclass
class Row:
    """One (layout, algorithm) result."""

    layout: Layout
    algo: str
    iteration_time_s: float | None
    peak_memory_bytes: int | None
    fits: bool
    tokens_per_s_per_gpu: float | None = None
    simulated: str = "projected"  # "full": simulated on the full pipeline; "projected": from a shortened one
    note: str = ""
    bounds: list[int] = field(default_factory=list, repr=False)
    policies: list = field(default_factory=list, repr=False)

    def json(self) -> dict:
        lay = self.layout
        return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep, "cp": lay.cp, "fsdp": lay.fsdp,
                "hsdp_shard_size": lay.hsdp_shard_size, "micro_batch_size": lay.micro_batch_size,
                "num_microbatches": lay.num_microbatches, "sequence_parallel": lay.sequence_parallel,
                "schedule": lay.schedule, "virtual_stages": lay.virtual_stages,
                "algo": self.algo, "iteration_time_s": self.iteration_time_s,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "peak_memory_bytes": self.peak_memory_bytes,
                "fits": self.fits, "time_from": self.simulated, "note": self.note}


def short_profile(profile: Profile) -> Profile:
    from .solvers.heu import shortened

    return shortened(profile)


def _row(layout: Layout, algo: str, short: Profile, full_m: int, limit: int, bounds, pols, evaluation,
         tokens: float, gpus: int) -> Row:
    from .solvers.heu import projected_s

    fits = evaluation.fits(limit)
    t = projected_s(evaluation, full_m) if fits else None
    return Row(layout, algo, t, evaluation.peak_bytes, fits, tokens / t / gpus if t else None,
               "full" if short.parallel.num_microbatches == full_m else "projected", bounds=bounds, policies=pols)


def plan_layout(profile: Profile, layout: Layout, limit: int, tokens: float, gpus: int, heu: bool = True
                ) -> list[Row]:
    """Rows for Megatron's full, selective and block recomputation (`none` when block needs no layer recomputed) and
    (if `heu`) HEU on one layout. A layout whose full recomputation does not fit gets one row, `full`, with fits
    false."""
    from .solvers import Problem, megatron
    from .solvers.heu import heu_strategy

    short = short_profile(profile)
    m = profile.parallel.num_microbatches
    rows = []
    for algo in MEGATRON:
        strategy = megatron.search(Problem(short, limit), algo)
        stages = ev.stage_plans(short, strategy.bounds, strategy.policies)
        evaluation = ev.evaluate(short, stages, ideal=False)
        name = "none" if algo == "block" and not any(p.recompute for p in strategy.policies) else algo
        rows.append(_row(layout, name, short, m, limit, strategy.bounds, strategy.policies, evaluation, tokens,
                         gpus))
        if algo == "full" and not rows[-1].fits:
            rows[-1].note = "does not fit even with full recomputation"
            return rows
    if heu:
        bounds, pols, evaluation = heu_strategy(short, limit, "auto")
        rows.append(_row(layout, "heu", short, m, limit, bounds, pols, evaluation, tokens, gpus))
    return rows


def offload_row(profile: Profile, layout: Layout, limit: int, tokens: float, gpus: int) -> Row:
    """HEU with offload on one layout: HEU's recomputation traded for copies over the host link where they pay."""
    from .solvers import Problem
    from .solvers.offload import search as offload_search

    short = short_profile(profile)
    got = offload_search(Problem(short, limit, partition="auto"), "heu-offload")
    evaluation = ev.evaluate(short, ev.stage_plans(short, got.bounds, got.policies), ideal=False)
    return _row(layout, "heu-offload", short, profile.parallel.num_microbatches, limit, got.bounds, got.policies,
                evaluation, tokens, gpus)


def _table_bar(rows: list[Row], places: int) -> float:
    """tokens/s per GPU of the `places`-th layout in the ranking (0 while fewer layouts fit): a row must beat it
    to enter the table."""
    seen: list[Layout] = []
    for r in _rank(rows):
        if r.layout not in seen:
            seen.append(r.layout)
            if len(seen) == places:
                return r.tokens_per_s_per_gpu
    return 0.0


def offload_pass(rows: list[Row], planned: dict[Layout, tuple[float, Profile]], limit: int, tokens: float,
                 gpus: int, places: int, progress: Callable[[int, int, str], None] | None = None,
                 deadline: float | None = None) -> tuple[list[Row], bool]:
    """HEU-with-offload rows, once every layout has its HEU row: on the layouts whose HEU plan recomputes, on
    hardware with a host link, best HEU row first, skipping a layout whose balanced ideal (a bound on any of its
    plans, offloading ones too) cannot beat the table's `places`-th layout or its own HEU row. Offload search costs
    seconds a layout; only the layouts that can still change the table pay it. Also says whether `deadline`
    (time.perf_counter()) cut the pass short."""
    heu_rows = [r for r in _rank(rows) if r.algo == "heu" and any(p.recompute for p in r.policies)
                and offload.rank_link(planned[r.layout][1]) is not None]
    found: list[Row] = []
    for i, r in enumerate(heu_rows):
        if deadline is not None and time.perf_counter() > deadline:
            return found, True
        if progress:
            progress(i, len(heu_rows), f"offload {r.layout.label()}")
        bound_s, prof = planned[r.layout]
        best_possible = tokens / bound_s / gpus
        if best_possible <= max(_table_bar(rows + found, places), r.tokens_per_s_per_gpu):
            continue
        found.append(offload_row(prof, r.layout, limit, tokens, gpus))
    if progress and heu_rows:
        progress(len(heu_rows), len(heu_rows), "")
    return found, False


def simulate_full(profile: Profile, row: Row, limit: int, tokens: float, gpus: int) -> Row:
    """The row's plan simulated on the full pipeline (a plan from the shortened one may peak higher there)."""
    if row.simulated == "full" or not row.fits:
        return row
    evaluation = ev.evaluate(profile, ev.stage_plans(profile, row.bounds, row.policies), ideal=False)
    t = evaluation.predicted.iteration_time_s
    fits = evaluation.fits(limit)
    return replace(row, iteration_time_s=t if fits else None, peak_memory_bytes=evaluation.peak_bytes, fits=fits,
                   tokens_per_s_per_gpu=tokens / t / gpus if fits else None, simulated="full",
                   note="" if fits else "peaks over the limit on the full pipeline")


# --------------------------------------------------------------------------------------------------------------
# the search over layouts


@dataclass
class TuneResult:
    rows: list[Row]  # every (layout, algorithm) planned, best first
    top: list[Row]  # the table: the best row per layout, best first, simulated on the full pipeline
    best_megatron: Row | None
    best_plan: Plan | None
    best_profile: Profile | None
    enumerated: int
    too_big: int  # layouts that do not fit even with full recomputation
    planned: int  # layouts planned with HEU and Megatron
    megatron_only: int  # layouts planned with Megatron only (HEU could not enter the table there)
    pruned: int  # layouts skipped: their balanced ideal could not enter the table
    time_limit_hit: bool
    elapsed_s: float


def _rank(rows: list[Row]) -> list[Row]:
    """Fitting rows, fastest first; on a tie HEU first, then by layout."""
    return sorted((r for r in rows if r.fits),
                  key=lambda r: (-r.tokens_per_s_per_gpu, r.layout, r.algo != "heu", r.algo))


def tune(model: str, gpus: int, hw: Hardware, global_batch: int, seq_len: int = 2048, memory_limit: int | None = None,
         time_limit: float | None = None, top: int = 10, distributed_optimizer: bool = True,
         profiles: Profiles | None = None, progress: Callable[[int, int, str], None] | None = None,
         make_plan: bool = True, names: tuple[str, ...] = ("1f1b",), virtual: int | None = None,
         ep: int | None = None) -> TuneResult:
    """Search the layouts and recomputation plans of `model` on `gpus` GPUs of kind `hw`, under the pipeline
    schedules `names` (chunks per rank: `virtual`, or searched) and, for MoE models, every expert-parallel size (or
    only `ep`)."""
    t0 = time.perf_counter()
    limit = memory_limit or default_memory_limit(hw)
    profiles = profiles or Profiles(model, hw, seq_len, distributed_optimizer)
    num_layers, heads = model_shape(model, profiles)
    tokens = global_batch * seq_len
    candidates = []
    hit = False
    found = layouts(gpus, hw, global_batch, num_layers, heads, seq_len, names, virtual, model_experts(model), ep,
                    profiles.search, is_model_file(model))
    if not found:
        raise InputError(option_reason(gpus, hw, global_batch, num_layers, heads, seq_len, names, virtual,
                                       model_experts(model), ep)
                         or no_layout_reason(model, gpus, hw, global_batch, num_layers, heads))
    for lay in found:
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            hit = True  # profiling every layout of a huge search can itself take long
            break
        prof = profiles(lay)
        if prof is not None:
            candidates.append((balanced_ideal_s(prof), lay, prof))
    candidates.sort(key=lambda c: (c[0], c[1]))
    rows: list[Row] = []
    too_big = planned = megatron_only = pruned = 0
    with_heu: dict[Layout, tuple[float, Profile]] = {}
    for i, (bound_s, lay, prof) in enumerate(candidates):
        if progress:
            progress(i, len(candidates), lay.label())
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            hit = True
            break
        best_possible = tokens / bound_s / gpus
        ranked = _rank(rows)
        kth_heu = [r for r in ranked if r.algo == "heu"]
        meg = [r for r in ranked if is_megatron(r)]
        heu_bar = kth_heu[top - 1].tokens_per_s_per_gpu if len(kth_heu) >= top else 0.0
        meg_bar = meg[0].tokens_per_s_per_gpu if meg else 0.0
        if best_possible < min(heu_bar, meg_bar):
            pruned += 1
            continue
        static = max_static_bytes(prof)
        if static > limit:  # weights and optimizer state alone exceed the limit: nothing to simulate
            rows.append(Row(lay, "full", None, static, False, note="does not fit even with full recomputation "
                            "(weights and optimizer state alone exceed the limit)"))
            too_big += 1
            continue
        got = plan_layout(prof, lay, limit, tokens, gpus, heu=best_possible >= heu_bar)
        if len(got) == 1:
            too_big += 1
        elif any(r.algo == "heu" for r in got):
            planned += 1
            with_heu[lay] = (bound_s, prof)
        else:
            megatron_only += 1
        rows += got
    if progress:
        progress(len(candidates), len(candidates), "")
    if not hit:
        found, hit = offload_pass(rows, with_heu, limit, tokens, gpus, top + 2, progress,
                                  None if time_limit is None else t0 + time_limit)
        rows += found
    top_rows, best_meg, best_plan, best_prof = _finish(rows, profiles, limit, tokens, gpus, top, make_plan)
    return TuneResult(_rank(rows) + [r for r in rows if not r.fits], top_rows, best_meg, best_plan, best_prof,
                      len(candidates), too_big, planned, megatron_only, pruned, hit, time.perf_counter() - t0)


def _finish(rows: list[Row], profiles: Profiles, limit: int, tokens: float, gpus: int, top: int, make_plan: bool):
    """The table's rows and the best Megatron row simulated on the full pipeline; the best layout planned with HEU
    as `lynx plan` would."""
    by_layout: dict[Layout, Row] = {}
    for r in _rank(rows):
        by_layout.setdefault(r.layout, r)
    table: list[Row] = []
    for r in list(by_layout.values())[: top + 2]:  # a couple spare: the full pipeline can reorder or drop
        full = simulate_full(profiles(r.layout), r, limit, tokens, gpus)
        _replace(rows, r, full)
        table.append(full)
    best_meg = None
    for r in [r for r in _rank(rows) if is_megatron(r)][:3]:
        full = simulate_full(profiles(r.layout), r, limit, tokens, gpus)
        _replace(rows, r, full)
        if full.fits and (best_meg is None or full.tokens_per_s_per_gpu > best_meg.tokens_per_s_per_gpu):
            best_meg = full
    table = _rank(table)[:top]
    plan = prof = None
    if make_plan and table:
        from .solvers import Infeasible, solve

        prof = profiles(table[0].layout)
        algo = "heu-offload" if table[0].algo == "heu-offload" else "heu"
        try:
            solved = solve(prof, algo, limit)
        except Infeasible:
            solved = None
        if solved is not None:
            plan = ev.make_plan(prof, "profile.json", "", algo, limit, solved.stages, solved.solver,
                                solved.evaluation)
            t = plan.predicted.iteration_time_s
            if table[0].algo == algo:
                table[0] = replace(table[0], iteration_time_s=t, peak_memory_bytes=solved.evaluation.peak_bytes,
                                   tokens_per_s_per_gpu=tokens / t / gpus, simulated="full")
                _replace(rows, next(r for r in rows if r.layout == table[0].layout and r.algo == algo), table[0])
    return table, best_meg, plan, prof


def _replace(rows: list[Row], old: Row, new: Row) -> None:
    for i, r in enumerate(rows):
        if r is old:
            rows[i] = new
            return


def write_outputs(result: TuneResult, out_dir: Path) -> tuple[Path, Path]:
    """The best layout's profile.json and plan.json (the plan refers to the profile beside it by its sha256)."""
    import hashlib

    from .io import dumps, write_atomic

    assert result.best_plan is not None and result.best_profile is not None
    text = dumps(result.best_profile)
    sha = hashlib.sha256(text.encode()).hexdigest()
    plan = result.best_plan.model_copy(update={"profile_sha256": sha, "profile_path": "profile.json"})
    profile_path, plan_path = out_dir / "profile.json", out_dir / "plan.json"
    write_atomic(profile_path, text)
    write_atomic(plan_path, dumps(plan))
    return profile_path, plan_path


# --------------------------------------------------------------------------------------------------------------
# which GPUs, and how many


GPU_COUNTS = tuple(2**k for k in range(15))  # 1 .. 16384


def fits_somewhere(model: str, gpus: int, hw: Hardware, global_batch: int, seq_len: int, limit: int,
                   profiles: Profiles) -> bool:
    """Does any layout on `gpus` GPUs fit with full recomputation?"""
    from .solvers import Problem, megatron

    num_layers, heads = model_shape(model, profiles)
    for lay in layouts(gpus, hw, global_batch, num_layers, heads, seq_len, experts=model_experts(model),
                       search=profiles.search, model_file=is_model_file(model)):
        prof = profiles(lay)
        if prof is None:
            continue
        short = short_profile(prof)
        if max_static_bytes(short) > limit:
            continue
        strategy = megatron.search(Problem(short, limit), "full")
        if ev.evaluate(short, ev.stage_plans(short, strategy.bounds, strategy.policies), ideal=False).fits(limit):
            return True
    return False


def max_static_bytes(profile: Profile) -> int:
    """The largest stage's weights, gradients and optimizer state on Megatron's even split."""
    return max(ev.static_bytes(profile, *b) for b in _even_stage_ranges(profile))


def _even_stage_ranges(profile: Profile) -> Iterator[tuple[int, int]]:
    from .solvers.partition import even_bounds

    b = even_bounds(profile, profile.parallel.pp)
    return zip(b[:-1], b[1:])


@dataclass
class Sizing:
    hardware: str
    fewest_gpus: int | None
    results: list[tuple[int, TuneResult]]  # (GPUs, tune result) at the fewest and a few sizes above


def size_up(model: str, hw: Hardware, global_batch: int, seq_len: int = 2048, memory_limit: int | None = None,
            sizes_above: int = 2, time_limit: float | None = None, distributed_optimizer: bool = True,
            progress: Callable[[int, int, str], None] | None = None, search: ParallelSearch = ParallelSearch()
            ) -> Sizing:
    """The fewest GPUs (powers of two) of kind `hw` on which the model trains within memory, and the best
    configuration there and at `sizes_above` doublings above it."""
    limit = memory_limit or default_memory_limit(hw)
    profiles = Profiles(model, hw, seq_len, distributed_optimizer, search=search)
    fewest = None
    for n in GPU_COUNTS:
        if n > global_batch * hw.gpus_per_node * 64:
            break
        if fits_somewhere(model, n, hw, global_batch, seq_len, limit, profiles):
            fewest = n
            break
    results = []
    if fewest is not None:
        for n in (fewest * 2**k for k in range(sizes_above + 1)):
            results.append((n, tune(model, n, hw, global_batch, seq_len, limit, time_limit, top=1,
                                    distributed_optimizer=distributed_optimizer, profiles=profiles,
                                    progress=progress, make_plan=False)))
    return Sizing(hw.name, fewest, results)


# --------------------------------------------------------------------------------------------------------------
# which GPUs, how many: one answer across GPU types and counts

MAX_GPU_COUNTS = 16  # counts one `--gpus` list or range may name (each is a full search per GPU type)


def gpu_counts(text: str) -> list[int]:
    """`--gpus`: one count (64), a list (32,64,128), or a range lo-hi (32-256: the powers of two from lo to hi,
    the counts `lynx tune` sizes up over), in increasing order without repeats."""
    text = str(text).strip()
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            if lo < 1 or hi < lo:
                raise ValueError
            counts, n = [], 1
            while n <= hi and len(counts) <= MAX_GPU_COUNTS:
                if n >= lo:
                    counts.append(n)
                n *= 2
            if not counts:
                raise InputError(f"--gpus: {text}: no power of two between {lo} and {hi} (name the counts: "
                                 f"{lo},{hi})")
        else:
            counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--gpus: {text!r} is not a count, a list (32,64,128) or a range (32-256)") from None
    if not counts or min(counts) < 1:
        raise InputError(f"--gpus: {text!r}: counts must be at least 1")
    counts = sorted(set(counts))
    if len(counts) > MAX_GPU_COUNTS:
        raise InputError(f"--gpus: {text!r} names {len(counts)} counts; at most {MAX_GPU_COUNTS} (each is a search)")
    return counts


@dataclass(frozen=True)
class Choice:
    """The best configuration of one GPU type at one GPU count, as a verdict weighs it."""

    hardware: str
    gpus: int
    row: Row
    limit_bytes: int  # the memory limit the search planned to

    @property
    def gpu_hours(self) -> float:
        """GPU-hours one iteration takes: GPUs x iteration time."""
        return self.gpus * self.row.iteration_time_s / 3600

    @property
    def headroom_bytes(self) -> int:
        return self.limit_bytes - self.row.peak_memory_bytes


def verdicts(choices: list[Choice]) -> tuple[Choice, Choice] | None:
    """(fastest, cheapest) across GPU types and counts: the shortest iteration (the most tokens per second: all
    choices train the same global batch), and the fewest GPU-hours per iteration (the most tokens per GPU-hour).
    Ties: fewer GPUs, then the type's name. None when nothing fits anywhere."""
    fit = [c for c in choices if c.row.fits]
    if not fit:
        return None
    fastest = min(fit, key=lambda c: (c.row.iteration_time_s, c.gpus, c.hardware))
    cheapest = min(fit, key=lambda c: (c.gpu_hours, c.row.iteration_time_s, c.hardware))
    return fastest, cheapest
