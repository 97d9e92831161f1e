"""Activation offload: the host link of a rank and its copy engine, the arithmetic the simulator and the searches share.

An offloaded tensor is one a layer keeps for its backward (LayerPolicy.offload: kept ops, or 'input'); it is
produced on the device and so counts there from the layer's forward on. When the layer's forward ends, its copy to
pinned host memory is queued on the device-to-host copy engine; the device bytes are freed when that copy ends. When the
layer's reload fires (LayerPolicy.reload: backward entering the layer above, or the start of the micro-batch's backward
on the stage), a device buffer is allocated and the copy back is queued on the host-to-device engine; the layer's
backward waits for it (a late copy stalls the compute stream: exposed, while the side stream may recompute). Copies of
one direction run one at a time in the order they were queued (a PCIe or C2C link is full duplex: the two directions run
side by side). Host memory holds a tensor from the start of its copy out to the end of its copy back: a second limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .schema import BLOCK_INPUT, Hardware, Profile

# The fixed cost of one host copy where the hardware gives none: DualPath (Wu et al., arXiv 2602.21548, 2026, section
# 5.2) measures 5-7 us per cudaMemcpyAsync submission; `lynx hardware calibrate` measures it (a 4 KiB copy's time).
COPY_LATENCY_S = 6e-6

MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act", "layer_input")


@dataclass(frozen=True)
class Link:
    """One rank's host link: copy bandwidth per direction, and the pinned host memory it may fill."""

    kind: str
    d2h_bytes_per_s: float
    h2d_bytes_per_s: float
    pinned_bytes: int
    shared_with_nic: bool = False
    latency_s: float = 0.0  # fixed cost of each copy (one cudaMemcpyAsync), beside its bytes over the bandwidth


def host_link(hw: Hardware) -> Link | None:
    """The hardware's host link: its own fields (a calibrated or hand-written file), else the catalog's entry for its
    name (models/hardware.py HOST_LINKS); None where there is none (a CPU rank has nothing to offload to)."""
    from .models.hardware import HOST_LINKS

    if hw.device == "cpu" or hw.host_link == "none":
        return None
    cat = HOST_LINKS.get(hw.name)
    d2h = hw.host_d2h_bytes_per_s or (cat.d2h if cat else None)
    h2d = hw.host_h2d_bytes_per_s or (cat.h2d if cat else None)
    if d2h is None or h2d is None:
        return None
    pinned = hw.pinned_host_bytes if hw.pinned_host_bytes is not None else (cat.pinned_bytes if cat else 0)
    shared = hw.host_link_shared_with_nic if hw.host_link_shared_with_nic is not None else \
        (cat.shared_with_nic if cat else False)
    latency = hw.host_copy_latency_s if hw.host_copy_latency_s is not None else \
        (cat.latency_s if cat else COPY_LATENCY_S)
    return Link(hw.host_link or (cat.kind if cat else "unknown"), d2h, h2d, pinned, shared, latency)


def nic_share_bytes_per_s(profile: Profile) -> float:
    """Bandwidth the NIC takes from a host link it shares (GPUDirect RDMA over the same x16 port), where the rank's
    groups leave the node: the inter-node bus bandwidth one GPU drives (one NIC's share)."""
    from . import streams

    hw = profile.hardware
    if not any(kind == "inter" for *_, kind in streams.describe(profile)):
        return 0.0
    nics = hw.nics_per_node or 1
    return hw.inter_node_bus_bytes_per_s * min(1.0, nics / hw.gpus_per_node)


def rank_link(profile: Profile) -> Link | None:
    """The host link as one rank of this setup sees it: a NIC sharing it takes its share (at most half the link)."""
    link = host_link(profile.hardware)
    if link is None or not link.shared_with_nic:
        return link
    nic = nic_share_bytes_per_s(profile)
    if nic == 0:
        return link
    return Link(link.kind, max(link.d2h_bytes_per_s / 2, link.d2h_bytes_per_s - nic),
                max(link.h2d_bytes_per_s / 2, link.h2d_bytes_per_s - nic), link.pinned_bytes, True, link.latency_s)


def offloaded_bytes(block, offload: list[str] | tuple[str, ...]) -> int:
    """Bytes a layer of `block` offloads per micro-batch: each named kept op's held bytes ('input': the block input)."""
    from . import policy

    info = policy.analyse(block)
    return sum(block.input_bytes if o == BLOCK_INPUT else info.unit_bytes[o] for o in offload)


# --------------------------------------------------------------------------------------------------- the copy engine

@dataclass
class CopyEngine:
    """One rank's two copy queues and its host memory timeline (the simulator drives it in each rank's time order)."""

    link: Link
    d2h_free: float = 0.0  # when each direction's queue is next free
    h2d_free: float = 0.0
    busy_d2h: float = 0.0
    busy_h2d: float = 0.0
    host: list[tuple[float, int]] = field(default_factory=list)  # (time, host bytes delta)
    sent: dict = field(default_factory=dict)  # key -> (bytes, when its copy out ends)
    fetched: dict = field(default_factory=dict)  # key -> when its copy back ends

    def send(self, key, t: float, nbytes: int, copies: int = 1) -> tuple[float, float]:
        """Queue the copy out of `nbytes` produced at t, in `copies` transfers (one per tensor, each paying the
        link's fixed latency): (start, end)."""
        start = max(t, self.d2h_free)
        dt = copies * self.link.latency_s + nbytes / self.link.d2h_bytes_per_s
        self.d2h_free, self.busy_d2h = start + dt, self.busy_d2h + dt
        self.host.append((start, nbytes))
        self.sent[key] = (nbytes, start + dt, copies)
        return start, start + dt

    def fetch(self, key, t: float) -> tuple[float, float] | None:
        """Queue the copy back of `key` at t (after its copy out ended): (start, end); None if already fetched."""
        if key in self.fetched or key not in self.sent:
            return None
        nbytes, out_end, copies = self.sent[key]
        start = max(t, self.h2d_free, out_end)
        dt = copies * self.link.latency_s + nbytes / self.link.h2d_bytes_per_s
        self.h2d_free, self.busy_h2d = start + dt, self.busy_h2d + dt
        self.host.append((start + dt, -nbytes))
        self.fetched[key] = start + dt
        return start, start + dt

    def host_peak(self) -> int:
        level = peak = 0
        for _, d in sorted(self.host, key=lambda e: (e[0], e[1])):  # frees first at equal times
            level += d
            peak = max(peak, level)
        return peak

    @property
    def busy_s(self) -> float:
        return max(self.busy_d2h, self.busy_h2d)


def policy_problem(profile: Profile, info, pol) -> str | None:
    """Why a layer policy's offload is not executable, or None: it offloads kept tensors (or the block input) once
    each, not in a Megatron uniform chunk (whose input the layer below regenerates), on hardware with a host link."""
    if not pol.offload:
        return None
    if host_link(profile.hardware) is None:
        return (f"offloads {pol.offload[0]!r}, but {profile.hardware.name} has no host link to offload to (set "
                "host_link and host_*_bytes_per_s in the hardware file, or run `lynx hardware calibrate`)")
    if len(set(pol.offload)) != len(pol.offload):
        return "offload lists an op twice"
    if pol.recompute_with is not None:
        return "a uniform chunk layer recomputes from the chunk input and keeps nothing to offload"
    kept = set(pol.keep) - set(pol.recompute)
    bad = [o for o in pol.offload if o != BLOCK_INPUT and o not in kept]
    if bad:
        return f"offload names ops that are not kept (only kept tensors can be offloaded): {', '.join(bad[:3])}"
    empty = [o for o in pol.offload if o != BLOCK_INPUT and info.unit_bytes.get(o, 0) == 0]
    if empty:
        return f"offload names ops that keep no bytes: {', '.join(empty[:3])}"
    return None


# ------------------------------------------------------------------------- Megatron's offload and recompute modules

# Megatron-core's fine-grained offloading modules (docs/user-guide/features/fine_grained_activation_offloading.md:
# attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act) and layer_input (the layer's input,
# with full recomputation), matched by the last part of an op's module path in the families lynx builds (GPT, Hugging
# Face Llama/Mistral/Qwen/Mixtral, torchtitan) or, for core attention, by its tag.
_PATHS = {
    "attn_norm": ("ln1", "input_layernorm", "attention_norm", "ln_1", "norm1"),
    "qkv_linear": ("qkv", "q_proj", "k_proj", "v_proj", "wq", "wk", "wv", "c_attn", "query_key_value",
                   "kv_a_proj_with_mqa", "q_a_proj", "q_b_proj", "kv_b_proj"),
    "attn_proj": ("proj", "o_proj", "wo", "dense"),
    "mlp_norm": ("ln2", "post_attention_layernorm", "ffn_norm", "ln_2", "norm2"),
}
_GEMMS = ("mm", "bmm", "addmm", "linear", "_grouped_mm")


def _path(op_id: str) -> list[str]:
    return op_id.split(":")[0].split(".")


def in_module(op, name: str) -> bool:
    """Whether an op belongs to one of Megatron's offload modules."""
    path = _path(op.id)
    if name == "core_attn":
        return "core_attn" in op.tags
    if name in ("attn_proj", "qkv_linear") and "core_attn" in op.tags:
        return False
    if name == "moe_act":
        return "experts" in path and path[-1] in ("act_fn", "act", "activation_func")
    if name == "expert_fc1":
        aten = op.id.split(":")[-1].split("#")[0]
        return "experts" in path and aten in _GEMMS and not any(p in ("w2", "down_proj", "fc2") for p in path)
    paths = _PATHS.get(name, ())
    if name == "attn_proj":  # a projection under the attention module
        return bool(path) and path[-1] in paths and any(p.startswith(("attn", "self_attn", "attention")) for p in path)
    return bool(path) and path[-1] in paths


def module_units(block, names) -> tuple[list[str], bool]:
    """(the saved units that the ops of Megatron's modules `names` record for their backward, in op order; whether
    the block input is among them, or layer_input is named)."""
    from . import policy

    info = policy.analyse(block)
    ops = [op for op in block.ops if not op.view and any(in_module(op, n) for n in names)]
    units, takes_input = set(), "layer_input" in names
    for op in ops:
        for ref in op.saves:
            b = info.base.get(ref, ref)
            if b == BLOCK_INPUT:
                takes_input = True
            elif b in info.keepable:
                units.add(b)
        if op.aux_bytes and op.id in info.keepable:
            units.add(op.id)
    return sorted(units, key=info.order.__getitem__), takes_input


def module_ops(block, names) -> set[str]:
    """Ids of the ops of Megatron's modules `names` (its fine-grained recompute modules: layernorm, moe_act)."""
    return {op.id for op in block.ops if not op.view and any(in_module(op, n) for n in names)}


def summary_line(stages, iteration_s: float) -> str:
    """One line for plan and simulate: offloaded bytes per micro-batch, link utilisation, stalls, host memory."""
    worst = max(stages, key=lambda p: p.offloaded_bytes)
    util = max(p.link_busy_s for p in stages) / iteration_s if iteration_s > 0 else 0.0
    stall = max(p.offload_stall_s for p in stages)
    host = max(p.host_peak_bytes for p in stages)
    from .io import format_bytes

    return (f"offload: {format_bytes(worst.offloaded_bytes)} per micro-batch (stage {worst.stage}), host link busy "
            f"{util:.0%} of the iteration, backward stalls {stall * 1e3:.1f} ms, host memory {format_bytes(host)}")


# ------------------------------------------------------------------------------------------------- measuring the link

def measure_link(repeats: int = 10, nbytes: int = 256 << 20) -> dict | None:
    """On a CUDA device: pinned device-to-host and host-to-device copy bandwidth (medians of `repeats` copies of
    `nbytes`, timed with CUDA events) and the fixed cost of one copy (the median time of a 4 KiB copy, both ways), as
    Hardware fields; None on a machine without CUDA (nothing to offload to)."""
    import statistics

    import torch

    if not torch.cuda.is_available():
        return None
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    stream = torch.cuda.Stream()

    def seconds(dst, src) -> float:
        times = []
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)  # warm-up
            for _ in range(repeats):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(stream)
                dst.copy_(src, non_blocking=True)
                b.record(stream)
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
        return statistics.median(times)

    d2h, h2d = nbytes / seconds(host, dev), nbytes / seconds(dev, host)
    small = 4096
    latency = min(seconds(host[:small], dev[:small]), seconds(dev[:small], host[:small]))
    return {"host_d2h_bytes_per_s": float(f"{d2h:.4g}"), "host_h2d_bytes_per_s": float(f"{h2d:.4g}"),
            "host_copy_latency_s": float(f"{latency:.3g}")}


# ------------------------------------------------------------------------------------------------------------ export

_RECOMPUTE_MODULES = {"layernorm": ("attn_norm", "mlp_norm"), "core_attn": ("core_attn",), "moe_act": ("moe_act",)}


def nearest_modules(plan, profile: Profile) -> tuple[list[str], list[str]]:
    """(Megatron offload modules, fine-grained recompute modules) nearest to the plan: a module is offloaded where the
    plan offloads at least half of the bytes it saves, in most of the layers of the repeated block that offload;
    recomputed where those layers recompute all its ops."""
    from collections import Counter

    from .solvers.partition import repeated_block

    rep = repeated_block(profile)
    pols = [(p, p.layers[1] - p.layers[0]) for st in plan.stages for p in st.policies if p.block == rep and p.offload]
    layers = sum(n for _, n in pols)
    if not layers:
        return [], []
    block = profile.blocks[rep]
    from . import policy

    info = policy.analyse(block)
    off_votes, rec_votes = Counter(), Counter()
    for p, n in pols:
        off = set(p.offload)
        for m in MODULES:
            units, takes_input = module_units(block, [m])
            total = sum(info.unit_bytes[u] for u in units) + (block.input_bytes if takes_input else 0)
            sent = sum(info.unit_bytes[u] for u in units if u in off) + \
                (block.input_bytes if takes_input and BLOCK_INPUT in off else 0)
            if total and 2 * sent >= total:
                off_votes[m] += n
        rec = set(p.recompute)
        for name, mods in _RECOMPUTE_MODULES.items():
            ops = module_ops(block, mods)
            if ops and ops <= rec:
                rec_votes[name] += n
    return ([m for m in MODULES if 2 * off_votes[m] > layers and m != "layer_input"],
            [m for m in _RECOMPUTE_MODULES if 2 * rec_votes[m] > layers])


def megatron_choice(plan, profile: Profile, bounds: list[int], limit: int) -> dict | None:
    """Megatron's fine-grained offloading nearest to the plan (None where the plan offloads nothing), simulated: the
    fields of export.MegatronChoice."""
    if not any(p.offload for st in plan.stages for p in st.policies):
        return None
    from . import evaluate as ev
    from .solvers.offload import megatron_offload
    from .solvers.partition import repeated_block

    offl, rec = nearest_modules(plan, profile)
    if not offl:
        return None
    rep = repeated_block(profile)
    recompute = tuple(m for name in rec for m in _RECOMPUTE_MODULES[name])
    pols = [megatron_offload(profile, i, tuple(offl), recompute) if profile.layers[i].block == rep
            else ev.none_policy(profile, i) for i in range(len(profile.layers))]
    e = ev.evaluate(profile, ev.stage_plans(profile, bounds, pols), ideal=False)
    flags = ["--fine-grained-activation-offloading", "--offload-modules " + " ".join(offl)]
    if rec:
        flags += ["--recompute-granularity selective", "--recompute-modules " + " ".join(rec)]
    return {"name": "offload " + ",".join(offl), "flags": flags, "iteration_time_s": e.predicted.iteration_time_s,
            "peak_memory_bytes": e.peak_bytes, "fits": e.fits(limit)}


def export_notes(plan, profile: Profile, to: str = "megatron") -> list[str]:
    """What of the plan's offload the target cannot express."""
    pols = [p for st in plan.stages for p in st.policies]
    offl = [p for p in pols if p.offload]
    if not offl:
        return []
    if to == "torchtitan":
        return ["the plan offloads activations to host memory: torchtitan 0.3 offloads only parameters, gradients "
                "and optimizer state (--training.enable_cpu_offload, FSDP's CPUOffloadPolicy), not activations; the "
                "lynx hook (apply_plan) runs the plan's offload"]
    notes = []
    n_off = sum(p.layers[1] - p.layers[0] for p in offl)
    n_all = sum(p.layers[1] - p.layers[0] for p in pols)
    if n_off < n_all:
        notes.append(f"the plan offloads in {n_off} of {n_all} layers; Megatron offloads its modules in every layer")
    if any(p.reload == "grad_wait" for p in offl):
        notes.append("the plan reloads some layers at the start of the backward; Megatron prefetches one layer ahead")
    return notes
