"""Per parallel dimension, its memory and its collectives: ZeRO-1 (zero1.py: Megatron's distributed optimizer),
FSDP2 / ZeRO-3 / HSDP (fsdp.py) and context parallelism (cp.py). The timeline reads them through streams.py.

This package answers, for one parallel setup, the sharding questions every profile builder asks: the bytes one rank
holds per parameter of its layers, and over how many ranks the optimizer state is split."""

from __future__ import annotations

from ..schema import ParallelConfig
from . import cp, fsdp, zero1


def bytes_per_param(par: ParallelConfig) -> float:
    """Static bytes one rank holds per parameter of its (TP/EP-sharded) layers: weights, gradients, master weights
    and Adam state at the setup's sharding level (none, ZeRO-1, FSDP)."""
    if par.fsdp:
        return fsdp.bytes_per_param(par)
    return zero1.bytes_per_param(par)


def optimizer_shards(par: ParallelConfig) -> int:
    """Ranks the Adam step's parameters are split over (each rank steps 1/shards of its layers' parameters)."""
    if par.fsdp:
        return fsdp.shard_ranks(par)
    return zero1.optimizer_shards(par)


def grad_ranks(par: ParallelConfig) -> int:
    """Ranks that hold the same parameters and so reduce their gradients together: data parallelism, and context
    parallelism (each CP rank's gradients cover only its share of the sequence; Megatron's DP group with CP,
    torchtitan's dp_shard_cp mesh)."""
    return par.dp * par.cp


def torchtitan_settings(par: ParallelConfig) -> dict[str, int]:
    """torchtitan's [parallelism] degrees of the data-parallel and context-parallel dimensions. torchtitan has no
    ZeRO-1: a distributed-optimizer setup is exported as FSDP over dp (its closest), plain DP as replicas."""
    if par.fsdp:
        out = fsdp.torchtitan_settings(par)
    elif par.distributed_optimizer:
        out = {"data_parallel_shard_degree": par.dp}
    else:
        out = {"data_parallel_replicate_degree": par.dp, "data_parallel_shard_degree": 1}
    return out | cp.torchtitan_settings(par.cp)


def megatron_flags(par: ParallelConfig) -> tuple[list[str], list[str]]:
    """(Megatron-LM flags, notes on what they cannot express) for FSDP and context parallelism."""
    notes = []
    if par.fsdp and par.hsdp_shard_size:
        notes.append(f"HSDP (shard groups of {par.hsdp_shard_size} of the {par.dp} DP ranks) is not exported: these "
                     "flags shard over all DP ranks (Megatron FSDP's hybrid mode takes more than a flag)")
    if par.fsdp and not par.reshard_after_forward:
        notes.append("the profile keeps gathered parameters from forward to backward (reshard_after_forward false); "
                     "Megatron FSDP with optim_grads_params gathers them again for the backward")
    return fsdp.megatron_flags(par) + cp.megatron_flags(par.cp), notes


__all__ = ["bytes_per_param", "optimizer_shards", "grad_ranks", "torchtitan_settings", "megatron_flags", "cp", "fsdp",
           "zero1"]
