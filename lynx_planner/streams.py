"""The timeline's resources: the streams of one rank and the links its collectives and transfers use.

One rank runs these streams side by side (docs/timeline.md draws them):

  compute           the schedule's forward, backward and weight-gradient work, and exposed recomputation
  recompute (side)  Lynx's recomputation, released early, running while the compute stream waits (slowed by the
                    interference of the communication beside it)
  tp collective     tensor-parallel all-reduces / all-gathers / reduce-scatters inside a layer (and MoE all-to-alls)
  pp p2p            pipeline sends of activations and gradients between neighbouring stages
  dp collective     data-parallel gradient reduction at the iteration's end; FSDP's per-layer parameter
                    all-gathers and gradient reduce-scatters (parallel/fsdp.py)
  cp exchange       ring attention's K/V chunk exchange inside each attention (parallel/cp.py)
  copy engine       host <-> device copies of offloaded activations (offload.py: the link, its queues, host memory)

A profile measured on a CPU for a job lynx validate runs there (schema.LocalRuntime, profiler/runtime.py) adds what
that job's runtime costs besides the layers: a measured gloo send for the pp link (pp_link), per-item CPU of the
schedule, sends and loss (item_overhead_s), the gradient scaling (grad_scale_s), the communication threads' CPU
where it comes out of compute (collective_cpu_s), and the slowdown of every layer's compute by the other ranks
computing beside it on the shared caches and memory (compute_slowdown). Under FSDP, where it measured them, FSDP2's
collectives' wall time and its own training-thread work run in line on the compute stream (fsdp_in_line: a CPU has
no streams). Every other profile has none and its timeline is unchanged.

The compute stream waits on the others only where a layer's compute is shorter than the communication it needs:
those waits are the idle segments of a layer's forward and backward (LayerRun.fwd / .bwd), each named by the stream
it waits for, and they are where the side stream hides recomputation. This module says how long each wait is; the
simulator runs them and never asks which parallel dimension produced one.

Links: a collective's group is a set of ranks `stride` apart in the rank order, innermost first tp, cp, dp (the shard
groups of HSDP inside, the replicas outside), pp (Megatron's tp-cp-dp-pp; torchtitan's mesh [pp, dp_replicate,
dp_shard, cp, tp]). A group within a node runs on the intra-node link, one spanning nodes on the inter-node link
(costs.group_link: one ring per NIC where the group has several GPUs on each node).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import costs, placements
from .parallel import cp as cp_dim
from .parallel import fsdp
from .schema import Block, ParallelConfig, Profile

COMPUTE = "compute"
SIDE = "recompute (side)"
TP = "tp collective"
PP = "pp p2p"
DP = "dp collective"
CP = "cp exchange"
COPY = "copy engine"
STREAMS: tuple[str, ...] = (COMPUTE, SIDE, TP, PP, DP, CP, COPY)


@dataclass(frozen=True)
class Group:
    """A communication group of one rank: `size` ranks, `stride` ranks apart in the rank order."""

    name: str
    size: int
    stride: int
    stream: str
    p2p: bool = False  # sends between neighbours (a ring of p2p transfers), not a collective


def groups(par: ParallelConfig) -> dict[str, Group]:
    """The rank's groups, by name: tp, cp, dp (gradient reduction: dp x cp ranks hold the same parameters), and under
    FSDP its shard group and (HSDP) replica group."""
    shard = fsdp.shard_size(par) if par.fsdp else par.dp
    out = {"tp": Group("tp", par.tp, 1, TP), "cp": Group("cp", par.cp, par.tp, CP, p2p=True),
           "dp": Group("dp", par.dp * par.cp, par.tp, DP)}
    if par.fsdp:
        out["fsdp_shard"] = Group("fsdp_shard", shard * par.cp, par.tp, DP)
        out["fsdp_replicate"] = Group("fsdp_replicate", par.dp // shard, par.tp * par.cp * shard, DP)
    return out


def bus(profile: Profile, group: str) -> tuple[float, float]:
    """(bus bandwidth, latency) of one of the rank's groups, by where its ranks lie."""
    g, hw = groups(profile.parallel)[group], profile.hardware
    if g.p2p:  # a ring of sends: its slowest hop, over one NIC where the ring leaves the node
        if g.size * g.stride <= hw.gpus_per_node:
            return costs.p2p_link(hw, g.stride)
        return costs.link(hw, g.size * g.stride)
    return costs.group_link(hw, g.size, g.stride)


def pp_link(profile: Profile) -> tuple[float, float] | None:
    """(bandwidth, latency) of a pipeline send measured with the profile's job on this CPU (its LocalRuntime), or
    None: the hardware's links price it (simulator.p2p_bus)."""
    rt = profile.runtime
    if rt is None or rt.p2p_bytes_per_s is None:
        return None
    return rt.p2p_bytes_per_s, rt.p2p_latency_s or 0.0


def item_overhead_s(profile: Profile, rank: int) -> float:
    """Compute-stream seconds a pipeline rank spends per forward or backward item besides its chunk's layers (torch's
    schedule and stage, posting and waiting on the item's sends and receives, the loss on the last rank, and where
    no core is spare the communication threads): a measured CPU profile's LocalRuntime.item_s; 0 elsewhere."""
    rt = profile.runtime
    if rt is None or rank >= len(rt.item_s):
        return 0.0
    return rt.item_s[rank] + rt.comm_cpu_share * (rt.item_comm_s[rank] if rank < len(rt.item_comm_s) else 0.0)


def compute_slowdown(profile: Profile) -> float:
    """The factor every layer's compute (forward, backward, recomputation) takes on the compute stream because the
    job's other ranks compute beside it on the same CPU's caches and memory (the profile timed each block on one
    process alone): a measured CPU profile's LocalRuntime.compute_slowdown; 1 elsewhere."""
    rt = profile.runtime
    return rt.compute_slowdown if rt is not None else 1.0


def grad_scale_s(profile: Profile, params: int) -> float:
    """The pipeline schedule's gradient scaling by 1 / micro-batches at a rank's iteration end (torch's
    stage.scale_grads; Megatron folds it into the loss): a measured CPU profile's per-parameter CPU; 0 elsewhere."""
    rt = profile.runtime
    return rt.grad_scale_s_per_param * params if rt is not None else 0.0


def copy_link(profile: Profile):
    """The copy engine's link to host memory as one rank sees it (offload.rank_link: the NIC's share taken where it
    shares the link), or None where there is none."""
    from . import offload

    return offload.rank_link(profile)


def link_kind(profile: Profile, group: str) -> str:
    """'intra' or 'inter': whether the group stays within one node."""
    g = groups(profile.parallel)[group]
    return "intra" if g.size * g.stride <= profile.hardware.gpus_per_node else "inter"


# ------------------------------------------------------------------------------------------------ waits inside a block

def op_waits(profile: Profile, block: Block) -> tuple[tuple[str, float, float, str], ...]:
    """Waits a block's ops leave on the compute stream besides its TP collectives: (op id, forward seconds, backward
    seconds, stream), placed right after the op in forward and before it in backward. Context parallelism: ring
    attention's K/V exchange where it outlasts the blockwise attention beside it."""
    par = profile.parallel
    if par.cp == 1:
        return ()
    ids = {op.id: op for op in block.ops}
    out = []
    for op in block.ops:
        if "core_attn" in op.tags and op.kind == "compute" and len(op.inputs) >= 3:
            kv = sum(ids[i].out_bytes for i in op.inputs[1:3] if i in ids)
            f, b = cp_dim.exchange_exposed_s(par.cp, kv, op.fwd_s, op.bwd_s, bus(profile, "cp"))
            if f > 0 or b > 0:
                out.append((op.id, f, b, CP))
    return tuple(out)


def op_spans(profile: Profile, block: Block) -> tuple[tuple[str, str, str, float, float], ...]:
    """What the trace draws of a block's communication beside its compute, waited for or not: (stream, name, phase
    'F' or 'B', seconds from the layer's start in that phase, seconds). Context parallelism: each attention's whole
    ring exchange, from the attention's start (forward) or from its backward's start (backward)."""
    par = profile.parallel
    if par.cp == 1:
        return ()
    ops = [op for op in block.ops if not op.view]
    ids = {op.id: op for op in ops}
    waits = {w[0]: w for w in op_waits(profile, block)}
    out, t = [], 0.0
    for op in ops:  # forward offsets: every op and wait before the attention
        if "core_attn" in op.tags and op.kind == "compute" and len(op.inputs) >= 3:
            kv = sum(ids[i].out_bytes for i in op.inputs[1:3] if i in ids)
            f, _ = cp_dim.exchange_s(par.cp, kv, bus(profile, "cp"))
            out.append((CP, "K/V ring", "F", t, f))
        t += op.fwd_s + (waits[op.id][1] if op.id in waits else 0.0)
    t = 0.0
    for op in reversed(ops):
        t += waits[op.id][2] if op.id in waits else 0.0
        if "core_attn" in op.tags and op.kind == "compute" and len(op.inputs) >= 3:
            kv = sum(ids[i].out_bytes for i in op.inputs[1:3] if i in ids)
            _, b = cp_dim.exchange_s(par.cp, kv, bus(profile, "cp"))
            out.append((CP, "K/V + dK/dV ring", "B", t, b))
        t += op.bwd_s
    return tuple(out)


# ------------------------------------------------------------------------------------------- waits between layers

@dataclass(frozen=True)
class LayerWaits:
    """The DP stream's waits around one layer (FSDP): before its forward (its all-gather), before its backward (the
    top layer's all-gather, nothing to prefetch it behind) and after its backward (the next lower layer's all-gather
    and this layer's reduce-scatter, beyond this layer's backward)."""

    fwd_before: float = 0.0
    bwd_before: float = 0.0
    bwd_after: float = 0.0
    # compute-stream work FSDP2 adds to the layer (fsdp.copies_s): its all-gather's copy-out before the forward;
    # in backward the copy-out again and the gradient's copy into the reduce-scatter input
    fwd_copy: float = 0.0
    bwd_copy: float = 0.0
    rec_beside: float = 0.0  # on-demand recomputation of the layer that runs beside the DP stream's work: hidden
    spans: tuple[tuple[str, str, str, float, float], ...] = ()  # for the trace: as op_spans, this layer's collectives


def layer_waits(profile: Profile, layers: list[int], fwd_s: list[float], bwd_s: list[float],
                on_demand_s: list[float] | None = None) -> list[LayerWaits]:
    """Per layer of a chunk (global indices `layers`, bottom up, with each layer's forward and backward seconds on
    the compute stream), the steady-state waits FSDP2's prefetching leaves: forward, layer i's all-gather runs beside
    layer i-1's forward (implicit prefetch), so i waits max(0, AG_i - F_{i-1}); the chunk's lowest layer waits its
    whole all-gather. Backward (explicit prefetch of one unit), layer i's backward (its on-demand recomputation
    included: FSDP2 runs a checkpointed unit's forward inside its backward, the parameters already gathered) runs
    beside the all-gather of layer i-1 and the reduce-scatter of layer i: the compute stream waits
    max(0, AG_{i-1} + RS_i - B_i) after it; what of that its on-demand recomputation fills is hidden (rec_beside). The
    chunk's top layer waits its whole backward all-gather; the lowest
    layer's reduce-scatter overlaps what follows (the iteration's last one is in simulator.reduce_gradients)."""
    par = profile.parallel
    if not par.fsdp:
        return [LayerWaits() for _ in layers]
    if fsdp_in_line(profile):
        return _in_line_waits(profile, layers)
    shard, rep = bus(profile, "fsdp_shard"), bus(profile, "fsdp_replicate")
    params = [profile.layers[i].params for i in layers]
    ag = [fsdp.all_gather_s(n, par, shard, fsdp.gather_bytes(profile)) for n in params]
    rs = [fsdp.reduce_scatter_s(n, par, shard, rep) for n in params]
    regather = fsdp.gathers_in_backward(par)
    stolen = collective_steal_s(profile, params)
    rec = on_demand_s or [0.0] * len(layers)
    out = []
    for j in range(len(layers)):
        f_steal, b_steal = stolen[j]
        before = ag[j] if j == 0 else max(0.0, ag[j] - fwd_s[j - 1] - f_steal)
        bwd_before = ag[j] if regather and j == len(layers) - 1 else 0.0
        comm = 0.0 if j == 0 else max(0.0, (ag[j - 1] if regather else 0.0) + rs[j] - bwd_s[j] - b_steal)
        # the trace's spans: this layer's all-gather ending as its forward compute starts (after the wait); in
        # backward, the next lower layer's all-gather from its start (resharded), then this layer's reduce-scatter
        # once its compute ends (the wait after it, if any, is these outlasting it)
        spans = [(DP, f"all-gather L{layers[j]}", "F", before - ag[j], ag[j])]
        if j > 0 and regather:
            spans.append((DP, f"all-gather L{layers[j - 1]}", "B", 0.0, ag[j - 1]))
        end = bwd_before + bwd_s[j] + rec[j]
        spans.append((DP, f"reduce-scatter L{layers[j]}", "B", max(end, ag[j - 1] if j > 0 and regather else 0.0),
                      rs[j]))
        fc, bc = fsdp.copies_s(profile, params[j])
        out.append(LayerWaits(before, bwd_before, max(0.0, comm - rec[j]), rec_beside=min(rec[j], comm),
                              spans=tuple(spans), fwd_copy=fc + f_steal, bwd_copy=bc + b_steal))
    return out


def fsdp_in_line(profile: Profile) -> bool:
    """Whether FSDP runs in line on the training thread: an FSDP job on this CPU whose profile measured its
    collectives' wall time and FSDP2's own training-thread work (LocalRuntime). A CPU has no streams: FSDP2 calls
    every all-gather and reduce-scatter synchronously (unshard_async_op False; its "prefetch" runs in line) and its
    copies, hooks and allocations on the same thread, so nothing overlaps them. Every other profile (a GPU's, a
    catalog's, a CPU profile measured before these terms) keeps the streams above."""
    rt = profile.runtime
    return profile.parallel.fsdp and rt is not None and rt.all_gather_wall is not None \
        and rt.reduce_scatter_wall is not None and rt.fsdp_forward is not None and rt.fsdp_backward is not None


def _line(cost: tuple[float, float], size: float) -> float:
    return cost[0] + cost[1] * size


def in_line_s(profile: Profile, params: list[int]) -> list[tuple[float, float, float, float]]:
    """Per layer (its `params`), in line on a CPU (fsdp_in_line): (FSDP2's training-thread CPU in its forward, the
    same in its backward, the wall time of its all-gather, of its reduce-scatter). The collectives move the
    parameters' own dtype (validate's job runs FSDP2 without a mixed-precision policy: gather and reduce in the
    weights' dtype, gather_bytes). Resharded after forward, the backward's part includes the unit's second gather;
    kept gathered, the forward's part (one gather) comes off it."""
    rt, g = profile.runtime, fsdp.gather_bytes(profile)
    regather = fsdp.gathers_in_backward(profile.parallel)
    out = []
    for n in params:
        f, b = _line(rt.fsdp_forward, n), _line(rt.fsdp_backward, n)
        out.append((f, b if regather else max(0.0, b - f), _line(rt.all_gather_wall, g * n),
                    _line(rt.reduce_scatter_wall, g * n)))
    return out


def _in_line_waits(profile: Profile, layers: list[int]) -> list[LayerWaits]:
    """layer_waits in line (fsdp_in_line): each layer's forward runs its all-gather and FSDP2's work before its
    compute; its backward the top layer's gather, the next lower layer's (the explicit backward prefetch, run in
    line), its reduce-scatter and FSDP2's work. All of it is compute-stream time (busy: the training thread is
    blocked in it, so no recomputation hides there) — the lowest layer's reduce-scatter too, every micro-batch
    (grad_sync_s leaves it out)."""
    costs_ = in_line_s(profile, [profile.layers[i].params for i in layers])
    regather = fsdp.gathers_in_backward(profile.parallel)
    out = []
    for j in range(len(layers)):
        f_thread, b_thread, ag, rs = costs_[j]
        top = ag if regather and j == len(layers) - 1 else 0.0
        below = costs_[j - 1][2] if regather and j > 0 else 0.0
        spans = [(DP, f"all-gather L{layers[j]}", "F", 0.0, ag)]
        if top:
            spans.append((DP, f"all-gather L{layers[j]}", "B", 0.0, top))
        if below:
            spans.append((DP, f"all-gather L{layers[j - 1]}", "B", top, below))
        spans.append((DP, f"reduce-scatter L{layers[j]}", "B", top + below, rs))
        out.append(LayerWaits(fwd_copy=f_thread + ag, bwd_copy=b_thread + top + below + rs, spans=tuple(spans)))
    return out


def not_training_thread_s(profile: Profile, params: list[int]) -> list[tuple[float, float]]:
    """Per layer (its `params`), the compute-stream seconds of its forward and backward that are not its training
    thread's CPU (what validate's measured forward and backward leave out): the communication threads' CPU taken
    from compute (collective_steal_s) or, in line, the collectives' wall (the thread waits, using no CPU)."""
    if not fsdp_in_line(profile):
        return collective_steal_s(profile, params)
    costs_ = in_line_s(profile, params)
    regather = fsdp.gathers_in_backward(profile.parallel)
    out = []
    for j, (_, _, ag, rs) in enumerate(costs_):
        top = ag if regather and j == len(params) - 1 else 0.0
        below = costs_[j - 1][2] if regather and j > 0 else 0.0
        out.append((ag, top + below + rs))
    return out


def collective_steal_s(profile: Profile, params: list[int]) -> list[tuple[float, float]]:
    """Per layer of a chunk (its `params`, bottom up), the compute-stream seconds FSDP's collectives take from its
    forward and its backward where their communication threads share the ranks' cores (collective_cpu_s): the
    all-gather of layer j runs beside layer j-1's forward (the lowest layer's is waited for whole: nothing beside it);
    the next lower layer's all-gather and layer j's reduce-scatter beside layer j's backward. Zeros elsewhere."""
    ag, rs = collective_cpu_s(profile, params)
    regather = fsdp.gathers_in_backward(profile.parallel)
    return [(ag[j] if j > 0 else 0.0, (ag[j - 1] if j > 0 and regather else 0.0) + rs[j]) for j in range(len(params))]


def collective_cpu_s(profile: Profile, params: list[int]) -> tuple[list[float], list[float]]:
    """Per layer (its `params`), the compute-stream seconds FSDP's all-gather and reduce-scatter of it take where
    their communication threads run on the cores the ranks compute on (a measured CPU profile's LocalRuntime: the
    threads' CPU per byte, times comm_cpu_share); zeros elsewhere (a GPU's collectives run beside its compute)."""
    rt = profile.runtime
    if rt is None or not rt.comm_cpu_share:
        return [0.0] * len(params), [0.0] * len(params)
    g = fsdp.gather_bytes(profile)
    return ([rt.comm_cpu_share * rt.all_gather_cpu_s_per_byte * g * n for n in params],
            [rt.comm_cpu_share * rt.reduce_scatter_cpu_s_per_byte * fsdp.REDUCE_BYTES * n for n in params])


def grad_sync_s(profile: Profile, params: list[int], experts: list[int] | None = None,
                bottom_first: bool = True) -> list[float]:
    """The DP stream's gradient reduction at the iteration's end, per layer of a rank (bottom up): an all-reduce (a
    reduce-scatter with the distributed optimizer) over the dp x cp ranks, a layer's routed experts (`experts`, of its
    `params`) over their dp x cp / ep replicas only; under FSDP only the lowest layer's reduce-scatter is left (the
    others ran in the backward's waits, layer_waits)."""
    par = profile.parallel
    if par.fsdp:
        if fsdp_in_line(profile):  # every reduce-scatter ran in line in the backward (layer_waits)
            return [0.0] * len(params)
        shard, rep = bus(profile, "fsdp_shard"), bus(profile, "fsdp_replicate")
        return [fsdp.reduce_scatter_s(n, par, shard, rep) if j == 0 else 0.0 for j, n in enumerate(params)]
    from .simulator import grad_bytes  # the gradient element size (fp32 main grads, or 16-bit)

    b, n, g = bus(profile, "dp"), par.dp * par.cp, grad_bytes(profile)
    eb, en = costs.group_link(profile.hardware, n // par.ep, par.tp * par.ep), n // par.ep  # ranks tp x ep apart
    per = costs.all_gather_s if par.distributed_optimizer else costs.all_reduce_s
    return [per(g * (p - e), n, b) + (per(g * e, en, eb) if e else 0.0)
            for p, e in zip(params, experts or [0] * len(params))]


# --------------------------------------------------------------------------------------------------- placements

def legal_placements(profile: Profile, s: int) -> tuple[str, ...]:
    """Recomputation placements that fire on virtual stage s (placements.py) and find what they need: under FSDP
    resharding after forward, only those whose parameters are gathered when they run (parallel/fsdp.py)."""
    par = profile.parallel
    legal = placements.legal_placements(par.schedule, par.pp, s, par.num_microbatches, par.virtual_stages)
    allowed = fsdp.early_placements(par)
    return tuple(at for at in legal if at == "on_demand" or at in allowed)


def describe(profile: Profile) -> list[tuple[str, str, int, int, str]]:
    """(group, stream, size, stride, link) of each of the rank's groups larger than one rank: for docs and reports."""
    return [(g.name, g.stream, g.size, g.stride, link_kind(profile, name))
            for name, g in groups(profile.parallel).items() if g.size > 1]
