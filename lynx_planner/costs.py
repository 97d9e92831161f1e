"""Time of one kernel or one transfer on a given piece of hardware: efficiency by shape for compute (GEMM by its
dimensions, attention by its per-head work), a roofline for memory-bound kernels, ring formulas for links.

The GEMM model (one description per kind of hardware: `Hardware.gemm_half_dim`, `gemm_backward_efficiency`):
[m, k] @ [k, n] runs at  e = gemm_efficiency * q(m) q(n),  q(d) = d / (d + gemm_half_dim): the kernel tiles its
[m, n] output; a dimension much larger than a tile costs nothing, one near a tile's size leaves part of the tiles
(and of the last wave) idle; the output dimension that halves the efficiency on its own is gemm_half_dim. A short
reduction dimension k shows as the roofline: a GEMM is never faster than streaming its operands and result once. It
pays KERNEL_S to launch. Backward GEMMs (the input gradient dgrad
[m, n] @ [n, k] and the weight gradient wgrad [k, m] @ [m, n], each on its own shape) run at
gemm_backward_efficiency of that (transposed operand layouts; wgrad accumulating into fp32 main_grad).
Fused attention: efficiency grows with the work of one (batch, head) slice, F / (F + attention_half_flops).
Hardware files without these fields keep the old meaning: flat efficiency, backward = 2 x forward.
"""

from __future__ import annotations

from .schema import Hardware

ELEM = 2  # bytes of a bf16 GEMM operand
KERNEL_S = 4e-6  # launch and tail of one kernel, with the shape model only


def gemm_s(flops: float, hw: Hardware) -> float:
    """A large GEMM of `flops` FLOPs (the flat efficiency: no shape)."""
    return flops / (hw.peak_flops * hw.gemm_efficiency)


def shape_efficiency(m: int, k: int, n: int, hw: Hardware, batch: int = 1) -> float:
    """Achieved / peak FLOP/s of an [m, k] @ [k, n] GEMM, or of `batch` of them in one batched kernel: the batch's
    tiles fill the waves a small output dimension leaves idle, as if stacked along the smaller one."""
    d = hw.gemm_half_dim
    if d is None:
        return hw.gemm_efficiency
    small, large = sorted((m, n))
    small *= batch
    return hw.gemm_efficiency * (small / (small + d)) * (large / (large + d))


def _gemm_shape_s(m: int, k: int, n: int, hw: Hardware, batch: int = 1) -> float:
    t = 2.0 * batch * m * k * n / (hw.peak_flops * shape_efficiency(m, k, n, hw, batch))
    if hw.gemm_half_dim is None:
        return t
    return max(t, memory_s(ELEM * batch * (m * k + k * n + m * n), hw)) + KERNEL_S


def gemm_fwd_s(m: int, k: int, n: int, hw: Hardware, batch: int = 1) -> float:
    """[m, k] @ [k, n], or `batch` such products in one batched kernel (attention's q kᵀ and p v per head)."""
    return _gemm_shape_s(m, k, n, hw, batch)


def gemm_bwd_s(m: int, k: int, n: int, hw: Hardware, batch: int = 1) -> float:
    """Backward of [m, k] @ [k, n]: dgrad [m, n] @ [n, k] plus wgrad [k, m] @ [m, n] (per product of a batch: a
    batched GEMM's second operand has its own gradient per product, reduced over m only)."""
    if hw.gemm_half_dim is None and hw.gemm_backward_efficiency is None:
        return 2 * gemm_fwd_s(m, k, n, hw, batch)  # the old meaning, for hardware files without the shape model
    return (_gemm_shape_s(m, n, k, hw, batch) + _gemm_shape_s(k, m, n, hw, batch)) / (hw.gemm_backward_efficiency
                                                                                       or 1.0)


def attention_s(flops: float, hw: Hardware, per_head_flops: float | None = None) -> float:
    """A fused attention kernel of `flops` FLOPs whose (batch, head) slices do `per_head_flops` each: efficiency
    grows with the work of one slice (sequence squared times head size), on the same curve as GEMMs."""
    half = hw.attention_half_flops
    if half is None or per_head_flops is None:
        return flops / (hw.peak_flops * hw.attention_efficiency)
    return flops * (per_head_flops + half) / per_head_flops / (hw.peak_flops * hw.attention_efficiency)


def memory_s(nbytes: float, hw: Hardware) -> float:
    """A memory-bound kernel that reads and writes `nbytes` in all."""
    return nbytes / (hw.hbm_bytes_per_s * hw.memory_efficiency)


def link(hw: Hardware, ranks_spanned: int) -> tuple[float, float]:
    """(bus bandwidth, latency) of a group whose ranks span `ranks_spanned` consecutive GPUs."""
    if ranks_spanned <= hw.gpus_per_node:
        return hw.intra_node_bus_bytes_per_s, hw.intra_node_latency_s
    return hw.inter_node_bus_bytes_per_s, hw.inter_node_latency_s


def group_link(hw: Hardware, size: int, stride: int = 1) -> tuple[float, float]:
    """(bus bandwidth, latency) of a collective over `size` ranks `stride` apart (a data-parallel group in Megatron's
    order: ranks tp apart). Across nodes NCCL runs a ring per NIC, so a group with g GPUs on each node moves
    min(g, nics_per_node) times one NIC's bus bandwidth; with g > 1 its rings also cross the intra-node link, which
    then bounds it."""
    if size * stride <= hw.gpus_per_node:
        return link(hw, size * stride)
    per_node = min(size, max(1, hw.gpus_per_node // stride))
    rings = min(per_node, hw.nics_per_node or 1)
    if rings == 1:
        return hw.inter_node_bus_bytes_per_s, hw.inter_node_latency_s
    return min(hw.inter_node_bus_bytes_per_s * rings, hw.intra_node_bus_bytes_per_s), hw.inter_node_latency_s


def p2p_link(hw: Hardware, ranks_apart: int) -> tuple[float, float]:
    """(bandwidth, latency) of a send between two ranks `ranks_apart` apart: the measured point-to-point link where
    the hardware gives one and both ranks share a node, else the collective link of that span."""
    if ranks_apart < hw.gpus_per_node and hw.p2p_bytes_per_s is not None:
        return hw.p2p_bytes_per_s, hw.p2p_latency_s if hw.p2p_latency_s is not None else hw.intra_node_latency_s
    return link(hw, ranks_apart + 1)


def all_reduce_s(nbytes: float, n: int, bus: tuple[float, float]) -> float:
    """Ring all-reduce of an `nbytes` message over n ranks; bus bandwidth as nccl-tests reports it."""
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bus[0] + bus[1]


def all_gather_s(nbytes: float, n: int, bus: tuple[float, float]) -> float:
    """Ring all-gather (or reduce-scatter) whose gathered (or unreduced) tensor has `nbytes`."""
    if n == 1:
        return 0.0
    return (n - 1) / n * nbytes / bus[0] + bus[1]


def p2p_s(nbytes: float, bus: tuple[float, float]) -> float:
    return nbytes / bus[0] + bus[1]


def scatter_gather_send_s(nbytes: float, tp: int, bus: tuple[float, float], tp_bus: tuple[float, float]) -> float:
    """Megatron's pipeline send of an activation every TP rank holds whole (no sequence parallelism): each of the tp
    ranks sends its 1/tp share over its own link, the receivers all-gather it over the TP group
    (--scatter-gather-tensors-in-pipeline, on by default since 2021)."""
    if tp == 1:
        return p2p_s(nbytes, bus)
    return p2p_s(nbytes / tp, bus) + all_gather_s(nbytes, tp, tp_bus)


def all_to_all_s(nbytes: float, n: int, bus: tuple[float, float]) -> float:
    """All-to-all in which each of n ranks holds `nbytes` and keeps 1/n of it (nccl-tests alltoall busbw)."""
    if n == 1:
        return 0.0
    return (n - 1) / n * nbytes / bus[0] + bus[1]


def ep_all_to_all_s(nbytes: float, n: int, stride: int, hw: Hardware) -> float:
    """Expert-parallel dispatch or combine: an all-to-all over n ranks `stride` GPUs apart (EP ranks are tp apart in
    Megatron's order) in which each rank holds `nbytes`, keeps 1/n and sends 1/n to each peer (balanced routing).
    Peers on its own node are reached over the intra-node link, the others over the rank's NIC; the two parts are
    priced one after the other, so the time is the mix of the all-intra-node and all-inter-node prices weighted by
    the share of peers on the node (an EP 16 group over two 8-GPU nodes: 7 of 15 peers inside). docs/moe.md."""
    if n == 1:
        return 0.0
    per_node = max(1, min(n, hw.gpus_per_node // stride))  # the group's ranks on one node
    inside = (per_node - 1) / (n - 1)
    intra = all_to_all_s(nbytes, n, (hw.intra_node_bus_bytes_per_s, hw.intra_node_latency_s))
    if inside == 1:
        return intra
    inter = all_to_all_s(nbytes, n, (hw.inter_node_bus_bytes_per_s, hw.inter_node_latency_s))
    return inside * intra + (1 - inside) * inter
