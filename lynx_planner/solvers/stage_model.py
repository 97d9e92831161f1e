"""The per-stage model the searches optimise (the simulator then judges the result).

For one stage and one steady-state micro-batch: the stage's forward and backward time, plus exposed recomputation.
A layer's recomputation placed `layer_above` can hide in the idle backward time of the layer above it (for the top
layer of the stage: in the wait for the gradient from the next stage); `grad_wait` and `prev_forward` share a pool
each (the gradient wait; the forward's TP collectives). All windows are divided by the interference factor.
Memory at the stage's peak (the start of the backward of the oldest in-flight micro-batch): kept bytes of the
in-flight micro-batches, plus what early placements have already regenerated, plus the two layers being recomputed
around the backward's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from .. import costs, placements, simulator
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


def candidates_of(profile: Profile, block: str) -> tuple[Candidate, ...]:
    return pareto(profile.blocks[block])


def idle_s(segs: tuple[float, ...]) -> float:
    """Idle (collective-wait) seconds of alternating busy, idle, ... segments."""
    return sum(segs[1::2])


def stage_model(profile: Profile, s: int, first: int, end: int, memory_limit: int, grad_wait_s: float) -> StageModel:
    par, hw = profile.parallel, profile.hardware
    gamma = hw.interference
    segs = [simulator.block_segments(profile.blocks[profile.layers[i].block]) for i in range(first, end)]
    slots = []
    for j, i in enumerate(range(first, end)):
        top = i == end - 1
        above = grad_wait_s if top else idle_s(segs[j + 1][1]) / gamma
        slots.append(Slot(i, profile.layers[i].block, above, top))
    return StageModel(
        stage=s, first=first, end=end,
        in_flight=simulator.in_flight(par.schedule, par.pp, s, par.num_microbatches),
        budget=memory_limit - static_bytes(profile, first, end),
        compute_s=sum(sum(f) + sum(b) for f, b in segs),
        grad_wait_s=grad_wait_s,
        fwd_idle_s=sum(idle_s(f) for f, _ in segs) / gamma,
        slots=tuple(slots),
        pools=tuple(at for at in ("grad_wait", "prev_forward")
                    if at in placements.legal_placements(par.schedule, par.pp, s, par.num_microbatches)),
        prev_forward_share=placements.prev_forward_share(par.schedule, par.pp, s, par.num_microbatches),
        send_s=0.0 if end == len(profile.layers) else costs.p2p_s(
            simulator.boundary_bytes(profile, end - 1), costs.link(hw, par.tp * par.pp)),
    )


def p2p_wait_s(profile: Profile, first: int, end: int) -> float:
    """Hideable work in the gradient wait of a balanced pipeline: the transfer of the gradient itself."""
    if end == len(profile.layers):
        return 0.0
    bus = costs.link(profile.hardware, profile.parallel.tp * profile.parallel.pp)
    return costs.p2p_s(simulator.boundary_bytes(profile, end - 1), bus) / profile.hardware.interference


def measured_grad_waits(profile: Profile, sim: simulator.SimResult) -> list[float]:
    """Median wait before a backward, per stage, in a simulated plan (as hideable work)."""
    return [median(r.grad_waits_s) / profile.hardware.interference if r.grad_waits_s else 0.0 for r in sim.stages]


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
