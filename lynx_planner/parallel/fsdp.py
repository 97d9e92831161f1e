"""FSDP2 (ZeRO-3) and HSDP: the memory and the per-layer collectives of parameters sharded over the data-parallel
group, as torchtitan runs FSDP2 (fully_shard per transformer block, the embedding, and the final norm with the output
layer; MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)). One profile layer is one FSDP unit.

Static bytes per parameter, sharded over the shard group (dp, or hsdp_shard_size, times cp: torchtitan shards over
its dp_shard_cp mesh): the fp32 sharded parameter, which is also the optimizer's master weight (4), its fp32 gradient
(4), Adam's m and v (8) = 16 / shard. (Megatron's mixed precision keeps a separate bf16 weight as well: 18; FSDP2's
bf16 copy exists only while a unit is gathered, below.)

Transient bytes (allocated per unit while it runs; counted with the static bytes since one set is alive at any time):
forward: the unit's gathered bf16 parameters and the next unit's, all-gathered ahead (FSDP2's implicit forward
prefetch: the copy-in of unit i+1 is issued while unit i computes); backward: the unit's and the next-lower unit's
(explicit backward prefetch) gathered parameters, the unit's unsharded bf16 gradient and its fp32 copy that the
reduce-scatter reads (reduce_dtype fp32): 2 + 2 + 2 + 4 bytes per parameter of a unit (a profile in plain fp32:
4 + 4 + 4, its gradient already fp32). With reshard_after_forward false every gathered unit of the rank stays from
its forward to its backward: 2 (fp32: 4) bytes per parameter of all of them.

Collectives per micro-batch (FSDP2 syncs gradients on every backward unless told not to; torchtitan does not):
all-gather of each unit's bf16 parameters before its forward and, resharded after forward, again before its
backward; reduce-scatter of its fp32 gradient after its backward over the shard group, and with HSDP an all-reduce
of the reduced shard across the replicas (dp / hsdp_shard_size groups).
"""

from __future__ import annotations

from .. import costs
from ..schema import ParallelConfig, Profile

PARAM_BYTES = 4  # fp32 sharded parameter = the optimizer's master weight
GRAD_BYTES = 4  # fp32 sharded gradient
ADAM_BYTES = 8  # m and v, fp32
GATHER_BYTES = 2  # bf16 parameters the all-gather moves (param_dtype)
REDUCE_BYTES = 4  # fp32 gradients the reduce-scatter moves (reduce_dtype)


def shard_size(par: ParallelConfig) -> int:
    """DP ranks of one shard group (HSDP: hsdp_shard_size; FSDP: all dp)."""
    return par.hsdp_shard_size or par.dp


def shard_ranks(par: ParallelConfig) -> int:
    """Ranks a parameter is sharded over: the shard group of DP ranks times the CP ranks."""
    return shard_size(par) * par.cp


def replicas(par: ParallelConfig) -> int:
    """Shard groups holding the same shards (HSDP); 1 under plain FSDP."""
    return par.dp // shard_size(par)


def bytes_per_param(par: ParallelConfig) -> float:
    return (PARAM_BYTES + GRAD_BYTES + ADAM_BYTES) / shard_ranks(par)


def gather_bytes(profile: Profile) -> int:
    """Bytes per parameter the all-gather moves: bf16 (param_dtype of the mixed-precision policy), or fp32 for a
    profile trained in fp32 without autocast (FSDP2 without a MixedPrecisionPolicy gathers the fp32 shards)."""
    return PARAM_BYTES if profile.dtype == "fp32" and profile.autocast is None else GATHER_BYTES


def unsharded_grad_bytes(profile: Profile) -> int:
    """Bytes per parameter of a unit's gradient before its reduce-scatter: autograd's gradient in the gathered
    parameters' dtype and, where that is not fp32, FSDP2's fp32 copy for the reduction."""
    g = gather_bytes(profile)
    return g + (REDUCE_BYTES if g != REDUCE_BYTES else 0)


def transient_bytes(profile: Profile, layers: list[int]) -> int:
    """Peak of the gathered parameters and unsharded gradients on a rank that holds `layers` (global indices, in
    order): the largest over its units of the forward's (this unit and the next gathered) and the backward's (this
    unit and the next lower gathered, this unit's bf16 gradient and fp32 reduce-scatter input); with
    reshard_after_forward false, all units stay gathered from forward to backward beside the backward's gradients."""
    par = profile.parallel
    if not par.fsdp or not layers:
        return 0
    n = [profile.layers[i].params for i in layers]
    g, gb = gather_bytes(profile), unsharded_grad_bytes(profile)
    grads = max(n) * gb
    if not par.reshard_after_forward:
        return g * sum(n) + grads
    nxt = [n[j + 1] if j + 1 < len(n) else 0 for j in range(len(n))]
    lower = [n[j - 1] if j > 0 else 0 for j in range(len(n))]
    fwd = max(g * (a + b) for a, b in zip(n, nxt))
    bwd = max(g * (a + b) + a * gb for a, b in zip(n, lower))
    return max(fwd, bwd)


def all_gather_s(params: int, par: ParallelConfig, shard_bus: tuple[float, float], nbytes: int = GATHER_BYTES
                 ) -> float:
    """All-gather of one unit's parameters (`nbytes` each: gather_bytes) over its shard group."""
    return costs.all_gather_s(nbytes * params, shard_ranks(par), shard_bus)


def reduce_scatter_s(params: int, par: ParallelConfig, shard_bus: tuple[float, float],
                     replica_bus: tuple[float, float]) -> float:
    """Reduce-scatter of one unit's fp32 gradient over its shard group, then (HSDP) the all-reduce of this rank's
    shard across the replicas."""
    t = costs.all_gather_s(REDUCE_BYTES * params, shard_ranks(par), shard_bus)
    return t + costs.all_reduce_s(REDUCE_BYTES * params / shard_ranks(par), replicas(par), replica_bus)


def gathers_in_backward(par: ParallelConfig) -> bool:
    """Resharded after forward, each unit is all-gathered again before its backward (and before a recomputation of
    it, which FSDP2 runs inside the unit's backward: the checkpointed forward finds the parameters gathered)."""
    return par.reshard_after_forward


def early_placements(par: ParallelConfig) -> tuple[str, ...]:
    """Recomputation placements whose parameters FSDP2 has gathered when they fire. Resharded after forward, a unit's
    parameters exist only from its backward all-gather on: `layer_above` (the recomputation runs in the wait for that
    all-gather and the prefetch of the unit below; in a communication-bound backward the two orders cost the same,
    docs/timeline.md) — not `grad_wait` or `prev_forward`, which would need a gather of their own. Kept gathered
    (reshard_after_forward false), every placement."""
    if not par.fsdp or not par.reshard_after_forward:
        return ("layer_above", "grad_wait", "prev_forward")
    return ("layer_above",)


def torchtitan_settings(par: ParallelConfig) -> dict[str, int]:
    """torchtitan's [parallelism] degrees for this setup (data_parallel_shard_degree times
    data_parallel_replicate_degree is dp; 1 replicate without HSDP)."""
    return {"data_parallel_shard_degree": shard_size(par), "data_parallel_replicate_degree": replicas(par)}


def megatron_flags(par: ParallelConfig) -> list[str]:
    """Megatron-LM (megatron-core 0.19) flags for this setup: Megatron FSDP (`--use-megatron-fsdp`, sharding strategy
    `optim_grads_params`: ZeRO-3). HSDP and keeping parameters gathered have no flag there (refused by the caller)."""
    if not par.fsdp:
        return []
    # Megatron FSDP turns on the distributed optimizer itself (and warns); said here, the flags say what runs
    return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
            "--use-distributed-optimizer"]
