"""Time of one kernel or one transfer on a given piece of hardware: roofline for compute, ring formulas for links."""

from __future__ import annotations

from .schema import Hardware


def gemm_s(flops: float, hw: Hardware) -> float:
    return flops / (hw.peak_flops * hw.gemm_efficiency)


def attention_s(flops: float, hw: Hardware) -> float:
    return flops / (hw.peak_flops * hw.attention_efficiency)


def memory_s(nbytes: float, hw: Hardware) -> float:
    """A memory-bound kernel that reads and writes `nbytes` in all."""
    return nbytes / (hw.hbm_bytes_per_s * hw.memory_efficiency)


def link(hw: Hardware, ranks_spanned: int) -> tuple[float, float]:
    """(bus bandwidth, latency) of a group whose ranks span `ranks_spanned` consecutive GPUs."""
    if ranks_spanned <= hw.gpus_per_node:
        return hw.intra_node_bus_bytes_per_s, hw.intra_node_latency_s
    return hw.inter_node_bus_bytes_per_s, hw.inter_node_latency_s


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


def all_to_all_s(nbytes: float, n: int, bus: tuple[float, float]) -> float:
    """All-to-all in which each of n ranks holds `nbytes` and keeps 1/n of it (nccl-tests alltoall busbw)."""
    if n == 1:
        return 0.0
    return (n - 1) / n * nbytes / bus[0] + bus[1]
