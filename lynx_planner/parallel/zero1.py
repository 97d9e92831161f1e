"""No sharding and ZeRO-1 (Megatron's distributed optimizer, --distributed-optimizer): the memory side. Mixed-
precision Adam as Megatron keeps it: a bf16 weight (2 bytes), an fp32 gradient (main_grad, 4), an fp32 master weight
and Adam's m and v (12). ZeRO-1 shards those 12 optimizer bytes over the gradient-reduction group; the weights and
gradients stay whole on every rank. (Its collectives, a reduce-scatter of the gradients and an all-gather of the
updated weights, are in simulator.reduce_gradients.)"""

from __future__ import annotations

from ..schema import ParallelConfig

WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 4, 12


def optimizer_shards(par: ParallelConfig) -> int:
    return par.dp * par.cp if par.distributed_optimizer else 1


def bytes_per_param(par: ParallelConfig) -> float:
    """18 bytes unsharded; 6 + 12 / (dp x cp) with the distributed optimizer (its group includes the CP ranks)."""
    if par.distributed_optimizer:
        return WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES / optimizer_shards(par)
    return WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES
