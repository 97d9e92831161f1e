"""The per-stage model the searches optimise (the simulator then judges the result).

For one stage and one steady-state micro-batch: the stage's forward and backward time, plus exposed recomputation.
A layer's recomputation placed `layer_above` can hide in the idle backward time of the layer above it (for the top
layer of the stage: in the wait for the gradient from the next stage); `grad_wait` and `prev_forward` share a pool
each (the gradient wait; the forward's TP collectives). All windows are divided by the interference factor.
Memory at the stage's peak (the start of the backward holding the most graphs): kept bytes of the in-flight
micro-batches, the graphs of those awaiting W (split backward), plus what early placements have already regenerated,
plus the two layers being recomputed around the backward's start, plus, on the stage holding the loss, the loss's
backward gradients (simulator.loss_grad_bytes, taken off the budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from .. import placements, schedules, simulator, streams
from ..evaluate import static_bytes
from ..schema import Profile
from .candidates import Candidate, pareto


@dataclass(frozen=True)
class Slot:
    """A layer position of the stage: its candidates and the window above it."""

    layer: int
    block: str
    above_s: float  # hideable work per micro-batch under layer_above (seconds of recomputation)
    top: bool
    above_bwd_s: float = 0.0  # the backward of the layer above (where an offloaded layer's copy back must fit)


@dataclass(frozen=True)
class StageModel:
    stage: int
    first: int
    end: int
    in_flight: int
    budget: int  # bytes left for activations
    compute_s: float  # forward + backward per micro-batch, exposed recomputation excluded
    grad_wait_s: float  # pool: hideable work in the wait for the gradient
    fwd_idle_s: float  # pool: hideable work in one forward's TP collectives
    slots: tuple[Slot, ...]
    pools: tuple[str, ...] = ("grad_wait", "prev_forward")  # the pooled placements that fire on this stage
    prev_forward_share: float = 1.0  # the micro-batches whose prev_forward fires (the others' run on demand)
    send_s: float = 0.0  # the transfer of the stage's output (and of its gradient back)
    awaiting_w: int = 0  # micro-batches whose graph (kept and recomputed tensors) waits for W (split backward)
    fwd_s: float = 0.0  # of compute_s, the forward's (the window the offloaded tensors' copies out leave in)
    bwd_s: float = 0.0  # of compute_s, the backward's (the window their copies back return in)


def candidates_of(profile: Profile, block: str) -> tuple[Candidate, ...]:
    return pareto(profile.blocks[block])


def idle_s(segs: tuple[float, ...]) -> float:
    """Idle (collective-wait) seconds of alternating busy, idle, ... segments."""
    return sum(segs[1::2])


def stage_model(profile: Profile, s: int, first: int, end: int, memory_limit: int, grad_wait_s: float) -> StageModel:
    par, hw = profile.parallel, profile.hardware
    gamma = hw.interference
    # the simulator's busy and idle seconds (with --tp-comm-overlap, forward collectives hide behind GEMMs: no window)
    segs = simulator.stage_segments(profile, first, end)  # with the waits between layers (streams.py: FSDP)
    slots = []
    for j, i in enumerate(range(first, end)):
        top = i == end - 1
        above = grad_wait_s if top else idle_s(segs[j + 1][1]) / gamma
        slots.append(Slot(i, profile.layers[i].block, above, top, 0.0 if top else sum(segs[j + 1][1])))
    legal = streams.legal_placements(profile, s)
    # the micro-batches in flight and awaiting W at the backward start holding the most graphs (not each maximum)
    flying, awaiting_w = schedules.peak_graphs(par.schedule, par.pp, par.virtual_stages, s, par.num_microbatches)
    # what each micro-batch awaiting W holds beside its graph, whatever the plan (the simulator's count)
    beside = sum(simulator.held_until_w(profile, i, first) for i in range(first, end))
    held = awaiting_w * beside
    # and the loss's gradients over its layer's backward, beside the in-flight micro-batches (the simulator's count)
    held += max((simulator.loss_grad_bytes(profile.blocks[profile.layers[i].block]) for i in range(first, end)),
                default=0)
    budget = memory_limit - static_bytes(profile, first, end) - held
    # After the last backward more graphs may await W, none in flight. A graph awaiting W holds every tensor its
    # layers save, kept or recomputed (kept + rec bytes: the same for every candidate), so those bytes do not depend on
    # the plan: a stage they do not fit has no plan.
    most_awaiting = schedules.awaiting_weight_pass(par.schedule, par.pp, par.virtual_stages, s, par.num_microbatches)
    if most_awaiting > awaiting_w:
        graph = 0
        for i in range(first, end):
            c = candidates_of(profile, profile.layers[i].block)[0]
            graph += c.kept_bytes + c.rec_bytes
        if most_awaiting * (graph + beside) > memory_limit - static_bytes(profile, first, end):
            budget = -1
    return StageModel(
        stage=s, first=first, end=end,
        in_flight=flying,
        awaiting_w=awaiting_w,
        budget=budget,
        compute_s=sum(sum(f) + sum(b) for f, b in segs),
        fwd_s=sum(sum(f) for f, _ in segs), bwd_s=sum(sum(b) for _, b in segs),
        grad_wait_s=grad_wait_s,
        fwd_idle_s=sum(idle_s(f) for f, _ in segs) / gamma,
        slots=tuple(slots),
        pools=tuple(at for at in ("grad_wait", "prev_forward") if at in legal),
        prev_forward_share=placements.prev_forward_share(par.schedule, par.pp, s, par.num_microbatches,
                                                         par.virtual_stages),
        send_s=0.0 if end == len(profile.layers) else simulator.send_s(
            profile, simulator.boundary_bytes(profile, end - 1)),
    )


def n_chunks(profile: Profile) -> int:
    """Virtual stages of the pipeline: the plan's stages (pp of them unless interleaved)."""
    return profile.parallel.pp * profile.parallel.virtual_stages


def chunk_limits(profile: Profile, bounds: list[int], limit: int) -> list[int]:
    """The memory limit each virtual stage's model is given: its static bytes plus a share of what its rank has left
    for activations, in proportion to its in-flight micro-batches times its layers (one chunk per rank: the limit)."""
    par = profile.parallel
    if par.virtual_stages == 1:
        return [limit] * (len(bounds) - 1)
    chunks = range(len(bounds) - 1)
    rank = [schedules.rank_of(par.pp, c) for c in chunks]
    layer_static = [static_bytes(profile, bounds[c], bounds[c + 1]) - profile.extra_static_bytes for c in chunks]
    weight = [simulator.in_flight(par.schedule, par.pp, c, par.num_microbatches, par.virtual_stages)
              * (bounds[c + 1] - bounds[c]) for c in chunks]
    out = []
    for c in chunks:
        mine = [d for d in chunks if rank[d] == rank[c]]
        free = limit - profile.extra_static_bytes - sum(layer_static[d] for d in mine)
        out.append(layer_static[c] + profile.extra_static_bytes + free * weight[c] // sum(weight[d] for d in mine))
    return out


@dataclass(frozen=True)
class RankMemory:
    """A rank holding several chunks (interleaved, v > 1): its chunks' indices among the models, the in-flight counts
    per chunk at its backwards' starts (schedules.peak_counts), each chunk's most of them (the count its model's bytes
    are at), and the bytes the rank has for activations."""

    chunks: tuple[int, ...]
    counts: tuple[tuple[int, ...], ...]
    most: tuple[int, ...]
    free: int


def rank_memory(profile: Profile, models: list[StageModel], limit: int, cut: list[int] | None = None,
                frugal_peaks: list[int] | None = None) -> list[RankMemory] | None:
    """Per rank, for models built at the whole `limit` each: what the rank's chunks share (None: one chunk per rank).
    `cut`: bytes taken off each rank's budget (a simulation found it over). `frugal_peaks`: each rank's simulated peak
    with every layer at its most frugal policy; the rank's budget is then calibrated there (this count at those
    policies plus the room the simulation leaves), as HEU's rank_limits does."""
    par = profile.parallel
    if par.virtual_stages == 1:
        return None
    out = []
    for r in range(par.pp):
        mine = schedules.chunks_of(par.pp, par.virtual_stages, r)
        counts = schedules.peak_counts(par.schedule, par.pp, par.virtual_stages, r, par.num_microbatches)
        most = tuple(max(1, max(n[i] for n in counts)) for i in range(len(mine)))
        # each model's budget is the limit less its chunk's static bytes (the per-rank ones included) and held bytes
        free = sum(models[c].budget for c in mine) - (len(mine) - 1) * (limit - profile.extra_static_bytes)
        if frugal_peaks is not None:
            held, near = [], 0
            for c in mine:
                frugal = [min(candidates_of(profile, sl.block), key=lambda x: (x.kept_bytes, x.rec_s))
                          for sl in models[c].slots]
                held.append(sum(models[c].in_flight * x.kept_bytes + models[c].awaiting_w * (x.kept_bytes + x.rec_bytes)
                                for x in frugal))
                near = max(near, frugal[-1].rec_bytes)  # the top layer's, recomputed on demand at the peak
            at_frugal = max(sum(n[i] * held[i] / most[i] for i in range(len(mine))) for n in counts) + near
            free = int(at_frugal) + limit - frugal_peaks[r]
        out.append(RankMemory(mine, counts, most, free - (cut[r] if cut else 0)))
    return out


def share_limit(profile: Profile, first: int, end: int, limit: int) -> int:
    """A virtual stage's limit before the split is known (partitioning): as if its rank's other chunks were like it."""
    v = profile.parallel.virtual_stages
    if v == 1:
        return limit
    own = static_bytes(profile, first, end)
    return own + (limit - profile.extra_static_bytes - v * (own - profile.extra_static_bytes)) // v


def end_tail_s(profile: Profile, bounds: list[int]) -> float:
    """Seconds the iteration runs on after rank 0's last backward (where the MILP's iteration ends): the most, over
    ranks, of a rank's end of iteration (its gradients' reduction, the optimizer step: simulator.end_of_iteration)
    less how much earlier its own last backward ends. That is at least the backwards and sends of the chunks below
    its lowest one, where every rank ends on its lowest chunk's last backward (1F1B, interleaved, GPipe); otherwise
    (zero bubble's W last) taken as nothing."""
    par = profile.parallel
    if par.dp * par.cp == 1 and not par.optimizer_step and profile.runtime is None:  # as end_of_iteration's
        return 0.0
    p, v, m = par.pp, par.virtual_stages, par.num_microbatches
    bwd = [[sum(b) for _, b in simulator.stage_segments(profile, bounds[c], bounds[c + 1])]
           for c in range(len(bounds) - 1)]
    chained = all(schedules.order(par.schedule, p, v, r, m)[-1] == ("B", r, m - 1) for r in range(p))
    out, ahead = 0.0, 0.0
    for r in range(p):
        mine = schedules.chunks_of(p, v, r)
        layers = [i for c in mine for i in range(bounds[c], bounds[c + 1])]
        tail = simulator.end_of_iteration(profile, r, p, layers, [t for c in mine for t in bwd[c]], 0.0,
                                          dp_free_s=float("-inf"))
        out = max(out, tail - ahead)
        if chained:  # rank r + 1's last backward sends its gradient to rank r's, which runs after it
            ahead += sum(bwd[r]) + simulator.send_s(profile, simulator.boundary_bytes(profile, bounds[r + 1] - 1))
    return out


def p2p_wait_s(profile: Profile, first: int, end: int) -> float:
    """Hideable work in the gradient wait of a balanced pipeline: the transfer of the gradient itself."""
    if end == len(profile.layers):
        return 0.0
    return simulator.send_s(profile, simulator.boundary_bytes(profile, end - 1)) / profile.hardware.interference


def measured_grad_waits(profile: Profile, sim: simulator.SimResult) -> list[float]:
    """Median wait before a backward, per virtual stage, in a simulated plan (as hideable work)."""
    return [median(w) / profile.hardware.interference if w else 0.0 for w in sim.chunk_grad_waits_s]


def exposure(slot: Slot, c: Candidate, at: str) -> float | None:
    """Exposed seconds per micro-batch of one layer's recomputation placed alone (None: not allowed)."""
    if c.rec_s == 0:
        return 0.0 if at == "on_demand" else None
    if c.replays_collective and at != "on_demand":
        return None
    if at == "on_demand":
        return c.rec_s
    if at == "layer_above":
        return max(0.0, c.rec_s - slot.above_s)
    return None  # pooled placements are costed per stage
