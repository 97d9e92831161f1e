"""FSDP2 (ZeRO-3) and HSDP: the memory and the per-layer collectives of parameters sharded over the data-parallel
group, as torchtitan runs FSDP2 (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)).

Units (`units`), as torchtitan 0.3 wraps them (torchtitan/distributed/fsdp.py, apply_fsdp): one per profile layer
(the embedding, each transformer block), with the profile's reshard_after_forward, except the final norm and the output
layer, one unit [norm, output] that is never resharded after forward ("As an optimization, do not
reshard_after_forward the last layers by default since FSDP would prefetch them immediately"; resharded only under
torchtitan's "always", which lynx does not offer). The root unit (fully_shard(model)) is left without parameters. The
[norm, output] pair is found by the layers' roles (exports/layout.py: a profile whose names follow no convention and
end in no norm and output layer, e.g. a plain stack of layers, has one unit per layer: as validate_fsdp.py and a
per-layer wrapping run it). A tied embedding's unit (torchtitan: [embedding, norm, output]) is not modelled.

Static bytes per parameter, sharded over the shard group (dp, or hsdp_shard_size, times cp: torchtitan shards over
its dp_shard_cp mesh): the fp32 sharded parameter, which is also the optimizer's master weight (4), its fp32 gradient
(4), Adam's m and v (8) = 16 / shard. (Megatron's mixed precision keeps a separate bf16 weight as well: 18; FSDP2's
bf16 copy exists only while a unit is gathered, below.)

Transient bytes (allocated per unit while it runs; counted with the static bytes since one set is alive at any time),
as torch's FSDP2 allocates them (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, _fsdp_param_group.py):
an all-gather writes into a flat output buffer of the whole unit (all_gather_output), which is copied out into the
unit's unsharded parameters and then freed; a unit's backward makes autograd's unsharded gradient (the gathered
dtype), and its post-backward reshards the parameters, copies the gradient into a flat reduce-scatter input of the
whole unit in reduce_dtype (allocated even where the dtypes match) and frees the gradient. That input is held after
the collective until the next unit's post-backward (comm_ctx.reduce_scatter_states, one buffer by default), and the
root frees the last one when the backward ends. So, with g bytes per gathered parameter (bf16 2; a plain fp32
profile 4) and r = 4 (fp32 reduce):
  forward of unit i: its parameters and the next unit's all-gather output and copy-out target (the implicit
  prefetch): g n_i + 2 g n_(i+1);
  backward of unit i: the unit below's all-gather output (explicit backward prefetch), its own parameters and
  gradient, beside the unit above's held reduce-scatter input; then, resharded, its gradient (alive until its
  reduction ends: measured, tests/test_runtime_fsdp.py) beside its own reduce-scatter input and output (the shard,
  over the S shard ranks): g n_(i-1) + max(2 g n_i + r n_(i+1), g n_i + r n_i + r n_i / S).
A unit not resharded after forward stays gathered from its forward to its backward (g per parameter, counted as held
throughout: at the start of the backward, where the peak falls, all of them are) and no gather runs in its backward
(nor is it prefetched there); with reshard_after_forward false for all: g sum(n) + max_i max(g n_i + r n_(i+1),
g n_i + r n_i + r n_i / S).
Of these, the unsharded parameters are storages FSDP2 resizes in place (not new tensors); the all-gather outputs,
gradients and reduce-scatter inputs are new tensors each iteration (`new_storage_bytes`: what validate's live-bytes
probe sees beside the activations).

Collectives per micro-batch (FSDP2 syncs gradients on every backward unless told not to; torchtitan does not):
all-gather of each unit's bf16 parameters before its forward and, resharded after forward, again before its
backward; reduce-scatter of its fp32 gradient after its backward over the shard group, and with HSDP an all-reduce
of the reduced shard across the replicas (dp / hsdp_shard_size groups). Copies on the compute stream: each
all-gather's copy-out into the unit's parameters and the gradient's copy into the reduce-scatter input (copies_s).
"""

from __future__ import annotations

from .. import costs
from ..memo import per_object
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


def transient_bytes(profile: Profile, layers: list[int]) -> int:
    """Peak of FSDP2's gathered parameters, all-gather and reduce-scatter buffers and unsharded gradients on a rank
    that holds `layers` (global indices, in order): the largest over its units' forwards and backwards (module
    docstring)."""
    return _peak(profile, layers, parameters=True)


def new_storage_bytes(profile: Profile, layers: list[int]) -> int:
    """The same peak without the unsharded parameters, which FSDP2 re-fills in place: the bytes of new tensors FSDP2
    makes in an iteration (all-gather outputs, gradients, reduce-scatter inputs), as a live-bytes probe counts them."""
    return _peak(profile, layers, parameters=False)


def backward_new_bytes(profile: Profile, layers: list[int]) -> list[tuple[int, int]]:
    """Per unit of `layers` (in order), the most bytes of new tensors FSDP2 holds (unsharded parameters excluded: what
    a live-bytes probe sees beside the activations) during its backward and during its post-backward (reduction)."""
    if not profile.parallel.fsdp:
        return [(0, 0)] * len(layers)
    _, during, post, _ = _units(profile, layers, parameters=False)
    return [(d, p) for (members, _), d, p in zip(units(profile, layers), during, post) for _ in members]


@per_object
def _tail(profile: Profile) -> frozenset[int]:
    """The profile's final norm and output layer (torchtitan's [norm, output] unit): the trailing norm layers and the
    output layer after the last decoder layer; empty where the layers' roles show no output layer."""
    from ..exports.layout import LOSS, NORM, roles

    try:
        got = roles(profile)
    except ValueError:  # no decoder layers to place the ends by
        return frozenset()
    if not got or got[-1] != LOSS:
        return frozenset()
    first = len(got) - 1
    while first > 0 and got[first - 1] == NORM:
        first -= 1
    return frozenset(range(first, len(got)))


def units(profile: Profile, layers: list[int]) -> list[tuple[list[int], bool]]:
    """The FSDP units of a rank holding `layers` (global indices, in order), as torchtitan 0.3 wraps them (module
    docstring): (their layers, resharded after forward), in order."""
    tail, raf = _tail(profile), profile.parallel.reshard_after_forward
    out: list[tuple[list[int], bool]] = []
    for i in layers:
        if i in tail and out and out[-1][0][-1] in tail:
            out[-1][0].append(i)
        else:
            out.append(([i], raf and i not in tail))
    return out


def _peak(profile: Profile, layers: list[int], parameters: bool) -> int:
    if not profile.parallel.fsdp or not layers:
        return 0
    fwd, during, post, kept = _units(profile, layers, parameters)
    return kept + max(max(fwd), max(during), max(post))


def _units(profile: Profile, layers: list[int], parameters: bool) -> tuple[list[int], list[int], list[int], int]:
    """Per unit (`units`), bytes of FSDP2's transient tensors (module docstring) in its forward, its backward and its
    post-backward, and the bytes held throughout; `parameters`: with the gathered units' own parameters."""
    par = profile.parallel
    wrapped = units(profile, layers)
    n = [sum(profile.layers[i].params for i in members) for members, _ in wrapped]
    raf = [resharded for _, resharded in wrapped]
    g, r, s = gather_bytes(profile), REDUCE_BYTES, shard_ranks(par)
    p = g if parameters else 0  # bytes per parameter of a gathered unit's own parameters
    above = [n[j + 1] if j + 1 < len(n) else 0 for j in range(len(n))]
    up_raf = [raf[j + 1] if j + 1 < len(n) else True for j in range(len(n))]
    # in backward, the unit below's all-gather (prefetched) where it was resharded after forward
    below = [n[j - 1] if j > 0 and raf[j - 1] else 0 for j in range(len(n))]
    own = [p * a if rs else 0 for a, rs in zip(n, raf)]  # not resharded: held (below)
    held = sum(p * a for a, rs in zip(n, raf) if not rs)
    # forward: the unit, and the next one's all-gather output and (resharded after forward) copy-out target; with
    # none resharded, no all-gather's bytes matter beside the backward's
    fwd = [o + (g + (p if ur else 0)) * up if any(raf) else 0 for o, up, ur in zip(own, above, up_raf)]
    # backward: the unit below's prefetched all-gather output, the unit's parameters and gradient, the unit above's
    # reduce-scatter input (held until this unit's post-backward)
    during = [g * low + o + g * a + r * up for a, o, low, up in zip(n, own, below, above)]
    # post-backward, resharded: the gradient (alive until the reduction ends), its RS input and output (the shard)
    post = [g * low + g * a + r * a + r * a // s for a, low in zip(n, below)]
    return fwd, during, post, held


def copies_s(profile: Profile, params: int) -> tuple[float, float]:
    """(forward, backward) seconds of the copies FSDP2 runs on the compute stream for one unit of `params` per
    micro-batch, memory-bound (costs.memory_s): after each all-gather, the copy-out from the flat all-gather output
    into the unsharded parameters (read and write g bytes each: split_with_sizes_copy), in forward and, resharded
    after forward, again in backward; after the backward, the copy-in of the unsharded gradient into the flat
    reduce-scatter input (read g, write r: chunk_cat). The copy-in of the local shard before an all-gather (a copy
    stream on a GPU) and the accumulation into the sharded gradient (the reduce-scatter stream) are left out."""
    if not profile.parallel.fsdp:
        return 0.0, 0.0
    g = gather_bytes(profile)
    out = costs.memory_s(2 * g * params, profile.hardware)
    reduce_in = costs.memory_s((g + REDUCE_BYTES) * params, profile.hardware)
    return out, (out if gathers_in_backward(profile.parallel) else 0.0) + reduce_in


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
