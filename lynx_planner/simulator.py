"""Discrete-event simulation of one pipeline-parallel training iteration with recomputation.

Each pipeline rank has a compute stream that runs its schedule's work items in order (lynx_planner/schedules: 1F1B,
GPipe, interleaved 1F1B, zero bubble; the simulator has no schedule-specific branch). A rank holds one or more virtual
stages (chunks) of consecutive layers. An item F(c, k) or B(c, k) runs chunk c's layers for micro-batch k, each as
alternating busy and idle segments: idle while the next op waits for a TP collective (in backward, only the part of the
collective not covered by the weight-gradient GEMM). Stages exchange activations and gradients by point-to-point
transfers (none between two chunks of one rank); a rank idles until its input arrives. Where the schedule splits the
backward, B(c, k) computes the input gradient and W(c, k) later the weight gradients (half of each weight GEMM's
backward; both scaled by the block's measured `split_backward`, B + W over the whole, except on chunk 0, whose backward
torch runs whole); B frees nothing: the layer's graph, with its kept and recomputed tensors and the output gradients
of its weight GEMMs and norms (and, at a chunk's lowest layer, the chunk's input gradient), lives until W ends
(torch's stage_backward_input keeps the graph for the weight pass; measured in docs/zero-bubble-memory.md).

Recomputation is one task per (micro-batch, layer). It is released where placements.py says its placement fires (the
table the runtime reads too) and then runs on a low-priority side stream only while the compute stream is idle, at
1/interference speed because a collective or transfer runs beside it; earliest deadline first. Whatever is left when
the layer's backward starts runs on the compute stream: that part is exposed. A memory timeline per stage counts the
kept tensors of in-flight micro-batches and recomputed tensors from the moment their recomputation starts until the
layer's backward ends, over all the chunks of a rank.
"""

from __future__ import annotations

import bisect
import heapq
import math
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import accumulate, compress, islice
from operator import attrgetter, ne

from . import costs, offload, placements, policy, schedules, streams
from .parallel import optimizer_shards
from .memo import per_object
from .schema import Block, LayerPolicy, Profile

EPS = 1e-15


@dataclass(frozen=True)
class LayerRun:
    """One layer of a stage under its policy, reduced to what the timeline needs."""

    index: int  # global layer index
    fwd: tuple[float, ...]  # busy, idle, busy, ... seconds
    bwd: tuple[float, ...]
    kept_bytes: int
    rec_bytes: int
    rec_s: float
    at: str
    trigger: int | None = None  # local position of the layer whose backward recomputes this one (uniform chunks)
    bwd_input: tuple[float, ...] = ()  # the backward without the weight gradients (B of a split backward)
    wgrad_s: float = 0.0  # the weight gradients (W of a split backward)
    wgrad_bytes: int = 0  # held from B to W: the weight GEMMs' and norms' output gradients (a chunk's lowest layer: and
    # the chunk's input gradient)
    rec_beside: float = 0.0  # of rec_s on demand, what runs while the DP stream's work outlasts the layer (hidden)
    spans: tuple = ()  # for the trace: its communication beside the compute (streams.op_spans, LayerWaits.spans)
    # the stream each idle segment of fwd, bwd and bwd_input waits for (streams.py); () for all TP collectives
    fwd_streams: tuple[str, ...] = ()
    bwd_streams: tuple[str, ...] = ()
    bwd_input_streams: tuple[str, ...] = ()
    off_bytes: int = 0  # of kept_bytes, what goes to the host after the forward (offload.py)
    off_copies: int = 0  # in how many copies (one per offloaded tensor: each pays the link's fixed latency)
    reload: str = "layer_above"  # when it comes back
    bwd_transient: int = 0  # allocated over its backward (a split one's B): the loss's gradients (loss_grad_bytes)


@per_object
def block_segments(block: Block) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Forward and backward of one block as alternating busy and idle seconds."""
    return _segments_of(block, False)[:2]


@per_object
def block_segments_tp_overlap(block: Block) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The same with Megatron's --tp-comm-overlap: each TP collective runs in chunks beside its neighbouring GEMM
    (the larger of the compute ops before and after it), so only what outlasts that GEMM is idle."""
    return _segments_of(block, True)[:2]


_WAITED: dict[int, tuple] = {}  # id(block) -> (block, key, segments with their streams' waits)


def segments(profile: Profile, block: Block) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A block's busy and idle seconds in this profile's setup (with or without --tp-comm-overlap, and the waits
    the streams model adds inside it: streams.op_waits)."""
    return segments_named(profile, block)[:2]


def segments_named(profile: Profile, block: Block) -> tuple[tuple[float, ...], tuple[float, ...], tuple[str, ...],
                                                            tuple[str, ...]]:
    """segments() and, per idle segment of the forward and of the backward, the stream the compute waits for."""
    tp_overlap = profile.parallel.tp_comm_overlap
    waits = streams.op_waits(profile, block)
    if not waits:
        fwd, bwd = (block_segments_tp_overlap if tp_overlap else block_segments)(block)
        return fwd, bwd, (), ()
    key = (tp_overlap, waits)
    hit = _WAITED.get(id(block))
    if hit is None or hit[0] is not block or hit[1] != key:
        hit = _WAITED[id(block)] = (block, key, _segments_of(block, tp_overlap, waits))
    return hit[2]


def _alternate(items: list[tuple[bool, float, str]]) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """(busy, idle, busy, ... seconds; the stream of each idle segment: the first that opened it)."""
    segs, names = [0.0], []
    for idle, dt, stream in items:
        if (len(segs) % 2 == 0) != idle:  # switch between busy (odd length) and idle (even length)
            segs.append(0.0)
            if idle:
                names.append(stream)
        segs[-1] += dt
    return tuple(segs), tuple(names)


def _segments_of(block: Block, tp_overlap: bool, waits: tuple = ()) -> tuple[tuple[float, ...], tuple[float, ...],
                                                                            tuple[str, ...], tuple[str, ...]]:
    ops = [op for op in block.ops if not op.view]
    beside = [0.0] * len(ops)  # (forward, backward) compute a collective can hide behind
    beside_b = [0.0] * len(ops)
    if tp_overlap:
        for i, op in enumerate(ops):
            if op.kind == "collective":
                near = [o for o in (ops[i - 1] if i else None, ops[i + 1] if i + 1 < len(ops) else None)
                        if o is not None and o.kind == "compute"]
                beside[i] = max((o.fwd_s for o in near), default=0.0)
                beside_b[i] = max((o.bwd_s for o in near), default=0.0)
    after = {op_id: (f, b, stream) for op_id, f, b, stream in waits}  # streams.op_waits: after the op in forward

    fwd, bwd = [], []
    for i, op in enumerate(ops):
        if op.kind == "collective":
            fwd.append((True, max(0.0, op.fwd_s - beside[i]), streams.TP))
        else:
            fwd.append((False, op.fwd_s, streams.COMPUTE))
        if op.id in after:
            fwd.append((True, after[op.id][0], after[op.id][2]))
    for i, op in reversed(list(enumerate(ops))):
        if op.id in after:  # before the op in backward
            bwd.append((True, after[op.id][1], after[op.id][2]))
        if op.kind == "collective":
            bwd.append((True, max(0.0, op.bwd_s - max(op.bwd_overlap_s, beside_b[i])), streams.TP))
        else:
            bwd.append((False, op.bwd_s, streams.COMPUTE))
    (f, fn), (b, bn) = _alternate(fwd), _alternate(bwd)
    return f, b, fn, bn


WEIGHT_OPS = ("addmm", "mm", "linear")  # aten ops whose backward includes a weight gradient GEMM
# aten ops of modules with an affine weight: torch's split backward (stage_backward_input) also keeps their output
# gradients for W, as it keeps the weight GEMMs' (measured: a GPT block's two layer norms, 1 MiB each per micro-batch)
NORM_OPS = ("native_layer_norm", "native_group_norm", "native_batch_norm", "_fused_rms_norm")


def is_weight_op(op) -> bool:
    return op.kind == "compute" and not op.view and op.id.split(":")[-1].split("#")[0] in WEIGHT_OPS \
        and "core_attn" not in op.tags


@per_object
def block_split(block: Block) -> tuple[tuple[float, ...], float, int]:
    """(the backward as busy, idle, ... seconds without the weight gradients; the weight gradients' seconds; the
    output gradients W reads: the weight GEMMs' and the norms') for a backward split into B and W: a weight GEMM's
    backward is half input gradient, half weight gradient."""
    half = {op.id: op.bwd_s / 2 for op in block.ops if is_weight_op(op)}
    items = [(True, max(0.0, op.bwd_s - op.bwd_overlap_s)) if op.kind == "collective"
             else (False, op.bwd_s - half.get(op.id, 0.0)) for op in reversed(block.ops) if not op.view]
    segs = [0.0]
    for idle, dt in items:
        if (len(segs) % 2 == 0) != idle:
            segs.append(0.0)
        segs[-1] += dt
    norms = sum(op.out_bytes for op in block.ops if op.kind == "compute" and not op.view
                and op.id.split(":")[-1].split("#")[0] in NORM_OPS)
    return tuple(segs), sum(half.values()), sum(op.out_bytes for op in block.ops if op.id in half) + norms


def held_until_w(profile: Profile, index: int, first: int) -> int:
    """Bytes a split backward's B of layer `index` (in the chunk starting at layer `first`) holds until its W beside the
    layer's graph: the weight GEMMs' and norms' output gradients, and at the chunk's lowest layer the chunk's input
    gradient (B's result, set on the input). None on chunk 0: torch's B does nothing there (its input needs no
    gradient) and W runs the whole backward."""
    if first == 0:
        return 0
    block = profile.blocks[profile.layers[index].block]
    return block_split(block)[2] + (block.input_bytes if index == first else 0)


LOSS_PREFIX = "loss:"  # op ids of the training stack's loss (analytic/decoder.py, analytic/gpt.py)


@per_object
def loss_grad_bytes(block: Block) -> int:
    """Bytes the loss's backward allocates beside the layer's kept tensors, from the start of the layer's backward to
    its end: log_softmax's backward holds the gradient of its output (from nll_loss) and the gradient it makes for the
    logits, both fp32 (HF and torchtitan cast the logits to fp32 before the cross-entropy) and each the size of the
    fp32 output the loss saves (its aux_bytes, already kept). So 2 x 4 bytes per token per vocabulary entry on the
    rank (b s V / tp), beside the saved 4: torchtitan_memory_by_hand's `loss` term. A block without a loss op: 0."""
    return max((2 * op.aux_bytes for op in block.ops if op.id.startswith(LOSS_PREFIX)), default=0)


@per_object
def _costs_of(block: Block) -> dict[tuple, policy.PolicyCost]:
    """policy.cost per (keep, recompute) of a block, as the plans' lists give them: a search simulates the same
    policies many times."""
    return {}


def layer_run(profile: Profile, index: int, pol: LayerPolicy, first: int, keeps_input: bool = True) -> LayerRun:
    """Layer `index` (in the chunk starting at `first`) under `pol`. Within reused_backwards() (a search, whose
    plans share most layers' policies) made once per layer, policy and place: a pure function of them."""
    memo = _REUSED[-1] if _REUSED else None
    if memo is None:
        return _layer_run(profile, index, pol, first, keeps_input)
    key = ("run", id(profile), index, first, keeps_input, tuple(pol.keep), tuple(pol.recompute), pol.at,
           pol.recompute_with, tuple(pol.offload), pol.reload)
    hit = memo.get(key)
    if hit is None:  # holding the profile keeps its id from being reused
        # A run reads of its place only whether it is its chunk's lowest layer and the chunk the first (and its
        # trigger's place in the chunk): the same block under the same policy elsewhere is that run at its index.
        alike = ("run at", id(profile), profile.layers[index].block, first == 0, index == first, keeps_input,
                 *key[5:8], None if pol.recompute_with is None else pol.recompute_with - first, *key[9:])
        base = memo.get(alike)
        if base is None:
            run = _layer_run(profile, index, pol, first, keeps_input)
            memo[alike] = (profile, run)
        else:
            run = replace(base[1], index=index)
        hit = memo[key] = (profile, run)
    return hit[1]


def _layer_run(profile: Profile, index: int, pol: LayerPolicy, first: int, keeps_input: bool) -> LayerRun:
    block = profile.blocks[profile.layers[index].block]
    costs_of, key = _costs_of(block), (tuple(pol.keep), tuple(pol.recompute))
    c = costs_of.get(key)
    if c is None:
        c = costs_of[key] = policy.cost(policy.analyse(block), frozenset(pol.keep), key[1])
    fwd, bwd, fwd_streams, bwd_streams = segments_named(profile, block)
    kept, rec = c.kept_bytes, c.recomputed_bytes
    trigger = None
    if pol.recompute_with is not None:
        trigger = pol.recompute_with - first
        if not keeps_input:  # inside a uniform chunk: the input is regenerated by the layer below
            kept, rec = kept - block.input_bytes, rec + block.input_bytes
    bwd_input, wgrad_s, _ = block_split(block)
    wgrad_bytes = held_until_w(profile, index, first)
    if block.split_backward is not None and first > 0:  # measured B + W over the whole; torch runs stage 0's whole
        f = block.split_backward
        bwd_input, wgrad_s = tuple(t if i % 2 else t * f for i, t in enumerate(bwd_input)), wgrad_s * f
    off = offload.offloaded_bytes(block, pol.offload) if pol.offload else 0
    rec_s = c.recompute_s
    if block.record_s and fwd and policy.records_every_forward(pol.mode, pol.offload,
                                                               bool(policy.analyse(block).collective)):
        fwd = (fwd[0] + block.record_s,) + fwd[1:]  # the torch runtime records the layer op by op (MoE routing)
    if (slower := streams.compute_slowdown(profile)) != 1.0:  # the other ranks' compute beside it (a local CPU job)
        fwd, bwd, bwd_input = _busy_scaled(fwd, slower), _busy_scaled(bwd, slower), _busy_scaled(bwd_input, slower)
        wgrad_s, rec_s = wgrad_s * slower, rec_s * slower
    return LayerRun(index, fwd, bwd, kept, rec, rec_s, pol.at, trigger, bwd_input, wgrad_s, wgrad_bytes,
                    fwd_streams=fwd_streams, bwd_streams=bwd_streams, spans=streams.op_spans(profile, block),
                    off_bytes=off, off_copies=len(pol.offload) if off else 0, reload=pol.reload,
                    bwd_transient=loss_grad_bytes(block))


def _busy_scaled(segs: tuple[float, ...], factor: float) -> tuple[float, ...]:
    """busy, idle, busy, ... seconds with the busy (compute) segments times factor, the waits as they were."""
    return tuple(t * factor if i % 2 == 0 else t for i, t in enumerate(segs))


def expand_policies(policies: list[LayerPolicy]) -> dict[int, LayerPolicy]:
    return {i: p for p in policies for i in range(*p.layers)}


def stage_runs(profile: Profile, first: int, end: int, policies: list[LayerPolicy]) -> list[LayerRun]:
    by_layer = expand_policies(policies)

    def keeps_input(i: int) -> bool:  # only a uniform chunk's lowest layer keeps its input
        w = by_layer[i].recompute_with
        return w is None or i == first or by_layer[i - 1].recompute_with != w

    runs = [layer_run(profile, i, by_layer[i], first, keeps_input(i)) for i in range(first, end)]
    on_demand = [r.rec_s if r.at == "on_demand" and r.trigger is None else 0.0 for r in runs]
    return with_waits(runs, streams.layer_waits(profile, list(range(first, end)), [sum(r.fwd) for r in runs],
                                                [sum(r.bwd) for r in runs], on_demand))


def _named(segs: tuple[float, ...], names: tuple[str, ...]) -> tuple[str, ...]:
    return names or (streams.TP,) * (len(segs) // 2)


def _waited(segs: tuple[float, ...], names: tuple[str, ...], before: float, after: float, copy: float = 0.0
            ) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """segs with a DP-stream wait before (an idle segment after an empty busy one) and after it, and `copy` seconds
    of compute-stream work (FSDP2's copies) added to their first busy segment."""
    names = _named(segs, names)
    if copy > 0 and segs:
        segs = (segs[0] + copy,) + segs[1:]
    if before > 0:
        segs, names = (0.0, before) + segs, (streams.DP,) + names
    if after > 0:
        segs, names = segs + (after, 0.0), names + (streams.DP,)
    return segs, names


def with_waits(runs: list[LayerRun], waits: list[streams.LayerWaits]) -> list[LayerRun]:
    """The layers of a chunk with the waits between layers the streams model gives (FSDP's all-gathers and
    reduce-scatters) as idle segments of their forward and backward."""
    out, none = [], streams.LayerWaits()
    for r, w in zip(runs, waits):
        if w == none:
            out.append(r)
            continue
        fwd, fn = _waited(r.fwd, r.fwd_streams, w.fwd_before, 0.0, w.fwd_copy)
        bwd, bn = _waited(r.bwd, r.bwd_streams, w.bwd_before, w.bwd_after, w.bwd_copy)
        bi, bin_ = _waited(r.bwd_input, r.bwd_input_streams, w.bwd_before, w.bwd_after, w.bwd_copy)
        out.append(replace(r, fwd=fwd, bwd=bwd, bwd_input=bi, fwd_streams=fn, bwd_streams=bn,
                           bwd_input_streams=bin_, rec_beside=w.rec_beside, spans=r.spans + w.spans))
    return out


def with_item_overhead(runs: list[LayerRun], overhead: float) -> list[LayerRun]:
    """A chunk's layers with the rank's per-item overhead (streams.item_overhead_s) as compute before each of its
    forward and backward items: on the first busy segment of its lowest layer's forward and of its top layer's
    backward (where the item starts)."""
    if overhead <= 0 or not runs:
        return runs

    def first(segs: tuple[float, ...]) -> tuple[float, ...]:
        return (segs[0] + overhead,) + segs[1:] if segs else segs
    runs = list(runs)
    runs[0] = replace(runs[0], fwd=first(runs[0].fwd))
    runs[-1] = replace(runs[-1], bwd=first(runs[-1].bwd), bwd_input=first(runs[-1].bwd_input))
    return runs


def stage_segments(profile: Profile, first: int, end: int) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
    """Each layer's forward and backward busy and idle seconds in a chunk [first, end) without recomputation, the
    waits between layers included (what the searches' stage models read). Within reused_backwards() (a search, whose
    stage models ask again for the same chunks) found once per chunk."""
    memo = _REUSED[-1] if _REUSED else None
    if memo is None:
        return _stage_segments(profile, first, end)
    key = ("segments", id(profile), first, end)
    hit = memo.get(key)
    if hit is None:  # holding the profile keeps its id from being reused
        hit = memo[key] = (profile, _stage_segments(profile, first, end))
    return list(hit[1])


def _stage_segments(profile: Profile, first: int, end: int) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
    segs = [segments(profile, profile.blocks[profile.layers[i].block]) for i in range(first, end)]
    waits = streams.layer_waits(profile, list(range(first, end)), [sum(f) for f, _ in segs],
                                [sum(b) for _, b in segs])
    return [(_waited(f, (), w.fwd_before, 0.0, w.fwd_copy)[0],
             _waited(b, (), w.bwd_before, w.bwd_after, w.bwd_copy)[0]) for (f, b), w in zip(segs, waits)]


def schedule(kind: str, p: int, s: int, m: int) -> list[tuple[str, int]]:
    """The order of actions on stage s (placements.schedule)."""
    return list(placements.schedule(kind, p, s, m))


def in_flight(kind: str, p: int, s: int, m: int, v: int = 1) -> int:
    """Micro-batches whose activations virtual stage s holds at its peak (schedules.in_flight)."""
    return schedules.in_flight(kind, p, v, s, m)


# one task per (micro-batch, layer): compared by identity (fast queue removal); slots: made and read per release
@dataclass(eq=False, slots=True)
class _Task:
    rem: float
    key: tuple[int, int]  # (deadline: position of the backward in the rank's order, -layer position)
    nbytes: int
    chunk: int
    layer: int
    mb: int
    started: bool = False


_deadline = attrgetter("key")  # a task's (deadline, -layer): the queue's order (in C: bisect calls it per comparison)


@dataclass
class StageResult:
    activation_peak_bytes: int
    busy_s: float
    exposed_s: float
    hidden_s: float
    end_s: float
    grad_waits_s: list[float] = field(default_factory=list)  # idle time before each backward, in order
    backward_ends_s: list[float] = field(default_factory=list)  # when each micro-batch's backward finished
    grad_reduce_exposed_s: float = 0.0  # data-parallel gradient reduction left after the last backward
    offload_stall_s: float = 0.0  # the compute stream's waits for late prefetches (offload.py)
    link_busy_s: float = 0.0  # the busier direction of the host link
    host_peak_bytes: int = 0  # pinned host memory at its peak


@dataclass
class SimResult:
    iteration_time_s: float
    stages: list[StageResult]  # per rank (a pipeline stage's device)
    trace: list[dict] = field(default_factory=list)
    # per rank, (micro-batch, global layer) -> (trigger, action) that released its recomputation (when tracing)
    releases: list[dict[tuple[int, int], tuple[str, tuple[str, int]]]] = field(default_factory=list)
    memory: list[list[tuple[float, int]]] = field(default_factory=list)  # with trace: (time, activation bytes delta)
    chunk_grad_waits_s: list[list[float]] = field(default_factory=list)  # per virtual stage: idle before each backward


class _Chunk:
    """What the timeline needs of one virtual stage's layers."""

    def __init__(self, runs: list[LayerRun], split: bool):
        self.runs = runs
        n = len(runs)
        tables = [_layer_tables(r, split) for r in runs]
        self.recomputes = [x[0] for x in tables]
        # per placement, its recomputing layers; per layer, the uniform-chunk layers it recomputes (one pass each: a
        # search derives a chunk for each new plan of it)
        self.by_at = {"grad_wait": [], "prev_forward": [], "layer_above": []}
        self.chunk = {m: [] for m in range(n)}
        for l, r in enumerate(runs):
            if self.recomputes[l] and r.at in self.by_at:
                self.by_at[r.at].append(l)
            if r.trigger in self.chunk:
                self.chunk[r.trigger].append(l)
        # (busy, idle) seconds of each layer's forward and backward: the fast path when nothing is queued
        self.fwd_sums = [x[1] for x in tables]
        self.bwd_sums = [x[2] for x in tables]
        self.bwd_input_sums = [x[3] for x in tables]
        # and as (busy, idle) pairs: what _segments walks when something is queued
        self.fwd_pairs = [x[4] for x in tables]
        self.bwd_pairs = [x[5] for x in tables]
        self.grad_waits: list[float] = []
        # Per layer, what backward() reads for every micro-batch, looked up once: whether the layer below it is
        # released layer_above here, the uniform-chunk layers it recomputes, and whether it recomputes at all.
        la = set(self.by_at["layer_above"])
        self.top_la = n - 1 in la
        self.bwd_plan = [(l, runs[l], l - 1 in la, self.chunk[l], self.recomputes[l]) for l in range(n - 1, -1, -1)]
        # Straight-line forms of F and B, for when nothing is queued and nothing is released on the way (no placement
        # but on demand, no uniform chunk): the general path's additions in its order, without its bookkeeping.
        # Offload: copies out after a layer's forward, back before its backward (the general path only).
        self.offloads = any(r.off_bytes for r in runs)
        self.reload_first = [l for l in range(n - 1, -1, -1) if runs[l].off_bytes and
                             (runs[l].reload == "grad_wait" or l == n - 1)]
        self.reload_below = [l > 0 and runs[l - 1].off_bytes > 0 and runs[l - 1].reload == "layer_above"
                             for l in range(n)]
        self.straight = not any(self.by_at.values()) and all(r.trigger is None for r in runs) and not self.offloads
        # (a straight forward's events: its layers' ends, each with its kept bytes; the times one by one, the bytes in
        # one extend, as the two lists end up the same)
        self.fwd_straight = [x[6][:2] for x in tables]
        self.fwd_kept = [x[6][2] for x in tables]
        self.bwd_straight = [x[7] for x in reversed(tables)]
        # The backward of a chunk whose recomputation is released in its own backward (gradient wait, layer_above)
        # when nothing else is queued: its tasks are served and consumed within it, so a local queue does.
        self.local = not self.straight and not self.by_at["prev_forward"] and not self.offloads
        self.first_released = [(l, runs[l]) for l in
                               sorted(self.by_at["grad_wait"] + ([n - 1] if self.top_la else []), reverse=True)]
        # per layer, top down: (layer, the layer below if released layer_above here, uniform layers it recomputes,
        # whether it recomputes, its run, its backward's (busy, idle) segment pairs, their busy and busy + idle sums,
        # the bytes its end frees or holds, the loss's gradients held over it)
        self.bwd_local = [(l, runs[l - 1] if below_la and l > 0 else None, [runs[u] for u in uniform], recomputes, r,
                           self.bwd_pairs[l], *straight[2:])
                          for (l, r, below_la, uniform, recomputes), straight in zip(self.bwd_plan, self.bwd_straight)]


# A search's chunks share most of their layers' runs (layer_run makes one per layer, policy and place): what a _Chunk
# derives of each run alone is derived once per run. Keyed by the run's id, the run held (so its id is not reused);
# cleared when full.
_LAYER_TABLES: dict[tuple[int, bool], tuple] = {}
LAYER_TABLE_CACHE_SIZE = 1 << 14


def _layer_tables(r: LayerRun, split: bool) -> tuple:
    """What a _Chunk reads of one layer's run (a pure function of it): whether it recomputes (released as a task or
    on demand); its forward's, backward's and split backward's (busy, idle) sums; its forward's and (split or whole)
    backward's (busy, idle) pairs; its straight forward's (busy, busy + idle, kept bytes) and straight backward's
    (recomputed bytes or None, recompute seconds, busy, busy + idle, bytes freed or held at its end less the loss's
    gradients, the loss's gradients)."""
    got = _LAYER_TABLES.get((id(r), split))
    if got is not None and got[0] is r:
        return got[1]
    recomputes = (r.rec_s > 0 or r.rec_bytes > 0) and r.trigger is None
    fwd = (sum(r.fwd[0::2]), sum(r.fwd[1::2]))
    bwd = (sum(r.bwd[0::2]), sum(r.bwd[1::2]))
    bwd_input = (sum(r.bwd_input[0::2]), sum(r.bwd_input[1::2]))
    busy, idle = bwd_input if split else bwd
    tables = (recomputes, fwd, bwd, bwd_input, _pairs(r.fwd), _pairs(r.bwd_input if split else r.bwd),
              (fwd[0], fwd[0] + fwd[1], r.kept_bytes),
              (r.rec_bytes if recomputes else None, r.rec_s, busy, busy + idle,
               (r.wgrad_bytes if split else -(r.kept_bytes + r.rec_bytes)) - r.bwd_transient, r.bwd_transient))
    if len(_LAYER_TABLES) >= LAYER_TABLE_CACHE_SIZE:
        _LAYER_TABLES.clear()
    _LAYER_TABLES[(id(r), split)] = (r, tables)
    return tables


def _pairs(segs: tuple[float, ...]) -> tuple[tuple[float, float], ...]:
    """Alternating (busy, idle, busy, ...) segments as (busy, idle) pairs, a last busy one with no idle time after."""
    return tuple(zip(segs[0::2], segs[1::2] + (0.0,) * (len(segs) % 2)))


# A search simulates plans that differ in a chunk or two, passing the others' run lists again (solvers/heu.py keeps
# them): their _Chunk tables are derived once. Keyed by the list's id, the list held (so its id is not reused) and its
# runs compared by identity (so a list changed in place is derived again); cleared when full.
_CHUNKS: dict[int, tuple[list[LayerRun], tuple[LayerRun, ...], bool, _Chunk]] = {}
CHUNK_CACHE_SIZE = 1024


def _chunk(runs: list[LayerRun], split: bool) -> _Chunk:
    """A _Chunk of these runs with its own (empty) gradient waits, the only part a simulation changes."""
    got = _CHUNKS.get(id(runs))
    if got is None or got[2] != split or len(got[1]) != len(runs) or any(a is not b for a, b in zip(got[1], runs)):
        if len(_CHUNKS) >= CHUNK_CACHE_SIZE:
            _CHUNKS.clear()
        got = _CHUNKS[id(runs)] = (runs, tuple(runs), split, _Chunk(runs, split))
    chunk = _Chunk.__new__(_Chunk)  # a shallow copy (copy.copy's steps, without its protocol lookups)
    chunk.__dict__.update(got[3].__dict__)
    chunk.grad_waits = []
    return chunk


class _Memory:
    """A rank's activation-memory timeline: (time, bytes allocated or freed) events, as two lists (cheaper to append
    and to scan than pairs)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.deltas: list[int] = []

    def note(self, t: float, delta: int) -> None:
        self.times.append(t)
        self.deltas.append(delta)

    def peak(self) -> int:
        """The highest sum of the events in time order, frees before allocations at equal times."""
        times, deltas = self.times, self.deltas
        if times != sorted(times):  # a side-stream start can lie an ulp past the compute stream's clock: sort all
            return max(0, max(accumulate(d for _, d in sorted(zip(times, deltas))), default=0))
        # In time order, the sum over a run of equal times, frees first, is lowest inside the run and highest at one of
        # its ends: the peak is the highest sum at the end of a run.
        return max(0, _run_end_top(times, list(accumulate(deltas)))) if times else 0


def _run_end_top(times: list[float], sums: list[int]) -> int:
    """The highest of `sums` (the running sums of events at `times`, in time order; `times` may go on, at later times)
    at the end of a run of equal times. Most events have a time of their own: where the highest sum of all is first
    met at a run's end, that is it (no run's end is higher); only otherwise the run ends are picked out."""
    top = max(sums)
    i = sums.index(top)
    if i + 1 == len(sums) or times[i] != times[i + 1]:
        return top
    return max(sums[-1], max(compress(sums, map(ne, times, islice(times, 1, len(sums)))), default=sums[-1]))


def _serve(queue: list[list], mem: _Memory, t: float, until: float, gamma: float, hidden: float
           ) -> tuple[float, float]:
    """_Stage.idle on a local queue of [seconds left, bytes, started, layer] tasks: the side stream works from t until
    `until`; returns (the compute stream's time, hidden seconds)."""
    cur = t
    cap = (until - cur) / gamma
    while cap > EPS and queue:
        task = queue[0]
        if not task[2]:
            task[2] = True
            mem.times.append(cur)
            mem.deltas.append(task[1])
        work = task[0] if task[0] < cap else cap
        task[0] -= work
        cap -= work
        hidden += work
        cur += work * gamma
        if task[0] <= EPS:
            queue.pop(0)
    return (until if until > t else t), hidden


class _Stage:
    """The compute and side streams and the memory timeline of one rank (its chunks share them)."""

    def __init__(self, s: int, chunks: dict[int, list[LayerRun]], gamma: float, trace: list | None,
                 deadline: dict[tuple[int, int], int], split: bool, link: offload.Link | None = None):
        self.s, self.gamma, self.trace, self.deadline, self.split = s, gamma, trace, deadline, split
        self.chunks = {c: _chunk(runs, split) for c, runs in chunks.items()}
        offloads = any(ch.offloads for ch in self.chunks.values())
        if offloads and link is None:
            raise ValueError("the plan offloads, but the hardware has no host link to offload to (offload.host_link)")
        self.copy = offload.CopyEngine(link) if offloads else None
        self.stall = 0.0
        # (micro-batch, global layer) -> (trigger, action) that released its recomputation; kept when tracing
        self.released: dict[tuple[int, int], tuple[str, tuple[str, int]]] = {}
        self.t = 0.0
        self.queue: list[_Task] = []
        self.tasks: dict[tuple[int, int, int], _Task] = {}
        self.mem = _Memory()
        self.busy = self.exposed = self.hidden = 0.0
        self.grad_waits: list[float] = []
        # no forward ever queues work here: no trace to draw, no prev_forward recomputation on this rank
        self.plain_forward = trace is None and not any(ch.by_at["prev_forward"] for ch in self.chunks.values()) \
            and not offloads

    def _event(self, stream: str, name: str, start: float, dur: float) -> None:
        if self.trace is not None and dur > 0:
            self.trace.append({"name": name, "ph": "X", "pid": self.s, "tid": stream,
                               "ts": start * 1e6, "dur": dur * 1e6})

    def _log(self, c: int, k: int, l: int, trigger: str, action: tuple[str, int]) -> None:
        if self.trace is not None:
            self.released[(k, self.chunks[c].runs[l].index)] = (trigger, action)

    def release(self, c: int, k: int, l: int, trigger: str, action: tuple[str, int]) -> None:
        if self.trace is not None:
            self._log(c, k, l, trigger, action)
        r = self.chunks[c].runs[l]
        task = _Task(r.rec_s, (self.deadline[(c, k)], -l), r.rec_bytes, c, l, k)
        self.tasks[(c, k, l)] = task
        if self.queue:
            bisect.insort(self.queue, task, key=_deadline)  # earliest deadline first
        else:
            self.queue.append(task)

    def idle(self, until: float) -> None:
        """The compute stream waits until `until`; the side stream recomputes meanwhile."""
        cur, queue = self.t, self.queue
        if not queue:
            self.t = until if until > cur else cur  # max(cur, until), without the call
            return
        gamma, hidden, tracing = self.gamma, self.hidden, self.trace is not None
        note_t, note_d = self.mem.times.append, self.mem.deltas.append
        cap = (until - cur) / gamma
        while cap > EPS and queue:
            task = queue[0]
            if not task.started:
                task.started = True
                note_t(cur)
                note_d(task.nbytes)
            rem = task.rem
            work = cap if cap < rem else rem  # min(rem, cap), without the call
            task.rem = rem - work
            cap -= work
            hidden += work
            if tracing:
                self._event("recompute (side)", f"R mb{task.mb} L{self.chunks[task.chunk].runs[task.layer].index}", cur,
                            work * gamma)
            cur += work * gamma
            if task.rem <= EPS:
                queue.pop(0)
        self.hidden = hidden
        self.t = until if until > self.t else self.t

    def _segments(self, segs: tuple[float, ...], pairs: tuple[tuple[float, float], ...], sums: tuple[float, float],
                  action: str, k: int, index: int, waits_for: tuple[str, ...] = ()) -> None:
        """A layer's busy and idle segments (`segs`; as (busy, idle) `pairs`, and their sums) on the compute stream; the
        side stream recomputes in the idle ones."""
        queue = self.queue
        if self.trace is None:
            if not queue:  # nothing to recompute in the idle parts: skip through
                self.busy += sums[0]
                self.t += sums[0] + sums[1]
                return
            for dt, wait in pairs:  # idle() only while the side stream has work
                self.t += dt
                self.busy += dt
                if wait > 0:
                    if queue:
                        self.idle(self.t + wait)
                    else:  # idle() with nothing queued: max(t, t + wait), which is t + wait
                        self.t += wait
            return
        name = f"{action} mb{k} L{index}"
        for i, dt in enumerate(segs):
            if i % 2 == 0:
                self._event(streams.COMPUTE, name, self.t, dt)
                self.t += dt
                self.busy += dt
            elif dt > 0:  # the wait, on the stream the compute waits for
                self._event(waits_for[i // 2] if waits_for else streams.TP, name, self.t, dt)
                self.idle(self.t + dt)

    def _spans(self, r: LayerRun, phase: str, k: int) -> None:
        """Trace only: the layer's communication beside its compute (streams.py), from the layer's start in `phase`."""
        if self.trace is not None:
            for stream, name, at, offset, dur in r.spans:
                if at == phase:
                    self._event(stream, f"{name} mb{k}", self.t + offset, dur)

    def _expose(self, k: int, index: int, work: float, nbytes: int, started: bool) -> None:
        if not started:
            self.mem.note(self.t, nbytes)
        if work > 0:
            if self.trace is not None:
                self._event("compute", f"R mb{k} L{index} (exposed)", self.t, work)
            self.t += work
            self.busy += work
            self.exposed += work

    def forward(self, c: int, k: int, ready: float, releases: tuple[int, int] | None) -> None:
        """F(c, k); at its start, after its input arrived, the prev_forward tasks of `releases` (chunk, micro-batch)
        are released."""
        ch = self.chunks[c]
        if self.trace is None and not self.queue and not ch.offloads and (
                releases is None or not self.chunks[releases[0]].by_at["prev_forward"]):  # nothing to queue
            t, busy, times = ready if ready > self.t else self.t, self.busy, self.mem.times
            for dt_busy, dt in ch.fwd_straight:  # the additions of idle() and _segments() with nothing queued
                busy += dt_busy
                t += dt
                times.append(t)
            self.mem.deltas.extend(ch.fwd_kept)
            self.t, self.busy = t, busy
            return
        self.idle(ready)
        if releases is not None:
            rc, rk = releases
            for l in self.chunks[rc].by_at["prev_forward"]:
                self.release(rc, rk, l, "prev_forward", ("F", k))
        tracing, note_t, note_d = self.trace is not None, self.mem.times.append, self.mem.deltas.append
        for l, r in enumerate(ch.runs):
            if tracing:
                self._spans(r, "F", k)
            self._segments(r.fwd, ch.fwd_pairs[l], ch.fwd_sums[l], "F", k, r.index, r.fwd_streams)
            note_t(self.t)
            note_d(r.kept_bytes)
            if r.off_bytes:  # the copy out, queued behind earlier ones; the device bytes are freed when it ends
                start, end = self.copy.send((c, k, l), self.t, r.off_bytes, r.off_copies)
                self.mem.note(end, -r.off_bytes)
                self._event(streams.COPY, f"D2H mb{k} L{r.index}", start, end - start)

    def _fetch(self, c: int, k: int, l: int) -> None:
        """Queue the copy back of layer l's offloaded tensors of micro-batch k; its device buffer is allocated when the
        copy starts."""
        got = self.copy.fetch((c, k, l), self.t)
        if got is not None:
            r = self.chunks[c].runs[l]
            self.mem.note(got[0], r.off_bytes)
            self._event(streams.COPY, f"H2D mb{k} L{r.index}", got[0], got[1] - got[0])

    def _await_reload(self, c: int, k: int, l: int) -> None:
        """Layer l's backward needs its offloaded tensors: the compute stream waits for a late copy (exposed; the side
        stream recomputes meanwhile)."""
        self._fetch(c, k, l)  # not fetched yet (its reload never fired): on demand, now
        end = self.copy.fetched[(c, k, l)]
        if end > self.t:
            self._event(streams.COMPUTE, f"wait H2D mb{k} L{self.chunks[c].runs[l].index}", self.t, end - self.t)
            self.stall += end - self.t
            self.idle(end)

    def backward(self, c: int, k: int, ready: float) -> None:
        ch = self.chunks[c]
        n = len(ch.runs)
        action = ("B", k)
        for l in ch.by_at["grad_wait"]:
            self.release(c, k, l, "grad_wait", action)
        if ch.top_la:  # the top layer's layer above is the wait for the gradient
            self.release(c, k, n - 1, "grad_wait", action)
        if ch.offloads:  # prefetches released when the backward item starts: grad_wait ones, the top layer's
            for l in ch.reload_first:
                self._fetch(c, k, l)
        wait = max(0.0, ready - self.t)
        self.grad_waits.append(wait)
        ch.grad_waits.append(wait)
        self.idle(ready)
        split, tracing, note_t, note_d = self.split, self.trace is not None, self.mem.times.append, self.mem.deltas.append
        sums = ch.bwd_input_sums if split else ch.bwd_sums
        for l, r, below_la, uniform, recomputes in ch.bwd_plan:
            if below_la and l > 0:
                self.release(c, k, l - 1, "layer_above", action)
            if ch.offloads and ch.reload_below[l]:  # backward enters layer l: the layer below's prefetch
                self._fetch(c, k, l - 1)
            for u in uniform:  # Megatron uniform: the chunk top recomputes the whole chunk
                self._log(c, k, u, placements.ON_DEMAND, action)
                self._expose(k, ch.runs[u].index, ch.runs[u].rec_s, ch.runs[u].rec_bytes, False)
            if recomputes:  # only a recomputing layer is ever released (its task, if any, is pending here)
                task = self.tasks.pop((c, k, l), None)
                if task is not None:
                    if task in self.queue:
                        self.queue.remove(task)
                    self._expose(k, r.index, task.rem, task.nbytes, task.started)
                else:  # on demand (or a prev_forward with no forward before this backward)
                    self._log(c, k, l, placements.ON_DEMAND, action)
                    self._expose(k, r.index, r.rec_s, r.rec_bytes, False)
            if r.off_bytes:
                self._await_reload(c, k, l)
            if tracing:
                self._spans(r, "B", k)
            if r.bwd_transient:
                note_t(self.t)
                note_d(r.bwd_transient)
            self._segments(r.bwd_input if split else r.bwd, ch.bwd_pairs[l], sums[l], "B", k, r.index,
                           r.bwd_input_streams if split else r.bwd_streams)
            note_t(self.t)
            if split:  # the weight gradients wait for W: the layer's graph stays, with their output gradients
                note_d(r.wgrad_bytes - r.bwd_transient)
            else:
                note_d(-(r.kept_bytes + r.rec_bytes + r.bwd_transient))

    def backward_local(self, ch: _Chunk, ready: float) -> None:
        """B of a chunk whose recomputation is all released in its own backward (gradient wait, layer_above) or runs
        on demand, with nothing queued before it: backward()'s additions in its order, its tasks ([seconds left,
        bytes, started, layer]) in a local queue, consumed by its end (one micro-batch's: the highest layer first).
        Within reused_backwards(), looked up where the same chunk's backward ran from the same state before."""
        memo = _REUSED[-1] if _REUSED else None
        if memo is None:
            return self._backward_local(ch, ready)
        key = (id(ch.bwd_local), self.t, ready, self.busy, self.exposed, self.hidden, self.gamma)
        hit = memo.get(key)
        times, deltas = self.mem.times, self.mem.deltas
        if hit is None:
            n = len(times)
            self._backward_local(ch, ready)
            if len(memo) >= REUSED_BACKWARDS:
                memo.clear()
            # holding bwd_local keeps its id from being reused while the entry lives
            memo[key] = (ch.bwd_local, self.t, self.busy, self.exposed, self.hidden, self.grad_waits[-1], times[n:],
                         deltas[n:])
            return
        _, self.t, self.busy, self.exposed, self.hidden, wait, new_times, new_deltas = hit
        self.grad_waits.append(wait)
        ch.grad_waits.append(wait)
        times.extend(new_times)
        deltas.extend(new_deltas)

    def _backward_local(self, ch: _Chunk, ready: float) -> None:
        gamma, mem = self.gamma, self.mem
        note_t, note_d = mem.times.append, mem.deltas.append
        t, busy, exposed, hidden = self.t, self.busy, self.exposed, self.hidden
        queue, pending = [], {}
        for l, r in ch.first_released:
            pending[l] = task = [r.rec_s, r.rec_bytes, False, l]
            queue.append(task)
        wait = ready - t if ready - t > 0.0 else 0.0
        self.grad_waits.append(wait)
        ch.grad_waits.append(wait)
        if queue:  # the wait for the gradient, as idle()
            t, hidden = _serve(queue, mem, t, ready, gamma, hidden)
        else:
            t = ready if ready > t else t
        for l, below, uniform, recomputes, r, pairs, segs_busy, segs_s, freed, transient in ch.bwd_local:
            for u in uniform:  # as _expose: never started
                note_t(t)
                note_d(u.rec_bytes)
                if u.rec_s > 0:
                    t += u.rec_s
                    busy += u.rec_s
                    exposed += u.rec_s
            if recomputes:
                task = pending.pop(l, None)
                if task is None:  # on demand
                    work, nbytes, started = r.rec_s, r.rec_bytes, False
                else:
                    if queue and queue[0] is task:  # not done yet: the highest layer queued
                        queue.pop(0)
                    work, nbytes, started = task[0], task[1], task[2]
                if not started:
                    note_t(t)
                    note_d(nbytes)
                if work > 0:
                    t += work
                    busy += work
                    exposed += work
            if below is not None:
                # layer_above: released at this layer's backward and served after this layer's task, which is consumed
                # just above (nothing in between touches the queue); every higher layer's task went at its own layer,
                # and the others queued are lower: so it goes first
                task = [below.rec_s, below.rec_bytes, False, l - 1]
                pending[l - 1] = task
                queue.insert(0, task)
            if transient:
                note_t(t)
                note_d(transient)
            if not queue:  # as _segments with nothing queued
                busy += segs_busy
                t += segs_s
            else:
                steps = iter(pairs)
                for dt, idle in steps:
                    t += dt
                    busy += dt
                    if idle > 0:  # _serve(queue, mem, t, t + idle, gamma, hidden) inlined: most of a search's calls
                        until = t + idle
                        cur, cap = t, (until - t) / gamma
                        while cap > EPS and queue:
                            task = queue[0]
                            if not task[2]:
                                task[2] = True
                                note_t(cur)
                                note_d(task[1])
                            rem = task[0]
                            work = rem if rem < cap else cap
                            task[0] = rem = rem - work
                            cap -= work
                            hidden += work
                            cur += work * gamma
                            if rem <= EPS:
                                del queue[0]
                        t = until if until > t else t
                        if not queue:  # the layer's other segments as idle() with nothing queued: t + idle each
                            for dt, idle in steps:  # (idle() adds none of 0 seconds, and t + 0.0 is t)
                                t += dt
                                busy += dt
                                t += idle
                            break
            note_t(t)
            note_d(freed)
        self.t, self.busy, self.exposed, self.hidden = t, busy, exposed, hidden

    def weight(self, c: int, k: int) -> None:
        """W(c, k): every layer's weight gradients, top down; then its graph is freed."""
        for r in reversed(self.chunks[c].runs):
            self._event("compute", f"W mb{k} L{r.index}", self.t, r.wgrad_s)
            self.t += r.wgrad_s
            self.busy += r.wgrad_s
            self.mem.note(self.t, -(r.kept_bytes + r.rec_bytes + r.wgrad_bytes))

    def activation_peak(self) -> int:
        return self.mem.peak()


def boundary_bytes(profile: Profile, layer: int) -> int:
    return profile.blocks[profile.layers[layer].block].output_bytes


def p2p_bus(profile: Profile) -> tuple[float, float]:
    """The link between neighbouring pipeline stages: the send measured on this CPU where a measured profile has one
    (streams.pp_link), else tp x dp ranks apart on the p2p link in Megatron's rank order, else tp x pp apart on the
    collective one."""
    par = profile.parallel
    local = streams.pp_link(profile)  # measured with the job on this CPU
    if local is not None:
        return local
    if par.rank_order == "tp-dp-pp":
        return costs.p2p_link(profile.hardware, par.tp * par.dp)
    return costs.link(profile.hardware, par.tp * par.pp)


def _send_shares(par) -> int:
    """In Megatron's rank order a whole (not sequence-parallel) activation is split over the TP ranks' links and
    all-gathered by the receivers (scatter-gather): one share per TP rank."""
    return par.tp if par.rank_order == "tp-dp-pp" and not par.sequence_parallel else 1


def send_s(profile: Profile, nbytes: float) -> float:
    """One pipeline send of `nbytes` between neighbouring stages, the receivers' all-gather included."""
    par = profile.parallel
    return costs.scatter_gather_send_s(nbytes, _send_shares(par), p2p_bus(profile),
                                       costs.link(profile.hardware, par.tp))


def sender_s(profile: Profile, nbytes: float) -> float:
    """The part of a pipeline send the sender waits out when sends block: its own share's transfer (the receivers'
    all-gather of a scatter-gather send is theirs)."""
    return costs.p2p_s(nbytes / _send_shares(profile.parallel), p2p_bus(profile))


def backward_deadlines(order: tuple[schedules.Item, ...]) -> dict[tuple[int, int], int]:
    """(chunk, micro-batch) -> position of its backward in the rank's order: the side stream serves the earliest."""
    return {(c, k): i for i, (kind, c, k) in enumerate(order) if kind == "B"}


@lru_cache(maxsize=4096)
def _rank_tables(kind: str, p: int, v: int, rank: int, m: int):
    """What a rank's schedule fixes, derived once per (schedule, p, v, rank, m) rather than per simulation: its order,
    the deadlines of its backwards and, per item, the prev_forward recomputations its start releases (read-only)."""
    order = schedules.order(kind, p, v, rank, m)
    fires = placements.prev_forward_fires(kind, p, v, rank, m)
    return order, backward_deadlines(order), tuple(fires.get((c, k)) if a == "F" else None for a, c, k in order)


@lru_cache(maxsize=256)
def _visits(kind: str, p: int, v: int, m: int, blocking: bool) -> tuple[tuple[tuple[int, int, int], ...], bool]:
    """The visits simulate() makes to the ranks, as (rank, first item, end) in order, and whether they run every item
    (else the schedule deadlocks). Passes over the ranks in order, each running as far as its inputs allow: an item
    needs the end of the item before it on its path (a forward the forward of the chunk below, a backward the backward
    of the chunk above; with blocking p2p, a paired forward the gradient of its backward too), so which items a visit
    runs follows from the schedule alone, not from any time. A rank that stopped is visited again only once an item it
    may wait for has ended (in this pass if it comes later, else in the next); visits that run nothing are left out
    (they change nothing)."""
    orders = [_rank_tables(kind, p, v, r, m)[0] for r in range(p)]
    pairs = schedules.get(kind).paired_sends if blocking else None
    paired = [pairs(p, v, r, m) if pairs else frozenset() for r in range(p)]
    n_chunks = p * v
    last = n_chunks - 1
    fwd_done = [[False] * m for _ in range(n_chunks)]
    bwd_done = [[False] * m for _ in range(n_chunks)]
    up = [schedules.rank_of(p, c + 1) for c in range(n_chunks)]  # the rank an item's end may unblock
    down = [schedules.rank_of(p, c - 1) for c in range(n_chunks)]
    ptr = [0] * p
    now, later = list(range(p)), []  # this pass's ranks (a heap), the next pass's
    queued = [True] * p
    visits = []

    def wake(r: int, s: int) -> None:
        if not queued[r] and r != s:
            queued[r] = True
            heapq.heappush(now, r) if r > s else later.append(r)

    while now:
        s = heapq.heappop(now)
        queued[s] = False
        order, i = orders[s], ptr[s]
        while i < len(order):
            kind_, c, k = order[i]
            if kind_ == "F":
                if c > 0 and not fwd_done[c - 1][k]:
                    break
                if blocking and c < last and i in paired[s]:  # with the backward after it
                    _, cb, kb = order[i + 1]
                    if cb < last and not bwd_done[cb + 1][kb]:
                        break
                    bwd_done[cb][kb] = True
                    if cb > 0:
                        wake(down[cb], s)
                    i += 1
                fwd_done[c][k] = True
                if c < last:
                    wake(up[c], s)
            elif kind_ == "B":  # the last chunk's follows its own forward on the same rank
                if c < last and not bwd_done[c + 1][k]:
                    break
                bwd_done[c][k] = True
                if c > 0:
                    wake(down[c], s)
            i += 1  # W follows its own B on the same rank
        if i > ptr[s]:
            visits.append((s, ptr[s], i))
        ptr[s] = i
        if not now:
            now, later = sorted(later), []
    return tuple(visits), all(i == len(o) for i, o in zip(ptr, orders))


# A search simulates many plans that share chunks, and their timelines agree until the first item their
# differences reach (a rank's items before it start from the same state): within reused_backwards(), a local backward
# (_Stage.backward_local: a pure function of its chunk's tables, the rank's clock, busy, exposed and hidden seconds,
# its ready time and the interference factor) is run once per such state and replayed after, bit for bit. The same
# block holds what else a search asks again with the same arguments: layer_run, stage_segments and _tail_costs.
_REUSED: list[dict] = []
REUSED_BACKWARDS = 1 << 16  # entries kept (each a backward's few memory events); cleared when full


@contextmanager
def reused_backwards():
    _REUSED.append({})
    try:
        yield
    finally:
        _REUSED.pop()
        if not _REUSED:
            # The tables of this search's runs and chunks (keyed by the objects, which the search made: no later one
            # meets them again), freed with it rather than kept until the caches fill: tens of thousands of objects
            # each later garbage collection would scan.
            _LAYER_TABLES.clear()
            _CHUNKS.clear()


CAP_SCAN_EVENTS = 256  # with caps, a rank's memory is scanned once this many events have come since the last scan


def _settled_peak(mem: _Memory, scan: list, now: float) -> int | None:
    """The most a rank's memory events before `now` (its clock) add up to at the end of a time: a lower bound on its
    peak, as every later event comes at or after its clock (the peak is the highest sum of the events up to a time).
    Scanned on from where the last call stopped (`scan`: index, sum, highest, last time); None once the events are
    out of time order (a side-stream start an ulp past the clock): no bound then."""
    i, run, top, last = scan
    tail = mem.times[i:]
    if not tail or tail[0] >= now:
        return top
    if tail[0] < last or tail != sorted(tail):
        return None
    j = bisect.bisect_left(tail, now)  # the events before now: each time's run is complete
    sums = list(accumulate(islice(mem.deltas, i, i + j), initial=run))
    del sums[0]
    top = max(top, _run_end_top(tail, sums))
    scan[:] = [i + j, sums[-1], top, tail[j - 1]]
    return top


def simulate(profile: Profile, stage_layers: list[list[LayerRun]], trace: bool = False,
             caps: list[int] | None = None) -> SimResult | None:
    """Simulate one iteration; `stage_layers[c]` are the layers of virtual stage c in order (pp x virtual_stages of
    them; rank c % pp runs chunk c). `caps`: per rank, activation bytes; None comes back as soon as a rank's memory
    is known to peak above its cap (a search that only asks whether a plan fits stops there)."""
    par, hw = profile.parallel, profile.hardware
    p, v, m = par.pp, par.virtual_stages, par.num_microbatches
    n_chunks = len(stage_layers)
    if n_chunks != p * v:
        raise ValueError(f"{n_chunks} virtual stages for pp {p} x {v} virtual stages")
    events: list[dict] | None = [] if trace else None
    split = schedules.get(par.schedule).splits_backward
    if profile.runtime is not None:
        stage_layers = [with_item_overhead(runs, streams.item_overhead_s(profile, schedules.rank_of(p, c)))
                        for c, runs in enumerate(stage_layers)]
    tables = [_rank_tables(par.schedule, p, v, r, m) for r in range(p)]
    stages = []
    link = streams.copy_link(profile) if any(run.off_bytes for runs in stage_layers for run in runs) else None
    for r in range(p):
        stages.append(_Stage(r, {c: stage_layers[c] for c in schedules.chunks_of(p, v, r)}, hw.interference, events,
                             tables[r][1], split, link))
    # a chunk's output goes to the next chunk's rank; none when both are on one rank
    send = [0.0 if schedules.rank_of(p, c + 1) == schedules.rank_of(p, c) and c + 1 < n_chunks else
            send_s(profile, boundary_bytes(profile, runs[-1].index)) for c, runs in enumerate(stage_layers)]
    # Megatron's blocking p2p (overlap_p2p_comm false): a rank posts its sends and the receives of its next item
    # together when an item ends (`posted`); a transfer starts once both ends have posted, and the sender waits out
    # its own share. A steady-state forward of the interleaved schedule sends its output with the backward after it,
    # after both.
    blocking = not par.overlap_p2p_comm
    posted = [0.0] * p
    hold = [0.0 if x == 0.0 else sender_s(profile, boundary_bytes(profile, runs[-1].index)) if blocking else 0.0
            for x, runs in zip(send, stage_layers)]
    pairs = schedules.get(par.schedule).paired_sends if blocking else None
    paired = [pairs(p, v, r, m) if pairs else frozenset() for r in range(p)]
    fwd_end = [[-1.0] * m for _ in range(n_chunks)]
    bwd_end = [[-1.0] * m for _ in range(n_chunks)]
    last = n_chunks - 1
    # The visits to the ranks, each running a rank's items as far as its inputs allow: which items a visit runs
    # depends on the schedule alone (an item waits for the end of another, never for a time), so they are found once
    # per schedule (_visits) and only their timing is simulated here, visit by visit in the same order (the trace's
    # order too).
    visits, complete = _visits(par.schedule, p, v, m, blocking)
    # What a visit to a rank reads, looked up once (a deep pipeline's ranks are visited thousands of times).
    visit = [(st, order, fired, st.chunks, st.plain_forward, st.trace is None, st.grad_waits,
              st.mem.times.append, st.mem.deltas.append, st.mem.deltas.extend)
             for st, (order, _, fired) in zip(stages, tables)]
    # with caps, each rank's memory so far, scanned after each visit (not with offload: the copy engine's events)
    scans = [[0, 0, 0, -math.inf] for _ in range(p)] if caps is not None and link is None else None
    for s, i, stop in visits:
        st, order, fired, chunks, plain_f, plain_b, waits, note_t, note_d, add_d = visit[s]
        # Straight F and B (nothing queued, nothing released on the way) run here, on local copies of the rank's
        # clock, busy and exposed seconds: method calls and attribute traffic were most of their cost. The other
        # items go through the rank's methods, the copies synchronised around them.
        t, busy, exposed = st.t, st.busy, st.exposed
        while i < stop:  # each item's inputs have ended (_visits)
            kind, c, k = order[i]
            if kind == "F":
                if c == 0:
                    ready = 0.0
                else:
                    ready = fwd_end[c - 1][k]
                    ready = (max(ready, posted[s]) if blocking else ready) + send[c - 1]
                if blocking:  # Megatron's blocking p2p: through the rank's methods
                    if c < last and i in paired[s]:  # the pair starts once the backward's gradient is in too; F's
                        _, cb, kb = order[i + 1]  # output leaves after B
                        ready = max(ready, max(bwd_end[cb + 1][kb], posted[s]) + send[cb] if cb < last else 0.0)
                        st.t, st.busy, st.exposed = t, busy, exposed
                        st.forward(c, k, ready, fired[i])
                        st.backward(cb, kb, fwd_end[cb][kb] if cb == last else st.t)
                        bwd_end[cb][kb] = fwd_end[c][k] = posted[s] = st.t
                        st.idle(st.t + max(hold[c], hold[cb - 1] if cb > 0 else 0.0))
                        i += 1
                    else:
                        st.t, st.busy, st.exposed = t, busy, exposed
                        st.forward(c, k, ready, fired[i])
                        fwd_end[c][k] = posted[s] = st.t
                        if c < last:
                            st.idle(st.t + hold[c])
                    t, busy, exposed = st.t, st.busy, st.exposed
                elif plain_f and not st.queue:  # as _Stage.forward with nothing to queue
                    t = ready if ready > t else t
                    ch = chunks[c]
                    for dt_busy, dt in ch.fwd_straight:
                        busy += dt_busy
                        t += dt
                        note_t(t)
                    add_d(ch.fwd_kept)
                    fwd_end[c][k] = t
                else:
                    st.t, st.busy, st.exposed = t, busy, exposed
                    st.forward(c, k, ready, fired[i])
                    t, busy, exposed = st.t, st.busy, st.exposed
                    fwd_end[c][k] = t
            elif kind == "B":
                if c == last:
                    ready = fwd_end[c][k]
                else:
                    ready = bwd_end[c + 1][k]
                    ready = (max(ready, posted[s]) if blocking else ready) + send[c]
                ch = chunks[c]
                if ch.straight and plain_b and not st.queue:  # recomputation all on demand: backward()'s additions
                    wait = ready - t if ready - t > 0.0 else 0.0
                    waits.append(wait)
                    ch.grad_waits.append(wait)
                    t = ready if ready > t else t
                    for rec_bytes, rec_s, dt_busy, dt, freed, transient in ch.bwd_straight:
                        if rec_bytes is not None:  # exposed recomputation, as _expose
                            note_t(t)
                            note_d(rec_bytes)
                            if rec_s > 0:
                                t += rec_s
                                busy += rec_s
                                exposed += rec_s
                        if transient:
                            note_t(t)
                            note_d(transient)
                        busy += dt_busy
                        t += dt
                        note_t(t)
                        note_d(freed)
                else:
                    st.t, st.busy, st.exposed = t, busy, exposed
                    if ch.local and plain_b and not st.queue:  # released in this backward, served in it
                        st.backward_local(ch, ready)
                    else:
                        st.backward(c, k, ready)
                    t, busy, exposed = st.t, st.busy, st.exposed
                bwd_end[c][k] = t
                if blocking:  # the rank posts its sends; the sender waits out its share
                    posted[s] = t
                    if c > 0:
                        st.t, st.busy, st.exposed = t, busy, exposed
                        st.idle(t + hold[c - 1])
                        t = st.t
            else:  # W follows its own B on the same rank
                st.t, st.busy, st.exposed = t, busy, exposed
                st.weight(c, k)
                t, busy, exposed = st.t, st.busy, st.exposed
            i += 1
        st.t, st.busy, st.exposed = t, busy, exposed
        if scans is not None and scans[s] is not None and len(st.mem.times) - scans[s][0] >= CAP_SCAN_EVENTS:
            top = _settled_peak(st.mem, scans[s], t)
            if top is None:
                scans[s] = None
            elif top > caps[s]:
                return None
    if not complete:
        raise RuntimeError("pipeline schedule deadlocked")
    results = [StageResult(st.activation_peak(), st.busy, st.exposed, st.hidden, st.t, st.grad_waits, bwd_end[s])
               for s, st in enumerate(stages)]
    if caps is not None and any(res.activation_peak_bytes > cap for res, cap in zip(results, caps)):
        return None
    for res, st in zip(results, stages):  # the copy engine's figures
        if st.copy is not None:
            res.offload_stall_s, res.link_busy_s, res.host_peak_bytes = st.stall, st.copy.busy_s, st.copy.host_peak()
    for r, res in enumerate(results):  # on-demand recomputation beside the DP stream's work: its time is in the waits
        beside = m * sum(run.rec_beside for c in schedules.chunks_of(p, v, r) for run in stage_layers[c])
        res.exposed_s, res.hidden_s = max(0.0, res.exposed_s - beside), res.hidden_s + beside
    rank_runs = [[run for c in schedules.chunks_of(p, v, r) for run in stage_layers[c]] for r in range(p)]
    reduce_gradients(profile, rank_runs, results, events)
    return SimResult(max(r.end_s for r in results), results, events or [], releases=[st.released for st in stages],
                     memory=[list(zip(st.mem.times, st.mem.deltas)) for st in stages] if trace else [],
                     chunk_grad_waits_s=[stages[schedules.rank_of(p, c)].chunks[c].grad_waits for c in range(n_chunks)])


GRAD_BYTES = 4  # Megatron reduces gradients in fp32 under bf16 training (main_grad buffers)
# Without contiguous gradient buffers (Megatron's local DDP before they became the rule; PyTorch DDP without
# gradient_as_bucket_view) every gradient is copied into a flat buffer, divided by dp in place and copied back: three
# passes that each read and write it, on the compute stream.
DDP_COPY_PASSES = 3
PARAM_BYTES = 2  # the distributed optimizer all-gathers the updated bf16 weights
# Bytes the optimizer step moves per parameter it updates (multi-tensor kernels, memory-bound): the gradient norm
# reads the fp32 gradient (4), clipping scales it in place (8), Adam reads the gradient (4), reads and writes the
# fp32 master weight, m and v (24) and writes the bf16 weight (2).
OPTIMIZER_BYTES_PER_PARAM = 42
# With 16-bit gradients (an fp16 run, grad_reduce_in_fp32 false) the step first copies them to fp32 main grads (read
# 2, write 4) and the loss scaler unscales those, checking for inf (read 4, write 4): Megatron's Float16Optimizer.
FP16_GRAD_STEP_BYTES_PER_PARAM = 14


def grad_bytes(profile: Profile) -> int:
    """Bytes per gradient element the DP reduction moves: fp32 main grads, or the 16-bit grads of an fp16 run
    without --accumulate-allreduce-grads-in-fp32 (grad_reduce_in_fp32 false)."""
    return GRAD_BYTES if profile.parallel.grad_reduce_in_fp32 else 2


def reduce_gradients(profile: Profile, stage_layers: list[list[LayerRun]], results: list[StageResult],
                     events: list[dict] | None = None) -> None:
    """The end of the iteration on each stage, after its last backward; moves each stage's `end_s` (in place).

    Data parallelism: each stage reduces its gradients over its DP group, layer by layer as the last micro-batch's
    backward finishes them (Megatron's --overlap-grad-reduce; one stream, in backward order; without it, all after
    the last backward): an all-reduce, or a reduce-scatter with the distributed optimizer, over the links the group
    spans (ranks tp apart, Megatron's order). A layer's gradients are taken as ready when its backward's compute is
    done, ignoring exposed recomputation of the layers below it in that backward (which would only make them ready
    earlier). With `optimizer_step`: the tied word embedding's gradients are all-reduced between the first and last
    stage (pp > 1), then the gradient norm (an all-reduce of one number over all ranks), clipping and the Adam step
    on this rank's parameters (its DP shard with the distributed optimizer). Then, with the distributed optimizer,
    the updated weights are all-gathered: exposed, or hidden in the next iteration's forward with
    --overlap-param-gather."""
    if profile.parallel.dp * profile.parallel.cp == 1 and not profile.parallel.optimizer_step \
            and profile.runtime is None:
        return
    p = len(stage_layers)
    for s, (runs, r) in enumerate(zip(stage_layers, results)):
        end = end_of_iteration(profile, s, p, [run.index for run in runs], [sum(run.bwd) for run in runs], r.end_s,
                               events)
        r.grad_reduce_exposed_s = max(0.0, end - r.end_s)
        r.end_s = end


def end_of_iteration(profile: Profile, s: int, p: int, layers: list[int], bwd_s: list[float], end_s: float,
                     events: list[dict] | None = None, dp_free_s: float = 0.0) -> float:
    """When rank `s` of `p` ends the iteration (reduce_gradients says what it runs): its `layers` (bottom up) with
    their last backward's seconds `bwd_s`, that backward ending at `end_s`; the DP stream is free from `dp_free_s`."""
    par = profile.parallel
    if par.dp * par.cp == 1 and not par.optimizer_step and profile.runtime is None:
        return end_s

    def event(name: str, start: float, dur: float) -> None:
        if events is not None and dur > 0:
            events.append({"name": name, "ph": "X", "pid": s, "tid": "dp collective", "ts": start * 1e6,
                           "dur": dur * 1e6})

    ready = end_s  # the bottom layer's gradients are complete when the last backward ends
    ready_at = []
    for dt in bwd_s:  # bottom up: a layer is done before the backward of the layers below it
        ready_at.append(ready if par.overlap_grad_reduce else end_s)
        ready -= dt
    sync, scale, copies, step, gather = _tail_costs(profile, s, p, layers)
    t = dp_free_s
    for i, dt, at in zip(reversed(layers), reversed(sync), reversed(ready_at)):
        start = at if at > t else t  # max(t, at), without the call (a search runs this per rank and layer)
        if events is not None:
            event(f"DP grad L{i}", start, dt)
        t = start + dt
    t = max(t, end_s)
    if scale > 0:  # torch's pipeline schedule
        if events is not None:  # compute-stream work (the rank's training thread)
            events.append({"name": "gradient scaling", "ph": "X", "pid": s, "tid": streams.COMPUTE,
                           "ts": t * 1e6, "dur": scale * 1e6})
        t += scale
    if copies is not None:  # gradients copied to flat buckets, divided, copied back
        event("DP bucket copies", t, copies)
        t += copies
    if step is not None:
        event("optimizer step", t, step)
        t += step
    if gather is not None:
        event("DP param all-gather", t, gather)
        t += gather
    return t


def _tail_costs(profile: Profile, s: int, p: int, layers: list[int]
                ) -> tuple[list[float], float, float | None, float | None, float | None]:
    """What end_of_iteration adds after a rank's last backward, whenever it ends: per layer its gradients' reduction
    (bottom up), the gradient scaling, the bucket copies, the optimizer step and the weights' all-gather (None: not
    run). Within reused_backwards() (a search: every plan it simulates asks again) found once per rank's layers."""
    memo = _REUSED[-1] if _REUSED else None
    key = ("tail", id(profile), s, p, tuple(layers))
    hit = memo.get(key) if memo is not None else None
    if hit is not None:
        return hit[1]
    par, hw = profile.parallel, profile.hardware
    params = [profile.layers[i].params for i in layers]
    experts = [profile.layers[i].expert_params for i in layers]
    sync = streams.grad_sync_s(profile, params, experts)  # per layer, bottom up
    scale = streams.grad_scale_s(profile, sum(params)) if par.pp > 1 else 0.0
    copies = step = gather = None
    if par.dp > 1 and not par.contiguous_grad_buffers and not par.fsdp:
        copies = costs.memory_s(DDP_COPY_PASSES * 2 * grad_bytes(profile) * sum(params), hw)
    if par.optimizer_step:
        ends = p > 1 and (s == 0 or s == p - 1)  # the first stage's embedding and the last's copy in the head
        step = optimizer_step_s(profile, sum(params), tied_embedding_params(profile) if ends else 0, p, sum(experts))
    if par.distributed_optimizer and par.dp > 1 and not par.overlap_param_gather:
        gather = costs.all_gather_s(PARAM_BYTES * (sum(params) - sum(experts)), par.dp * par.cp,
                                    streams.bus(profile, "dp"))
        if sum(experts):  # expert-DP: ranks tp x ep apart
            gather += costs.all_gather_s(PARAM_BYTES * sum(experts), par.dp * par.cp // par.ep,
                                         costs.group_link(hw, par.dp * par.cp // par.ep, par.tp * par.ep))
    got = (sync, scale, copies, step, gather)
    if memo is not None:  # holding the profile keeps its id from being reused
        memo[key] = (profile, got)
    return got


def tied_embedding_params(profile: Profile) -> int:
    """Parameters (this rank's) of the word embedding the output layer shares, whose gradients the first and last
    stage all-reduce: the GPT family's `embedding` block (always tied, with its positions), or the first layer of a
    model whose config ties them (the HF families' tie_word_embeddings)."""
    if profile.model.config.get("tie_embeddings") and profile.layers:
        return profile.layers[0].params
    return next((l.params for l in profile.layers if l.block == "embedding"), 0)


def optimizer_step_s(profile: Profile, params: int, tied_params: int = 0, stages: int = 1,
                     expert_params: int = 0) -> float:
    """The end of an iteration on a stage holding `params` parameters (this rank's): the all-reduce of the tied word
    embedding's gradients between the first and last stage (`tied_params`), the gradient norm (one number
    all-reduced over all ranks), clipping and the Adam step on this rank's share (its DP shard with the distributed
    optimizer; the routed experts among them, `expert_params`, sharded over their dp / ep replicas, as memory
    holds them)."""
    par, hw = profile.parallel, profile.hardware
    t = 0.0
    if tied_params:
        link = costs.link(hw, par.tp * par.dp * (stages - 1) + 1)
        t += costs.all_reduce_s(grad_bytes(profile) * tied_params, 2, link)
    ranks = par.tp * par.dp * stages
    t += costs.all_reduce_s(4, ranks, costs.link(hw, ranks))
    per_param = OPTIMIZER_BYTES_PER_PARAM + (0 if par.grad_reduce_in_fp32 else FP16_GRAD_STEP_BYTES_PER_PARAM)
    shards = optimizer_shards(par)
    expert_shards = max(1, shards // par.ep)  # the routed experts: sharded over their dp / ep replicas
    return t + costs.memory_s(per_param * ((params - expert_params) / shards + expert_params / expert_shards), hw)
